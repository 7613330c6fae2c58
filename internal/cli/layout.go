package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func newLayoutCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "layout (get|set) PATH",
		Short: "Show or set how a file or directory is striped",
		Long: `Show or set the layout of PATH on a weft mount: chunk size (the stripe
unit), stripe count (how many chains a file spreads over) and replicas.

A directory's layout is the default for files and directories created in
it afterwards and is inherited down the tree; a regular file's layout can
only be set while the file is empty.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("weft layout needs a subcommand: get or set")
			}
			return usagef("unknown weft layout subcommand %q: use get or set", args[0])
		},
		RunE: func(cmd *cobra.Command, args []string) error { return nil },
	}
	cmd.AddCommand(newLayoutGetCmd(), newLayoutSetCmd())
	return cmd
}

func newLayoutGetCmd() *cobra.Command {
	var metaAddr string
	cmd := &cobra.Command{
		Use:   "get PATH",
		Short: "Show the layout of a file or directory on a weft mount",
		Args:  exactArgs(1, "a PATH on a weft mount"),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := resolveLayoutTarget(args[0], metaAddr)
			if err != nil {
				return err
			}
			mc, closeConn, err := dialMeta(t.metaAddr)
			if err != nil {
				return err
			}
			defer closeConn()
			ctx, cancel := context.WithTimeout(cmd.Context(), rpcTimeout)
			defer cancel()
			resp, err := mc.GetLayout(ctx, &weftv1.GetLayoutRequest{Caller: currentCaller(), Ino: t.ino})
			if err != nil {
				return layoutRPCError("get the layout of "+t.path, t.metaAddr, err)
			}
			writeLayout(cmd.OutOrStdout(), t, resp)
			return nil
		},
	}
	cmd.Flags().StringVar(&metaAddr, "meta", "", "address of the meta service (default: the one of the mount holding PATH)")
	return cmd
}

func newLayoutSetCmd() *cobra.Command {
	var metaAddr, chunkSize string
	var stripeCount, replicas uint32
	cmd := &cobra.Command{
		Use:   "set PATH [--stripe-count N] [--chunk-size S] [--replicas R]",
		Short: "Set the layout of a directory (for new children) or of an empty file",
		Args:  exactArgs(1, "a PATH on a weft mount"),
		RunE: func(cmd *cobra.Command, args []string) error {
			fl := cmd.Flags()
			if !fl.Changed("stripe-count") && !fl.Changed("chunk-size") && !fl.Changed("replicas") {
				return usagef("say what to set: --stripe-count N, --chunk-size S and/or --replicas R")
			}
			want := &weftv1.Layout{}
			if fl.Changed("chunk-size") {
				v, err := parseSize(chunkSize)
				if err != nil {
					return usagef("--chunk-size: %v", err)
				}
				if v == 0 || v > math.MaxUint32 {
					return usagef("--chunk-size %s is not allowed: it must be a power of two from 64KiB to 64MiB", chunkSize)
				}
				want.ChunkSize = uint32(v)
			}
			if fl.Changed("stripe-count") {
				if stripeCount == 0 {
					return usagef("--stripe-count must be at least 1")
				}
				want.StripeCount = stripeCount
			}
			if fl.Changed("replicas") {
				if replicas == 0 {
					return usagef("--replicas must be at least 1")
				}
				want.Replicas = replicas
			}
			t, err := resolveLayoutTarget(args[0], metaAddr)
			if err != nil {
				return err
			}
			if want.Replicas > 1 && want.Replicas <= maxReplicas {
				if err := checkReplicas(cmd, t, want.Replicas); err != nil {
					return err
				}
			}
			mc, closeConn, err := dialMeta(t.metaAddr)
			if err != nil {
				return err
			}
			defer closeConn()
			ctx, cancel := context.WithTimeout(cmd.Context(), rpcTimeout)
			defer cancel()
			if _, err := mc.SetLayout(ctx, &weftv1.SetLayoutRequest{Caller: currentCaller(), Ino: t.ino, Layout: want}); err != nil {
				return layoutRPCError("set the layout of "+t.path, t.metaAddr, err)
			}
			resp, err := mc.GetLayout(ctx, &weftv1.GetLayoutRequest{Caller: currentCaller(), Ino: t.ino})
			if err != nil {
				return layoutRPCError("get the layout of "+t.path, t.metaAddr, err)
			}
			writeLayout(cmd.OutOrStdout(), t, resp)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&metaAddr, "meta", "", "address of the meta service (default: the one of the mount holding PATH)")
	fl.Uint32Var(&stripeCount, "stripe-count", 0, "number of chains a file is striped over")
	fl.StringVar(&chunkSize, "chunk-size", "", "chunk (stripe unit) size, e.g. 64KiB, 1MiB, 4M")
	fl.Uint32Var(&replicas, "replicas", 0, "copies of every chunk")
	return cmd
}

// checkReplicas refuses a replica count the cluster cannot hold (fewer
// targets than copies), and warns when copies would have to share a data
// server.
func checkReplicas(cmd *cobra.Command, t layoutTarget, replicas uint32) error {
	st, err := fetchStatus(cmd.Context(), t.metaAddr)
	if err != nil {
		return err
	}
	targets := len(targetIDs(st))
	if targets < int(replicas) {
		return failure("set the layout of "+t.path,
			fmt.Errorf("%d replicas need at least %d data targets, and the cluster has %d", replicas, replicas, targets),
			"start more data servers (weft data --meta "+t.metaAddr+" ...) or ask for fewer replicas")
	}
	if servers := len(st.GetServers()); servers < int(replicas) {
		fmt.Fprintf(cmd.ErrOrStderr(), "weft: warning: %d replicas on %d data servers: some copies share a server, and losing it loses them all; add data servers to spread them\n",
			replicas, servers)
	}
	return nil
}

// layoutTarget is a PATH resolved to its weft inode and meta service.
type layoutTarget struct {
	path     string
	ino      uint64
	isDir    bool
	metaAddr string
}

// resolveLayoutTarget finds the inode of path (st_ino on a weft mount is
// the weft inode number) and the meta service of its mount.
func resolveLayoutTarget(path, metaAddr string) (layoutTarget, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return layoutTarget{}, failure("stat "+path, err, "give a file or directory on a weft mount")
	}
	t := layoutTarget{path: path, ino: st.Ino, isDir: st.Mode&syscall.S_IFMT == syscall.S_IFDIR, metaAddr: metaAddr}
	if metaAddr != "" {
		return t, nil
	}
	abs, err := filepath.Abs(path)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return t, failure("resolve "+path, err, "give a file or directory on a weft mount")
	}
	mp, err := findWeftMount(abs)
	if err != nil {
		return t, failure("find the weft mount of "+path, err, "give a path on a weft mount, or the meta service with --meta ADDR")
	}
	rec, err := readMountRecord(mp)
	if err != nil {
		return t, failure("find the meta service of the mount "+mp, err, "give it with --meta ADDR")
	}
	t.metaAddr = rec.MetaAddr
	return t, nil
}

// currentCaller identifies this process to the meta service.
func currentCaller() *weftv1.Caller {
	c := &weftv1.Caller{Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid()), Pid: uint32(os.Getpid())}
	if groups, err := os.Getgroups(); err == nil {
		for _, g := range groups {
			c.Groups = append(c.Groups, uint32(g))
		}
	}
	return c
}

// layoutRPCError explains a failed layout RPC: the meta service's own
// message for invalid values (it names the allowed range).
func layoutRPCError(what, addr string, err error) error {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return metaUnreachable(addr, err)
	}
	msg := errors.New(grpcMessage(err))
	switch {
	case errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES):
		return failure(what, msg, "only the owner (or root) may change a layout")
	case errors.Is(err, syscall.ENOENT):
		return failure(what, msg, "the file was removed; check the path")
	case errors.Is(err, syscall.EINVAL), status.Code(err) == codes.InvalidArgument:
		return failure(what, msg, "choose values in the allowed range")
	}
	return failure(what, msg, "check the meta service's log")
}

// writeLayout prints a layout for a person.
func writeLayout(w io.Writer, t layoutTarget, resp *weftv1.GetLayoutResponse) {
	l := resp.GetLayout()
	kind := "file"
	if t.isDir {
		kind = "directory"
		l = resp.GetEffective()
		if l == nil {
			l = resp.GetLayout()
		}
	}
	fmt.Fprintf(w, "path:          %s\n", t.path)
	fmt.Fprintf(w, "inode:         %d\n", t.ino)
	fmt.Fprintf(w, "type:          %s\n", kind)
	if t.isDir {
		if resp.GetHasOwn() {
			fmt.Fprintf(w, "layout:        own (new files and directories in it get it)\n")
		} else {
			fmt.Fprintf(w, "layout:        inherited (from the nearest parent with a layout, or the cluster default)\n")
		}
	}
	fmt.Fprintf(w, "chunk size:    %s\n", formatSize(uint64(l.GetChunkSize())))
	fmt.Fprintf(w, "stripe count:  %d\n", l.GetStripeCount())
	fmt.Fprintf(w, "replicas:      %d\n", l.GetReplicas())
	if l.GetPool() != "" {
		fmt.Fprintf(w, "pool:          %s\n", l.GetPool())
	}
	if !t.isDir {
		chains := make([]string, 0, len(l.GetChains()))
		for _, c := range l.GetChains() {
			chains = append(chains, fmt.Sprint(c))
		}
		if len(chains) == 0 {
			chains = append(chains, "(none yet)")
		}
		fmt.Fprintf(w, "chains:        %s\n", strings.Join(chains, ", "))
	}
}
