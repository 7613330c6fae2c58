package mount

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/weft-fs/weft/client"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestRemovesAfterCreates checks that files made through a mount (the
// first ones by the meta service, the rest under the delegation the
// creates earn) and sent in the background are removed by the mount
// itself, by name, as a remove benchmark does.
func TestRemovesAfterCreates(t *testing.T) {
	needFUSE(t)
	tc := startCluster(t, &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 1, Replicas: 1}, 1)
	a, ca, _ := mountWithConfig(t, tc, Options{}, client.Config{})
	d := filepath.Join(a, "d")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 50
	for i := range n {
		f, err := os.OpenFile(filepath.Join(d, fmt.Sprint("f", i)), os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	before := ca.LocalRemoves()
	for i := range n {
		if err := os.Remove(filepath.Join(d, fmt.Sprint("f", i))); err != nil {
			t.Fatal(err)
		}
	}
	if got := ca.LocalRemoves() - before; got != n {
		t.Fatalf("%d of %d removes answered by the mount", got, n)
	}
	if err := syncDir(d); err != nil {
		t.Fatal(err)
	}
	fsckClean(t, tc)
}
