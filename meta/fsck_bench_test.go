package meta

import (
	"context"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestFsckScale measures fsck over a large namespace written straight to
// the engine (WEFT_FSCK_INODES files in directories of 1000; skipped when
// unset): wall time and CPU time of a check run.
func TestFsckScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("WEFT_FSCK_INODES"))
	if n <= 0 {
		t.Skip("set WEFT_FSCK_INODES=100000 to measure fsck over that many files")
	}
	s := openService(t, nil, nil)
	ctx := context.Background()
	const perDir, perTxn = 1000, 500
	next := uint64(1 << 20)
	dirs := 0
	for made := 0; made < n; {
		dir := next
		next++
		dirs++
		err := s.update(ctx, func(x *tx) error {
			root, err := x.dir(rootIno, "bench")
			if err != nil {
				return err
			}
			d := &weftv1.Attr{Ino: dir, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, CtimeNs: x.now}
			root.Nlink++
			if err := x.addChild(root, "d"+strconv.FormatUint(dir, 10), d); err != nil {
				return err
			}
			if err := x.t.Set(parentKey(dir), be64(rootIno)); err != nil {
				return err
			}
			return x.countInode(true, dir, 1)
		})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < perDir && made < n; i += perTxn {
			err := s.eng.Update(ctx, func(t kv.Txn) error {
				x := &tx{t: t, now: time.Now().UnixNano()}
				for j := i; j < min(i+perTxn, perDir) && made+j-i < n; j++ {
					a := &weftv1.Attr{Ino: next + uint64(j), Mode: syscall.S_IFREG | 0o644, Nlink: 1, CtimeNs: x.now}
					if err := x.putInode(a); err != nil {
						return err
					}
					if err := x.t.Set(dentryKey(dir, "f"+strconv.Itoa(j)), encodeDentry(a.Ino, syscall.S_IFREG)); err != nil {
						return err
					}
					if err := x.countInode(false, a.Ino, 1); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			k := min(perTxn, perDir-i, n-made)
			made += k
		}
		next += perDir
	}
	if err := s.update(ctx, func(x *tx) error { return x.t.Set(keyNextIno, be64(next+inoRangeSize)) }); err != nil {
		t.Fatal(err)
	}
	var before, after syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	start := time.Now()
	r, err := s.Fsck(ctx, &weftv1.FsckRequest{})
	wall := time.Since(start)
	syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	if err != nil {
		t.Fatal(err)
	}
	cpu := time.Duration(after.Utime.Nano()+after.Stime.Nano()-before.Utime.Nano()-before.Stime.Nano()) * time.Nanosecond
	t.Logf("fsck of %d inodes, %d entries (%d directories): %v wall, %v CPU; %d problems",
		r.InodesChecked, r.EntriesChecked, dirs, wall, cpu, len(r.Problems))
	if len(r.Problems) != 0 {
		t.Fatalf("problems in a namespace made for the measurement:%s", describeProblems(r))
	}
}
