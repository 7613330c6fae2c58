package cli

import (
	"testing"

	"github.com/spf13/cobra"

	"github.com/weft-fs/weft/client"
)

func TestClientSettingsSizes(t *testing.T) {
	tests := []struct {
		writeBuffer, readAhead string
		wantWB, wantRA         int64
		wantErr                bool
	}{
		{"64MiB", "8MiB", 64 << 20, 8 << 20, false},
		{"1GiB", "4M", 1 << 30, 4 << 20, false},
		{"256MiB", "0", 256 << 20, -1, false}, // read-ahead off
		{"512KiB", "8MiB", 0, 0, true},        // write buffer too small
		{"64MiB", "2GiB", 0, 0, true},         // read-ahead too large
		{"lots", "8MiB", 0, 0, true},
		{"64MiB", "-1", 0, 0, true},
	}
	for _, tt := range tests {
		s := clientSettings{writeBuffer: tt.writeBuffer, readAhead: tt.readAhead}
		wb, ra, err := s.sizes()
		if (err != nil) != tt.wantErr {
			t.Errorf("sizes(%q, %q): error %v, want error %v", tt.writeBuffer, tt.readAhead, err, tt.wantErr)
			continue
		}
		if err == nil && (wb != tt.wantWB || ra != tt.wantRA) {
			t.Errorf("sizes(%q, %q) = %d, %d; want %d, %d", tt.writeBuffer, tt.readAhead, wb, ra, tt.wantWB, tt.wantRA)
		}
	}
}

// --local-reads reaches the client's configuration: on by default, off
// when given false.
func TestClientSettingsLocalReads(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want bool // NoLocalReads
	}{
		{nil, false},
		{[]string{"--local-reads=false"}, true},
		{[]string{"--local-reads=true"}, false},
	} {
		cmd := &cobra.Command{Use: "x"}
		var s clientSettings
		s.addFlags(cmd)
		if err := cmd.ParseFlags(tt.args); err != nil {
			t.Fatal(err)
		}
		var cfg client.Config
		s.apply(&cfg)
		if cfg.NoLocalReads != tt.want {
			t.Errorf("%v: NoLocalReads = %v, want %v", tt.args, cfg.NoLocalReads, tt.want)
		}
	}
}
