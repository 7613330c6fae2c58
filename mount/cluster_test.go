package mount

import (
	"context"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/client"
	"github.com/weft-fs/weft/internal/testcluster"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// testCluster is a meta service and data servers running in-process.
type testCluster struct {
	*testcluster.Cluster
	metaAddr string
}

// startCluster runs a meta service and nData data servers in-process over
// real gRPC on loopback, with the given default layout, and returns once
// every data server's chain is in the chain table.
func startCluster(t *testing.T, layout *weftv1.Layout, nData int) *testCluster {
	t.Helper()
	o := testcluster.Options{DataServers: nData, Layout: layout}
	if testing.Verbose() {
		o.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	s := testcluster.Start(t, o)
	return &testCluster{Cluster: s, metaAddr: s.MetaAddr()}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// mountCluster starts a cluster and mounts it in a temporary directory,
// unmounted when the test ends.
func mountCluster(t *testing.T, layout *weftv1.Layout) (*testCluster, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root here")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no FUSE: %v", err)
	}
	tc := startCluster(t, layout, 3)
	return tc, mountAt(t, tc)
}

// mountAt mounts the cluster with a client of its own in a temporary
// directory, unmounted when the test ends.
func mountAt(t *testing.T, tc *testCluster) string {
	t.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := client.New(context.Background(), client.Config{MetaAddr: tc.metaAddr, MountPoint: "test", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	m, err := Mount(c, dir, Options{})
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var err error
		for range 50 {
			if err = m.Unmount(); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("unmount %s: %v", dir, err)
		_ = syscall.Unmount(dir, syscall.MNT_DETACH)
	})
	return dir
}
