package cli

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// Chunk size limits of a layout (see DESIGN.md: a power of two, 64 KiB to
// 64 MiB).
const (
	minChunkSizeBytes = 64 << 10
	maxChunkSizeBytes = 64 << 20
)

// sizeUnits maps a suffix to its multiplier. K, M, G and their KB/KiB
// spellings are all binary: chunk sizes are powers of two.
var sizeUnits = []struct {
	suffix string
	mult   uint64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30},
	{"kb", 1 << 10}, {"mb", 1 << 20}, {"gb", 1 << 30},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30},
	{"b", 1},
}

// parseSize reads a byte size such as 1048576, 64KiB, 1MiB, 4M or 1m.
func parseSize(s string) (uint64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := uint64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t = strings.TrimSpace(strings.TrimSuffix(t, u.suffix))
			mult = u.mult
			break
		}
	}
	n, err := strconv.ParseUint(t, 10, 64)
	if err != nil || t == "" {
		return 0, fmt.Errorf("%q is not a size: write a number of bytes with an optional unit, e.g. 64KiB, 1MiB, 4M", s)
	}
	hi, v := bits.Mul64(n, mult)
	if hi != 0 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return v, nil
}

// parseChunkSize reads a chunk size and checks it is a power of two
// between 64 KiB and 64 MiB.
func parseChunkSize(s string) (uint32, error) {
	v, err := parseSize(s)
	if err != nil {
		return 0, err
	}
	if v < minChunkSizeBytes || v > maxChunkSizeBytes || v&(v-1) != 0 {
		return 0, fmt.Errorf("chunk size %s is not allowed: it must be a power of two from 64KiB to 64MiB (64KiB, 128KiB, ..., 1MiB, ..., 64MiB)", s)
	}
	return uint32(v), nil
}

// formatSize prints a byte count for a person: exact binary units when the
// count is a multiple of one (1 MiB, 64 KiB), otherwise one decimal.
func formatSize(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	i := 0
	exact := true
	v := n
	for v >= 1024 && i < len(units)-1 {
		if v%1024 != 0 {
			exact = false
		}
		v /= 1024
		i++
	}
	if exact {
		return fmt.Sprintf("%d %s", v, units[i])
	}
	f := float64(n)
	for j := 0; j < i; j++ {
		f /= 1024
	}
	return fmt.Sprintf("%.1f %s", f, units[i])
}
