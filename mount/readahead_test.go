package mount

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestKernelReadAhead checks that a mount's kernel read-ahead window is
// raised to one request (1 MiB) unless told to leave the kernel's own,
// and that reads through the raised window return the file's bytes.
func TestKernelReadAhead(t *testing.T) {
	tc, dir := mountCluster(t, &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 3, Replicas: 1})
	kernelDefault, _, _ := mountWith(t, tc, Options{KernelReadAhead: -1})
	larger, _, _ := mountWith(t, tc, Options{KernelReadAhead: 4 << 20})
	for _, tt := range []struct {
		name string
		dir  string
		want uint64
	}{
		{"default", dir, DefaultKernelReadAhead},
		{"kernel's own", kernelDefault, 128 << 10},
		{"4 MiB", larger, 4 << 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := KernelReadAhead(tt.dir)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("kernel read-ahead %d, want %d", got, tt.want)
			}
		})
	}
	data := make([]byte, 5<<20+12345)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{kernelDefault, larger} {
		if got, err := os.ReadFile(filepath.Join(d, "f")); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read through %s: %d bytes, %v; want the %d written", d, len(got), err, len(data))
		}
	}
}

func TestSetKernelReadAheadErrors(t *testing.T) {
	if err := SetKernelReadAhead(filepath.Join(t.TempDir(), "missing"), 1<<20); err == nil {
		t.Error("a missing mount point: no error")
	}
	if err := SetKernelReadAhead("/nonexistent", 0); err != nil {
		t.Errorf("0 leaves the window alone, got %v", err)
	}
}
