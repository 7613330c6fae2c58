package posixtest

import (
	"os"
	"testing"

	"github.com/weft-fs/weft/internal/testcluster"
)

func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

// TestWeft runs the suite on a FUSE mount (weft mount) of an in-process weft cluster.
func TestWeft(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and a FUSE mount")
	}
	c := testcluster.Start(t, testcluster.Options{Mount: true, MountArgs: []string{"--allow-other"}})
	MakeSearchable(t, c.MountDir())
	Run(t, c.MountDir(), Options{})
}
