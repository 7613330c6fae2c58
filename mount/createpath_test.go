package mount

import (
	"bytes"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/client"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func needFUSE(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root here")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no FUSE: %v", err)
	}
}

// mountFreshDir mounts a new cluster and makes a directory through the
// mount (so the mount knows it completely), with the kernel's cache of the
// root's attributes warm again.
func mountFreshDir(t *testing.T) (*testCluster, string, *client.Client) {
	t.Helper()
	return mountFreshDirConfig(t, client.Config{})
}

// slowSends is a client configuration whose made files wait a second
// before they are sent when nobody waits for them: tests that count what
// goes with a create do not depend on the machine being quick.
var slowSends = client.Config{Testing: client.Testing{CreateSendDelay: time.Second}}

// mountFreshDirConfig is mountFreshDir with the client configured by cfg.
func mountFreshDirConfig(t *testing.T, cfg client.Config) (*testCluster, string, *client.Client) {
	t.Helper()
	tc := startCluster(t, &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 1, Replicas: 1}, 1)
	dir, c, _ := mountWithConfig(t, tc, Options{}, cfg)
	d := filepath.Join(dir, "fresh")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	// The mkdir made the kernel drop the root's attributes: let it fetch
	// them again before counting.
	if _, err := os.Stat(filepath.Join(d, "warm")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat of a missing name: %v", err)
	}
	return tc, d, c
}

// checkDirAttrs checks that what the kernel shows of directory d (link
// count, times) is what the meta service holds.
func checkDirAttrs(t *testing.T, tc *testCluster, d, when string) {
	t.Helper()
	var got syscall.Stat_t
	if err := syscall.Stat(d, &got); err != nil {
		t.Fatal(err)
	}
	want, err := tc.Meta().GetAttr(tc.Context(), &weftv1.GetAttrRequest{Ino: got.Ino})
	if err != nil {
		t.Fatal(err)
	}
	if uint64(got.Nlink) != uint64(want.Attr.Nlink) || got.Mtim.Nano() != want.Attr.MtimeNs || got.Ctim.Nano() != want.Attr.CtimeNs {
		t.Fatalf("%s %s shows nlink %d, mtime %d, ctime %d; the meta service holds %d, %d, %d",
			when, d, got.Nlink, got.Mtim.Nano(), got.Ctim.Nano(), want.Attr.Nlink, want.Attr.MtimeNs, want.Attr.CtimeNs)
	}
}

// TestCreateMetaCalls counts the meta calls of creating files in a
// directory this mount made: with callbacks live, the kernel's lookup of
// each new name is answered from the complete directory; after the first
// few creates the mount holds the directory (a create delegation) and
// answers creates itself, sending the files to the meta service in
// CreateMany calls, and no release follows their closes. A file written
// or synced is at the meta service once its close or fsync returned; one
// closed without I/O goes within milliseconds.
func TestCreateMetaCalls(t *testing.T) {
	needFUSE(t)
	tc, d, c := mountFreshDir(t)
	const n = 100
	calls, local, released := c.MetaCalls(), c.LocalLookups(), c.ReleasesSent()
	_, made0 := c.Delegations()
	var dir syscall.Stat_t
	if err := syscall.Stat(d, &dir); err != nil {
		t.Fatal(err)
	}
	// Three kinds of file: closed without I/O (the close does not wait for
	// the meta service: nothing was written), written then closed, and
	// synced then closed (both return once the meta service has it).
	unsent := 0
	for i := range n {
		name := fmt.Sprint("f", i)
		f, err := os.OpenFile(filepath.Join(d, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		switch i % 3 {
		case 1:
			if _, err := f.WriteString("x"); err != nil {
				f.Close()
				t.Fatal(err)
			}
		case 2:
			if err := f.Sync(); err != nil {
				f.Close()
				t.Fatal(err)
			}
			if p := c.PendingCreates(); p != 0 {
				f.Close()
				t.Fatalf("%s: %d files not at the meta service after fsync returned", name, p)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		switch p := c.PendingCreates(); {
		case i%3 == 0 && p > 0:
			unsent++
		case i%3 == 1 && p != 0:
			t.Fatalf("%s: %d files not at the meta service after the close of a written file returned", name, p)
		}
	}
	if unsent == 0 && c.PendingCreates() == 0 {
		t.Errorf("every close of an empty file waited for the meta service")
	}
	// The rest is sent within milliseconds, with nobody asking.
	for deadline := time.Now().Add(2 * time.Second); c.PendingCreates() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d files made here still not sent after 2 s", c.PendingCreates())
		}
		time.Sleep(time.Millisecond)
	}
	held, made := c.Delegations()
	if made-made0 < n-10 || held != 1 {
		t.Errorf("%d of %d files made under a delegation (%d held), want all but the first few", made-made0, n, held)
	}
	time.Sleep(100 * time.Millisecond) // the kernel's RELEASEs come after close
	if got := c.ReleasesSent() - released; got > 10 {
		t.Errorf("%d releases sent, want only those of the files made before the delegation", got)
	}
	// At most one CreateMany per file made here (fewer when files wait
	// together; the kernel's check of a written file's
	// security.capability at its first write is answered here), a create,
	// a release and that check for each file made before the grant, the
	// grant.
	viaMeta := n - int(made-made0)
	if want := int(made-made0) + 3*viaMeta + 2; c.MetaCalls()-calls > uint64(want) {
		t.Errorf("%d meta calls for %d creates (%d before the grant), want at most %d", c.MetaCalls()-calls, n, viaMeta, want)
	}
	if got := c.LocalLookups() - local; got < n {
		t.Errorf("%d lookups answered without a call, want at least %d", got, n)
	}
	for i := range n {
		name := fmt.Sprint("f", i)
		if _, err := tc.Meta().Lookup(tc.Context(), &weftv1.LookupRequest{Parent: dir.Ino, Name: name}); err != nil {
			t.Fatalf("%s at the meta service: %v", name, err)
		}
	}
	checkDirAttrs(t, tc, d, "after the creates")
	for i := range n {
		if _, err := os.Stat(filepath.Join(d, fmt.Sprint("f", i))); err != nil {
			t.Fatal(err)
		}
	}
}

// twoMountsWithDir starts a cluster, mounts it twice with long cache
// timeouts (callbacks keep them right) and makes directory d through the
// first mount.
func twoMountsWithDir(t *testing.T) (a, b string, ca *client.Client) {
	t.Helper()
	return twoMountsWithDirConfig(t, client.Config{})
}

// twoMountsWithDirConfig is twoMountsWithDir with the first mount's client
// configured by cfg.
func twoMountsWithDirConfig(t *testing.T, cfg client.Config) (a, b string, ca *client.Client) {
	t.Helper()
	needFUSE(t)
	tc := startCluster(t, &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 1, Replicas: 1}, 1)
	long := Options{AttrTimeout: 10 * time.Minute, EntryTimeout: 10 * time.Minute}
	a, ca, _ = mountWithConfig(t, tc, long, cfg)
	b, _, _ = mountWith(t, tc, long)
	if err := os.Mkdir(filepath.Join(a, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	return a, b, ca
}

// TestDelegatedFileXattrs checks the extended attributes of files made
// under a delegation: none, answered without a meta call; one this mount
// sets reads back; one another mount sets (after the recall its lookup
// causes) is seen here.
func TestDelegatedFileXattrs(t *testing.T) {
	a, b, ca := twoMountsWithDir(t)
	for i := range 8 {
		f, err := os.Create(filepath.Join(a, "d", fmt.Sprint("f", i)))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if _, made := ca.Delegations(); made == 0 {
		t.Fatal("no file made under a delegation")
	}
	last := filepath.Join(a, "d", "f7")
	buf := make([]byte, 64)
	waitMetaQuiet(t, ca)
	calls := ca.MetaCalls()
	if _, err := unix.Getxattr(last, "security.capability", buf); err != unix.ENODATA {
		t.Fatalf("getxattr security.capability of a new file: %v, want ENODATA", err)
	}
	if got := ca.MetaCalls() - calls; got != 0 {
		t.Errorf("getxattr of a file made here made %d meta calls, want 0", got)
	}
	if err := unix.Setxattr(last, "security.weft-test", []byte("a"), 0); err != nil {
		t.Fatal(err)
	}
	if n, err := unix.Getxattr(last, "security.weft-test", buf); err != nil || string(buf[:n]) != "a" {
		t.Fatalf("getxattr after this mount set it: %q, %v", buf[:max(n, 0)], err)
	}
	other := filepath.Join(b, "d", "f6")
	if err := unix.Setxattr(other, "security.weft-test", []byte("b"), 0); err != nil {
		t.Fatal(err)
	}
	if n, err := unix.Getxattr(filepath.Join(a, "d", "f6"), "security.weft-test", buf); err != nil || string(buf[:n]) != "b" {
		t.Fatalf("getxattr of an attribute the other mount set: %q, %v", buf[:max(n, 0)], err)
	}
}

// waitMetaQuiet waits until c has sent the files it made under
// delegations and its background meta calls (delegation requests,
// batched releases) have stopped for 100 ms, so that a count of its meta
// calls around one operation counts that operation's only.
func waitMetaQuiet(t *testing.T, c *client.Client) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	last := c.MetaCalls()
	for quietSince := time.Now(); ; {
		time.Sleep(10 * time.Millisecond)
		if n := c.MetaCalls(); n != last || c.PendingCreates() != 0 {
			last, quietSince = n, time.Now()
		}
		if time.Since(quietSince) >= 100*time.Millisecond {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("meta calls still going on after 5 s (%d pending creates)", c.PendingCreates())
		}
	}
}

// TestDelegationAcrossMounts checks what another mount sees of files a
// mount made under a create delegation: all of them, as soon as it looks
// (its lookup recalls the delegation); its create of a name the holder
// made meanwhile fails with EEXIST; the holder's data; and a file the
// holder still has open keeps its data through the other mount's unlink.
func TestDelegationAcrossMounts(t *testing.T) {
	a, b, ca := twoMountsWithDir(t)
	pa := func(n string) string { return filepath.Join(a, "d", n) }
	pb := func(n string) string { return filepath.Join(b, "d", n) }
	create := func(name, data string) *os.File {
		t.Helper()
		f, err := os.OpenFile(pa(name), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if data != "" {
			if _, err := f.WriteString(data); err != nil {
				t.Fatal(err)
			}
		}
		return f
	}
	for i := range 10 {
		create(fmt.Sprint("f", i), fmt.Sprint("data ", i)).Close()
	}
	if held, _ := ca.Delegations(); held != 1 {
		t.Fatalf("A holds %d delegations after 10 creates, want 1", held)
	}
	// Made under the delegation and not closed: only A knows them.
	open := create("open", "kept open")
	quiet := create("quiet", "")
	defer open.Close()
	defer quiet.Close()

	names, err := os.ReadDir(filepath.Join(b, "d"))
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 12 {
		t.Fatalf("B lists %d names in d, want 12 (A's 10 closed files and 2 open)", len(names))
	}
	for i := range 10 {
		got, err := os.ReadFile(pb(fmt.Sprint("f", i)))
		if err != nil || string(got) != fmt.Sprint("data ", i) {
			t.Fatalf("B reads f%d: %q %v", i, got, err)
		}
	}
	if held, _ := ca.Delegations(); held != 0 {
		t.Errorf("A still holds %d delegations after B listed d", held)
	}

	// A takes d again after a few creates; B's exclusive create of a
	// name A made meanwhile fails.
	for i := range 5 {
		create(fmt.Sprint("g", i), "").Close()
	}
	create("clash", "").Close()
	if _, err := os.OpenFile(pb("clash"), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("B's exclusive create of a name A made: %v, want EEXIST", err)
	}

	// B unlinks a file A made under a delegation and still has open: A
	// reads and writes it on.
	if err := os.Remove(pb("open")); err != nil {
		t.Fatal(err)
	}
	if _, err := open.WriteAt([]byte(" and more"), 9); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, _ := open.ReadAt(buf, 0)
	if got := string(buf[:n]); got != "kept open and more" {
		t.Errorf("A's open file after B unlinked it reads %q", got)
	}
	// The unlink reaches A's kernel with the callback, within
	// milliseconds.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		_, err := os.Stat(pa("open"))
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("A still sees the unlinked name after 2 s: %v", err)
		}
	}
}

// TestCompleteDirAcrossMounts checks that a name another mount creates in
// a directory this mount knows completely is found within a bounded delay
// (the callback ends the completeness), and that open(O_CREAT) of such a
// name opens the existing file, while O_EXCL fails with EEXIST, whichever
// comes first: the callback or the open.
func TestCompleteDirAcrossMounts(t *testing.T) {
	a, b, ca := twoMountsWithDir(t)
	pa := func(n string) string { return filepath.Join(a, "d", n) }
	pb := func(n string) string { return filepath.Join(b, "d", n) }

	t.Run("seen", func(t *testing.T) {
		// A knows d completely: "x" is missing without a call.
		local := ca.LocalLookups()
		if _, err := os.Stat(pa("x0")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("stat x0 on A: %v", err)
		}
		if ca.LocalLookups() == local {
			t.Fatal("lookup of a missing name in a directory A made was sent to the meta service")
		}
		if err := os.WriteFile(pb("x"), []byte("from B"), 0o644); err != nil {
			t.Fatal(err)
		}
		eventually(t, "x created on B seen on A", func() error {
			_, err := os.Stat(pa("x"))
			return err
		})
	})

	for i := range 10 {
		t.Run(fmt.Sprint("open O_CREAT ", i), func(t *testing.T) {
			// A may learn of y through its callback before or after it
			// opens it: either way the existing file is opened.
			y, z := fmt.Sprint("y", i), fmt.Sprint("z", i)
			if err := os.WriteFile(pb(y), []byte("from B"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(pb(z), []byte("from B"), 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(pa(y), os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 16)
			n, _ := f.ReadAt(buf, 0)
			f.Close()
			if string(buf[:n]) != "from B" {
				t.Errorf("open(O_CREAT) of %s made on B read %q, want the existing file", y, buf[:n])
			}
			_, err = os.OpenFile(pa(z), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
			if !errors.Is(err, syscall.EEXIST) {
				t.Errorf("open(O_CREAT|O_EXCL) of %s made on B: %v, want EEXIST", z, err)
			}
			eventually(t, z+" seen on A", func() error {
				_, err := os.Stat(pa(z))
				return err
			})
		})
	}
}

// TestNamespaceChangesMetaCalls counts the meta calls of mkdir, symlink,
// link, unlink and rmdir in a directory this mount made: the answer of
// each carries the directory's new attributes, so the kernel's getattr of
// the directory that follows is answered without a call, and what it
// shows (link count, times) is what the meta service holds.
func TestNamespaceChangesMetaCalls(t *testing.T) {
	needFUSE(t)
	tc, d, c := mountFreshDir(t)
	f, err := os.Create(filepath.Join(d, "file"))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	const n = 20
	steps := []struct {
		name  string
		calls int // meta calls each may make
		do    func(i int) error
	}{
		{"mkdir", 1, func(i int) error { return os.Mkdir(filepath.Join(d, fmt.Sprint("d", i)), 0o755) }},
		{"symlink", 1, func(i int) error { return os.Symlink("file", filepath.Join(d, fmt.Sprint("s", i))) }},
		{"link", 1, func(i int) error { return os.Link(filepath.Join(d, "file"), filepath.Join(d, fmt.Sprint("l", i))) }},
		{"unlink", 1, func(i int) error { return os.Remove(filepath.Join(d, fmt.Sprint("s", i))) }},
		{"rmdir", 1, func(i int) error { return os.Remove(filepath.Join(d, fmt.Sprint("d", i))) }},
	}
	for _, st := range steps {
		calls := c.MetaCalls()
		for i := range n {
			if err := st.do(i); err != nil {
				t.Fatalf("%s %d: %v", st.name, i, err)
			}
			checkDirAttrs(t, tc, d, fmt.Sprintf("after %s %d", st.name, i))
		}
		if got := int(c.MetaCalls() - calls); got > st.calls*n+2 {
			t.Errorf("%d %ss made %d meta calls, want at most %d", n, st.name, got, st.calls*n+2)
		}
	}
}

// TestRenameMetaCalls: a rename answers with both directories' new
// attributes, so the kernel's getattrs of them that follow make no meta
// call, and what the kernel shows is what the meta service holds.
func TestRenameMetaCalls(t *testing.T) {
	needFUSE(t)
	tc := startCluster(t, &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 1, Replicas: 1}, 1)
	dir, c, _ := mountWith(t, tc, Options{})
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, d := range []string{a, b} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const n = 20
	for i := range n {
		f, err := os.Create(filepath.Join(a, fmt.Sprint("f", i)))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if _, err := os.Stat(filepath.Join(b, "warm")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat of a missing name: %v", err)
	}
	calls := c.MetaCalls()
	for i := range n {
		// Within a directory, then across.
		from := filepath.Join(a, fmt.Sprint("f", i))
		if err := os.Rename(from, from+".tmp"); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(from+".tmp", filepath.Join(b, fmt.Sprint("f", i))); err != nil {
			t.Fatal(err)
		}
		checkDirAttrs(t, tc, a, fmt.Sprint("after rename ", i))
		checkDirAttrs(t, tc, b, fmt.Sprint("after rename ", i))
	}
	if got := int(c.MetaCalls() - calls); got > 2*n+4 {
		t.Errorf("%d renames made %d meta calls, want at most %d", 2*n, got, 2*n+4)
	}
}

// TestDelegatedWritesOneMetaCall checks small files written under a
// delegation whose grant placed layouts: the data goes to the data
// servers before the meta service has the file, and the close stores
// the file and its length in one CreateMany (no CommitWrite), so a file
// created, written and closed costs at most one meta call. The files
// then read back whole after the page cache is dropped, with the length
// the meta service holds. Then the kernel forgets the directory (the
// mount no longer knows its names): the mount lists it again in the
// background, and the creates that follow are answered here again.
func TestDelegatedWritesOneMetaCall(t *testing.T) {
	needFUSE(t)
	tc, d, c := mountFreshDirConfig(t, slowSends)
	write := func(name string, data []byte) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(d, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	delegateDir(t, d, c)
	const n = 40
	data := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 10000+i) }
	calls, commits := c.MetaCalls(), c.CommitsSent()
	_, made0 := c.Delegations()
	for i := range n {
		write(fmt.Sprint("f", i), data(i))
	}
	// A create is sent without its length when the file is not closed
	// within milliseconds (a slow moment of the machine): allow a few.
	if got := c.CommitsSent() - commits; got > n/10 {
		t.Errorf("%d CommitWrite calls for %d files made, written and closed here, want (nearly) none: their lengths go with their creates", got, n)
	}
	_, made := c.Delegations()
	if made-made0 != n {
		t.Fatalf("%d of %d files made under the delegation", made-made0, n)
	}
	// One call each, and one spare (a background call such as a lease
	// renewal); without the layouts it took two each.
	if got := c.MetaCalls() - calls; got > n+1 {
		t.Errorf("%d meta calls for %d files created, written and closed, want at most one each", got, n)
	}
	var dir syscall.Stat_t
	if err := syscall.Stat(d, &dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		name := fmt.Sprint("f", i)
		a, err := tc.Meta().Lookup(tc.Context(), &weftv1.LookupRequest{Parent: dir.Ino, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		if a.Attr.Size != uint64(len(data(i))) {
			t.Errorf("%s: the meta service holds length %d, want %d", name, a.Attr.Size, len(data(i)))
		}
		got, err := os.ReadFile(filepath.Join(d, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data(i)) {
			t.Errorf("%s read back %d bytes, not the %d written", name, len(got), len(data(i)))
		}
	}

	// The kernel forgets the directory's inode; creates there go to the
	// meta service until the mount has listed it again.
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		t.Fatal(err)
	}
	_, made0 = c.Delegations()
	for i := range n {
		write(fmt.Sprint("g", i), data(i))
	}
	if _, made := c.Delegations(); made-made0 < n/2 {
		t.Errorf("after the kernel forgot the directory, %d of %d files made under a delegation, want most", made-made0, n)
	}
}

// TestDelegatedUnpackOneMetaCall unpacks files the way GNU tar does
// (create, write, set the times, owner and mode on the open file, close):
// under a delegation the three attribute changes are applied to the
// unsent create, so each file costs one meta call, and what the meta
// service then holds (and stat shows after the caches are dropped) is
// what was set.
func TestDelegatedUnpackOneMetaCall(t *testing.T) {
	needFUSE(t)
	tc, d, c := mountFreshDirConfig(t, slowSends)
	delegateDir(t, d, c)
	const n = 30
	stamp := time.Date(2020, 2, 3, 4, 5, 6, 0, time.UTC)
	calls, commits, local := c.MetaCalls(), c.CommitsSent(), c.LocalSetAttrs()
	for i := range n {
		p := filepath.Join(d, fmt.Sprint("f", i))
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(bytes.Repeat([]byte{byte(i)}, 3000+i)); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, stamp, stamp.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := f.Chown(0, 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Chmod(0o640); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.LocalSetAttrs() - local; got < 3*n-n/10*3 {
		t.Errorf("%d of %d attribute changes applied to unsent creates", got, 3*n)
	}
	if got := c.MetaCalls() - calls; got > n+n/10 {
		t.Errorf("%d meta calls for %d files unpacked, want about one each", got, n)
	}
	if got := c.CommitsSent() - commits; got > n/10 {
		t.Errorf("%d CommitWrite calls for %d files unpacked, want (nearly) none", got, n)
	}
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		t.Fatal(err)
	}
	var dir syscall.Stat_t
	if err := syscall.Stat(d, &dir); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		name := fmt.Sprint("f", i)
		got, err := tc.Meta().Lookup(tc.Context(), &weftv1.LookupRequest{Parent: dir.Ino, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		a := got.Attr
		wantMtime := stamp.Add(time.Duration(i) * time.Second).UnixNano()
		if a.Size != uint64(3000+i) || a.MtimeNs != wantMtime || a.Mode&0o7777 != 0o640 || a.Uid != 0 || a.Gid != 0 {
			t.Errorf("%s at the meta service: size %d mtime %d mode %#o owner %d:%d, want %d %d 0640 0:0",
				name, a.Size, a.MtimeNs, a.Mode&0o7777, a.Uid, a.Gid, 3000+i, wantMtime)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(d, name), &st); err != nil {
			t.Fatal(err)
		}
		if st.Size != int64(3000+i) || st.Mtim.Nano() != wantMtime || st.Mode&0o7777 != 0o640 {
			t.Errorf("%s shows size %d mtime %d mode %#o", name, st.Size, st.Mtim.Nano(), st.Mode&0o7777)
		}
		data, err := os.ReadFile(filepath.Join(d, name))
		if err != nil || !bytes.Equal(data, bytes.Repeat([]byte{byte(i)}, 3000+i)) {
			t.Errorf("%s reads back %d bytes (%v)", name, len(data), err)
		}
	}
}

// TestMkdirDelegates checks that a mount making files asks for the
// delegation of each directory it makes with the mkdir itself, so even the
// first files made there are made here (unpacking a tree of small
// directories), and that a mount only making directories does not.
func TestMkdirDelegates(t *testing.T) {
	needFUSE(t)
	_, d, c := mountFreshDir(t)
	// Only directories: no delegations.
	for i := range 5 {
		if err := os.Mkdir(filepath.Join(d, fmt.Sprint("empty", i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if held, _ := c.Delegations(); held != 0 {
		t.Fatalf("%d delegations held after mkdirs alone, want none", held)
	}
	// Files in d (three go to the meta service, then d is delegated),
	// then a tree of directories of two files each.
	for i := range 5 {
		if err := os.WriteFile(filepath.Join(d, fmt.Sprint("top", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	waitHeld(t, c, 1)
	const dirs = 10
	calls := c.MetaCalls()
	_, made0 := c.Delegations()
	sub := d
	for i := range dirs {
		sub = filepath.Join(sub, fmt.Sprint("sub", i))
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		for j := range 2 {
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprint("f", j)), []byte("data"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	held, made := c.Delegations()
	if made-made0 != 2*dirs || held != 1+dirs {
		t.Errorf("%d of %d files made here, %d directories held; want all, and %d held", made-made0, 2*dirs, held, 1+dirs)
	}
	// Per directory: the mkdir, and one CreateMany per file.
	if got, want := c.MetaCalls()-calls, uint64(3*dirs+1); got > want {
		t.Errorf("%d meta calls for %d directories of 2 files, want at most %d", got, dirs, want)
	}
}

// TestHeldCreateSendsDataFirst checks a file made under a delegation,
// written, and given its times while still open (its create then carries
// the length of bytes still buffered here): when another mount reads it
// before it is closed (the recall sends the create), it reads the bytes
// written, not zeros, and after the close the whole file.
func TestHeldCreateSendsDataFirst(t *testing.T) {
	a, b, ca := twoMountsWithDirConfig(t, slowSends)
	delegateDir(t, filepath.Join(a, "d"), ca)
	p := filepath.Join(a, "d", "held")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	first := bytes.Repeat([]byte("w"), 5000)
	if _, err := f.Write(first); err != nil {
		t.Fatal(err)
	}
	stamp := time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC)
	local := ca.LocalSetAttrs()
	if err := os.Chtimes(p, stamp, stamp); err != nil {
		t.Fatal(err)
	}
	if ca.LocalSetAttrs() != local+1 {
		t.Fatalf("the times were not set on the unsent create (%d local changes)", ca.LocalSetAttrs()-local)
	}
	got, err := os.ReadFile(filepath.Join(b, "d", "held"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, first) {
		t.Fatalf("the other mount reads %d bytes (%q...), want the %d written", len(got), got[:min(len(got), 8)], len(first))
	}
	more := bytes.Repeat([]byte("m"), 3000)
	if _, err := f.Write(more); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err = os.ReadFile(filepath.Join(b, "d", "held"))
	if err != nil {
		t.Fatal(err)
	}
	if want := append(first, more...); !bytes.Equal(got, want) {
		t.Fatalf("after the close the other mount reads %d bytes, want %d", len(got), len(want))
	}
}

// delegateDir makes 3 files in directory d through the mount of c, waits
// until c holds d's delegation, and then until c's background meta calls
// (the releases of those files) are over, so that they are not counted
// with what follows.
func delegateDir(t *testing.T, d string, c *client.Client) {
	t.Helper()
	for i := range 3 {
		if err := os.WriteFile(filepath.Join(d, fmt.Sprint("first", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	waitHeld(t, c, 1)
	waitMetaQuiet(t, c)
}

// waitHeld waits until c holds n delegations.
func waitHeld(t *testing.T, c *client.Client, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if held, _ := c.Delegations(); held == n {
			return
		}
		if time.Now().After(deadline) {
			held, _ := c.Delegations()
			t.Fatalf("%d delegations held after 5 s, want %d", held, n)
		}
	}
}
