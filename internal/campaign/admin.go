package campaign

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// statusJSON is the part of `weft status --json` the campaign reads.
type statusJSON struct {
	Health        string   `json:"health"`
	HealthReasons []string `json:"health_reasons"`
	ServersOnline int      `json:"servers_online"`
	ServersTotal  int      `json:"servers_total"`
	Files         uint64   `json:"files"`
	Directories   uint64   `json:"directories"`
	Sessions      uint64   `json:"sessions"`
	GCPending     uint64   `json:"gc_pending"`
	OpenGraceMs   int64    `json:"open_grace_left_ms"`
	Warnings      []string `json:"warnings"`
	MetaServers   []struct {
		Address string `json:"address"`
	} `json:"meta_servers"`
}

// fsckJSON is the part of `weft fsck --json` the campaign reads.
type fsckJSON struct {
	Problems []struct {
		Kind   string `json:"kind"`
		Ino    uint64 `json:"ino"`
		Name   string `json:"name"`
		Detail string `json:"detail"`
	} `json:"problems"`
	ProblemsLeft  uint64 `json:"problems_left"`
	InodesChecked uint64 `json:"inodes_checked"`
}

// weft runs the weft binary with args (bounded by timeout) and returns
// its standard output; an exit status other than 0 is an error with its
// standard error, unless okCodes lists it.
func (c *cluster) weft(timeout time.Duration, okCodes []int, args ...string) (string, int, error) {
	out, errOut, code, err := c.spawn.run(timeout, append([]string{c.cfg.Weft}, args...), append(os.Environ(), c.env...))
	if err == nil && code != 0 && !slices.Contains(okCodes, code) {
		err = fmt.Errorf("exit status %d", code)
	}
	if err != nil {
		return out, code, fmt.Errorf("weft %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errOut))
	}
	return out, code, nil
}

// status runs weft status --json.
func (c *cluster) status() (*statusJSON, error) {
	out, _, err := c.weft(15*time.Second, nil, "status", "--meta", c.metaAddrs(), "--json")
	if err != nil {
		return nil, err
	}
	st := new(statusJSON)
	if err := json.Unmarshal([]byte(out), st); err != nil {
		return nil, fmt.Errorf("weft status --json: %w", err)
	}
	return st, nil
}

// describe summarizes a status in one line.
func (st *statusJSON) describe() string {
	s := fmt.Sprintf("%s, %d/%d data servers online, %d files, %d directories, %d sessions, %d chunks queued for GC",
		st.Health, st.ServersOnline, st.ServersTotal, st.Files, st.Directories, st.Sessions, st.GCPending)
	if len(st.HealthReasons) > 0 {
		s += " (" + strings.Join(st.HealthReasons, "; ") + ")"
	}
	if st.OpenGraceMs > 0 {
		s += fmt.Sprintf(", %d ms of open grace left", st.OpenGraceMs)
	}
	return s
}

// waitStatus polls weft status until ok holds, for at most timeout.
func (c *cluster) waitStatus(timeout time.Duration, ok func(*statusJSON) bool) error {
	deadline := time.Now().Add(timeout)
	last := "no answer yet"
	for {
		st, err := c.status()
		if err == nil {
			if ok(st) {
				return nil
			}
			last = st.describe()
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not reached after %v; last status: %s", timeout, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// fsck runs weft fsck --json (read-only) and returns its report.
func (c *cluster) fsck(repair bool) (*fsckJSON, error) {
	args := []string{"fsck", "--meta", c.metas[0].front.Addr(), "--json"}
	if repair {
		args = append(args, "--repair")
	}
	out, _, err := c.weft(2*time.Minute, []int{1}, args...)
	if err != nil {
		return nil, err
	}
	r := new(fsckJSON)
	if err := json.Unmarshal([]byte(out), r); err != nil {
		return nil, fmt.Errorf("weft fsck --json: %w\n%s", err, out)
	}
	return r, nil
}

// setReplicas gives the new files of dir (on a mount) r replicas.
func (c *cluster) setReplicas(dir string, r int) error {
	_, _, err := c.weft(30*time.Second, nil, "layout", "set", dir, "--replicas", fmt.Sprint(r), "--meta", c.metas[0].front.Addr())
	return err
}
