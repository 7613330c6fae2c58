package weftv1

import (
	"fmt"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// MetaCall is how weft treats the calls of one Meta method: the method's
// Call option (options.proto) with the fields it names resolved. It is
// the one table of per-method behaviour; the client and the meta service
// consult it instead of lists of their own.
type MetaCall struct {
	*Call
	// Name is the method's short name ("Lookup"), FullName its gRPC name
	// ("/weft.v1.Meta/Lookup"); both empty for an unknown method.
	Name, FullName string
	// Reply is the method's response type.
	Reply protoreflect.MessageType

	dirs, interest, replyInterest []fieldPath
	entries                       [][2]protoreflect.FieldDescriptor
}

// Entry is a directory entry a request names: parent directory and name.
type Entry struct {
	Parent uint64
	Name   string
}

// unknownCall is what MetaCallOf returns for a name that is no Meta
// method: nothing special about it.
var unknownCall = &MetaCall{Call: &Call{}}

// metaCalls holds every Meta method's MetaCall by short and by full name,
// read from the service descriptor on first use.
var metaCalls = sync.OnceValue(func() map[string]*MetaCall {
	sd := File_proto_weft_v1_meta_proto.Services().ByName("Meta")
	out := make(map[string]*MetaCall, 2*sd.Methods().Len())
	for i := range sd.Methods().Len() {
		c, err := newMetaCall(sd.Methods().Get(i))
		if err != nil {
			panic(err) // a mistake in meta.proto, caught by the tests
		}
		out[c.Name], out[c.FullName] = c, c
	}
	return out
})

// MetaCallOf returns the behaviour of the Meta method named by its short
// ("Lookup") or full ("/weft.v1.Meta/Lookup") name; for a name that is no
// Meta method, one with every flag off and an empty Name.
func MetaCallOf(method string) *MetaCall {
	if c := metaCalls()[method]; c != nil {
		return c
	}
	return unknownCall
}

// MetaCalls lists the behaviour of every Meta method.
func MetaCalls() []*MetaCall {
	var out []*MetaCall
	for name, c := range metaCalls() {
		if name == c.Name {
			out = append(out, c)
		}
	}
	return out
}

// newMetaCall reads the Call option of md and resolves the fields it
// names.
func newMetaCall(md protoreflect.MethodDescriptor) (*MetaCall, error) {
	call, _ := proto.GetExtension(md.Options(), E_Call).(*Call)
	if call == nil {
		call = &Call{}
	}
	reply, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		return nil, fmt.Errorf("meta method %s: reply type: %w", md.Name(), err)
	}
	c := &MetaCall{Call: call, Name: string(md.Name()), FullName: "/" + string(md.Parent().FullName()) + "/" + string(md.Name()), Reply: reply}
	resolve := func(msg protoreflect.MessageDescriptor, paths []string) ([]fieldPath, error) {
		var out []fieldPath
		for _, p := range paths {
			fp, err := resolvePath(msg, p)
			if err != nil {
				return nil, fmt.Errorf("meta method %s: %w", md.Name(), err)
			}
			out = append(out, fp)
		}
		return out, nil
	}
	if c.dirs, err = resolve(md.Input(), call.Dirs); err != nil {
		return nil, err
	}
	if c.interest, err = resolve(md.Input(), call.Interest); err != nil {
		return nil, err
	}
	if c.replyInterest, err = resolve(md.Output(), call.ReplyInterest); err != nil {
		return nil, err
	}
	for _, e := range call.Entries {
		parent, name, ok := strings.Cut(e, ",")
		fields := md.Input().Fields()
		pf, nf := fields.ByName(protoreflect.Name(parent)), fields.ByName(protoreflect.Name(name))
		if !ok || pf == nil || nf == nil || pf.Kind() != protoreflect.Uint64Kind || nf.Kind() != protoreflect.StringKind ||
			pf.IsList() || nf.IsList() {
			return nil, fmt.Errorf("meta method %s: entry %q is not \"parent,name\" of a uint64 and a string field of %s",
				md.Name(), e, md.Input().Name())
		}
		c.entries = append(c.entries, [2]protoreflect.FieldDescriptor{pf, nf})
	}
	return c, nil
}

// fieldPath is a resolved path of fields from a message to a uint64.
type fieldPath []protoreflect.FieldDescriptor

// resolvePath resolves a dotted path of field names in msg; every field
// but the last is a message (or a list of them), the last a uint64 (or a
// list of them).
func resolvePath(msg protoreflect.MessageDescriptor, path string) (fieldPath, error) {
	var fp fieldPath
	names := strings.Split(path, ".")
	for i, n := range names {
		f := msg.Fields().ByName(protoreflect.Name(n))
		if f == nil {
			return nil, fmt.Errorf("field path %q: %s has no field %q", path, msg.Name(), n)
		}
		fp = append(fp, f)
		if i == len(names)-1 {
			if f.Kind() != protoreflect.Uint64Kind {
				return nil, fmt.Errorf("field path %q: %s is not a uint64", path, n)
			}
			break
		}
		if f.Message() == nil || f.IsMap() {
			return nil, fmt.Errorf("field path %q: %s is not a message", path, n)
		}
		msg = f.Message()
	}
	return fp, nil
}

// appendValues appends the non-zero values p reaches from m.
func (p fieldPath) appendValues(out []uint64, m protoreflect.Message) []uint64 {
	f := p[0]
	switch {
	case len(p) == 1 && f.IsList():
		l := m.Get(f).List()
		for i := range l.Len() {
			if v := l.Get(i).Uint(); v != 0 {
				out = append(out, v)
			}
		}
	case len(p) == 1:
		if v := m.Get(f).Uint(); v != 0 {
			out = append(out, v)
		}
	case f.IsList():
		l := m.Get(f).List()
		for i := range l.Len() {
			out = p[1:].appendValues(out, l.Get(i).Message())
		}
	case m.Has(f):
		out = p[1:].appendValues(out, m.Get(f).Message())
	}
	return out
}

// values returns what the paths reach from msg, without repeats of the
// value just before (many files of a batch share a parent).
func values(paths []fieldPath, msg proto.Message) []uint64 {
	if len(paths) == 0 || msg == nil {
		return nil
	}
	m := msg.ProtoReflect()
	if !m.IsValid() {
		return nil
	}
	var out []uint64
	for _, p := range paths {
		out = p.appendValues(out, m)
	}
	n := 0
	for i, v := range out {
		if i == 0 || v != out[n-1] {
			out[n] = v
			n++
		}
	}
	return out[:n]
}

// Dirs lists the directories the request reads or changes (Call.dirs).
func (c *MetaCall) Dirs(req proto.Message) []uint64 { return values(c.dirs, req) }

// Interest lists the inodes whose state the reply to req lets the
// session cache, known before the call runs (Call.interest).
func (c *MetaCall) Interest(req proto.Message) []uint64 { return values(c.interest, req) }

// ReplyInterest lists the further inodes the reply lets the session cache
// (Call.reply_interest).
func (c *MetaCall) ReplyInterest(reply proto.Message) []uint64 {
	return values(c.replyInterest, reply)
}

// Entries lists the entries the request names whose directories, if
// delegated, it waits for too (Call.entries).
func (c *MetaCall) Entries(req proto.Message) []Entry {
	if len(c.entries) == 0 || req == nil {
		return nil
	}
	m := req.ProtoReflect()
	out := make([]Entry, 0, len(c.entries))
	for _, e := range c.entries {
		out = append(out, Entry{Parent: m.Get(e[0]).Uint(), Name: m.Get(e[1]).String()})
	}
	return out
}
