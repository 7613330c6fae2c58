package client

import (
	"bytes"
	"context"
	"syscall"
	"testing"

	"google.golang.org/protobuf/proto"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestOpenStartsFirstChunkEarly checks that an open for reading of a file
// whose layout a lookup brought starts opening its first chunk in place
// beside the meta service's open, and that the file then reads what was
// written: with the right layout, with none heard (no early open), for
// writing (none), and with a layout heard that is not the file's (a chunk
// of another chain opened early, never read: neither the open's answer
// nor the read take it for the file's).
func TestOpenStartsFirstChunkEarly(t *testing.T) {
	ctx := context.Background()
	tc := startCluster(t, &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 1, Replicas: 1}, 2)
	w := newTestClient(t, tc.metaAddr, Config{})
	data := testPattern(64 << 10)
	f := writeFile(t, w, "small", data)
	ino, layout := f.Ino(), f.in.layout
	tab, err := tc.Meta().GetChains(ctx, &weftv1.GetChainsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var other uint64
	for _, ch := range tab.Chains {
		if ch.Id != layout.Chains[0] {
			other = ch.Id
		}
	}
	if other == 0 {
		t.Fatalf("one chain only (%v): no wrong layout to try", tab.Chains)
	}
	wrong := proto.Clone(layout).(*weftv1.Layout)
	wrong.Chains = []uint64{other}

	for _, tt := range []struct {
		name  string
		hint  *weftv1.Layout // nil: the lookup's
		flags uint32
		early bool
	}{
		{"layout from the lookup", nil, syscall.O_RDONLY, true},
		{"for writing", nil, syscall.O_RDWR, false},
		{"a layout that is not the file's", wrong, syscall.O_RDONLY, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestClient(t, tc.metaAddr, Config{})
			if _, err := c.Lookup(ctx, root, 1, "small"); err != nil {
				t.Fatal(err)
			}
			if tt.hint != nil {
				c.layoutHints.note(&weftv1.Attr{Ino: ino, Mode: syscall.S_IFREG | 0o644, Size: uint64(len(data)), Layout: tt.hint})
			}
			g, _, err := c.Open(ctx, root, ino, tt.flags)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Release(ctx)
			if got := c.EarlyOpens() == 1; got != tt.early {
				t.Errorf("%d chunks opened early, want early %v", c.EarlyOpens(), tt.early)
			}
			buf := make([]byte, len(data)+10)
			n, err := g.ReadAt(ctx, buf, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf[:n], data) {
				t.Fatalf("read %d bytes that are not the %d written", n, len(data))
			}
			if c.LocalReadBytes() == 0 {
				t.Errorf("nothing read in place")
			}
		})
	}
	// Without a lookup first (a mount that knows nothing of the file),
	// and for a file larger than what its first read brings in, nothing
	// is opened early.
	c := newTestClient(t, tc.metaAddr, Config{})
	g, _, err := c.Open(ctx, root, ino, syscall.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	g.Release(ctx)
	writeFile(t, w, "larger", testPattern(earlyMax+1))
	g, _ = open(t, c, "larger", syscall.O_RDONLY)
	g.Release(ctx)
	if c.EarlyOpens() != 0 {
		t.Errorf("%d chunks opened early without a layout heard, or of a file over %d bytes", c.EarlyOpens(), earlyMax)
	}
}
