package client

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"sync"
	"time"
)

// groupsTTL is how long the supplementary groups of a pid are reused: long
// enough to spare /proc reads on a burst of requests, short enough that a
// recycled pid or a setgroups call is noticed quickly.
const groupsTTL = 2 * time.Second

type groupEntry struct {
	groups []uint32
	at     time.Time
}

// groupCache caches the supplementary groups of processes by pid.
type groupCache struct {
	mu      sync.Mutex
	entries map[uint32]groupEntry
}

func (g *groupCache) get(pid uint32) []uint32 {
	if pid == 0 {
		return nil
	}
	now := time.Now()
	g.mu.Lock()
	e, ok := g.entries[pid]
	g.mu.Unlock()
	if ok && now.Sub(e.at) < groupsTTL {
		return e.groups
	}
	groups := readGroups(pid)
	g.mu.Lock()
	if len(g.entries) > 4096 {
		for p, e := range g.entries {
			if now.Sub(e.at) >= groupsTTL {
				delete(g.entries, p)
			}
		}
	}
	g.entries[pid] = groupEntry{groups: groups, at: now}
	g.mu.Unlock()
	return groups
}

// readGroups parses the "Groups:" line of /proc/<pid>/status; a process
// that is gone has no groups.
func readGroups(pid uint32) []uint32 {
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/status")
	if err != nil {
		return nil
	}
	return parseGroups(b)
}

func parseGroups(status []byte) []uint32 {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		line := sc.Bytes()
		rest, ok := bytes.CutPrefix(line, []byte("Groups:"))
		if !ok {
			continue
		}
		var out []uint32
		for _, f := range bytes.Fields(rest) {
			if v, err := strconv.ParseUint(string(f), 10, 32); err == nil {
				out = append(out, uint32(v))
			}
		}
		return out
	}
	return nil
}
