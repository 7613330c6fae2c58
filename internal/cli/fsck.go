package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// defaultFsckTimeout bounds a whole fsck run: it reads every record of the
// namespace and lists every chunk on every data server.
const defaultFsckTimeout = 6 * time.Hour

func newFsckCmd() *cobra.Command {
	var metaAddr, dir string
	var repair, asJSON bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "fsck (--meta ADDR | --dir DIR) [--repair] [--json]",
		Short: "Check the namespace and the chunks on the data servers (and repair them)",
		Long: `Check a running file system while it stays mounted and in use: directory
entries naming missing inodes, wrong link counts, inodes no entry names
(apart from files unlinked while open), directory parent records, the file
and directory counters, GC queue entries of live files, open records of
ended sessions, symbolic links without target, entry types; and on the data
servers, chunks that no file owns and chunks that some serving replicas of
their chain lack. Every finding is verified again against the current state
before it is reported, so files changing meanwhile are not reported.

--repair fixes what can be fixed safely: dangling entries are removed, link
counts, counters, entry types and parent records corrected, stale open
records dropped, inodes without a name moved to /lost+found (as #<ino>),
chunks of deleted inodes queued for the garbage collector and missing
replicas copied from a serving member. Chunks of live files are never
deleted.

Exit status: 0 when nothing is wrong (or everything was repaired), 1 when
problems remain, 2 when fsck could not run.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			addr, err := resolveMetaAddr(metaAddr, dir)
			if err != nil {
				var uerr *usageError
				if errors.As(err, &uerr) {
					return err
				}
				return fsckFailed{err}
			}
			return runFsck(cmd, addr, repair, asJSON, timeout)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&metaAddr, "meta", "", "address of the meta service, host:port")
	fl.StringVar(&dir, "dir", "", "cluster directory of weft up (or a weft meta --dir) to find the meta service in")
	fl.BoolVar(&repair, "repair", false, "repair what can be repaired safely")
	fl.BoolVar(&asJSON, "json", false, "print machine-readable JSON")
	fl.DurationVar(&timeout, "timeout", defaultFsckTimeout, "give up after this long")
	return cmd
}

// fsckFailed is an error that kept fsck from running: exit status 2 (1
// means that problems remain).
type fsckFailed struct{ err error }

func (e fsckFailed) Error() string { return e.err.Error() }
func (e fsckFailed) Unwrap() error { return e.err }

// ExitCode is the exit status of Main for this error.
func (e fsckFailed) ExitCode() int { return exitUsage }

// runFsck asks the meta service at addr for a fsck and prints the answer.
func runFsck(cmd *cobra.Command, addr string, repair, asJSON bool, timeout time.Duration) error {
	if timeout <= 0 {
		return usagef("--timeout must be positive, got %v", timeout)
	}
	mc, closeConn, err := dialMeta(addr)
	if err != nil {
		return fsckFailed{err}
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
	defer cancel()
	resp, err := mc.Fsck(ctx, &weftv1.FsckRequest{Repair: repair})
	if err != nil {
		switch status.Code(err) {
		case codes.Unavailable:
			return fsckFailed{metaUnreachable(addr, err)}
		case codes.Unimplemented:
			return fsckFailed{failure("fsck", errors.New("the meta service does not support fsck"), "upgrade weft meta")}
		case codes.DeadlineExceeded:
			return fsckFailed{failure("fsck", fmt.Errorf("no answer within %v", timeout), "give a longer --timeout")}
		}
		return fsckFailed{failure("fsck", errors.New(grpcMessage(err)), "see the meta service's log, then run weft fsck again")}
	}
	w := cmd.OutOrStdout()
	if asJSON {
		if err := writeFsckJSON(w, resp); err != nil {
			return fsckFailed{err}
		}
	} else {
		writeFsckText(w, resp, repair)
	}
	if left := fsckLeft(resp); left > 0 {
		todo := "run weft fsck --repair to fix what can be fixed"
		if repair {
			todo = "the lines above say what to do about each"
		}
		return failure("fsck", fmt.Errorf("%d %s left", left, choose(uint32(min(left, 2)), "problem", "problems")), todo)
	}
	return nil
}

// fsckLeft counts the problems not repaired (those not listed count too).
func fsckLeft(r *weftv1.FsckResponse) uint64 {
	left := r.GetProblemsNotListed()
	for _, p := range r.GetProblems() {
		if !p.GetRepaired() {
			left++
		}
	}
	return left
}

// writeFsckText prints a line per problem, then a summary.
func writeFsckText(w io.Writer, r *weftv1.FsckResponse, repair bool) {
	repaired := 0
	for _, p := range r.GetProblems() {
		state := ""
		switch {
		case p.GetRepaired():
			state = " [repaired]"
			repaired++
		case repair:
			state = " [not repaired]"
		}
		fmt.Fprintf(w, "%s: %s%s\n", p.GetKind(), p.GetDetail(), state)
	}
	total := uint64(len(r.GetProblems())) + r.GetProblemsNotListed()
	if n := r.GetProblemsNotListed(); n > 0 {
		fmt.Fprintf(w, "... and %d more %s not listed\n", n, choose(uint32(min(n, 2)), "problem", "problems"))
	}
	found := "no problems"
	if total > 0 {
		found = fmt.Sprintf("%d %s", total, choose(uint32(min(total, 2)), "problem", "problems"))
		if repair {
			found += fmt.Sprintf(", %d repaired", repaired)
		}
	}
	fmt.Fprintf(w, "checked %d inodes, %d entries, %d chunk copies in %v: %s\n",
		r.GetInodesChecked(), r.GetEntriesChecked(), r.GetChunksChecked(),
		(time.Duration(r.GetDurationMs()) * time.Millisecond).String(), found)
}

type fsckProblemJSON struct {
	Kind     string `json:"kind"`
	Ino      uint64 `json:"ino,omitempty"`
	Parent   uint64 `json:"parent,omitempty"`
	Name     string `json:"name,omitempty"`
	Detail   string `json:"detail"`
	Repaired bool   `json:"repaired"`
}

type fsckJSON struct {
	Problems          []fsckProblemJSON `json:"problems"`
	ProblemsNotListed uint64            `json:"problems_not_listed"`
	ProblemsLeft      uint64            `json:"problems_left"`
	InodesChecked     uint64            `json:"inodes_checked"`
	EntriesChecked    uint64            `json:"entries_checked"`
	ChunksChecked     uint64            `json:"chunks_checked"`
	DurationMs        int64             `json:"duration_ms"`
}

func writeFsckJSON(w io.Writer, r *weftv1.FsckResponse) error {
	out := fsckJSON{
		Problems: []fsckProblemJSON{}, ProblemsNotListed: r.GetProblemsNotListed(), ProblemsLeft: fsckLeft(r),
		InodesChecked: r.GetInodesChecked(), EntriesChecked: r.GetEntriesChecked(), ChunksChecked: r.GetChunksChecked(),
		DurationMs: r.GetDurationMs(),
	}
	for _, p := range r.GetProblems() {
		out.Problems = append(out.Problems, fsckProblemJSON{Kind: p.GetKind(), Ino: p.GetIno(), Parent: p.GetParent(),
			Name: p.GetName(), Detail: p.GetDetail(), Repaired: p.GetRepaired()})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
