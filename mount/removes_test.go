package mount

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/client"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// removeEnv is one case of TestLocalRemoves: directory a of mount a (with
// client ca), held under a delegation, holding files f0..f4 the meta
// service has (this mount knows them); the same directory through mount b.
type removeEnv struct {
	t    *testing.T
	tc   *testCluster
	ca   *client.Client
	a, b string
}

func (e *removeEnv) pa(n string) string { return filepath.Join(e.a, n) }
func (e *removeEnv) pb(n string) string { return filepath.Join(e.b, n) }

// unlinkHere unlinks name through mount a and checks that it was answered
// there, without the meta service.
func (e *removeEnv) unlinkHere(n string) {
	e.t.Helper()
	before := e.ca.LocalRemoves()
	if err := os.Remove(e.pa(n)); err != nil {
		e.t.Fatal(err)
	}
	if e.ca.LocalRemoves() != before+1 {
		e.t.Fatalf("unlink of %s was not answered by the mount (local removes %d, before %d)", n, e.ca.LocalRemoves(), before)
	}
}

// names lists directory d.
func names(t *testing.T, d string) []string {
	t.Helper()
	ents, err := os.ReadDir(d)
	if err != nil {
		t.Fatal(err)
	}
	var ns []string
	for _, e := range ents {
		ns = append(ns, e.Name())
	}
	return ns
}

// wantMissing checks that name p does not exist (stat and open).
func wantMissing(t *testing.T, p, how string) {
	t.Helper()
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat of %s %s: %v, want no such file", p, how, err)
	}
	if _, err := os.Open(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("open of %s %s: %v, want no such file", p, how, err)
	}
}

// fsckClean runs the meta service's fsck and fails on any problem.
func fsckClean(t *testing.T, tc *testCluster) {
	t.Helper()
	resp, err := tc.Meta().Fsck(context.Background(), &weftv1.FsckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Problems) > 0 || resp.ProblemsNotListed > 0 {
		t.Fatalf("fsck found %d problems: %v", len(resp.Problems)+int(resp.ProblemsNotListed), resp.Problems)
	}
}

// TestLocalRemoves checks unlinks answered by a mount under a directory
// delegation (made files wait a minute to be sent unless something needs
// them, and so do the removes): another mount sees them at once, a name
// is made again, an fsync of the directory sends them, a file still open
// lives on, a remove the meta service refuses is reported by the next
// fsync of the directory, and rm -r of a tree leaves nothing for fsck.
func TestLocalRemoves(t *testing.T) {
	needFUSE(t)
	tc := startCluster(t, &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 1, Replicas: 1}, 1)
	long := Options{AttrTimeout: 10 * time.Minute, EntryTimeout: 10 * time.Minute}
	a, ca, _ := mountWithConfig(t, tc, long, client.Config{Testing: client.Testing{CreateSendDelay: time.Minute}})
	b, _, _ := mountWith(t, tc, long)
	for _, tt := range []struct {
		name string
		run  func(t *testing.T, e *removeEnv)
	}{
		{"seen from another mount", func(t *testing.T, e *removeEnv) {
			e.unlinkHere("f0")
			e.unlinkHere("f1")
			if n := e.ca.PendingRemoves(); n != 2 {
				t.Fatalf("%d removes waiting to be sent, want 2", n)
			}
			wantMissing(t, e.pa("f0"), "here")
			wantMissing(t, e.pb("f0"), "through the other mount")
			wantMissing(t, e.pb("f1"), "through the other mount")
			if ns := names(t, e.b); slices.Contains(ns, "f0") || slices.Contains(ns, "f1") || !slices.Contains(ns, "f2") {
				t.Fatalf("the other mount lists %v", ns)
			}
			if ns := names(t, e.a); slices.Contains(ns, "f0") || !slices.Contains(ns, "f2") {
				t.Fatalf("this mount lists %v", ns)
			}
		}},
		{"name made again", func(t *testing.T, e *removeEnv) {
			for i := range 4 {
				if i%2 == 1 {
					if err := syncDir(e.a); err != nil {
						t.Fatal(err)
					}
				}
				if i == 0 || i%2 == 1 {
					e.unlinkHere("f0") // known here: the first, or one sent
				} else if err := os.Remove(e.pa("f0")); err != nil {
					t.Fatal(err) // made here and not sent: the meta service's
				}
				wantMissing(t, e.pa("f0"), "here")
				if err := os.WriteFile(e.pa("f0"), []byte(fmt.Sprint("round ", i)), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range []string{e.pa("f0"), e.pb("f0")} {
				if got, err := os.ReadFile(p); err != nil || string(got) != "round 3" {
					t.Fatalf("read %s: %q, %v; want the last round's", p, got, err)
				}
			}
		}},
		{"fsync of the directory", func(t *testing.T, e *removeEnv) {
			for _, n := range []string{"f0", "f1", "f2"} {
				e.unlinkHere(n)
			}
			if err := syncDir(e.a); err != nil {
				t.Fatal(err)
			}
			if n := e.ca.PendingRemoves(); n != 0 {
				t.Fatalf("%d removes not sent after the directory's fsync", n)
			}
			if held, _ := e.ca.Delegations(); held == 0 {
				t.Fatal("the fsync returned the delegation")
			}
			if ns := slices.DeleteFunc(names(t, e.b), func(n string) bool { return n[0] != 'f' }); !slices.Equal(ns, []string{"f3", "f4"}) {
				t.Fatalf("the other mount lists %v", ns)
			}
		}},
		{"open file lives on", func(t *testing.T, e *removeEnv) {
			old, err := os.OpenFile(e.pa("f0"), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close()
			// Made here, sent, and open without the meta service
			// knowing yet.
			made, err := os.OpenFile(e.pa("new"), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer made.Close()
			if err := syncDir(e.a); err != nil {
				t.Fatal(err)
			}
			e.unlinkHere("f0")
			e.unlinkHere("new")
			for round, when := range []string{"before the sends", "after the sends"} {
				if round == 1 {
					if err := syncDir(e.a); err != nil {
						t.Fatal(err)
					}
				}
				for _, f := range []*os.File{old, made} {
					want := []byte(fmt.Sprint("data of ", f.Name(), " ", when))
					if _, err := f.WriteAt(want, 0); err != nil {
						t.Fatalf("write %s: %v", when, err)
					}
					if err := f.Sync(); err != nil {
						t.Fatalf("fsync %s: %v", when, err)
					}
					got := make([]byte, len(want))
					if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
						t.Fatalf("read %s: %q, %v; want %q", when, got, err, want)
					}
				}
			}
			wantMissing(t, e.pb("f0"), "through the other mount")
			wantMissing(t, e.pb("new"), "through the other mount")
		}},
		{"refused remove reported by fsync", func(t *testing.T, e *removeEnv) {
			e.unlinkHere("f0")
			// The meta service moves the name meanwhile, bypassing
			// the delegation: the queued remove finds nothing.
			var st syscall.Stat_t
			if err := syscall.Stat(e.a, &st); err != nil {
				t.Fatal(err)
			}
			if _, err := e.tc.Meta().Rename(context.Background(), &weftv1.RenameRequest{
				OldParent: st.Ino, OldName: "f0", NewParent: st.Ino, NewName: "moved"}); err != nil {
				t.Fatal(err)
			}
			err := syncDir(e.a)
			if !errors.Is(err, syscall.EIO) {
				t.Fatalf("fsync of the directory after a refused remove: %v, want EIO", err)
			}
			if err := syncDir(e.a); err != nil {
				t.Fatalf("second fsync of the directory: %v, want the error reported once", err)
			}
			eventually(t, "the moved name seen here", func() error {
				_, err := os.Stat(e.pa("moved"))
				return err
			})
		}},
		{"rm -r of a tree", func(t *testing.T, e *removeEnv) {
			tree := e.pa("tree")
			for i := range 4 {
				d := filepath.Join(tree, fmt.Sprint("d", i), "sub")
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
				for j := range 20 {
					for _, p := range []string{filepath.Join(d, fmt.Sprint("f", j)), filepath.Join(filepath.Dir(d), fmt.Sprint("f", j))} {
						if err := os.WriteFile(p, []byte(p), 0o644); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			// Listed (as rm -r does) once the files are sent.
			if err := syncDir(e.a); err != nil {
				t.Fatal(err)
			}
			before := e.ca.LocalRemoves()
			if err := os.RemoveAll(tree); err != nil {
				t.Fatal(err)
			}
			if e.ca.LocalRemoves() == before {
				t.Fatal("no remove of the tree was answered by the mount")
			}
			if err := syncDir(e.a); err != nil {
				t.Fatal(err)
			}
			wantMissing(t, e.pb("tree"), "through the other mount")
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newRemoveEnv(t, tc, ca, a, b)
			tt.run(t, e)
			if err := syncDir(e.a); err != nil {
				t.Fatal(err)
			}
			fsckClean(t, tc)
		})
	}
}

// newRemoveEnv makes a directory of its own for a case through mount a,
// has ca hold it under a delegation, and makes f0..f4 there, sent to the
// meta service (so mount a knows them).
func newRemoveEnv(t *testing.T, tc *testCluster, ca *client.Client, a, b string) *removeEnv {
	t.Helper()
	sub := filepath.Base(t.Name())
	e := &removeEnv{t: t, tc: tc, ca: ca, a: filepath.Join(a, sub), b: filepath.Join(b, sub)}
	if err := os.Mkdir(e.a, 0o755); err != nil {
		t.Fatal(err)
	}
	waitDelegated(t, ca, e.a)
	for i := range 5 {
		if err := os.WriteFile(e.pa(fmt.Sprint("f", i)), []byte(fmt.Sprint("file ", i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := syncDir(e.a); err != nil {
		t.Fatal(err)
	}
	return e
}

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
	if err := syncDir(d); err != nil { // the creates are stored: the files are kept here
		t.Fatal(err)
	}
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

// waitDelegated creates empty files "warmN" in dir until the mount of ca
// makes them under a create delegation of dir (50 at most).
func waitDelegated(t *testing.T, ca *client.Client, dir string) {
	t.Helper()
	for i := 0; ; i++ {
		_, made := ca.Delegations()
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprint("warm", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, now := ca.Delegations(); now > made {
			return
		}
		if i == 50 {
			t.Fatal("no create delegation of a new directory after 50 creates in it")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
