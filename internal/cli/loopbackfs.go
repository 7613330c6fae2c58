package cli

import (
	"context"
	"fmt"
	"os"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hanwen/go-fuse/v2/splice"
)

// go-fuse answers a read result that names a file descriptor by splicing
// the file's pages into a pipe behind the reply's header and the pipe
// into /dev/fuse. The pipe must hold the header, the data and a page
// more; a pipe holds at most fs.pipe-max-size bytes (1 MiB on a stock
// system), so the 1 MiB reads of a tuned mount cannot be spliced there.
// go-fuse then logs the failure and reads the bytes into a buffer: a
// wasted attempt and a log line per read. The loopback's files read
// such reads into the request's buffer themselves and answer with it.

// fuseReplyHeader is the size of a FUSE reply's header.
const fuseReplyHeader = 16

// spliceLimit is the largest read that go-fuse can splice through a pipe
// of at most maxPipe bytes.
func spliceLimit(maxPipe int) int {
	return max(0, maxPipe-os.Getpagesize()-fuseReplyHeader)
}

// loopbackNode is go-fuse's loopback node whose opened files are
// loopbackFiles.
type loopbackNode struct {
	*fs.LoopbackNode
	// spliceMax is the largest read answered by splicing; 0 splices none.
	spliceMax int
}

var (
	_ fs.NodeWrapChilder = (*loopbackNode)(nil)
	_ fs.NodeOpener      = (*loopbackNode)(nil)
	_ fs.NodeCreater     = (*loopbackNode)(nil)
)

// WrapChild makes every node below the root a loopbackNode too.
func (n *loopbackNode) WrapChild(_ context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if ln, ok := ops.(*fs.LoopbackNode); ok {
		return &loopbackNode{LoopbackNode: ln, spliceMax: n.spliceMax}
	}
	return ops
}

// Open opens the backing file.
func (n *loopbackNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	return n.wrap(fh), fuseFlags, errno
}

// Create creates and opens the backing file.
func (n *loopbackNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	in, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	return in, n.wrap(fh), fuseFlags, errno
}

func (n *loopbackNode) wrap(fh fs.FileHandle) fs.FileHandle {
	if lf, ok := fh.(*fs.LoopbackFile); ok {
		return &loopbackFile{LoopbackFile: lf, spliceMax: n.spliceMax}
	}
	return fh
}

// loopbackFile is go-fuse's loopback file that reads into the request's
// buffer what go-fuse could not splice.
type loopbackFile struct {
	*fs.LoopbackFile
	spliceMax int
}

var _ fs.FileReader = (*loopbackFile)(nil)

// Read answers with the backing file's descriptor (spliced) when the
// read fits a pipe, else with its bytes read into buf.
func (f *loopbackFile) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if len(buf) <= f.spliceMax {
		return f.LoopbackFile.Read(ctx, buf, off)
	}
	// The kernel does not release a file while reads of it are in
	// flight, so the descriptor stays open through the pread.
	fd, ok := f.PassthroughFd()
	if !ok {
		return nil, syscall.EBADF
	}
	n, err := syscall.Pread(fd, buf, off)
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	// A vector result is written with writev at once; go-fuse would try
	// (and fail) to splice any other kind first.
	return fuse.ReadResultVector([][]byte{buf[:n]}), 0
}

// newLoopbackRoot is the root of a loopback of src whose reads splice
// when splicing is on and the read fits a pipe.
func newLoopbackRoot(src string, spliceOn bool) (*loopbackNode, error) {
	root, err := fs.NewLoopbackRoot(src)
	if err != nil {
		return nil, err
	}
	ln, ok := root.(*fs.LoopbackNode)
	if !ok {
		return nil, fmt.Errorf("go-fuse's loopback root is a %T, not a *fs.LoopbackNode", root)
	}
	n := &loopbackNode{LoopbackNode: ln}
	if spliceOn && splice.Resizable() {
		n.spliceMax = spliceLimit(splice.MaxPipeSize())
	}
	n.RootData.RootNode = n
	return n, nil
}
