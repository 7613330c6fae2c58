package cli

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/internal/testcluster"
	"github.com/weft-fs/weft/internal/wire"
	"github.com/weft-fs/weft/meta/kv"
	"github.com/weft-fs/weft/meta/kv/pebblekv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// runFsckProcess runs the weft binary's fsck and returns its exit status
// and output.
func runFsckProcess(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.Command(testcluster.Binary(t), append([]string{"fsck"}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errOut.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errOut.String()
	}
	t.Fatal(err)
	return 0, "", ""
}

func be64Bytes(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// TestFsckProcess runs weft fsck against a cluster of processes with a
// mounted file system: clean after a workload; after an unowned chunk is
// put on a data server and the namespace damaged in the meta server's
// database (meta stopped meanwhile), fsck exits 1 naming each problem,
// --repair fixes them, and the next run exits 0 with the data intact.
func TestFsckProcess(t *testing.T) {
	metaListen := freePort(t)
	c := newFailCluster(t, 2, []string{"--listen", metaListen}, nil)
	mnt := c.mount()
	want := pattern("kept", 3<<20+5)
	if err := os.MkdirAll(filepath.Join(mnt, "d/e"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"d/kept", "d/e/other"} {
		if err := os.WriteFile(filepath.Join(mnt, name), want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(mnt, "d/kept"), filepath.Join(mnt, "hard")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(mnt, "d/e"), filepath.Join(mnt, "e2")); err != nil {
		t.Fatal(err)
	}
	held, err := os.Create(filepath.Join(mnt, "unlinked-open"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := held.Write([]byte("still here")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(mnt, "unlinked-open")); err != nil {
		t.Fatal(err)
	}
	kept := inoOf(t, filepath.Join(mnt, "d/kept"))

	code, out, errOut := runFsckProcess(t, "--meta", c.metaAddr)
	if code != 0 || !strings.Contains(out, ": no problems") {
		t.Fatalf("fsck of a clean file system: exit %d\n%s%s", code, out, errOut)
	}

	// A chunk of an inode that does not exist, written through a chain.
	const ghost = 987654321
	tab, err := c.mc.GetChains(context.Background(), &weftv1.GetChainsRequest{})
	if err != nil || len(tab.Chains) == 0 {
		t.Fatalf("chain table: %v, %v", tab, err)
	}
	ch := tab.Chains[0]
	dc := wire.NewClient(ch.Members[0].Address, 0) // chunk I/O: the lean protocol on the server's port
	defer dc.Close()
	_, err = dc.WriteChunk(context.Background(), &weftv1.WriteChunkRequest{
		Chunk: &weftv1.ChunkID{Ino: ghost}, ChainId: ch.Id, ChainVersion: ch.Version, Data: []byte("nobody's"), ChunkSize: 1 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}

	// Damage the namespace with the meta server stopped: a dangling entry
	// and a wrong link count.
	c.meta.Kill(t, syscall.SIGTERM)
	eng, err := pebblekv.Open(filepath.Join(c.base, "meta", "db"))
	if err != nil {
		t.Fatal(err)
	}
	err = eng.Update(context.Background(), func(tx kv.Txn) error {
		entry := append(append([]byte("n/d/"), be64Bytes(1)...), "/ghost"...)
		if err := tx.Set(entry, append(be64Bytes(123456789), 0, 0, 0x80, 0)); err != nil {
			return err
		}
		key := append([]byte("n/i/"), be64Bytes(kept)...)
		v, ok, err := tx.Get(key)
		if err != nil || !ok {
			return errors.Join(err, errors.New("no inode record for the kept file"))
		}
		a := new(weftv1.Attr)
		if err := proto.Unmarshal(v, a); err != nil {
			return err
		}
		a.Nlink = 7
		if v, err = proto.Marshal(a); err != nil {
			return err
		}
		return tx.Set(key, v)
	})
	if cerr := eng.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	c.meta = c.start("meta", "meta", "--dir", filepath.Join(c.base, "meta"), "--listen", metaListen,
		"--heartbeat-interval", failHeartbeat.String(), "--failure-timeout", failTimeout.String())
	if err := waitOnline(c.metaAddr, 2, failWait); err != nil {
		t.Fatal(err)
	}

	var found string
	c.waitFor("fsck to list the damage", failWait, func() bool {
		code, out, errOut = runFsckProcess(t, "--dir", filepath.Join(c.base, "meta"))
		found = out + errOut
		return code == 1 && strings.Contains(out, "unowned_chunk")
	})
	for _, w := range []string{"dangling_entry: entry \"ghost\" in directory 1 names inode 123456789", "wrong_nlink: inode ", "has link count 7, should be 2",
		"unowned_chunk: chunks of inode 987654321", "problems left; run weft fsck --repair"} {
		if !strings.Contains(found, w) {
			t.Errorf("fsck output lacks %q:\n%s", w, found)
		}
	}

	code, out, errOut = runFsckProcess(t, "--meta", c.metaAddr, "--repair", "--json")
	if code != 0 || !strings.Contains(out, `"problems_left": 0`) || strings.Count(out, `"repaired": true`) != 3 {
		t.Fatalf("fsck --repair: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runFsckProcess(t, "--meta", c.metaAddr)
	if code != 0 || !strings.Contains(out, ": no problems") {
		t.Fatalf("fsck after the repair: exit %d\n%s%s", code, out, errOut)
	}
	c.waitFor("the garbage collector to delete the unowned chunk", failWait, func() bool {
		for _, d := range c.data {
			if _, err := os.Stat(filepath.Join(d.dir, chunkRel(ghost, 0))); err == nil {
				return false
			}
		}
		return true
	})
	if got, err := readUncached(filepath.Join(mnt, "hard")); err != nil || !bytes.Equal(got, want) {
		t.Errorf("the file's data after the repair: %v (equal %v)", err, bytes.Equal(got, want))
	}
	if _, err := os.Stat(filepath.Join(mnt, "ghost")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stat of the removed dangling entry: %v", err)
	}
}

// TestFsckExitStatus checks that fsck exits 2 when it cannot run.
func TestFsckExitStatus(t *testing.T) {
	for _, args := range [][]string{{"--meta", "127.0.0.1:1", "--timeout", "5s"}, {"--dir", t.TempDir()}, {"--bogus"}} {
		code, out, errOut := runFsckProcess(t, args...)
		if code != 2 || out != "" || !strings.HasPrefix(errOut, "weft: ") {
			t.Errorf("weft fsck %s: exit %d, stdout %q, stderr %q; want exit 2 and one error", strings.Join(args, " "), code, out, errOut)
		}
	}
}
