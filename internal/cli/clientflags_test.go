package cli

import (
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/weft-fs/weft/client"
	"github.com/weft-fs/weft/mount"
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

// --local-reads and --close-sync reach the client's configuration: on
// (close-sync off) by default, off when given false. How chunks are opened
// around a random reader, and how creates are delegated and sent, are the
// client's own business: no flag tunes them.
func TestClientSettingsSwitches(t *testing.T) {
	for _, tt := range []struct {
		args         []string
		noLocalReads bool
		closeSync    bool
		wantErr      bool
	}{
		{args: nil},
		{args: []string{"--local-reads=false"}, noLocalReads: true},
		{args: []string{"--local-reads=true"}},
		{args: []string{"--close-sync"}, closeSync: true},
		{args: []string{"--close-sync=false"}},
	} {
		cmd := &cobra.Command{Use: "x"}
		s := clientSettings{onUnavailable: client.OnUnavailableFail, unavailableTimeout: time.Second, writeBuffer: "64MiB", readAhead: "8MiB"}
		s.addFlags(cmd)
		if err := cmd.ParseFlags(tt.args); err != nil {
			t.Fatal(err)
		}
		if err := s.check(); (err != nil) != tt.wantErr {
			t.Errorf("%v: check: %v, want an error: %v", tt.args, err, tt.wantErr)
			continue
		}
		if tt.wantErr {
			continue
		}
		var cfg client.Config
		s.apply(&cfg)
		if cfg.CloseSync != tt.closeSync {
			t.Errorf("%v: CloseSync = %v, want %v", tt.args, cfg.CloseSync, tt.closeSync)
		}
		if cfg.NoLocalReads != tt.noLocalReads {
			t.Errorf("%v: NoLocalReads = %v, want %v", tt.args, cfg.NoLocalReads, tt.noLocalReads)
		}
	}
}

// --kernel-read-ahead reaches the mount's options: 1 MiB by default, the
// kernel's own with 0, and bad or too large sizes are refused.
func TestCacheSettingsKernelReadAhead(t *testing.T) {
	for _, tt := range []struct {
		args    []string
		want    int64
		wantErr bool
	}{
		{nil, 1 << 20, false},
		{[]string{"--kernel-read-ahead", "4MiB"}, 4 << 20, false},
		{[]string{"--kernel-read-ahead", "0"}, -1, false},
		{[]string{"--kernel-read-ahead", "lots"}, 0, true},
		{[]string{"--kernel-read-ahead", "1GiB"}, 0, true},
	} {
		cmd := &cobra.Command{Use: "x"}
		var s cacheSettings
		s.addFlags(cmd)
		if err := cmd.ParseFlags(tt.args); err != nil {
			t.Fatal(err)
		}
		err := s.check()
		if (err != nil) != tt.wantErr {
			t.Errorf("%v: error %v, want error %v", tt.args, err, tt.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		var opts mount.Options
		s.apply(&opts)
		if opts.KernelReadAhead != tt.want {
			t.Errorf("%v: KernelReadAhead = %d, want %d", tt.args, opts.KernelReadAhead, tt.want)
		}
	}
}
