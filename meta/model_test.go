package meta

import (
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"syscall"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

var (
	modelSeed  = flag.Uint64("model.seed", 0, "seed of TestNamespaceModel (0: from the clock)")
	modelSteps = flag.Int("model.steps", 1000, "operations TestNamespaceModel runs")
)

// modelNode is an inode of the in-memory model of the namespace.
type modelNode struct {
	dir      bool
	parent   uint64            // directories only
	children map[string]uint64 // directories only
	links    uint32            // non-directories only
}

type model struct {
	nodes map[uint64]*modelNode
	gone  []uint64 // deleted inodes
}

func (m *model) dirs() []uint64 {
	var out []uint64
	for ino, n := range m.nodes {
		if n.dir {
			out = append(out, ino)
		}
	}
	slices.Sort(out)
	return out
}

func (m *model) files() []uint64 {
	var out []uint64
	for ino, n := range m.nodes {
		if !n.dir {
			out = append(out, ino)
		}
	}
	slices.Sort(out)
	return out
}

// inSubtree reports whether dir is top or below it.
func (m *model) inSubtree(top, dir uint64) bool {
	for {
		if dir == top {
			return true
		}
		if dir == rootIno {
			return false
		}
		dir = m.nodes[dir].parent
	}
}

func (m *model) nlink(ino uint64) uint32 {
	n := m.nodes[ino]
	if !n.dir {
		return n.links
	}
	var sub uint32
	for _, c := range n.children {
		if m.nodes[c].dir {
			sub++
		}
	}
	return 2 + sub
}

// drop removes name from dir in the model, deleting the inode with its
// last name.
func (m *model) drop(dir uint64, name string) {
	ino := m.nodes[dir].children[name]
	delete(m.nodes[dir].children, name)
	n := m.nodes[ino]
	if !n.dir {
		n.links--
		if n.links > 0 {
			return
		}
	}
	delete(m.nodes, ino)
	m.gone = append(m.gone, ino)
}

// TestNamespaceModel runs random mkdir/create/link/unlink/rmdir/rename
// operations against the service and an in-memory model, and after every
// step compares entries, inode numbers and link counts. Rerun a failure
// with -model.seed. It runs on each engine.
func TestNamespaceModel(t *testing.T) {
	seed := *modelSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -model.seed=%d)", seed, seed)
	onEngines(t, func(t *testing.T, newEnv envMaker) { runModel(t, newEnv(t), seed) })
}

// runModel runs TestNamespaceModel's steps on e.
func runModel(t *testing.T, e *env, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed))
	m := &model{nodes: map[uint64]*modelNode{rootIno: {dir: true, parent: rootIno, children: map[string]uint64{}}}}
	names := []string{"a", "b", "c", "d", "e"}
	pick := func(s []uint64) uint64 { return s[rng.IntN(len(s))] }

	steps := *modelSteps
	if e.engine != nil {
		steps /= 10 // every step is a few round trips to etcd
	}
	for step := range steps {
		dir := pick(m.dirs())
		name := names[rng.IntN(len(names))]
		existing, exists := m.nodes[dir].children[name]
		var desc string
		var err error
		var want syscall.Errno
		apply := func() {}
		switch op := rng.IntN(10); {
		case op < 2:
			desc = fmt.Sprintf("mkdir %d/%s", dir, name)
			var r *weftv1.AttrResponse
			r, err = e.s.Mkdir(e.ctx, &weftv1.MkdirRequest{Caller: root, Parent: dir, Name: name, Mode: 0o755})
			if exists {
				want = syscall.EEXIST
			} else if err == nil {
				apply = func() {
					m.nodes[r.Attr.Ino] = &modelNode{dir: true, parent: dir, children: map[string]uint64{}}
					m.nodes[dir].children[name] = r.Attr.Ino
				}
			}
		case op < 4:
			desc = fmt.Sprintf("create %d/%s", dir, name)
			var r *weftv1.CreateResponse
			r, err = e.s.Create(e.ctx, &weftv1.CreateRequest{Caller: root, Parent: dir, Name: name, Mode: 0o644, Exclusive: true})
			if exists {
				want = syscall.EEXIST
			} else if err == nil {
				apply = func() {
					m.nodes[r.Attr.Ino] = &modelNode{links: 1}
					m.nodes[dir].children[name] = r.Attr.Ino
				}
			}
		case op < 5:
			files := m.files()
			if len(files) == 0 {
				continue
			}
			f := pick(files)
			desc = fmt.Sprintf("link %d as %d/%s", f, dir, name)
			_, err = e.s.Link(e.ctx, &weftv1.LinkRequest{Caller: root, Ino: f, NewParent: dir, NewName: name})
			if exists {
				want = syscall.EEXIST
			} else {
				apply = func() {
					m.nodes[f].links++
					m.nodes[dir].children[name] = f
				}
			}
		case op < 6:
			desc = fmt.Sprintf("unlink %d/%s", dir, name)
			err = e.unlink(root, dir, name)
			switch {
			case !exists:
				want = syscall.ENOENT
			case m.nodes[existing].dir:
				want = syscall.EISDIR
			default:
				apply = func() { m.drop(dir, name) }
			}
		case op < 7:
			desc = fmt.Sprintf("rmdir %d/%s", dir, name)
			err = e.rmdir(root, dir, name)
			switch {
			case !exists:
				want = syscall.ENOENT
			case !m.nodes[existing].dir:
				want = syscall.ENOTDIR
			case len(m.nodes[existing].children) > 0:
				want = syscall.ENOTEMPTY
			default:
				apply = func() { m.drop(dir, name) }
			}
		default:
			to := pick(m.dirs())
			toName := names[rng.IntN(len(names))]
			desc = fmt.Sprintf("rename %d/%s to %d/%s", dir, name, to, toName)
			err = e.rename(root, dir, name, to, toName, 0)
			dst, dstExists := m.nodes[to].children[toName]
			switch {
			case !exists:
				want = syscall.ENOENT
			case dstExists && dst == existing:
				// same inode: nothing happens
			case m.nodes[existing].dir && dir != to && m.inSubtree(existing, to):
				want = syscall.EINVAL
			case dstExists && m.nodes[existing].dir && !m.nodes[dst].dir:
				want = syscall.ENOTDIR
			case dstExists && !m.nodes[existing].dir && m.nodes[dst].dir:
				want = syscall.EISDIR
			case dstExists && m.nodes[dst].dir && len(m.nodes[dst].children) > 0:
				want = syscall.ENOTEMPTY
			default:
				apply = func() {
					if dstExists {
						m.drop(to, toName)
					}
					delete(m.nodes[dir].children, name)
					m.nodes[to].children[toName] = existing
					if n := m.nodes[existing]; n.dir {
						n.parent = to
					}
				}
			}
		}
		if got := errnoOf(t, err); got != want {
			t.Fatalf("seed %d step %d: %s: got %v (%v), want errno %v", seed, step, desc, got, err, want)
		}
		if err == nil {
			apply()
		}
		checkModel(t, e, m, fmt.Sprintf("seed %d step %d (%s)", seed, step, desc))
	}
}

// checkModel compares every directory's entries and every inode's link
// count with the model, and checks that deleted inodes are gone.
func checkModel(t *testing.T, e *env, m *model, where string) {
	t.Helper()
	for ino, n := range m.nodes {
		a, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: ino})
		if err != nil {
			t.Fatalf("%s: getattr %d: %v", where, ino, err)
		}
		if a.Attr.Nlink != m.nlink(ino) || isDir(a.Attr.Mode) != n.dir {
			t.Fatalf("%s: inode %d: nlink %d dir %v, model says nlink %d dir %v", where, ino, a.Attr.Nlink, isDir(a.Attr.Mode), m.nlink(ino), n.dir)
		}
		if !n.dir {
			continue
		}
		r, err := e.s.ReadDir(e.ctx, &weftv1.ReadDirRequest{Caller: root, Ino: ino})
		if err != nil {
			t.Fatalf("%s: readdir %d: %v", where, ino, err)
		}
		got := map[string]uint64{}
		for _, d := range r.Entries {
			got[d.Name] = d.Ino
		}
		if !maps.Equal(got, n.children) {
			t.Fatalf("%s: directory %d has %v, model says %v", where, ino, got, n.children)
		}
		if ino != rootIno {
			up, err := e.lookup(root, ino, "..")
			if err != nil || up.Ino != n.parent {
				t.Fatalf("%s: %d/.. = %v, %v; model says %d", where, ino, up, err, n.parent)
			}
		}
	}
	for _, ino := range m.gone {
		if _, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: ino}); errnoOf(t, err) != syscall.ENOENT {
			t.Fatalf("%s: deleted inode %d: %v", where, ino, err)
		}
	}
	st, err := e.s.Status(e.ctx, &weftv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var files, dirs uint64
	for _, n := range m.nodes {
		if n.dir {
			dirs++
		} else {
			files++
		}
	}
	if st.Files != files || st.Directories != dirs {
		t.Fatalf("%s: status counts %d files %d dirs, model %d and %d", where, st.Files, st.Directories, files, dirs)
	}
}
