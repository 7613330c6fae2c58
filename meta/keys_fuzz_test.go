package meta

import (
	"context"
	"testing"
	"time"

	"github.com/weft-fs/weft/cluster"
	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// schemaPrefixes are the prefixes of the key schema (keys.go) a damaged
// record is put under.
var schemaPrefixes = [][]byte{
	prefixInode, prefixSymlink, prefixParent, prefixDentry, prefixXattr, prefixLayout,
	prefixSession, prefixOpen, prefixSessOpn, prefixOrphan, prefixGC, prefixDead,
	[]byte("n/cnt/s/"), []byte("n/lk/"), []byte("n/lks/"), []byte("n/rq/"), keyNextIno,
	keyCountFiles, keyCountDirs, keyLayoutGen,
}

// damagedRecords turns fuzz input into records: each is a prefix byte, a
// key length byte, the key's rest, a value length byte and the value.
func damagedRecords(b []byte) (keys, values [][]byte) {
	for len(b) >= 3 && len(keys) < 32 {
		p := schemaPrefixes[int(b[0])%len(schemaPrefixes)]
		kl := min(int(b[1]), len(b)-2)
		k := append(append([]byte(nil), p...), b[2:2+kl]...)
		b = b[2+kl:]
		if len(b) == 0 {
			break
		}
		vl := min(int(b[0]), len(b)-1)
		keys, values = append(keys, k), append(values, append([]byte(nil), b[1:1+vl]...))
		b = b[1+vl:]
	}
	return keys, values
}

// FuzzNamespaceRecords writes damaged records under every prefix of the
// key schema of a real namespace (the embedded engine, a few files and
// directories) and runs fsck, checking and repairing, and listings: each
// answers (findings or an error), never panics.
func FuzzNamespaceRecords(f *testing.F) {
	f.Add([]byte{0, 8, 0, 0, 0, 0, 0, 0, 0, 2, 3, 1, 2, 3})          // an inode that does not decode
	f.Add([]byte{3, 10, 0, 0, 0, 0, 0, 0, 0, 1, '/', 'x', 12, 0, 0}) // an entry with a short value
	f.Add([]byte{3, 3, 0, 0, 1, 0})                                  // an entry key without its slash
	f.Add([]byte{0, 2, 1, 2, 0})                                     // an inode key too short
	f.Add([]byte{7, 1, 9, 0, 10, 0, 0})                              // an open key too short
	f.Add([]byte{14, 5, 'f', 0, 1, 2, 3, 4, 1, 2, 3, 4})             // a counter shard of the wrong size
	f.Add([]byte{15, 20, 0, 0, 0, 0, 0, 0, 0, 1, '/', 'p', '/', 's', '/', 0, 0, 0, 0, 0, 3, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, values := damagedRecords(b)
		if len(keys) == 0 {
			return
		}
		ctx := context.Background()
		s, dir := fuzzService(t)
		err := s.eng.Update(ctx, func(x kv.Txn) error {
			for i, k := range keys {
				if err := x.Set(k, values[i]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, repair := range []bool{false, true} {
			// Findings, or an error naming the record (a corrupt counter
			// stops it): both fine.
			s.Fsck(ctx, &weftv1.FsckRequest{Repair: repair})
		}
		s.ReadDir(ctx, &weftv1.ReadDirRequest{Caller: root, Ino: rootIno})
		s.ReadDir(ctx, &weftv1.ReadDirRequest{Caller: root, Ino: dir})
	})
}

// fuzzService opens a meta service of its own for one fuzz input (the
// embedded engine, no data servers) with a directory "d" holding a
// symlink "f", and returns it with the directory's inode number.
func fuzzService(t *testing.T) (*Service, uint64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := Open(ctx, Config{
		Dir:     t.TempDir(),
		Cluster: cluster.Config{Logger: quietLogger(), HeartbeatInterval: time.Second, FailureTimeout: 3 * time.Second},
		Logger:  quietLogger(), SessionLease: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	d, err := s.Mkdir(ctx, &weftv1.MkdirRequest{Caller: root, Parent: rootIno, Name: "d", Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Symlink(ctx, &weftv1.SymlinkRequest{Caller: root, Parent: d.Attr.Ino, Name: "f", Target: "t"}); err != nil {
		t.Fatal(err)
	}
	return s, d.Attr.Ino
}
