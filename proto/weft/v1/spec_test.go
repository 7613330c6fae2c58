package weftv1

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// TestEveryMetaMethodDeclaresItsCall fails when a method of the Meta
// service has no (weft.v1.call) option, names fields that do not exist,
// or declares flags that contradict each other: adding a method means
// declaring its behaviour in meta.proto.
func TestEveryMetaMethodDeclaresItsCall(t *testing.T) {
	sd := File_proto_weft_v1_meta_proto.Services().ByName("Meta")
	if sd == nil || sd.Methods().Len() == 0 {
		t.Fatal("no Meta service in meta.proto")
	}
	for i := range sd.Methods().Len() {
		md := sd.Methods().Get(i)
		if !proto.HasExtension(md.Options(), E_Call) {
			t.Errorf("Meta method %s has no (weft.v1.call) option: declare its behaviour in meta.proto", md.Name())
			continue
		}
		c, err := newMetaCall(md)
		if err != nil {
			t.Error(err)
			continue
		}
		streaming := md.IsStreamingClient() || md.IsStreamingServer()
		for _, bad := range []struct {
			when bool
			why  string
		}{
			{c.Batch && streaming, "a stream cannot go in a batch"},
			{(c.Urgent || c.Quick) && !c.Batch, "urgent and quick are for batched calls"},
			{c.ManagerOnly && c.Batch, "a call the manager serves is not a namespace call"},
			{c.Quick && c.Changes, "a quick call only reads"},
			{c.Retry == Retry_RETRY_REQUEST_ID && !c.Batch, "request ids travel in batches"},
		} {
			if bad.when {
				t.Errorf("Meta method %s: %s", md.Name(), bad.why)
			}
		}
		if got := MetaCallOf(c.FullName); got.Name != c.Name || MetaCallOf(c.Name) != got {
			t.Errorf("MetaCallOf(%s) = %q, want the method by both names", c.FullName, got.Name)
		}
	}
	if len(MetaCalls()) != sd.Methods().Len() {
		t.Errorf("MetaCalls lists %d methods, the service has %d", len(MetaCalls()), sd.Methods().Len())
	}
}

// TestMetaCallFields checks what the declared field paths reach.
func TestMetaCallFields(t *testing.T) {
	attr := func(ino uint64) *Attr { return &Attr{Ino: ino} }
	for _, tc := range []struct {
		name   string
		method string
		msg    proto.Message
		get    func(*MetaCall, proto.Message) []uint64
		want   []uint64
	}{
		{"lookup dirs", "Lookup", &LookupRequest{Parent: 7, Name: "a"}, (*MetaCall).Dirs, []uint64{7}},
		{"link interest", "Link", &LinkRequest{Ino: 9, NewParent: 7}, (*MetaCall).Interest, []uint64{9, 7}},
		{"rename dirs", "Rename", &RenameRequest{OldParent: 3, NewParent: 4}, (*MetaCall).Dirs, []uint64{3, 4}},
		{"rename in one dir", "/weft.v1.Meta/Rename", &RenameRequest{OldParent: 3, NewParent: 3}, (*MetaCall).Dirs, []uint64{3}},
		{"create many parents", "CreateMany", &CreateManyRequest{Files: []*NewFile{{Parent: 5}, {Parent: 5}, {Parent: 6}}},
			(*MetaCall).Dirs, []uint64{5, 6}},
		{"attr reply", "GetAttr", &AttrResponse{Attr: attr(11)}, (*MetaCall).ReplyInterest, []uint64{11}},
		{"attr reply without attr", "GetAttr", &AttrResponse{}, (*MetaCall).ReplyInterest, nil},
		{"nil reply", "GetAttr", (*AttrResponse)(nil), (*MetaCall).ReplyInterest, nil},
		{"readdir entries with attributes", "ReadDir",
			&ReadDirResponse{Entries: []*DirEntry{{Ino: 2, Attr: attr(2)}, {Ino: 3}, {Ino: 4, Attr: attr(4)}}},
			(*MetaCall).ReplyInterest, []uint64{2, 4}},
		{"create many results", "CreateMany", &CreateManyResponse{Results: []*NewFileResult{{Attr: attr(8)}, {Errno: 17}}},
			(*MetaCall).ReplyInterest, []uint64{8}},
		{"delegate without dir", "Delegate", &DelegateResponse{}, (*MetaCall).ReplyInterest, nil},
		{"unlink interest", "Unlink", &RemoveRequest{Parent: 3, Name: "x"}, (*MetaCall).Interest, nil},
		{"unknown method", "NoSuchMethod", &LookupRequest{Parent: 7}, (*MetaCall).Dirs, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.get(MetaCallOf(tc.method), tc.msg); !slices.Equal(got, tc.want) {
				t.Errorf("%s: got %v, want %v", tc.method, got, tc.want)
			}
		})
	}
	got := MetaCallOf("Rename").Entries(&RenameRequest{OldParent: 3, OldName: "a", NewParent: 4, NewName: "b"})
	if want := []Entry{{Parent: 4, Name: "b"}}; !slices.Equal(got, want) {
		t.Errorf("rename entries: got %v, want %v", got, want)
	}
	if c := MetaCallOf("NoSuchMethod"); c.Name != "" || c.Batch || c.Retry != Retry_RETRY_NONE {
		t.Errorf("an unknown method has behaviour: %+v", c)
	}
	if MetaCallOf("Lookup").Reply.Descriptor().FullName() != protoreflect.FullName("weft.v1.AttrResponse") {
		t.Error("Lookup's reply type is not AttrResponse")
	}
}

// TestResolvePathRefusesMistakes checks that a path to a missing field or
// a field of the wrong kind is refused.
func TestResolvePathRefusesMistakes(t *testing.T) {
	msg := (&CreateManyRequest{}).ProtoReflect().Descriptor()
	for _, p := range []string{"nope", "session", "files", "files.name", "files.parent.x", "files.ino.x"} {
		if _, err := resolvePath(msg, p); err == nil {
			t.Errorf("path %q resolved", p)
		}
	}
	for _, p := range []string{"files.parent", "files.ino"} {
		if _, err := resolvePath(msg, p); err != nil {
			t.Errorf("path %q: %v", p, err)
		}
	}
}
