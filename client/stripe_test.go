package client

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"testing"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func TestSpans(t *testing.T) {
	const k = 64 << 10
	tests := []struct {
		name      string
		off, n    uint64
		chunkSize uint64
		want      []span
	}{
		{"empty", 5, 0, k, nil},
		{"inside first chunk", 10, 100, k, []span{{0, 10, 100, 0}}},
		{"exactly one chunk", k, k, k, []span{{1, 0, k, 0}}},
		{"across a boundary", k - 10, 30, k, []span{{0, k - 10, 10, 0}, {1, 0, 20, 10}}},
		{"three chunks", 1, 2 * k, k, []span{{0, 1, k - 1, 0}, {1, 0, k, k - 1}, {2, 0, 1, 2*k - 1}}},
		{"ends on a boundary", 0, 2 * k, k, []span{{0, 0, k, 0}, {1, 0, k, k}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := spans(tt.off, tt.n, tt.chunkSize)
			if len(got) == 0 && len(tt.want) == 0 {
				return
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("spans(%d, %d, %d) = %v, want %v", tt.off, tt.n, tt.chunkSize, got, tt.want)
			}
		})
	}
}

func TestChainFor(t *testing.T) {
	l := &weftv1.Layout{ChunkSize: 1 << 20, Chains: []uint64{7, 3, 9}}
	for i, want := range []uint64{7, 3, 9, 7, 3, 9, 7} {
		if got := chainFor(l, uint64(i)); got != want {
			t.Errorf("chunk %d on chain %d, want %d", i, got, want)
		}
	}
}

func TestChunkBufWrite(t *testing.T) {
	type w struct {
		off  uint64
		data string
	}
	tests := []struct {
		name   string
		writes []w
		want   []extent
	}{
		{"single", []w{{5, "abc"}}, []extent{{5, []byte("abc")}}},
		{"apart", []w{{10, "xy"}, {0, "ab"}}, []extent{{0, []byte("ab")}, {10, []byte("xy")}}},
		{"adjacent after", []w{{0, "ab"}, {2, "cd"}}, []extent{{0, []byte("abcd")}}},
		{"adjacent before", []w{{2, "cd"}, {0, "ab"}}, []extent{{0, []byte("abcd")}}},
		{"overwrite inside", []w{{0, "abcdef"}, {2, "XY"}}, []extent{{0, []byte("abXYef")}}},
		{"extend tail", []w{{0, "abcd"}, {2, "XYZW"}}, []extent{{0, []byte("abXYZW")}}},
		{"bridge two", []w{{0, "ab"}, {6, "gh"}, {1, "XXXXXX"}}, []extent{{0, []byte("aXXXXXXh")}}},
		{"cover all", []w{{2, "c"}, {5, "f"}, {0, "0123456789"}}, []extent{{0, []byte("0123456789")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b chunkBuf
			for _, x := range tt.writes {
				b.write(x.off, []byte(x.data))
			}
			if !reflect.DeepEqual(b.extents, tt.want) {
				t.Errorf("extents %v, want %v", b.extents, tt.want)
			}
		})
	}
}

// TestChunkBufModel checks random writes and truncates against a plain
// byte array model.
func TestChunkBufModel(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	const size = 4096
	for round := range 200 {
		var b chunkBuf
		model := make([]byte, size)
		set := make([]bool, size)
		var total int64
		for range 30 {
			if r.IntN(10) == 0 {
				cut := uint64(r.IntN(size))
				total -= b.truncate(cut)
				for i := cut; i < size; i++ {
					set[i] = false
				}
				continue
			}
			off := uint64(r.IntN(size - 1))
			n := 1 + r.IntN(min(size-int(off), 300))
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(r.Uint32())
			}
			total += b.write(off, p)
			copy(model[off:], p)
			for i := range n {
				set[off+uint64(i)] = true
			}
		}
		var got int64
		var prevEnd uint64
		for i, e := range b.extents {
			if i > 0 && e.off <= prevEnd {
				t.Fatalf("round %d: extents overlap or touch: %v", round, b.extents)
			}
			prevEnd = e.end()
			if !bytes.Equal(e.data, model[e.off:e.end()]) {
				t.Fatalf("round %d: extent at %d holds wrong bytes", round, e.off)
			}
			for i := e.off; i < e.end(); i++ {
				if !set[i] {
					t.Fatalf("round %d: byte %d buffered but never written", round, i)
				}
				set[i] = false
			}
			got += int64(len(e.data))
		}
		for i, s := range set {
			if s {
				t.Fatalf("round %d: written byte %d not buffered", round, i)
			}
		}
		if got != b.size || got != total {
			t.Fatalf("round %d: size %d, counted %d, deltas %d", round, b.size, got, total)
		}
	}
}

func TestParseGroups(t *testing.T) {
	status := []byte("Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nGroups:\t4 24 27 1000 \nNgid:\t0\n")
	if got, want := parseGroups(status), []uint32{4, 24, 27, 1000}; !reflect.DeepEqual(got, want) {
		t.Errorf("parseGroups = %v, want %v", got, want)
	}
	if got := parseGroups([]byte("Groups:\t\n")); len(got) != 0 {
		t.Errorf("no groups parsed as %v", got)
	}
}
