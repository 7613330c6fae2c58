package cli

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/etcdtest"
	"github.com/weft-fs/weft/internal/testcluster"
)

// startMetaProcess runs "weft meta" with args plus --dir dir and a free
// port, waits for its address file and stops it (SIGTERM) at cleanup.
func startMetaProcess(t *testing.T, dir string, args ...string) string {
	t.Helper()
	p := testcluster.StartProc(t, "weft meta", testcluster.ProcOptions{}, append([]string{"meta", "--dir", dir, "--listen", "127.0.0.1:0"}, args...)...)
	t.Cleanup(func() { p.Kill(t, syscall.SIGTERM) })
	addr := ""
	testcluster.WaitFor(t, "the address file of weft meta", 30*time.Second, func() bool {
		if !p.Running() {
			t.Fatalf("weft meta %s exited: %v\n%s", strings.Join(args, " "), p.Err(), p.Output())
		}
		var err error
		addr, err = readAddressFile(dir)
		return err == nil
	})
	return addr
}

func runWeft(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code = Main(ctx, args, &o, &e)
	return code, o.String(), e.String()
}

// TestMetaOnEtcd starts two meta services over one etcd: both report the
// etcd engine and the same cluster.
func TestMetaOnEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	eps := strings.Join(srv.Endpoints, ",")
	var ids []string
	for _, name := range []string{"meta1", "meta2"} {
		addr := startMetaProcess(t, filepath.Join(t.TempDir(), name), "--engine", "etcd", "--etcd-endpoints", eps, "--etcd-prefix", "/cli-test/")
		code, out, errOut := runWeft(t, "status", "--meta", addr)
		if code != 0 {
			t.Fatalf("weft status of %s: exit %d\n%s%s", name, code, out, errOut)
		}
		if !regexp.MustCompile(`(?m)engine: +etcd$`).MatchString(out) {
			t.Errorf("weft status of %s does not show the etcd engine:\n%s", name, out)
		}
		m := regexp.MustCompile(`(?m)^ +id: +(\S+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("weft status of %s shows no cluster id:\n%s", name, out)
		}
		ids = append(ids, m[1])
	}
	if ids[0] != ids[1] {
		t.Errorf("two meta services over one etcd prefix report clusters %s and %s, want the same", ids[0], ids[1])
	}
}

func TestMetaEngineFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown engine", []string{"--engine", "rocks"}, `--engine must be pebble or etcd, got "rocks"`},
		{"endpoints without etcd", []string{"--etcd-endpoints", "127.0.0.1:1"}, "--etcd-endpoints is only for --engine etcd"},
		{"etcd without endpoints", []string{"--engine", "etcd"}, "--engine etcd needs --etcd-endpoints"},
		{"prefix without slash", []string{"--engine", "etcd", "--etcd-endpoints", "127.0.0.1:1", "--etcd-prefix", "/weft"}, "--etcd-prefix must end with '/'"},
		{"etcd down", []string{"--engine", "etcd", "--etcd-endpoints", "127.0.0.1:1"}, "127.0.0.1:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"meta", "--dir", t.TempDir(), "--listen", "127.0.0.1:0"}, tc.args...)
			code, out, errOut := runWeft(t, args...)
			if code == 0 {
				t.Fatalf("weft %s succeeded:\n%s", strings.Join(args, " "), out)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("weft %s: stderr %q does not contain %q", strings.Join(args, " "), errOut, tc.want)
			}
		})
	}
}
