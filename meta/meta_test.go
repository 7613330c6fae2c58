package meta

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/cluster"
	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Callers used throughout the tests: root, alice (owner of most test
// files), bob (in alice's group through a supplementary group) and carol
// (other).
var (
	root  = &weftv1.Caller{Uid: 0, Gid: 0}
	alice = &weftv1.Caller{Uid: 1000, Gid: 1000}
	bob   = &weftv1.Caller{Uid: 1001, Gid: 1001, Groups: []uint32{1000}}
	carol = &weftv1.Caller{Uid: 1002, Gid: 1002}
)

// chunkServer is a data server's chunk-removal RPCs over real gRPC on
// loopback, recording what the cluster manager asked of it; it stands in
// for the data servers, which the namespace tests do not exercise.
type chunkServer struct {
	weftv1.UnimplementedDataServer
	addr string

	mu        sync.Mutex
	truncated map[uint64]uint64 // ino -> last size
	deleted   map[uint64]int    // ino -> calls
	failDel   bool
}

func (d *chunkServer) TruncateFile(_ context.Context, req *weftv1.TruncateFileRequest) (*weftv1.TruncateFileResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.truncated[req.Ino] = req.Size
	return &weftv1.TruncateFileResponse{}, nil
}

func (d *chunkServer) DeleteFile(_ context.Context, req *weftv1.DeleteFileRequest) (*weftv1.DeleteFileResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failDel {
		return nil, fmt.Errorf("delete inode %d: disk on fire: %w", req.Ino, syscall.EIO)
	}
	d.deleted[req.Ino]++
	return &weftv1.DeleteFileResponse{}, nil
}

func (d *chunkServer) truncatedSize(ino uint64) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.truncated[ino]
}

func (d *chunkServer) deletedCount(ino uint64) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.deleted[ino]
}

func startChunkServer(t *testing.T) *chunkServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &chunkServer{addr: lis.Addr().String(), truncated: map[uint64]uint64{}, deleted: map[uint64]int{}}
	srv := rpc.NewServer()
	weftv1.RegisterDataServer(srv, d)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return d
}

// env is a metadata service in a temporary directory with one registered
// data server of four targets (so four chains).
type env struct {
	t     *testing.T
	ctx   context.Context
	dir   string
	lease time.Duration
	grace time.Duration // Config.OpenGrace
	data  *chunkServer
	s     *Service
	// engine opens the engine the service runs on (nil: pebble in dir).
	engine func() kv.Engine
}

func newEnv(t *testing.T) *env { return newEnvEngine(t, nil) }

// newEnvEngine is newEnv on the engines engine opens (nil: pebble).
func newEnvEngine(t *testing.T, engine func() kv.Engine) *env {
	t.Helper()
	e := &env{t: t, ctx: context.Background(), dir: t.TempDir(), lease: time.Minute, data: startChunkServer(t), engine: engine}
	e.open()
	t.Cleanup(func() { e.s.Close() })
	return e
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// open opens the service in e.dir and registers the data server.
func (e *env) open() {
	e.t.Helper()
	var eng kv.Engine
	if e.engine != nil {
		eng = e.engine()
	}
	s, err := Open(e.ctx, Config{
		Dir:          e.dir,
		Engine:       eng,
		SessionLease: e.lease,
		OpenGrace:    e.grace,
		Cluster:      cluster.Config{Logger: quietLogger()},
		Logger:       quietLogger(),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.s = s
	req := &weftv1.RegisterServerRequest{Uuid: "server-1", Address: e.data.addr, Hostname: "test"}
	for i := range 4 {
		req.Targets = append(req.Targets, &weftv1.TargetReport{
			Uuid: fmt.Sprintf("target-%d", i), Path: fmt.Sprintf("/t%d", i),
			TotalBytes: 1 << 40, FreeBytes: 1 << 39,
		})
	}
	if _, err := s.RegisterServer(e.ctx, req); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) reopen() {
	e.t.Helper()
	if err := e.s.Close(); err != nil {
		e.t.Fatal(err)
	}
	e.open()
}

// errnoOf returns the errno err wraps, 0 for nil, and fails for an error
// without one.
func errnoOf(t *testing.T, err error) syscall.Errno {
	t.Helper()
	if err == nil {
		return 0
	}
	var en syscall.Errno
	if !errors.As(err, &en) {
		t.Fatalf("error without an errno: %v", err)
	}
	return en
}

func wantErrno(t *testing.T, err error, want syscall.Errno) {
	t.Helper()
	if got := errnoOf(t, err); got != want {
		t.Fatalf("got errno %d (%v) from error %v, want %d (%v)", got, got, err, want, want)
	}
}

// Helpers that fail the test on error.

func (e *env) mkdir(c *weftv1.Caller, parent uint64, name string, mode uint32) *weftv1.Attr {
	e.t.Helper()
	r, err := e.s.Mkdir(e.ctx, &weftv1.MkdirRequest{Caller: c, Parent: parent, Name: name, Mode: mode})
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Attr
}

func (e *env) create(c *weftv1.Caller, parent uint64, name string, mode uint32) *weftv1.Attr {
	e.t.Helper()
	r, err := e.s.Create(e.ctx, &weftv1.CreateRequest{Caller: c, Parent: parent, Name: name, Mode: mode, Exclusive: true})
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Attr
}

func (e *env) getattr(ino uint64) *weftv1.Attr {
	e.t.Helper()
	r, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: ino})
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Attr
}

func (e *env) lookup(c *weftv1.Caller, parent uint64, name string) (*weftv1.Attr, error) {
	r, err := e.s.Lookup(e.ctx, &weftv1.LookupRequest{Caller: c, Parent: parent, Name: name})
	if err != nil {
		return nil, err
	}
	return r.Attr, nil
}

func (e *env) setattr(req *weftv1.SetAttrRequest) *weftv1.Attr {
	e.t.Helper()
	r, err := e.s.SetAttr(e.ctx, req)
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Attr
}

func (e *env) chown(ino uint64, uid, gid uint32) {
	e.t.Helper()
	e.setattr(&weftv1.SetAttrRequest{Caller: root, Ino: ino, Valid: setUID | setGID, Uid: uid, Gid: gid})
}

func (e *env) unlink(c *weftv1.Caller, parent uint64, name string) error {
	_, err := e.s.Unlink(e.ctx, &weftv1.RemoveRequest{Caller: c, Parent: parent, Name: name})
	return err
}

func (e *env) rmdir(c *weftv1.Caller, parent uint64, name string) error {
	_, err := e.s.Rmdir(e.ctx, &weftv1.RemoveRequest{Caller: c, Parent: parent, Name: name})
	return err
}

func (e *env) rename(c *weftv1.Caller, op uint64, on string, np uint64, nn string, flags uint32) error {
	_, err := e.s.Rename(e.ctx, &weftv1.RenameRequest{Caller: c, OldParent: op, OldName: on, NewParent: np, NewName: nn, Flags: flags})
	return err
}

func (e *env) names(dir uint64) []string {
	e.t.Helper()
	r, err := e.s.ReadDir(e.ctx, &weftv1.ReadDirRequest{Caller: root, Ino: dir})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, d := range r.Entries {
		out = append(out, d.Name)
	}
	return out
}

func (e *env) gcPending() uint64 {
	e.t.Helper()
	st, err := e.s.Status(e.ctx, &weftv1.StatusRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	return st.GcPending
}

// fixture is the tree most tests start from:
//
//	/home        root 0755
//	/home/alice  alice:1000 0750
//	/home/alice/f  alice:1000 0640 regular file
//	/tmp         root 01777 (sticky)
//	/tmp/af      alice 0666       /tmp/cf  carol 0666
//	/sg          root:1000 02775 (setgid)
type fixture struct {
	home, aliceDir, f, tmp, af, cf, sg *weftv1.Attr
}

func (e *env) fixture() fixture {
	e.t.Helper()
	var fx fixture
	fx.home = e.mkdir(root, rootIno, "home", 0o755)
	fx.aliceDir = e.mkdir(root, fx.home.Ino, "alice", 0o750)
	e.chown(fx.aliceDir.Ino, 1000, 1000)
	fx.f = e.create(alice, fx.aliceDir.Ino, "f", 0o640)
	fx.tmp = e.mkdir(root, rootIno, "tmp", 0o1777)
	fx.af = e.create(alice, fx.tmp.Ino, "af", 0o666)
	fx.cf = e.create(carol, fx.tmp.Ino, "cf", 0o666)
	fx.sg = e.mkdir(root, rootIno, "sg", 0o2775)
	if fx.sg.Mode&syscall.S_ISGID != 0 {
		e.t.Fatalf("mkdir kept setgid from its mode argument (Linux drops it): %#o", fx.sg.Mode)
	}
	e.chown(fx.sg.Ino, 0, 1000)
	fx.sg = e.setattr(&weftv1.SetAttrRequest{Caller: root, Ino: fx.sg.Ino, Valid: setMode, Mode: 0o2775})
	return fx
}

func TestOpenCreatesRootOnce(t *testing.T) {
	e := newEnv(t)
	a := e.getattr(rootIno)
	if a.Mode != syscall.S_IFDIR|0o755 || a.Nlink != 2 || a.Uid != 0 {
		t.Fatalf("root = %v", a)
	}
	id := e.s.ClusterID()
	e.setattr(&weftv1.SetAttrRequest{Caller: root, Ino: rootIno, Valid: setUID, Uid: 1000})
	e.reopen()
	if e.s.ClusterID() != id {
		t.Fatalf("cluster id changed across restart: %s -> %s", id, e.s.ClusterID())
	}
	if a := e.getattr(rootIno); a.Uid != 1000 {
		t.Fatalf("root re-created on restart: %v", a)
	}
}
