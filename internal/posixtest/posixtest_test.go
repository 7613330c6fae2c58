package posixtest

import (
	"testing"
)

// TestLocalDisk runs the suite on a directory of the local disk: the
// baseline that shows the suite's expectations are those of Linux.
func TestLocalDisk(t *testing.T) {
	dir := t.TempDir()
	MakeSearchable(t, dir)
	Run(t, dir, Options{})
}
