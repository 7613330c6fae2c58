package cli

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/weft-fs/weft/mount"
)

// cacheSettings are the caching flags of weft mount and weft up: metadata
// caching and the kernel's read-ahead.
type cacheSettings struct {
	callbacks    bool
	attrTimeout  time.Duration // 0: mount's default for the callbacks setting
	entryTimeout time.Duration
	readAhead    string // --kernel-read-ahead
	// readAheadBytes is readAhead parsed by check; 0 leaves the kernel's.
	readAheadBytes uint64
}

// addFlags defines --callbacks, --attr-timeout, --entry-timeout and
// --kernel-read-ahead on cmd.
func (s *cacheSettings) addFlags(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&s.callbacks, "callbacks", true,
		"have the meta service call back when cached metadata changes, so that the kernel can cache it long "+
			"(--callbacks=false: short timeouts, close-to-open only)")
	fl.DurationVar(&s.attrTimeout, "attr-timeout", 0,
		"how long the kernel caches attributes (0: "+mount.DefaultCallbackTimeout.String()+" with callbacks, "+
			mount.DefaultTimeout.String()+" without)")
	fl.DurationVar(&s.entryTimeout, "entry-timeout", 0,
		"how long the kernel caches names, also missing ones with callbacks (0: "+mount.DefaultCallbackTimeout.String()+
			" with callbacks, "+mount.DefaultTimeout.String()+" without)")
	fl.StringVar(&s.readAhead, "kernel-read-ahead", formatSize(mount.DefaultKernelReadAhead),
		"the kernel's read-ahead window of the mount, which sets the size of a sequential reader's requests "+
			"(needs root; 0: leave the kernel's 128 KiB)")
}

// check validates the flags.
func (s *cacheSettings) check() error {
	if s.attrTimeout < 0 || s.entryTimeout < 0 {
		return usagef("--attr-timeout and --entry-timeout must not be negative")
	}
	if s.readAhead == "" {
		s.readAhead = formatSize(mount.DefaultKernelReadAhead)
	}
	n, err := parseSize(s.readAhead)
	if err != nil {
		return usagef("--kernel-read-ahead: %v", err)
	}
	if n > maxKernelReadAhead {
		return usagef("--kernel-read-ahead %s is too large: at most %s", s.readAhead, formatSize(maxKernelReadAhead))
	}
	s.readAheadBytes = n
	return nil
}

// maxKernelReadAhead bounds --kernel-read-ahead (the kernel reads that
// much ahead of every sequential reader of the mount).
const maxKernelReadAhead = 64 << 20

// apply copies the settings into opts.
func (s cacheSettings) apply(opts *mount.Options) {
	opts.NoCallbacks = !s.callbacks
	opts.AttrTimeout = s.attrTimeout
	opts.EntryTimeout = s.entryTimeout
	opts.KernelReadAhead = int64(s.readAheadBytes)
	if s.readAheadBytes == 0 {
		opts.KernelReadAhead = -1
	}
}
