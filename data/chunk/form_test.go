package chunk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// writeOlder writes chunk id on tg in the older form of two files, as
// builds before chunk files held their checksums did: <index> with the
// bytes and <index>.crc with a header (magic weftchk1) and the block
// checksums, or the checksums alone without header.
func writeOlder(t *testing.T, tg *Target, id ID, version, chain uint64, data []byte, withHeader bool) {
	t.Helper()
	if err := os.MkdirAll(tg.inoDir(id.Ino), 0o755); err != nil {
		t.Fatal(err)
	}
	var crc []byte
	if withHeader {
		hb := header{version: version, chain: chain, length: int64(len(data))}.encode()
		crc = append(crc, hb[:]...)
	}
	for off := 0; off < len(data); off += BlockSize {
		crc = binary.LittleEndian.AppendUint32(crc, crc32.Checksum(data[off:min(off+BlockSize, len(data))], castagnoli))
	}
	if err := os.WriteFile(tg.chunkPath(id), data, dataModeFresh); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tg.chunkPath(id)+".crc", crc, 0o644); err != nil {
		t.Fatal(err)
	}
}

// openStore opens a store of one target in dir.
func openStore(t *testing.T, dir string) (*Store, *Target) {
	t.Helper()
	s, err := Open([]string{dir}, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return s, s.Targets()[0]
}

// TestOlderFormRewritten checks chunks of the older form of two files:
// they read as they are, with their versions and digests (equal to those
// of the same chunk as one file), and their first mutation (a write, a
// truncate, a replace) leaves one chunk file holding the bytes, the
// version and the chain, and no older files. A crash that left both
// forms of a chunk reads and lists the chunk file, once.
func TestOlderFormRewritten(t *testing.T) {
	const size = 2*BlockSize + 500
	data := pattern(3, size)
	id := ID{Ino: 40, Index: 2}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	tests := []struct {
		name       string
		withHeader bool
		mutate     func(t *testing.T, tg *Target) []byte // returns the chunk's bytes after
		version    uint64                                // after the mutation
	}{
		{"write", true, func(t *testing.T, tg *Target) []byte {
			if _, err := tg.Write(id, 7, 100, []byte("new"), 1<<20, true); err != nil {
				t.Fatal(err)
			}
			want := bytes.Clone(data)
			copy(want[100:], "new")
			return want
		}, 6},
		{"write without header", false, func(t *testing.T, tg *Target) []byte {
			if _, err := tg.Write(id, 7, size, []byte("tail"), 1<<20, true); err != nil {
				t.Fatal(err)
			}
			return append(bytes.Clone(data), "tail"...)
		}, 1},
		{"truncate", true, func(t *testing.T, tg *Target) []byte {
			if err := tg.TruncateFile(id.Ino, 7, 2*(1<<20)+BlockSize+10, 1<<20); err != nil {
				t.Fatal(err)
			}
			return data[:BlockSize+10]
		}, 6},
		{"replace", true, func(t *testing.T, tg *Target) []byte {
			l := tg.Lock(id, 7)
			defer l.Unlock()
			if err := l.Replace(Full{Version: 9, Exists: true, Data: []byte("whole")}); err != nil {
				t.Fatal(err)
			}
			return []byte("whole")
		}, 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s, tg := openStore(t, dir)
			defer func() { s.Close() }()
			writeOlder(t, tg, id, 5, 7, data, tt.withHeader)
			got, err := tg.Read(id, 0, size)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read of the older form: %v, equal %v", err, bytes.Equal(got, data))
			}
			older, err := tg.Stat(id)
			if err != nil {
				t.Fatal(err)
			}
			want := tt.mutate(t, tg)
			if exists(tg.chunkPath(id)) || exists(tg.chunkPath(id)+".crc") {
				t.Error("older files left after the chunk was rewritten")
			}
			if !exists(tg.inlinePath(id)) {
				t.Fatal("no chunk file after the mutation")
			}
			// Again after a restart, from the files alone.
			s.Close()
			s, tg = openStore(t, dir)
			got, err = tg.Read(id, 0, 1<<20)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("read after the mutation: %v, %q... want %q...", err, got[:min(8, len(got))], want[:min(8, len(want))])
			}
			info, err := tg.Stat(id)
			if err != nil {
				t.Fatal(err)
			}
			if info.Version != tt.version || (tt.withHeader && info.Chain != 7) || info.Length != int64(len(want)) {
				t.Errorf("after: %+v, want version %d, chain 7, length %d", info, tt.version, len(want))
			}
			if tt.withHeader && tt.name == "write" && info.Digest == older.Digest {
				t.Error("digest unchanged by a write")
			}
		})
	}

	t.Run("digests agree across forms", func(t *testing.T) {
		s, tg := openStore(t, t.TempDir())
		defer s.Close()
		writeOlder(t, tg, id, 5, 7, data, true)
		a, err := tg.Stat(id)
		if err != nil {
			t.Fatal(err)
		}
		other := ID{Ino: 41, Index: 2}
		l := tg.Lock(other, 7)
		err = l.Replace(Full{Version: 5, Exists: true, Data: data})
		l.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		b, err := tg.Stat(other)
		if err != nil {
			t.Fatal(err)
		}
		if a.Digest != b.Digest || a.Version != b.Version || a.Length != b.Length {
			t.Errorf("older form %+v, chunk file %+v: want equal digests, versions and lengths", a, b)
		}
	})

	t.Run("both forms left by a crash", func(t *testing.T) {
		dir := t.TempDir()
		s, tg := openStore(t, dir)
		if _, err := tg.Write(id, 7, 0, []byte("current"), 1<<20, true); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s, tg = openStore(t, dir)
		defer s.Close()
		writeOlder(t, tg, id, 0, 7, []byte("stale bytes"), true)
		got, err := tg.Read(id, 0, 100)
		if err != nil || string(got) != "current" {
			t.Fatalf("read %q, %v; want the chunk file's bytes", got, err)
		}
		infos, _, err := tg.List(7, nil, 10)
		if err != nil || len(infos) != 1 {
			t.Fatalf("listed %v, %v; want the chunk once", infos, err)
		}
		lf := tg.LockFile(id.Ino, 7)
		err = lf.Delete()
		lf.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{tg.inlinePath(id), tg.chunkPath(id), tg.chunkPath(id) + ".crc"} {
			if exists(p) {
				t.Errorf("%s left after the delete", filepath.Base(p))
			}
		}
	})
}

// TestChunkFileCrashStates checks a chunk file as a crash can leave it:
// created and nothing written (empty), a head that does not read back
// (corruption, reported), an extending write whose header never came
// (cut back to what the header says).
func TestChunkFileCrashStates(t *testing.T) {
	id := ID{Ino: 50, Index: 0}
	data := pattern(4, BlockSize+10)
	tests := []struct {
		name        string
		damage      func(t *testing.T, p string)
		wantLen     int64
		wantCorrupt bool
	}{
		{"created, never written", func(t *testing.T, p string) { os.Truncate(p, 0) }, 0, false},
		{"head zeroed", func(t *testing.T, p string) {
			f, _ := os.OpenFile(p, os.O_WRONLY, 0)
			f.WriteAt(make([]byte, headerSize), 0)
			f.Close()
		}, 0, true},
		{"unfinished extension", func(t *testing.T, p string) {
			f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			f.Write(make([]byte, 3000))
			f.Close()
		}, int64(len(data)), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s, tg := openStore(t, dir)
			if _, err := tg.Write(id, 1, 0, data, 1<<20, true); err != nil {
				t.Fatal(err)
			}
			p := tg.inlinePath(id)
			s.Close()
			tt.damage(t, p)
			s, tg = openStore(t, dir)
			defer s.Close()
			got, err := tg.Read(id, 0, 1<<20)
			var ce *CorruptionError
			if tt.wantCorrupt {
				if !errors.As(err, &ce) || !ce.Header {
					t.Fatalf("read: %v, want a header corruption error", err)
				}
				return
			}
			if err != nil || int64(len(got)) != tt.wantLen || !bytes.Equal(got, data[:tt.wantLen]) {
				t.Fatalf("read %d bytes, %v; want %d", len(got), err, tt.wantLen)
			}
		})
	}
}
