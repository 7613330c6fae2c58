package mount

import (
	"context"
	"errors"
	"log/slog"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

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
	if errors.Is(err, context.Canceled) {
		return fuse.EINTR
	}
	log.Error("operation failed with an error that has no errno; answering EIO", "op", op, "ino", ino, "err", err)
	return fuse.EIO
}

// reqContext turns go-fuse's cancel channel (closed when the kernel
// interrupts the request) into a context.
func reqContext(cancel <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, stop := context.WithCancel(context.Background())
	if cancel != nil {
		go func() {
			select {
			case <-cancel:
				stop()
			case <-ctx.Done():
			}
		}()
	}
	return ctx, stop
}

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
	out.Blksize = 4096
	if cs := a.GetLayout().GetChunkSize(); cs > 0 {
		out.Blksize = min(cs, maxWrite)
	}
}
