package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/internal/rpc"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// rpcTimeout bounds one admin RPC.
const rpcTimeout = 10 * time.Second

func newStatusCmd() *cobra.Command {
	var metaAddr, dir string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status (--meta ADDR | --dir DIR) [--json]",
		Short: "Show the health of a cluster: servers, targets, capacity, files",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			addr, err := resolveMetaAddr(metaAddr, dir)
			if err != nil {
				return err
			}
			st, err := fetchStatus(cmd.Context(), addr)
			if err != nil {
				return err
			}
			if asJSON {
				return writeStatusJSON(cmd.OutOrStdout(), addr, st)
			}
			writeStatusText(cmd.OutOrStdout(), addr, st)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&metaAddr, "meta", "", "address of the meta service, host:port")
	fl.StringVar(&dir, "dir", "", "cluster directory of weft up (or a weft meta --dir) to find the meta service in")
	fl.BoolVar(&asJSON, "json", false, "print machine-readable JSON")
	return cmd
}

// resolveMetaAddr returns --meta, or the address recorded under --dir (a
// weft up cluster directory D, whose meta service writes D/meta/address,
// or a weft meta directory).
func resolveMetaAddr(metaAddr, dir string) (string, error) {
	switch {
	case metaAddr != "" && dir != "":
		return "", usagef("give either --meta or --dir, not both")
	case metaAddr != "":
		return metaAddr, nil
	case dir == "":
		return "", usagef("say which cluster: --meta ADDR (the meta service's host:port) or --dir DIR (a weft up directory)")
	}
	var lastErr error
	for _, d := range []string{filepath.Join(dir, "meta"), dir} {
		addr, err := readAddressFile(d)
		if err == nil {
			return addr, nil
		}
		if lastErr == nil || !errors.Is(err, fs.ErrNotExist) {
			lastErr = err
		}
	}
	if errors.Is(lastErr, fs.ErrNotExist) {
		lastErr = fmt.Errorf("%s does not exist", filepath.Join(dir, "meta", addressFileName))
	}
	return "", failure("find the meta service of "+dir, lastErr, "is it a weft up directory? start the cluster with weft up --dir "+dir+" or give --meta ADDR")
}

// dialMeta connects to the meta service at addr.
func dialMeta(addr string) (weftv1.MetaClient, func(), error) {
	cc, err := rpc.Dial(addr)
	if err != nil {
		return nil, nil, metaUnreachable(addr, err)
	}
	return weftv1.NewMetaClient(cc), func() { cc.Close() }, nil
}

// fetchStatus asks the meta service at addr for the cluster status.
func fetchStatus(ctx context.Context, addr string) (*weftv1.StatusResponse, error) {
	mc, closeConn, err := dialMeta(addr)
	if err != nil {
		return nil, err
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	st, err := mc.Status(ctx, &weftv1.StatusRequest{})
	if err != nil {
		return nil, metaUnreachable(addr, err)
	}
	return st, nil
}

// grpcMessage is the message of a gRPC error without the "rpc error: code
// = ..." decoration.
func grpcMessage(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Message()
	}
	return err.Error()
}

// onlineCount counts the online servers of st.
func onlineCount(st *weftv1.StatusResponse) int {
	n := 0
	for _, s := range st.GetServers() {
		if s.GetOnline() {
			n++
		}
	}
	return n
}

// layoutString describes a layout on one line.
func layoutString(l *weftv1.Layout) string {
	if l == nil {
		return "(none)"
	}
	s := fmt.Sprintf("chunk size %s, stripe count %d, replicas %d", formatSize(uint64(l.GetChunkSize())), l.GetStripeCount(), l.GetReplicas())
	if l.GetPool() != "" {
		s += ", pool " + l.GetPool()
	}
	return s
}

// writeStatusText prints st for a person, in the spirit of ceph -s.
func writeStatusText(w io.Writer, addr string, st *weftv1.StatusResponse) {
	servers := append([]*weftv1.ServerStatus(nil), st.GetServers()...)
	sort.Slice(servers, func(i, j int) bool { return servers[i].GetId() < servers[j].GetId() })
	online := onlineCount(st)
	health := "HEALTH_OK"
	switch {
	case len(servers) == 0:
		health = "HEALTH_WARN: no data servers registered"
	case online < len(servers):
		health = fmt.Sprintf("HEALTH_WARN: %d of %d data servers offline", len(servers)-online, len(servers))
	}
	fmt.Fprintf(w, "cluster:\n")
	fmt.Fprintf(w, "  id:       %s\n", st.GetClusterId())
	fmt.Fprintf(w, "  health:   %s\n", health)
	fmt.Fprintf(w, "  engine:   %s\n", st.GetEngine())
	fmt.Fprintf(w, "  meta:     %s\n", addr)
	fmt.Fprintf(w, "\nservers: %d/%d online, %d chains\n", online, len(servers), st.GetChains())
	for _, s := range servers {
		state := "online"
		if !s.GetOnline() {
			state = "OFFLINE"
			if ms := s.GetLastHeartbeatMs(); ms > 0 {
				state += fmt.Sprintf(" (last heartbeat %s ago)", (time.Duration(ms) * time.Millisecond).Round(time.Second))
			}
		}
		var where []string
		if h := s.GetHostname(); h != "" {
			where = append(where, "host "+h)
		}
		if s.GetSite() != "" {
			where = append(where, "site "+s.GetSite())
		}
		if s.GetRack() != "" {
			where = append(where, "rack "+s.GetRack())
		}
		line := fmt.Sprintf("  server %d  %-21s  %s", s.GetId(), s.GetAddress(), state)
		if len(where) > 0 {
			line += "  (" + strings.Join(where, ", ") + ")"
		}
		fmt.Fprintln(w, line)
		for _, t := range s.GetTargets() {
			tstate := ""
			if !t.GetOnline() {
				tstate = "  OFFLINE"
			}
			fmt.Fprintf(w, "    target %d  used %s, free %s of %s, %d chunks%s  %s\n", t.GetId(),
				formatSize(t.GetUsedBytes()), formatSize(t.GetFreeBytes()), formatSize(t.GetTotalBytes()), t.GetChunks(), tstate, t.GetPath())
		}
	}
	fmt.Fprintf(w, "\ncapacity: used %s, free %s of %s (online targets)\n",
		formatSize(st.GetUsedBytes()), formatSize(st.GetFreeBytes()), formatSize(st.GetTotalBytes()))
	fmt.Fprintf(w, "\nnamespace:\n")
	fmt.Fprintf(w, "  files:        %d\n", st.GetFiles())
	fmt.Fprintf(w, "  directories:  %d\n", st.GetDirectories())
	fmt.Fprintf(w, "  sessions:     %d\n", st.GetSessions())
	fmt.Fprintf(w, "  gc pending:   %d\n", st.GetGcPending())
	fmt.Fprintf(w, "  default layout: %s\n", layoutString(st.GetDefaultLayout()))
}

// statusJSON is the --json form of weft status; field names are stable.
type statusJSON struct {
	ClusterID     string       `json:"cluster_id"`
	Engine        string       `json:"engine"`
	MetaAddress   string       `json:"meta_address"`
	ServersOnline int          `json:"servers_online"`
	ServersTotal  int          `json:"servers_total"`
	Servers       []serverJSON `json:"servers"`
	Chains        uint64       `json:"chains"`
	TotalBytes    uint64       `json:"total_bytes"`
	FreeBytes     uint64       `json:"free_bytes"`
	UsedBytes     uint64       `json:"used_bytes"`
	Files         uint64       `json:"files"`
	Directories   uint64       `json:"directories"`
	Sessions      uint64       `json:"sessions"`
	GCPending     uint64       `json:"gc_pending"`
	DefaultLayout *layoutJSON  `json:"default_layout,omitempty"`
}

type serverJSON struct {
	ID              uint64       `json:"id"`
	Address         string       `json:"address"`
	Hostname        string       `json:"hostname"`
	Online          bool         `json:"online"`
	LastHeartbeatMs int64        `json:"last_heartbeat_age_ms"`
	Site            string       `json:"site,omitempty"`
	Rack            string       `json:"rack,omitempty"`
	Targets         []targetJSON `json:"targets"`
}

type targetJSON struct {
	ID         uint64 `json:"id"`
	Path       string `json:"path"`
	Online     bool   `json:"online"`
	TotalBytes uint64 `json:"total_bytes"`
	FreeBytes  uint64 `json:"free_bytes"`
	UsedBytes  uint64 `json:"used_bytes"`
	Chunks     uint64 `json:"chunks"`
}

type layoutJSON struct {
	ChunkSize   uint32   `json:"chunk_size"`
	StripeCount uint32   `json:"stripe_count"`
	Replicas    uint32   `json:"replicas"`
	Pool        string   `json:"pool,omitempty"`
	Chains      []uint64 `json:"chains,omitempty"`
}

func toLayoutJSON(l *weftv1.Layout) *layoutJSON {
	if l == nil {
		return nil
	}
	return &layoutJSON{ChunkSize: l.GetChunkSize(), StripeCount: l.GetStripeCount(), Replicas: l.GetReplicas(), Pool: l.GetPool(), Chains: l.GetChains()}
}

func writeStatusJSON(w io.Writer, addr string, st *weftv1.StatusResponse) error {
	out := statusJSON{
		ClusterID: st.GetClusterId(), Engine: st.GetEngine(), MetaAddress: addr,
		ServersOnline: onlineCount(st), ServersTotal: len(st.GetServers()), Servers: []serverJSON{},
		Chains: st.GetChains(), TotalBytes: st.GetTotalBytes(), FreeBytes: st.GetFreeBytes(), UsedBytes: st.GetUsedBytes(),
		Files: st.GetFiles(), Directories: st.GetDirectories(), Sessions: st.GetSessions(), GCPending: st.GetGcPending(),
		DefaultLayout: toLayoutJSON(st.GetDefaultLayout()),
	}
	for _, s := range st.GetServers() {
		sj := serverJSON{ID: s.GetId(), Address: s.GetAddress(), Hostname: s.GetHostname(), Online: s.GetOnline(),
			LastHeartbeatMs: s.GetLastHeartbeatMs(), Site: s.GetSite(), Rack: s.GetRack(), Targets: []targetJSON{}}
		for _, t := range s.GetTargets() {
			sj.Targets = append(sj.Targets, targetJSON{ID: t.GetId(), Path: t.GetPath(), Online: t.GetOnline(),
				TotalBytes: t.GetTotalBytes(), FreeBytes: t.GetFreeBytes(), UsedBytes: t.GetUsedBytes(), Chunks: t.GetChunks()})
		}
		out.Servers = append(out.Servers, sj)
	}
	sort.Slice(out.Servers, func(i, j int) bool { return out.Servers[i].ID < out.Servers[j].ID })
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
