package meta

import (
	"context"
	"fmt"
	"syscall"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/internal/etcdtest"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestReadDirPlusEtcd fills a directory with a few hundred files,
// directories and symlinks of different owners and modes on pebble and on
// etcd, and checks that readdirplus (whose inodes etcd reads together, 100
// per round trip) returns on both engines the same listing, whole or in
// pages, with every attribute as GetAttr returns it, and refuses a caller
// without read permission alike.
func TestReadDirPlusEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	const n = 300
	engines := []struct {
		name string
		s    *Service
	}{
		{"pebble", openService(t, nil, startChunkServer(t))},
		{"etcd", openService(t, openEtcd(t, srv, "/readdirplus/"), startChunkServer(t))},
	}
	listings := make([][]string, len(engines))
	for ei, eng := range engines {
		s := eng.s
		d, err := s.Mkdir(ctx, &weftv1.MkdirRequest{Caller: root, Parent: rootIno, Name: "d", Mode: 0o770})
		if err != nil {
			t.Fatal(err)
		}
		dir := d.Attr.Ino
		// alice's; bob may add entries too: he is in her group.
		valid := uint32(weftv1.SetAttrValid_SETATTR_UID | weftv1.SetAttrValid_SETATTR_GID)
		if _, err := s.SetAttr(ctx, &weftv1.SetAttrRequest{Caller: root, Ino: dir, Valid: valid, Uid: 1000, Gid: 1000}); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			name := fmt.Sprintf("e%03d", i)
			c := []*weftv1.Caller{alice, bob}[i%2]
			switch i % 5 {
			case 0, 1, 2:
				_, err = s.Create(ctx, &weftv1.CreateRequest{Caller: c, Parent: dir, Name: name, Mode: 0o600 + uint32(i%3)*0o40, Exclusive: true})
			case 3:
				_, err = s.Mkdir(ctx, &weftv1.MkdirRequest{Caller: c, Parent: dir, Name: name, Mode: 0o700 + uint32(i%4)*0o5})
			case 4:
				_, err = s.Symlink(ctx, &weftv1.SymlinkRequest{Caller: c, Parent: dir, Name: name, Target: "target-" + name})
			}
			if err != nil {
				t.Fatalf("%s: make %s: %v", eng.name, name, err)
			}
		}
		whole, err := s.ReadDir(ctx, &weftv1.ReadDirRequest{Caller: alice, Ino: dir, Plus: true, Limit: 10000})
		if err != nil {
			t.Fatalf("%s: readdirplus: %v", eng.name, err)
		}
		if len(whole.Entries) != n || whole.More {
			t.Fatalf("%s: readdirplus returned %d entries (more %v), want %d", eng.name, len(whole.Entries), whole.More, n)
		}
		var paged []*weftv1.DirEntry
		for after := ""; ; {
			r, err := s.ReadDir(ctx, &weftv1.ReadDirRequest{Caller: bob, Ino: dir, Plus: true, StartAfter: after, Limit: 64})
			if err != nil {
				t.Fatalf("%s: readdirplus page after %q: %v", eng.name, after, err)
			}
			paged = append(paged, r.Entries...)
			if !r.More {
				break
			}
			after = r.Entries[len(r.Entries)-1].Name
		}
		if len(paged) != n {
			t.Fatalf("%s: pages of 64 returned %d entries, want %d", eng.name, len(paged), n)
		}
		for i, e := range whole.Entries {
			a, err := s.GetAttr(ctx, &weftv1.GetAttrRequest{Ino: e.Ino})
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(e.Attr, a.Attr) {
				t.Errorf("%s: readdirplus attributes of %s = %v, getattr says %v", eng.name, e.Name, e.Attr, a.Attr)
			}
			if !proto.Equal(e, paged[i]) {
				t.Errorf("%s: entry %d whole = %v, paged = %v", eng.name, i, e, paged[i])
			}
			listings[ei] = append(listings[ei], fmt.Sprintf("%s type=%v mode=%o uid=%d gid=%d nlink=%d size=%d",
				e.Name, e.Type, e.Attr.Mode, e.Attr.Uid, e.Attr.Gid, e.Attr.Nlink, e.Attr.Size))
		}
		stranger := &weftv1.Caller{Uid: 2000, Gid: 2000}
		if _, err := s.ReadDir(ctx, &weftv1.ReadDirRequest{Caller: stranger, Ino: dir, Plus: true}); err == nil || errnoOf(t, err) != syscall.EACCES {
			t.Errorf("%s: readdirplus by a stranger of a 0770 directory: %v, want EACCES", eng.name, err)
		}
	}
	for i := range listings[0] {
		if listings[0][i] != listings[1][i] {
			t.Errorf("entry %d: pebble %s, etcd %s", i, listings[0][i], listings[1][i])
		}
	}
}
