package cli

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/internal/rpc"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func newScrubCmd() *cobra.Command {
	var metaAddr, dir string
	var serverID uint64
	cmd := &cobra.Command{
		Use:   "scrub (--meta ADDR | --dir DIR) [--server ID]",
		Short: "Verify every chunk now and repair bad copies from good replicas",
		Long: `Run a scrub pass now on every online data server (or only on --server ID,
as weft status lists them), instead of waiting for the background scrub: each
server re-reads every chunk of its targets at full speed, checks it against
its checksums, and replaces a bad copy (bit rot, a truncated or damaged chunk
file) with a serving replica's copy before it answers. The servers are
scrubbed one after another; for each, the chunks and bytes verified, the bad
copies found and those repaired are printed.

The exit status is non-zero if a server could not be scrubbed or a bad copy
could not be repaired (files with replicas 1 have no other copy).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			addr, err := resolveMetaAddr(metaAddr, dir)
			if err != nil {
				return err
			}
			return runScrub(cmd, addr, serverID)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&metaAddr, "meta", "", "address of the meta service, host:port")
	fl.StringVar(&dir, "dir", "", "cluster directory of weft up (or a weft meta --dir) to find the meta service in")
	fl.Uint64Var(&serverID, "server", 0, "scrub only the data server with this id (see weft status); default: every online one")
	return cmd
}

// runScrub asks the meta service at addr for the data servers and runs a
// scrub pass on each online one (or on server id only).
func runScrub(cmd *cobra.Command, addr string, id uint64) error {
	st, err := fetchStatus(cmd.Context(), addr)
	if err != nil {
		return err
	}
	var servers []*weftv1.ServerStatus
	var known []string
	for _, s := range st.GetServers() {
		known = append(known, strconv.FormatUint(s.GetId(), 10))
		if id != 0 && s.GetId() != id {
			continue
		}
		if !s.GetOnline() {
			if id != 0 {
				return failure(fmt.Sprintf("scrub data server %d", id), fmt.Errorf("it is offline (%s)", s.GetAddress()),
					"start it again, or scrub the others (weft scrub without --server)")
			}
			continue
		}
		servers = append(servers, s)
	}
	switch {
	case id != 0 && len(servers) == 0 && len(known) == 0:
		return failure(fmt.Sprintf("scrub data server %d", id), errors.New("the cluster has no data servers yet"), "start data servers first")
	case id != 0 && len(servers) == 0:
		return failure(fmt.Sprintf("scrub data server %d", id), fmt.Errorf("no data server %d: the cluster's data servers are %s", id, strings.Join(known, ", ")),
			"give one of them (weft status lists them)")
	case len(servers) == 0:
		return failure("scrub", errors.New("no data server is online"), "start the data servers (weft data ...), then scrub again")
	}

	w := cmd.OutOrStdout()
	var total weftv1.ScrubResponse
	var failed []string
	for _, s := range servers {
		resp, err := scrubServer(cmd, s)
		if err != nil {
			if cmd.Context().Err() != nil {
				return failure("scrub", cmd.Context().Err(), "")
			}
			fmt.Fprintf(w, "data server %d (%s): scrub failed: %s\n", s.GetId(), s.GetAddress(), oneLine(err.Error()))
			failed = append(failed, strconv.FormatUint(s.GetId(), 10))
			continue
		}
		writeScrubLine(w, fmt.Sprintf("data server %d (%s)", s.GetId(), s.GetAddress()), resp)
		for _, u := range resp.GetUnrepaired() {
			fmt.Fprintf(w, "  not repaired: chunk %d of inode %d on target %d (%s): %s; %s\n",
				u.GetChunk().GetIndex(), u.GetChunk().GetIno(), u.GetTargetId(), u.GetTargetDir(),
				oneLine(u.GetProblem()), oneLine(u.GetReason()))
		}
		total.Chunks += resp.GetChunks()
		total.Bytes += resp.GetBytes()
		total.Errors += resp.GetErrors()
		total.Repaired += resp.GetRepaired()
	}
	if len(servers) > 1 {
		writeScrubLine(w, fmt.Sprintf("total (%d data servers)", len(servers)-len(failed)), &total)
	}
	switch {
	case len(failed) > 0:
		return failure("scrub", fmt.Errorf("data %s %s could not be scrubbed", choose(uint32(min(len(failed), 2)), "server", "servers"), strings.Join(failed, ", ")),
			"see the error above and the data server's log, then scrub again")
	case total.Errors > total.Repaired:
		left := total.Errors - total.Repaired
		return failure("scrub", fmt.Errorf("%d bad %s could not be repaired", left, choose(uint32(min(left, 2)), "copy", "copies")),
			"the lines \"not repaired\" above name each and why: a chain with no other good replica (replicas 1) cannot repair them; restore those files from a backup, or bring their chains' other replicas back and scrub again")
	}
	return nil
}

// scrubServer runs a scrub pass on data server s and returns its counts.
func scrubServer(cmd *cobra.Command, s *weftv1.ServerStatus) (*weftv1.ScrubResponse, error) {
	cc, err := rpc.Dial(s.GetAddress())
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer cc.Close()
	resp, err := weftv1.NewDataClient(cc).Scrub(cmd.Context(), &weftv1.ScrubRequest{})
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			return nil, errors.New("this data server does not support weft scrub: upgrade it (its background scrub still runs)")
		}
		return nil, errors.New(grpcMessage(err))
	}
	return resp, nil
}

// writeScrubLine prints what a scrub pass found.
func writeScrubLine(w io.Writer, who string, r *weftv1.ScrubResponse) {
	fmt.Fprintf(w, "%s: %d %s, %s verified, %d bad %s found, %d repaired\n", who,
		r.GetChunks(), choose(uint32(min(r.GetChunks(), 2)), "chunk", "chunks"), formatSize(r.GetBytes()),
		r.GetErrors(), choose(uint32(min(r.GetErrors(), 2)), "copy", "copies"), r.GetRepaired())
}
