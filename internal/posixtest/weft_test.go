package posixtest

import (
	"testing"

	"github.com/weft-fs/weft/internal/testcluster"
	"github.com/weft-fs/weft/mount"
)

// TestWeft runs the suite on a FUSE mount of an in-process weft cluster.
func TestWeft(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and a FUSE mount")
	}
	c := testcluster.Start(t, testcluster.Options{Mount: true, MountOptions: mount.Options{AllowOther: true}})
	MakeSearchable(t, c.MountDir())
	Run(t, c.MountDir(), Options{})
}
