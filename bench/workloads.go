package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Workload names, as they appear in the table and in results.json.
const (
	WSeqWrite    = "seq-write"     // sequential write of a new file, fsync at the end (counted)
	WSeqRead     = "seq-read-cold" // sequential read with the page cache dropped first
	WReRead      = "re-read"       // sequential read of a file another process has just read whole (untimed)
	WRandRead    = "rand-read"     // every record once in random order (cold)
	WStrided     = "strided-read"  // read one record, skip one (cold)
	WRandWrite   = "rand-write"    // every record once in random order, fsync at the end
	WMixed       = "mixed-rw"      // random records, half read half written (cold)
	WSharedWrite = "shared-write"  // N processes writing disjoint ranges of one file
	WFairRead    = "fair-read"     // N concurrent cold readers of separate files: per-client MB/s

	WMdCreate       = "md-create"
	WMdStat         = "md-stat"
	WMdRead         = "md-read" // open + read of an empty file
	WMdRemove       = "md-remove"
	WMdMkdir        = "md-mkdir"
	WMdRmdir        = "md-rmdir"
	WMdCreateShared = "md-create-shared"
	WMdStatShared   = "md-stat-shared"
	WMdReadShared   = "md-read-shared"
	WMdRemoveShared = "md-remove-shared"
	WMdMkdirShared  = "md-mkdir-shared"
	WMdRmdirShared  = "md-rmdir-shared"

	// Small files, as many as the metadata workloads make empty ones, of
	// smallFileBytes each (mdtest -w/-e): written whole (create, write,
	// close) and read whole with the page cache dropped (open, read to
	// the end, close). Files per second.
	WMdSmallWrite    = "md-small-write"
	WMdSmallReadCold = "md-small-read-cold"

	smallFileBytes = 64 << 10

	WUntar      = "untar"       // unpack a generated source tarball (entries/s)
	WWalk       = "tree-walk"   // du-like lstat of every entry of the unpacked tree
	WTreeRemove = "tree-remove" // rm -r of the unpacked tree
)

// Groups of workloads for --workloads.
const (
	GroupData = "data"
	GroupMeta = "meta"
	GroupTree = "tree"
	GroupFair = "fair"
)

// dataWorkloads are the data workloads in the order they run for one record
// size and process count; each leaves the files the next one reads.
var dataWorkloads = []string{WSeqWrite, WSeqRead, WReRead, WRandRead, WStrided, WRandWrite, WMixed}

// coldWorkloads start from an empty page cache.
var coldWorkloads = map[string]bool{WSeqRead: true, WRandRead: true, WStrided: true, WMixed: true, WFairRead: true}

// writeWorkloads end with an fsync.
var writeWorkloads = map[string]bool{WSeqWrite: true, WRandWrite: true, WSharedWrite: true, WMixed: true}

// step is one measurement (or untimed setup) done on every target in turn.
type step struct {
	workload string
	group    string
	record   int64
	procs    int
	untimed  bool                         // setup or cleanup, not reported
	action   func(target string) error    // untimed steps without workers
	tasks    func(target string) []task   // one task per worker process
	prepare  func(target string) error    // untimed, before the workers start
	cleanup  func(target string) error    // untimed, after the workers
	cold     bool                         // drop caches before starting the workers
	paths    func(target string) []string // files to drop from the cache (non-root)
	fileSize int64                        // bytes per worker file (data)
	files    int                          // entries per worker (metadata, tarball)
	shared   bool                         // metadata in one shared directory
	fairness bool                         // report the spread of per-worker rates
}

// benchDir is where a run keeps its files below a target.
func benchDir(target string) string { return filepath.Join(target, "weft-bench") }

// fileSizeFor is the per-worker file size for a record size: size rounded
// down to whole records, at least one record.
func fileSizeFor(size, record int64) int64 {
	n := size / record * record
	if n < record {
		n = record
	}
	return n
}

// plan builds the ordered steps of a run.
func plan(cfg *Config) []step {
	var steps []step
	want := func(g string) bool { return cfg.wantGroup(g) }
	steps = append(steps, step{workload: "setup", untimed: true, action: func(target string) error {
		os.RemoveAll(benchDir(target))
		return os.MkdirAll(benchDir(target), 0o755)
	}})
	maxProcs := 0
	for _, p := range cfg.Procs {
		maxProcs = max(maxProcs, p)
	}
	if want(GroupData) || want(GroupFair) {
		for _, procs := range cfg.Procs {
			procs := procs
			ddir := func(target string) string { return filepath.Join(benchDir(target), fmt.Sprintf("data-p%d", procs)) }
			fileOf := func(target string, i int) string { return filepath.Join(ddir(target), fmt.Sprintf("f%d", i)) }
			paths := func(target string) []string {
				var ps []string
				for i := 0; i < procs; i++ {
					ps = append(ps, fileOf(target, i))
				}
				return ps
			}
			steps = append(steps, step{workload: "setup", untimed: true, action: func(target string) error {
				return os.MkdirAll(ddir(target), 0o755)
			}})
			if want(GroupData) {
				for _, rec := range cfg.Records {
					rec := rec
					fs := fileSizeFor(cfg.Size, rec)
					for _, w := range dataWorkloads {
						w := w
						steps = append(steps, step{workload: w, group: GroupData, record: rec, procs: procs, cold: coldWorkloads[w], paths: paths, fileSize: fs,
							tasks: func(target string) []task {
								ts := make([]task, procs)
								for i := range ts {
									ts[i] = task{Kind: w, Path: fileOf(target, i), Record: rec, Size: fs, Seed: uint64(i + 1), Truncate: w == WSeqWrite, Warm: w == WReRead}
								}
								return ts
							}})
					}
					if procs > 1 {
						shared := func(target string) string { return filepath.Join(ddir(target), "shared") }
						steps = append(steps, step{workload: WSharedWrite, group: GroupData, record: rec, procs: procs, fileSize: fs,
							prepare: func(target string) error {
								err := os.Remove(shared(target))
								if os.IsNotExist(err) {
									err = nil
								}
								return err
							},
							tasks: func(target string) []task {
								ts := make([]task, procs)
								for i := range ts {
									ts[i] = task{Kind: WSharedWrite, Path: shared(target), Record: rec, Size: fs, Offset: int64(i) * fs, Seed: uint64(i + 1)}
								}
								return ts
							},
							cleanup: func(target string) error { return os.Remove(shared(target)) }})
					}
				}
			}
			if want(GroupFair) && procs == maxProcs && procs > 1 {
				rec := min(int64(1<<20), cfg.Size)
				fs := fileSizeFor(cfg.Size, rec)
				if !want(GroupData) {
					steps = append(steps, step{workload: WSeqWrite, untimed: true, record: rec, procs: procs, fileSize: fs,
						tasks: func(target string) []task {
							ts := make([]task, procs)
							for i := range ts {
								ts[i] = task{Kind: WSeqWrite, Path: fileOf(target, i), Record: rec, Size: fs, Seed: uint64(i + 1), Truncate: true}
							}
							return ts
						}})
				}
				steps = append(steps, step{workload: WFairRead, group: GroupFair, record: rec, procs: procs, cold: true, paths: paths, fairness: true,
					tasks: func(target string) []task {
						ts := make([]task, procs)
						for i := range ts {
							// Each reader reads the whole of its file as it is now.
							r, fs := fileSizeNow(fileOf(target, i), rec)
							ts[i] = task{Kind: WFairRead, Path: fileOf(target, i), Record: r, Size: fs, Seed: uint64(i + 1)}
						}
						return ts
					}})
			}
			steps = append(steps, step{workload: "cleanup", untimed: true, action: func(target string) error {
				return os.RemoveAll(ddir(target))
			}})
		}
	}
	if want(GroupMeta) {
		for _, procs := range cfg.Procs {
			for _, shared := range []bool{false, true} {
				steps = append(steps, metaSteps(cfg, procs, shared)...)
			}
		}
	}
	if want(GroupWalk) && cfg.WalkFiles > 0 {
		steps = append(steps, walkSteps(cfg)...)
	}
	if want(GroupTree) {
		tdir := func(target string) string { return filepath.Join(benchDir(target), "tree") }
		steps = append(steps,
			step{workload: "setup", untimed: true, action: func(target string) error { return os.MkdirAll(tdir(target), 0o755) }},
			step{workload: WUntar, group: GroupTree, procs: 1, files: cfg.TarFiles,
				tasks: func(target string) []task {
					return []task{{Kind: WUntar, Path: tdir(target), Files: cfg.TarFiles, Seed: 1}}
				}},
			step{workload: WWalk, group: GroupTree, procs: 1, cold: true,
				tasks: func(target string) []task { return []task{{Kind: WWalk, Path: tdir(target)}} }},
			step{workload: WTreeRemove, group: GroupTree, procs: 1,
				tasks: func(target string) []task { return []task{{Kind: WTreeRemove, Path: tdir(target)}} }},
		)
	}
	steps = append(steps, step{workload: "cleanup", untimed: true, action: func(target string) error {
		return os.RemoveAll(benchDir(target))
	}})
	return steps
}

// fileSizeNow is the record (rec, or the file size when smaller) and the
// size of path rounded down to whole records.
func fileSizeNow(path string, rec int64) (int64, int64) {
	st, err := os.Stat(path)
	if err != nil || st.Size() == 0 {
		return rec, rec // the worker reports the missing or empty file
	}
	rec = min(rec, st.Size())
	return rec, fileSizeFor(st.Size(), rec)
}

// metaSteps are the mdtest-style phases for procs processes, each in its
// own directory or all in one shared directory.
func metaSteps(cfg *Config, procs int, shared bool) []step {
	suffix := ""
	if shared {
		suffix = "-shared"
	}
	base := func(target string) string {
		return filepath.Join(benchDir(target), fmt.Sprintf("md-p%d%s", procs, suffix))
	}
	dirOf := func(target string, i int) string {
		if shared {
			return base(target)
		}
		return filepath.Join(base(target), fmt.Sprintf("p%d", i))
	}
	var steps []step
	steps = append(steps, step{workload: "setup", untimed: true, action: func(target string) error {
		for i := 0; i < procs; i++ {
			if err := os.MkdirAll(dirOf(target, i), 0o755); err != nil {
				return err
			}
		}
		return nil
	}})
	for _, w := range []string{WMdCreate, WMdStat, WMdStatCold, WMdRead, WMdSmallWrite, WMdSmallReadCold, WMdRemove, WMdMkdir, WMdRmdir} {
		kind := w + suffix
		prefix := "f"
		switch w {
		case WMdMkdir, WMdRmdir:
			prefix = "d"
		case WMdSmallWrite, WMdSmallReadCold:
			prefix = "s" // left for the cleanup
		}
		var record int64
		if w == WMdSmallWrite || w == WMdSmallReadCold {
			record = smallFileBytes
		}
		steps = append(steps, step{workload: kind, group: GroupMeta, procs: procs, files: cfg.Files, shared: shared,
			cold: w == WMdStatCold || w == WMdSmallReadCold, record: record,
			tasks: func(target string) []task {
				ts := make([]task, procs)
				for i := range ts {
					ts[i] = task{Kind: kind, Path: dirOf(target, i), Files: cfg.Files, Prefix: fmt.Sprintf("p%d.%s", i, prefix)}
				}
				return ts
			}})
	}
	steps = append(steps, step{workload: "cleanup", untimed: true, action: func(target string) error {
		return os.RemoveAll(base(target))
	}})
	return steps
}

// isDataWorkload reports whether w moves file data (reported in MB/s;
// the others in operations per second).
func isDataWorkload(w string) bool {
	return !strings.HasPrefix(w, "md-") && w != WWalk && w != WTreeRemove && w != WUntar && w != WWalkLarge
}
