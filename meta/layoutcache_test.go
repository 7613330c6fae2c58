package meta

import (
	"testing"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// New files get their directory's effective layout also when it comes
// from the cache: after a default layout is set above, after their
// directory moves under another default, and back.
func TestLayoutCacheFollowsChanges(t *testing.T) {
	e := newEnv(t)
	setStripes := func(dir uint64, n uint32) {
		t.Helper()
		if _, err := e.s.SetLayout(e.ctx, &weftv1.SetLayoutRequest{Caller: root, Ino: dir, Layout: &weftv1.Layout{StripeCount: n}}); err != nil {
			t.Fatal(err)
		}
	}
	a := e.mkdir(root, rootIno, "a", 0o755)
	sub := e.mkdir(root, a.Ino, "sub", 0o755)
	b := e.mkdir(root, rootIno, "b", 0o755)
	setStripes(b.Ino, 3)
	var n uint64
	stripesOfNew := func(dir uint64) uint32 {
		t.Helper()
		n++
		return e.create(root, dir, "f"+itoa(n), 0o644).Layout.StripeCount
	}
	steps := []struct {
		name   string
		change func()
		dir    uint64
		want   uint32
	}{
		{"the default, cached", nil, sub.Ino, 4},
		{"still the default from the cache", nil, sub.Ino, 4},
		{"a layout set on the parent", func() { setStripes(a.Ino, 2) }, sub.Ino, 2},
		{"the directory moved under b", func() {
			if err := e.rename(root, a.Ino, "sub", b.Ino, "sub", 0); err != nil {
				t.Fatal(err)
			}
		}, sub.Ino, 3},
		{"b's own files", nil, b.Ino, 3},
		{"moved back under a", func() {
			if err := e.rename(root, b.Ino, "sub", a.Ino, "sub", 0); err != nil {
				t.Fatal(err)
			}
		}, sub.Ino, 2},
		{"a's layout changed again", func() { setStripes(a.Ino, 1) }, sub.Ino, 1},
	}
	for _, st := range steps {
		if st.change != nil {
			st.change()
		}
		if got := stripesOfNew(st.dir); got != st.want {
			t.Fatalf("%s: new file striped over %d chains, want %d", st.name, got, st.want)
		}
	}
}
