package mount

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/weft-fs/weft/client"
)

// TestColdStatAnsweredHere stats files, drops the kernel's caches and
// stats them again: the client kept their attributes under callbacks, so
// the second round costs (nearly) no meta call; another mount's change to
// one of them shows at once; and the files read back whole.
func TestColdStatAnsweredHere(t *testing.T) {
	needFUSE(t)
	tc, d, c := mountFreshDirConfig(t, client.Config{Testing: client.Testing{NoDelegations: true}})
	other, _, _ := mountWithConfig(t, tc, Options{}, client.Config{})
	const n = 50
	data := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 1000+i) }
	for i := range n {
		if err := os.WriteFile(filepath.Join(d, fmt.Sprint("f", i)), data(i), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	statAll := func() {
		t.Helper()
		for i := range n {
			st, err := os.Stat(filepath.Join(d, fmt.Sprint("f", i)))
			if err != nil {
				t.Fatal(err)
			}
			if st.Size() != int64(len(data(i))) {
				t.Fatalf("f%d: size %d, want %d", i, st.Size(), len(data(i)))
			}
		}
	}
	dropCaches := func() {
		t.Helper()
		if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
			t.Fatal(err)
		}
	}
	// The lookups go to the meta service, and are kept. Two rounds: the
	// kernel sends a file's release after close(2) returned, and a file
	// still open in the kernel survives a cache drop, so its stat in the
	// first round may not reach this client at all.
	for range 2 {
		dropCaches()
		statAll()
	}
	dropCaches()
	calls, hits := c.MetaCalls(), c.FileAttrHits()
	statAll()
	// The directory itself is looked up again (directories are not kept
	// here), and its attributes may be asked for. A file the kernel still
	// held through the drop is stat'd without reaching this client (no
	// call, no hit): allow one such. Without kept attributes this is 51
	// calls and no hits.
	if got := c.MetaCalls() - calls; got > 3 {
		t.Errorf("%d meta calls to stat %d files after a cache drop, want (nearly) none", got, n)
	}
	if got := c.FileAttrHits() - hits; got < n-1 {
		t.Errorf("%d of %d stats answered from kept attributes", got, n)
	}

	// Another mount appends to a file: the callback reaches this one.
	rel, _ := filepath.Rel(filepath.Dir(d), d)
	p := filepath.Join(other, rel, "f7")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	dropCaches()
	eventually(t, "the other mount's append seen here", func() error {
		st, err := os.Stat(filepath.Join(d, "f7"))
		if err != nil {
			return err
		}
		if want := int64(len(data(7)) + 4); st.Size() != want {
			return fmt.Errorf("size %d, want %d", st.Size(), want)
		}
		return nil
	})
	for i := range n {
		want := data(i)
		if i == 7 {
			want = append(want, "more"...)
		}
		got, err := os.ReadFile(filepath.Join(d, fmt.Sprint("f", i)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("f%d read back %d bytes, want %d", i, len(got), len(want))
		}
	}
}
