package rpc

import (
	"bytes"
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	// The standard codec, used for every message without bulk data.
	_ "google.golang.org/grpc/encoding/proto"
)

// bulkMin is the size from which a message's bulk "data" field is sent
// and received without the extra copies of the standard codec.
const bulkMin = 32 << 10

// codec is the standard protobuf codec, except for messages with a
// top-level bytes field named "data" (chunk reads and writes) when that
// field is large: marshaling sends the field's bytes as they are, after
// the other fields (no copy into a marshal buffer), and unmarshaling
// gathers the received frames into one buffer and points the field into
// it (no second copy by proto.Unmarshal). The wire format is plain
// protobuf either way, so peers with the standard codec understand it.
//
// A marshaled message references the caller's data slice until gRPC has
// sent it; callers must not change the bytes of a message in flight
// (weft never does: write buffers are not touched once handed to a send).
type codec struct {
	std encoding.CodecV2
}

func newCodec() *codec { return &codec{std: encoding.GetCodecV2("proto")} }

// Name is "proto": the codec replaces the standard one for weft's calls.
func (c *codec) Name() string { return "proto" }

// dataField returns the descriptor of m's top-level bytes field "data", or
// nil.
func dataField(m protoreflect.Message) protoreflect.FieldDescriptor {
	fd := m.Descriptor().Fields().ByName("data")
	if fd == nil || fd.Kind() != protoreflect.BytesKind || fd.Cardinality() == protoreflect.Repeated {
		return nil
	}
	return fd
}

// Marshal implements encoding.CodecV2.
func (c *codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return c.std.Marshal(v)
	}
	r := m.ProtoReflect()
	fd := dataField(r)
	if fd == nil {
		return c.std.Marshal(v)
	}
	data := r.Get(fd).Bytes()
	if len(data) < bulkMin {
		return c.std.Marshal(v)
	}
	// Marshal the other fields, then append the data field by hand.
	r.Clear(fd)
	head, err := proto.Marshal(m)
	r.Set(fd, protoreflect.ValueOfBytes(data))
	if err != nil {
		return nil, fmt.Errorf("marshal %s: %w", r.Descriptor().FullName(), err)
	}
	head = protowire.AppendTag(head, fd.Number(), protowire.BytesType)
	head = protowire.AppendVarint(head, uint64(len(data)))
	return mem.BufferSlice{mem.SliceBuffer(head), mem.SliceBuffer(data)}, nil
}

// Unmarshal implements encoding.CodecV2.
func (c *codec) Unmarshal(buffers mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok || buffers.Len() < bulkMin {
		return c.std.Unmarshal(buffers, v)
	}
	r := m.ProtoReflect()
	fd := dataField(r)
	if fd == nil {
		return c.std.Unmarshal(buffers, v)
	}
	// One copy into a buffer of our own; the data field points into it.
	// bytes.Join does not zero the buffer first (mem.Materialize does).
	parts := make([][]byte, len(buffers))
	for i, b := range buffers {
		parts[i] = b.ReadOnlyData()
	}
	buf := bytes.Join(parts, nil)
	var rest []byte
	var data []byte
	found := false
	for b := buf; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("unmarshal %s: %w", r.Descriptor().FullName(), protowire.ParseError(n))
		}
		if num == fd.Number() && typ == protowire.BytesType {
			val, m := protowire.ConsumeBytes(b[n:])
			if m < 0 {
				return fmt.Errorf("unmarshal %s: %w", r.Descriptor().FullName(), protowire.ParseError(m))
			}
			data, found = val, true
			b = b[n+m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return fmt.Errorf("unmarshal %s: %w", r.Descriptor().FullName(), protowire.ParseError(m))
		}
		rest = append(rest, b[:n+m]...)
		b = b[n+m:]
	}
	if err := proto.Unmarshal(rest, m); err != nil {
		return fmt.Errorf("unmarshal %s: %w", r.Descriptor().FullName(), err)
	}
	if found {
		r.Set(fd, protoreflect.ValueOfBytes(data))
	}
	return nil
}
