package cli

import "testing"

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr bool
	}{
		{"1048576", 1 << 20, false},
		{"64KiB", 64 << 10, false},
		{"64kib", 64 << 10, false},
		{"1MiB", 1 << 20, false},
		{"4M", 4 << 20, false},
		{"4m", 4 << 20, false},
		{"2G", 2 << 30, false},
		{"512K", 512 << 10, false},
		{"1 MiB", 1 << 20, false},
		{"10B", 10, false},
		{"", 0, true},
		{"MiB", 0, true},
		{"1.5M", 0, true},
		{"-1", 0, true},
		{"abc", 0, true},
		{"99999999999999999999G", 0, true},
	}
	for _, tt := range tests {
		got, err := parseSize(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseChunkSize(t *testing.T) {
	tests := []struct {
		in      string
		want    uint32
		wantErr bool
	}{
		{"64KiB", 64 << 10, false},
		{"1MiB", 1 << 20, false},
		{"64MiB", 64 << 20, false},
		{"32KiB", 0, true},
		{"128MiB", 0, true},
		{"3MiB", 0, true},
		{"x", 0, true},
	}
	for _, tt := range tests {
		got, err := parseChunkSize(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseChunkSize(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestFormatSize(t *testing.T) {
	tests := []struct {
		in   uint64
		want string
	}{
		{0, "0 B"},
		{1023, "1023 B"},
		{1024, "1 KiB"},
		{64 << 10, "64 KiB"},
		{1 << 20, "1 MiB"},
		{1536, "1.5 KiB"},
		{(10 << 30) + (300 << 20), "10.3 GiB"},
	}
	for _, tt := range tests {
		if got := formatSize(tt.in); got != tt.want {
			t.Errorf("formatSize(%d) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
