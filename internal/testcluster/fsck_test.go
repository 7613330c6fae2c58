package testcluster

import (
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weft-fs/weft/meta/kv"
	"github.com/weft-fs/weft/meta/kv/pebblekv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// damageEnv makes TestDamageHelper damage its cluster: "declared" says so
// with LeavesDamage, "undeclared" does not.
const damageEnv = "WEFT_TESTCLUSTER_DAMAGE"

// TestFsckAtTheEnd runs TestDamageHelper in a child test process: a test
// that leaves an orphan inode fails at its end unless it declared that
// damage.
func TestFsckAtTheEnd(t *testing.T) {
	for _, tc := range []struct {
		mode     string
		wantFail bool
	}{{"undeclared", true}, {"declared", false}} {
		t.Run(tc.mode, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestDamageHelper$", "-test.count=1")
			cmd.Env = append(os.Environ(), damageEnv+"="+tc.mode)
			out, err := cmd.CombinedOutput()
			if failed := err != nil; failed != tc.wantFail {
				t.Fatalf("the child test failed: %v, want %v:\n%s", failed, tc.wantFail, out)
			}
			if tc.wantFail && !strings.Contains(string(out), "orphan_inode") {
				t.Errorf("the child test failed without naming the orphan inode:\n%s", out)
			}
		})
	}
}

// TestDamageHelper is run by TestFsckAtTheEnd: it makes a directory and
// removes its entry behind the meta service's back.
func TestDamageHelper(t *testing.T) {
	mode := os.Getenv(damageEnv)
	if mode == "" {
		t.Skip("run by TestFsckAtTheEnd")
	}
	c := Start(t, Options{DataServers: 1})
	if mode == "declared" {
		c.LeavesDamage("orphan_inode", "wrong_nlink") // and the root counts the lost directory
	}
	ctx := context.Background()
	if _, err := c.Meta().Mkdir(ctx, &weftv1.MkdirRequest{Caller: &weftv1.Caller{}, Parent: 1, Name: "d", Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	if err := c.StopMeta(); err != nil {
		t.Fatal(err)
	}
	eng, err := pebblekv.Open(filepath.Join(c.Dir(), "meta", "db"))
	if err != nil {
		t.Fatal(err)
	}
	key := append(binary.BigEndian.AppendUint64([]byte("n/d/"), 1), "/d"...) // meta/keys.go
	err = eng.Update(ctx, func(t kv.Txn) error { return t.Delete(key) })
	if cerr := eng.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	c.StartMeta()
}
