package mount

import (
	"context"
	"errors"
	"log/slog"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// status translates an error of the client to the errno the kernel gets.
// It is the only place errors become errnos: the errno the weft service
// sent (or the client chose) passes through; an interrupted request is
// EINTR; anything else is EIO with a log line saying what failed.
func status(log *slog.Logger, op string, ino uint64, err error) fuse.Status {
	if err == nil {
		return fuse.OK
	}
	if e, ok := fserr.Errno(err); ok {
		if e == syscall.EIO {
			log.Error("I/O error", "op", op, "ino", ino, "err", err)
		}
		return fuse.Status(e)
	}
	if errors.Is(err, context.Canceled) || grpcstatus.Code(err) == codes.Canceled {
		return fuse.EINTR
	}
	log.Error("operation failed with an error that has no errno; answering EIO", "op", op, "ino", ino, "err", err)
	return fuse.EIO
}

// reqContext returns the context for one FUSE request. Kernel interrupts
// (the cancel channel) are deliberately not honoured: the kernel sends one
// for any signal the calling process gets, including the runtime's
// preemption signals of Go programs, and answering EINTR to stat or open
// breaks programs that do not retry. A fatal signal needs no help: the
// kernel stops waiting for the answer by itself. Operations that can
// block for long (a data server down) have their own timeouts in the
// client.
func reqContext(_ <-chan struct{}) (context.Context, context.CancelFunc) {
	return context.Background(), noCancel
}

// noCancel is the CancelFunc of a request's context, which has nothing to
// cancel.
func noCancel() {}

func splitNs(ns int64) (uint64, uint32) {
	t := time.Unix(0, ns)
	return uint64(t.Unix()), uint32(t.Nanosecond())
}

// fillAttr converts weft attributes to the kernel's.
func fillAttr(a *weftv1.Attr, out *fuse.Attr) {
	*out = fuse.Attr{
		Ino: a.Ino, Size: a.Size, Blocks: (a.Size + 511) / 512,
		Mode: a.Mode, Nlink: a.Nlink, Rdev: a.Rdev,
		Owner: fuse.Owner{Uid: a.Uid, Gid: a.Gid},
	}
	out.Atime, out.Atimensec = splitNs(a.AtimeNs)
	out.Mtime, out.Mtimensec = splitNs(a.MtimeNs)
	out.Ctime, out.Ctimensec = splitNs(a.CtimeNs)
	if a.Mode&syscall.S_IFMT == syscall.S_IFDIR && a.Size == 0 {
		// Directories have no data of their own; report what local file
		// systems do, as some tools expect a non-zero size.
		out.Size, out.Blocks = 4096, 8
	}
	out.Blksize = 4096
	if cs := a.GetLayout().GetChunkSize(); cs > 0 {
		out.Blksize = min(cs, maxWrite)
	}
}
