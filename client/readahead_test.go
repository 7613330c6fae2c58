package client

import "testing"

// TestContinues checks which reads continue a stream: the next request,
// one that came ahead of a request of its size, one that came behind, and
// not a skip or a read far back.
func TestContinues(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name         string
		next, off, n uint64
		want         bool
	}{
		{"next request", 8 * mib, 8 * mib, mib, true},
		{"a little back", 8 * mib, 8*mib - 64<<10, mib, true},
		{"one request ahead", 8 * mib, 9 * mib, mib, true},
		{"one request behind the one ahead", 10 * mib, 8 * mib, mib, true},
		{"two requests ahead", 8 * mib, 10 * mib, mib, false},
		{"skip of 4 MiB", 4 * mib, 8 * mib, mib, false},
		{"far back", 8 * mib, 4 * mib, mib, false},
		{"small reads, 256 KiB gap", 8 * mib, 8*mib + 256<<10 + 8<<10, 8 << 10, true},
		{"small reads, 1 MiB gap", 8 * mib, 9 * mib, 8 << 10, false},
		{"start of the file", 0, 0, 128 << 10, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := continues(tt.next, tt.off, tt.n); got != tt.want {
				t.Errorf("continues(next %d, off %d, n %d) = %v, want %v", tt.next, tt.off, tt.n, got, tt.want)
			}
		})
	}
}

// TestWindowGrowth checks the window against what a stream has read: an
// eighth of it in general, half of it for a file's first stream from its
// start, a power of two from 128 KiB to the limit.
func TestWindowGrowth(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name   string
		seq    uint64
		growth uint64
		limit  int64
		want   uint64
	}{
		{"first MiB", mib, raGrowth, 8 * mib, 128 << 10},
		{"under the smallest window", 512 << 10, raGrowth, 8 * mib, 0},
		{"16 MiB", 16 * mib, raGrowth, 8 * mib, 2 * mib},
		{"16 MiB from the start", 16 * mib, raGrowth0, 8 * mib, 8 * mib},
		{"12 MiB from the start", 12 * mib, raGrowth0, 8 * mib, 4 * mib},
		{"capped", 1 << 30, raGrowth, 8 * mib, 8 * mib},
		{"smaller limit", 16 * mib, raGrowth0, 1 * mib, 1 * mib},
		{"read-ahead off", 16 * mib, raGrowth, -1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := raWindowFor(tt.seq, tt.growth, tt.limit); got != tt.want {
				t.Errorf("raWindowFor(%d, %d, %d) = %d, want %d", tt.seq, tt.growth, tt.limit, got, tt.want)
			}
		})
	}
}
