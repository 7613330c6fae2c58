package testcluster

import (
	"os/exec"
	"strings"
	"testing"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestNoClientSide checks that the package does not depend on client or
// mount, whose in-package tests use it.
func TestNoClientSide(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, bad := range []string{"github.com/weft-fs/weft/client", "github.com/weft-fs/weft/mount"} {
			if dep == bad || strings.HasPrefix(dep, bad+"/") {
				t.Errorf("testcluster depends on %s", dep)
			}
		}
	}
}

// TestRestart starts servers, restarts a data server and the meta
// service, and checks that the meta service sees every data server.
func TestRestart(t *testing.T) {
	var fronted []string
	s := Start(t, Options{DataServers: 2, Layout: &weftv1.Layout{StripeCount: 1},
		Front: func(i int, addr string) (string, func()) {
			fronted = append(fronted, addr)
			return addr, nil
		}})
	if len(fronted) != 2 || s.DataAddr(0) != fronted[0] || s.DataAddr(1) != fronted[1] {
		t.Fatalf("Front saw %v, data servers listen on %s, %s", fronted, s.DataAddr(0), s.DataAddr(1))
	}
	if s.DataServer(0) == nil || s.Meta() == nil || len(s.DataDirs()) != 2 {
		t.Fatal("servers not running")
	}
	if err := s.StopData(0); err != nil {
		t.Fatalf("stop data server: %v", err)
	}
	if s.DataServer(0) != nil {
		t.Fatal("stopped data server still reported")
	}
	s.StartData(0)
	addr := s.MetaAddr()
	if err := s.StopMeta(); err != nil {
		t.Fatalf("stop meta service: %v", err)
	}
	s.StartMeta()
	if s.MetaAddr() != addr {
		t.Fatalf("meta service moved from %s to %s", addr, s.MetaAddr())
	}
	s.waitChains(2)
	s.WaitOnline(2)
}
