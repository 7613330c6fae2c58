package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/spf13/cobra"

	"github.com/weft-fs/weft/mount"
)

// loopbackFlags are the flags of "weft loopback".
type loopbackFlags struct {
	passthrough bool
	splice      bool
	debug       bool
	readAhead   string
}

func newLoopbackCmd() *cobra.Command {
	var f loopbackFlags
	cmd := &cobra.Command{
		Use:   "loopback [flags] SRC MNT",
		Short: "Mount SRC at MNT through a plain FUSE loopback (the baseline of weft bench)",
		Long: `Mount the directory SRC at MNT through go-fuse's loopback file system, tuned as
a network client would be (1 MiB requests, a 1 MiB kernel read-ahead as weft
mounts have, 64 background requests) and with kernel passthrough off, so
every read and write goes through this process: the FUSE cost weft is
compared against. --passthrough lets the kernel read and write the
backing files directly instead.

Runs in the foreground until SIGINT or SIGTERM, then unmounts.

Example:
  weft loopback /var/tmp/lo-src /var/tmp/lo-mnt &
  weft bench --compare /mnt/weft /var/tmp/lo-mnt /var/tmp/local`,
		Args: exactArgs(2, "SRC and MNT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runLoopback(cmd, f, args[0], args[1])
		},
	}
	cmd.Flags().BoolVar(&f.passthrough, "passthrough", false, "let the kernel do reads and writes on the backing files (FUSE passthrough)")
	cmd.Flags().BoolVar(&f.splice, "splice", true, "answer reads by splicing the backing file's pages to the kernel (no copy in this process) where a pipe can hold them (fs.pipe-max-size); false: read them into a buffer and write that")
	cmd.Flags().BoolVar(&f.debug, "debug", false, "log every FUSE request")
	cmd.Flags().StringVar(&f.readAhead, "kernel-read-ahead", formatSize(mount.DefaultKernelReadAhead),
		"the kernel's read-ahead window of the mount, as weft mounts set it (needs root; 0: leave the kernel's 128 KiB)")
	return cmd
}

// spliceNote says which reads the loopback splices.
func spliceNote(on bool, limit int) string {
	switch {
	case !on:
		return "reads copied through a buffer"
	case limit == 0:
		return "reads copied through a buffer: pipes cannot be resized here"
	case limit >= 1<<20:
		return "reads spliced"
	default:
		return fmt.Sprintf("reads up to %s spliced, larger ones copied through a buffer: "+
			"a pipe holds at most fs.pipe-max-size; sysctl fs.pipe-max-size=2097152 splices all", formatSize(uint64(limit)))
	}
}

// runLoopback mounts, waits for the context and unmounts.
func runLoopback(cmd *cobra.Command, f loopbackFlags, src, mnt string) error {
	readAhead, err := parseSize(f.readAhead)
	if err != nil {
		return usagef("--kernel-read-ahead: %v", err)
	}
	src, err = filepath.Abs(src)
	if err != nil {
		return failure("find "+src, err, "give an existing directory")
	}
	mnt, err = filepath.Abs(mnt)
	if err != nil {
		return failure("find "+mnt, err, "give an existing directory")
	}
	for _, d := range []string{src, mnt} {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			return failure("use "+d, fmt.Errorf("not a directory (%v)", err), "create it first")
		}
	}
	root, err := newLoopbackRoot(src, f.splice)
	if err != nil {
		return failure("open "+src, err, "check that it is readable")
	}
	isRoot := os.Geteuid() == 0
	sec := time.Second
	opts := &fs.Options{
		AttrTimeout:  &sec,
		EntryTimeout: &sec,
		MountOptions: fuse.MountOptions{
			MaxWrite:      1 << 20,
			MaxBackground: 64,
			AllowOther:    isRoot,
			DirectMount:   isRoot,
			FsName:        src,
			Name:          "weft-loopback",
			Debug:         f.debug,
			DisableSplice: !f.splice,
		},
	}
	if !f.passthrough {
		opts.MountOptions.DisabledCapabilities |= fuse.CAP_PASSTHROUGH
	}
	server, err := fs.Mount(mnt, root, opts)
	if err != nil {
		return failure("mount the loopback of "+src+" at "+mnt, err, "check that /dev/fuse exists and fuse3 is installed (fusermount3 when not root)")
	}
	if err := mount.SetKernelReadAhead(mnt, readAhead); err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: %v\n", err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "loopback of %s mounted at %s (passthrough %v, %s); Ctrl-C unmounts\n", src, mnt, f.passthrough, spliceNote(f.splice, root.spliceMax))
	done := make(chan struct{})
	go func() {
		server.Wait()
		close(done)
	}()
	select {
	case <-cmd.Context().Done():
	case <-done:
		return nil
	}
	var uerr error
	for i := 0; i < 50; i++ {
		if uerr = server.Unmount(); uerr == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if uerr != nil {
		return failure("unmount "+mnt, uerr, "close the files open there and run: umount "+mnt)
	}
	<-done
	return nil
}
