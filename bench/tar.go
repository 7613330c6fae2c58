package bench

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// sourceChars are the bytes of the generated files' text.
const sourceChars = "abcdefghijklmnopqrstuvwxyz{}();\n\t "

// makeTarball builds, in memory, a tarball shaped like a source tree: files
// regular files of mostly small sizes (median about 4 KiB, a few up to 256
// KiB) in nested directories, ten to twenty entries per directory. The same
// seed gives the same tarball.
func makeTarball(files int, seed uint64) ([]byte, error) {
	rng := rand.New(rand.NewPCG(seed, 11))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	content := make([]byte, 256<<10)
	for i := range content {
		content[i] = sourceChars[rng.IntN(len(sourceChars))]
	}
	now := time.Unix(1700000000, 0)
	dirs := []string{"src"}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "src/", Mode: 0o755, ModTime: now}); err != nil {
		return nil, err
	}
	inDir := 0
	cur := "src"
	for i := 0; i < files; i++ {
		if inDir >= 10+rng.IntN(10) {
			// A new directory below one of the existing ones (depth grows
			// slowly, like a real tree).
			parent := dirs[rng.IntN(len(dirs))]
			if strings.Count(parent, "/") > 6 {
				parent = "src"
			}
			cur = fmt.Sprintf("%s/d%d", parent, len(dirs))
			dirs = append(dirs, cur)
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: cur + "/", Mode: 0o755, ModTime: now}); err != nil {
				return nil, err
			}
			inDir = 0
		}
		size := fileSize(rng)
		h := &tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("%s/f%d.c", cur, i), Mode: 0o644, Size: int64(size), ModTime: now}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(content[:size]); err != nil {
			return nil, err
		}
		inDir++
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// fileSize draws a source-file-like size: most a few KiB, some empty, a
// few large.
func fileSize(rng *rand.Rand) int {
	switch p := rng.IntN(100); {
	case p < 5:
		return 0
	case p < 60:
		return 256 + rng.IntN(4096)
	case p < 95:
		return 4096 + rng.IntN(28<<10)
	default:
		return 32<<10 + rng.IntN(224<<10)
	}
}

// prepareUntar builds the tarball of t before the barrier; the timed part
// extracts it into t.Path as "tar x" would (directories, files with their
// modes and times).
func prepareUntar(t *task) (runFunc, func(), error) {
	tb, err := makeTarball(t.Files, t.Seed)
	if err != nil {
		return nil, nil, fmt.Errorf("build the tarball: %w", err)
	}
	copyBuf := make([]byte, 256<<10)
	run := func() (int64, int64, error) {
		return extract(tb, t.Path, copyBuf)
	}
	return run, nil, nil
}

// extract unpacks the tarball tb into dir; it returns the bytes written and
// the entries created.
func extract(tb []byte, dir string, copyBuf []byte) (int64, int64, error) {
	tr := tar.NewReader(bytes.NewReader(tb))
	var moved, entries int64
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return moved, entries, nil
		}
		if err != nil {
			return moved, entries, fmt.Errorf("read the tarball: %w", err)
		}
		p := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(p, os.FileMode(h.Mode)&os.ModePerm); err != nil && !os.IsExist(err) {
				return moved, entries, err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(h.Mode)&os.ModePerm)
			if err != nil {
				return moved, entries, err
			}
			n, err := io.CopyBuffer(struct{ io.Writer }{f}, tr, copyBuf)
			moved += n
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return moved, entries, fmt.Errorf("write %s: %w", p, err)
			}
			if err := os.Chtimes(p, h.ModTime, h.ModTime); err != nil {
				return moved, entries, err
			}
		}
		entries++
	}
}
