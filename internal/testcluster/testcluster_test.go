package testcluster

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestStartStopData(t *testing.T) {
	c := Start(t, Options{DataServers: 2})
	st := c.Status()
	if len(st.GetServers()) != 2 {
		t.Fatalf("status shows %d servers, want 2", len(st.GetServers()))
	}
	addr := c.DataAddr(1)
	c.StopData(1)
	c.WaitOffline(1)
	c.StartData(1)
	c.WaitOnline(2)
	if got := c.DataAddr(1); got != addr {
		t.Errorf("data server 1 came back on %s, want its old address %s", got, addr)
	}
	if n := len(c.Status().GetServers()); n != 2 {
		t.Errorf("a restarted data server must keep its identity: %d servers registered, want 2", n)
	}
	if c.NewClient() == nil {
		t.Fatal("NewClient returned nil")
	}
}

func TestMount(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil || os.Geteuid() != 0 {
		t.Skip("needs /dev/fuse and root")
	}
	c := Start(t, Options{DataServers: 2, ChunkSize: 64 << 10, StripeCount: 2, Mount: true})
	want := bytes.Repeat([]byte("weft"), 100000)
	p := filepath.Join(c.MountDir(), "f")
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back: %v", err)
	}
}
