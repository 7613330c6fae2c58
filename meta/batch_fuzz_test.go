package meta

import (
	"context"
	"testing"

	"google.golang.org/protobuf/proto"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// FuzzBatchCalls hands a real meta service (the embedded engine, no data
// servers, a directory and a symlink in it) batches of whatever a client may send: a
// method name and request bytes, alone and twice in one batch. Every
// call must be answered (a reply or an error status), never panic, and
// the namespace must stay whole: fsck finds nothing afterwards.
func FuzzBatchCalls(f *testing.F) {
	enc := func(m proto.Message) []byte { b, _ := proto.Marshal(m); return b }
	seeds := []struct {
		method string
		req    proto.Message
	}{
		{"Lookup", &weftv1.LookupRequest{Caller: root, Parent: rootIno, Name: "d"}},
		{"GetAttr", &weftv1.GetAttrRequest{Ino: rootIno}},
		{"SetAttr", &weftv1.SetAttrRequest{Caller: root, Ino: rootIno, Valid: 1, Mode: 0o700}},
		{"Create", &weftv1.CreateRequest{Caller: root, Parent: rootIno, Name: "new", Mode: 0o644}},
		{"Mkdir", &weftv1.MkdirRequest{Caller: root, Parent: rootIno, Name: "nd", Mode: 0o755}},
		{"Unlink", &weftv1.RemoveRequest{Caller: root, Parent: rootIno, Name: "f"}},
		{"Rmdir", &weftv1.RemoveRequest{Caller: root, Parent: rootIno, Name: "d"}},
		{"Rename", &weftv1.RenameRequest{Caller: root, OldParent: rootIno, OldName: "f", NewParent: rootIno, NewName: "g"}},
		{"Link", &weftv1.LinkRequest{Caller: root, Ino: 2, NewParent: rootIno, NewName: "h"}},
		{"Symlink", &weftv1.SymlinkRequest{Caller: root, Parent: rootIno, Name: "s", Target: "f"}},
		{"Readlink", &weftv1.ReadlinkRequest{Ino: 2}},
		{"Open", &weftv1.OpenRequest{Caller: root, Ino: 2, Flags: 2}},
		{"Release", &weftv1.ReleaseRequest{Ino: 2, MoreInos: []uint64{3, 4}}},
		{"Access", &weftv1.AccessRequest{Caller: root, Ino: rootIno, Mask: 7}},
		{"CommitWrite", &weftv1.CommitWriteRequest{Caller: root, Ino: 2, Size: 1 << 40}},
		{"GetXattr", &weftv1.GetXattrRequest{Caller: root, Ino: rootIno, Name: "user.a"}},
		{"SetXattr", &weftv1.SetXattrRequest{Caller: root, Ino: rootIno, Name: "user.a", Value: []byte("v")}},
		{"ListXattr", &weftv1.ListXattrRequest{Caller: root, Ino: rootIno}},
		{"RemoveXattr", &weftv1.RemoveXattrRequest{Caller: root, Ino: rootIno, Name: "user.a"}},
		{"CreateMany", &weftv1.CreateManyRequest{Files: []*weftv1.NewFile{{Caller: root, Parent: rootIno, Name: "m", Ino: 99}}}},
		{"Delegate", &weftv1.DelegateRequest{Caller: root, Dir: rootIno}},
		{"Fsck", &weftv1.FsckRequest{Repair: true}},
	}
	for _, s := range seeds {
		f.Add(s.method, enc(s.req))
	}
	f.Add("Create", []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add("", []byte(nil))
	f.Fuzz(func(t *testing.T, method string, req []byte) {
		ctx := context.Background()
		s, _ := fuzzService(t)
		call := &weftv1.BatchCall{Method: method, Request: req}
		for _, calls := range [][]*weftv1.BatchCall{{call}, {call, call}} {
			resp, err := s.Batch(ctx, &weftv1.BatchRequest{Calls: calls})
			if err != nil {
				continue // refused as a whole: fine
			}
			if len(resp.Replies) != len(calls) {
				t.Fatalf("%d calls got %d replies", len(calls), len(resp.Replies))
			}
			for i, r := range resp.Replies {
				if r == nil {
					t.Fatalf("call %d of %q got no reply", i, method)
				}
			}
		}
		r, err := s.Fsck(ctx, &weftv1.FsckRequest{})
		if err != nil {
			t.Fatalf("fsck after a batch of %q: %v", method, err)
		}
		if len(r.Problems) > 0 {
			t.Fatalf("fsck after a batch of %q %x:%s", method, req, describeProblems(r))
		}
	})
}
