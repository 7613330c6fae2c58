package rpc

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func TestCodecRoundTrip(t *testing.T) {
	big := bytes.Repeat([]byte("weft"), 100<<10)
	tests := []struct {
		name string
		msg  proto.Message
		out  proto.Message
	}{
		{"bulk write", &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Ino: 7, Index: 3}, ChainId: 2, ChainVersion: 9,
			Offset: 4096, Data: big, Sync: true, ChunkSize: 1 << 20}, &weftv1.WriteChunkRequest{}},
		{"small write", &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Ino: 7}, Data: []byte("x")}, &weftv1.WriteChunkRequest{}},
		{"bulk read", &weftv1.ReadChunkResponse{Data: big}, &weftv1.ReadChunkResponse{}},
		{"empty read", &weftv1.ReadChunkResponse{}, &weftv1.ReadChunkResponse{}},
		{"no data field", &weftv1.ChunkID{Ino: 1, Index: 2}, &weftv1.ChunkID{}},
	}
	c := newCodec()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs, err := c.Marshal(tt.msg)
			if err != nil {
				t.Fatal(err)
			}
			// The standard decoder must understand the lean encoding.
			std := tt.out.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(bs.Materialize(), std); err != nil {
				t.Fatalf("standard unmarshal: %v", err)
			}
			if !proto.Equal(std, tt.msg) {
				t.Fatalf("standard unmarshal got a different message")
			}
			// Split into frames as gRPC hands them over.
			flat := bs.Materialize()
			var frames mem.BufferSlice
			for len(flat) > 0 {
				n := min(len(flat), 16<<10)
				frames = append(frames, mem.SliceBuffer(flat[:n]))
				flat = flat[n:]
			}
			if err := c.Unmarshal(frames, tt.out); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(tt.out, tt.msg) {
				t.Fatalf("round trip got a different message")
			}
		})
	}
}
