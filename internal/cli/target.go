package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func newTargetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "target remove ID",
		Short: "Manage the data targets (disk directories) of a cluster",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("weft target needs a subcommand: remove")
			}
			return usagef("unknown weft target subcommand %q: use remove", args[0])
		},
		RunE: func(cmd *cobra.Command, args []string) error { return nil },
	}
	cmd.AddCommand(newTargetRemoveCmd())
	return cmd
}

func newTargetRemoveCmd() *cobra.Command {
	var metaAddr, dir string
	cmd := &cobra.Command{
		Use:   "remove ID (--meta ADDR | --dir DIR)",
		Short: "Take a target out of its chains now and re-replicate its data elsewhere",
		Long: `Take the target ID (as weft status lists it) out of every replicated chain
at once, as if it had been offline for longer than the repair delay: each of
its chains gets another target, which copies the chain's data from a serving
member in the background. Use it for a disk or server that is gone for good.

A target that still holds the only up-to-date copy of a chain stays in it
until another member has synced. Files with replicas 1 have no other copy:
they stay on the target.`,
		Args: exactArgs(1, "the target ID (see weft status)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil {
				return usagef("target ID %q is not a number: give the id weft status shows (target N)", args[0])
			}
			addr, err := resolveMetaAddr(metaAddr, dir)
			if err != nil {
				return err
			}
			return removeTarget(cmd, addr, dir, id)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&metaAddr, "meta", "", "address of the meta service, host:port")
	fl.StringVar(&dir, "dir", "", "cluster directory of weft up (or a weft meta --dir) to find the meta service in")
	return cmd
}

// removeTarget checks that target id exists, removes it and tells what
// happens next.
func removeTarget(cmd *cobra.Command, addr, dir string, id uint64) error {
	what := fmt.Sprintf("remove target %d", id)
	st, err := fetchStatus(cmd.Context(), addr)
	if err != nil {
		return err
	}
	known := targetIDs(st)
	if !slices.Contains(known, id) {
		return unknownTarget(what, id, known)
	}
	already := false
	for _, s := range st.GetServers() {
		for _, t := range s.GetTargets() {
			if t.GetId() == id && t.GetRemoved() {
				already = true
			}
		}
	}
	mc, closeConn, err := dialMeta(addr)
	if err != nil {
		return err
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(cmd.Context(), rpcTimeout)
	defer cancel()
	resp, err := mc.RemoveTarget(ctx, &weftv1.RemoveTargetRequest{TargetId: id})
	if err != nil {
		switch {
		case status.Code(err) == codes.Unavailable || status.Code(err) == codes.DeadlineExceeded:
			return metaUnreachable(addr, err)
		case errors.Is(err, syscall.ENOENT):
			return unknownTarget(what, id, known)
		}
		return failure(what, errors.New(grpcMessage(err)), "check the meta service's log, then try again")
	}
	where := "--meta " + addr
	if dir != "" {
		where = "--dir " + dir
	}
	w := cmd.OutOrStdout()
	if already {
		fmt.Fprintf(w, "target %d was already removed; its chains were checked again: %d %s changed\n", id, resp.GetChainsChanged(), plural(resp.GetChainsChanged(), "chain"))
	} else {
		fmt.Fprintf(w, "target %d removed: %d %s changed\n", id, resp.GetChainsChanged(), plural(resp.GetChainsChanged(), "chain"))
	}
	if after, err := fetchStatus(cmd.Context(), addr); err == nil {
		writeRemoval(w, id, st, after, addr)
	}
	fmt.Fprintf(w, "watch the re-replication progress with: weft status %s\n", where)
	return nil
}

// writeRemoval tells what became of the chains that held target id,
// comparing the chain lists before and after its removal.
func writeRemoval(w io.Writer, id uint64, before, after *weftv1.StatusResponse, addr string) {
	now := make(map[uint64]*weftv1.Chain)
	for _, c := range after.GetChainList() {
		now[c.GetId()] = c
	}
	var replaced, stuck, kept, rebuilt, dropped uint32
	var single []string
	for _, c := range before.GetChainList() {
		if !hasMember(c, id) {
			continue
		}
		if c.GetReplicas() <= 1 {
			single = append(single, strconv.FormatUint(c.GetId(), 10))
			continue
		}
		n := now[c.GetId()]
		switch {
		case n == nil:
			dropped++ // an unused chain it was the home of
		case hasMember(n, id):
			kept++
		case addedSyncing(c, n):
			replaced++
		case uint32(len(n.GetMembers())) >= n.GetReplicas():
			rebuilt++ // unused: planned again over the other targets
		default:
			stuck++
		}
	}
	if replaced > 0 {
		fmt.Fprintf(w, "  %d %s got a new member, which copies the data in the background\n", replaced, plural(replaced, "chain"))
	}
	if rebuilt > 0 {
		fmt.Fprintf(w, "  %d unused %s (no file on %s yet) rebuilt over the other targets\n",
			rebuilt, plural(rebuilt, "chain"), choose(rebuilt, "it", "them"))
	}
	if dropped > 0 {
		fmt.Fprintf(w, "  %d unused %s it headed dropped\n", dropped, plural(dropped, "chain"))
	}
	if kept > 0 {
		fmt.Fprintf(w, "  %d %s keep it until another member has synced: it holds their only up-to-date copy\n", kept, plural(kept, "chain"))
	}
	if stuck > 0 {
		fmt.Fprintf(w, "  %d %s found no target to replace it and stay degraded: add data servers (weft data --meta %s ...)\n",
			stuck, plural(stuck, "chain"), addr)
	}
	if len(single) > 0 {
		fmt.Fprintf(w, "  files with replicas 1 on it (%s %s) have no other copy: they stay on target %d\n",
			plural(uint32(len(single)), "chain"), strings.Join(single, ", "), id)
	}
}

// hasMember reports whether target id is a member of c.
func hasMember(c *weftv1.Chain, id uint64) bool {
	for _, m := range c.GetMembers() {
		if m.GetTargetId() == id {
			return true
		}
	}
	return false
}

// addedSyncing reports whether after has a syncing member that before
// did not have.
func addedSyncing(before, after *weftv1.Chain) bool {
	for _, m := range after.GetMembers() {
		if m.GetState() == "syncing" && !hasMember(before, m.GetTargetId()) {
			return true
		}
	}
	return false
}

// targetIDs lists the ids of the targets in st, in increasing order.
func targetIDs(st *weftv1.StatusResponse) []uint64 {
	var ids []uint64
	for _, s := range st.GetServers() {
		for _, t := range s.GetTargets() {
			ids = append(ids, t.GetId())
		}
	}
	slices.Sort(ids)
	return ids
}

// unknownTarget explains that id is not a target of the cluster.
func unknownTarget(what string, id uint64, known []uint64) error {
	if len(known) == 0 {
		return failure(what, fmt.Errorf("no target %d: the cluster has no targets yet", id), "start data servers first")
	}
	list := make([]string, len(known))
	for i, k := range known {
		list[i] = strconv.FormatUint(k, 10)
	}
	return failure(what, fmt.Errorf("no target %d: the cluster's targets are %s", id, strings.Join(list, ", ")),
		"give one of them (weft status lists every target with its server)")
}
