package exerciser

import (
	"os"
	"testing"

	"github.com/weft-fs/weft/internal/testcluster"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

// TestWeft runs the exerciser on a FUSE mount (weft mount) of an in-process weft cluster
// with small chunks, so that a run crosses many chunk and stripe boundaries.
func TestWeft(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and a FUSE mount")
	}
	const chunkSize = 256 << 10
	c := testcluster.Start(t, testcluster.Options{Mount: true, Layout: &weftv1.Layout{ChunkSize: chunkSize, StripeCount: 3}})
	Run(t, c.MountDir(), Config{Ops: 2000, MaxFileSize: 4 << 20, Files: 3, ChunkSizeHint: chunkSize})
}

// TestWeftReplicated runs the exerciser on three-way replicated chains, so
// that every write, scattered small writes sent as writes of pieces
// included, is forwarded down a chain.
func TestWeftReplicated(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and a FUSE mount")
	}
	const chunkSize = 256 << 10
	c := testcluster.Start(t, testcluster.Options{Mount: true, Layout: &weftv1.Layout{ChunkSize: chunkSize, StripeCount: 2, Replicas: 3}})
	Run(t, c.MountDir(), Config{Ops: 1000, MaxFileSize: 4 << 20, Files: 3, ChunkSizeHint: chunkSize})
}
