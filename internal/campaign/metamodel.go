package campaign

import (
	"path"
	"slices"
	"sort"
	"strings"
)

// nsModel is what a metadata workload knows of its tree: every name
// whose operation was acknowledged (it returned success; a file's
// creation with its close), and the operations that failed, whose outcome
// is open until the workload looks. Paths are relative to the worker's
// directory ("" is that directory).
type nsModel struct {
	entries map[string]*nsEntry
	pending []*nsPending
}

// nsEntry is a name in the tree.
type nsEntry struct {
	dir     bool
	ino     uint64 // 0 if not known
	content []byte // a file's content; nil if not known
}

// nsPending is a failed operation: its paths (and what is below them)
// are not touched until the workload has seen its outcome.
type nsPending struct {
	op       string // create, mkdir, unlink, rmdir, rename
	from, to string // to: rename only
	ino      uint64 // of the file made (create) or moved/removed; 0 if not known
	replaced *nsEntry
}

func newNSModel() *nsModel {
	return &nsModel{entries: map[string]*nsEntry{"": {dir: true}}}
}

// within reports whether p is q or below it.
func within(p, q string) bool {
	return q == "" || p == q || strings.HasPrefix(p, q+"/")
}

// locked reports whether p is, is below or is above a path of a pending
// operation.
func (m *nsModel) locked(p string) bool {
	for _, x := range m.pending {
		for _, q := range []string{x.from, x.to} {
			if q != "" && (within(p, q) || within(q, p) && p != "") {
				return true
			}
		}
	}
	return false
}

// pick returns the paths, sorted, for which keep holds, that no pending
// operation locks.
func (m *nsModel) pick(keep func(p string, e *nsEntry) bool) []string {
	var out []string
	for p, e := range m.entries {
		if keep(p, e) && !m.locked(p) {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// dirs lists the directories new names may go in (the root included:
// a pending operation below a directory does not stop a new name in it).
func (m *nsModel) dirs() []string {
	var out []string
	for p, e := range m.entries {
		if e.dir && !m.lockedExactly(p) {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// lockedExactly reports whether p or a directory above it is a path of
// a pending operation.
func (m *nsModel) lockedExactly(p string) bool {
	for _, x := range m.pending {
		for _, q := range []string{x.from, x.to} {
			if q != "" && within(p, q) {
				return true
			}
		}
	}
	return false
}

// children lists the names directly in directory dir.
func (m *nsModel) children(dir string) []string {
	var out []string
	for p := range m.entries {
		if p != "" && path.Dir(p) == dir || dir == "" && p != "" && !strings.Contains(p, "/") {
			out = append(out, path.Base(p))
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// move renames from (and what is below it) to to, replacing what to was.
func (m *nsModel) move(from, to string) {
	if old := m.entries[to]; old != nil && old.dir {
		m.removeTree(to)
	}
	delete(m.entries, to)
	moved := map[string]*nsEntry{}
	for p, e := range m.entries {
		if within(p, from) {
			moved[to+p[len(from):]] = e
			delete(m.entries, p)
		}
	}
	for p, e := range moved {
		m.entries[p] = e
	}
}

// removeTree removes p and what is below it.
func (m *nsModel) removeTree(p string) {
	for q := range m.entries {
		if within(q, p) {
			delete(m.entries, q)
		}
	}
}

// counts returns how many regular files and directories the model holds
// (its root not counted).
func (m *nsModel) counts() (files, dirs int) {
	for p, e := range m.entries {
		switch {
		case p == "":
		case e.dir:
			dirs++
		default:
			files++
		}
	}
	return files, dirs
}
