package archtest

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const module = "github.com/weft-fs/weft"

type pkgInfo struct {
	path    string
	doc     string
	imports []string
}

func listPackages(t *testing.T) []pkgInfo {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}\t{{.Doc}}\t{{join .Imports \" \"}}", "./...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkgInfo
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), "\t", 3)
		if len(parts) != 3 {
			continue
		}
		pkgs = append(pkgs, pkgInfo{path: parts[0], doc: parts[1], imports: strings.Fields(parts[2])})
	}
	return pkgs
}

// TestImportRules checks that each layer only reaches the layers below it:
// the client and the FUSE adapter talk to the services through the
// protocol only, and the services never import the client side. The one
// exception is data/chunk, the chunk file format, which the client's
// reads in place use (the format is written down once).
func TestImportRules(t *testing.T) {
	// A forbidden entry is a package path; "x/..." means x and everything
	// below it.
	rules := []struct {
		from      string
		forbidden []string
	}{
		{"client", []string{"meta/...", "data/...", "cluster/...", "mount/...", "internal/cli/..."}},
		{"mount", []string{"meta/...", "data/...", "cluster/...", "internal/cli/..."}},
		{"meta", []string{"client/...", "mount/...", "data/...", "internal/cli/..."}},
		{"data", []string{"client/...", "mount/...", "meta/...", "cluster/...", "internal/cli/..."}},
		{"cluster", []string{"client/...", "mount/...", "meta", "data/...", "internal/cli/..."}},
		{"proto", []string{"..."}},
	}
	matches := func(pattern, rel string) bool {
		if pattern == "..." {
			return true
		}
		if base, ok := strings.CutSuffix(pattern, "/..."); ok {
			return rel == base || strings.HasPrefix(rel, base+"/")
		}
		return rel == pattern
	}
	pkgs := listPackages(t)
	if len(pkgs) == 0 {
		t.Fatal("go list found no packages")
	}
	for _, p := range pkgs {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.path, module), "/")
		for _, r := range rules {
			if !matches(r.from+"/...", rel) {
				continue
			}
			for _, imp := range p.imports {
				if !strings.HasPrefix(imp, module+"/") {
					continue
				}
				irel := strings.TrimPrefix(imp, module+"/")
				if matches(r.from+"/...", irel) {
					continue // within the same layer
				}
				if r.from == "client" && irel == "data/chunk" {
					continue // the chunk file format (reads in place)
				}
				for _, f := range r.forbidden {
					if matches(f, irel) {
						t.Errorf("%s imports %s: %s must not depend on %s", rel, irel, r.from, f)
					}
				}
			}
		}
	}
}

// TestPackageDocs checks that every package has a doc comment.
func TestPackageDocs(t *testing.T) {
	for _, p := range listPackages(t) {
		if strings.TrimSpace(p.doc) == "" {
			t.Errorf("package %s has no doc comment", p.path)
		}
	}
}

// maxFileLines is the most lines a hand-written production file may have:
// a file past it holds more than one noun and is split by them.
const maxFileLines = 600

// TestFileSizes checks that no hand-written production Go file is longer
// than maxFileLines. Tests and generated code are exempt.
func TestFileSizes(t *testing.T) {
	root := "../.."
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if generated.MatchString(string(b[:min(len(b), 4096)])) {
			return nil
		}
		if n := bytes.Count(b, []byte("\n")); n > maxFileLines {
			rel, _ := filepath.Rel(root, path)
			t.Errorf("%s has %d lines: split it by noun (at most %d lines a file)", rel, n, maxFileLines)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk the module: %v", err)
	}
}

// generated matches the line Go's convention puts in generated files.
var generated = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)
