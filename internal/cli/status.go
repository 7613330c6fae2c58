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

	"github.com/weft-fs/weft/data"
	"github.com/weft-fs/weft/internal/rpc"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// rpcTimeout bounds one admin RPC.
const rpcTimeout = 10 * time.Second

func newStatusCmd() *cobra.Command {
	var metaAddr, dir string
	var asJSON, listChains bool
	cmd := &cobra.Command{
		Use:   "status (--meta ADDR | --dir DIR) [--chains] [--json]",
		Short: "Show the health of a cluster: servers, targets, chains, capacity, files",
		Long: `Show the health of a cluster in the spirit of ceph -s.

The health line is HEALTH_OK; HEALTH_WARN when the cluster runs with less
redundancy than asked (a data server offline, chains degraded or syncing) or
the meta service warns about something; HEALTH_ERR when a chain has no
serving member, so that the files on it cannot be read or written.

Chains are counted per replica count: healthy (every member serving),
degraded (a member offline or missing), syncing (a member copying what it
missed) and unavailable. While members sync, the bytes left and an estimate
of the time are shown. --chains lists every chain with its members.`,
		Args: noArgs,
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
			writeMetaServers(cmd.OutOrStdout(), st)
			if listChains {
				writeChainList(cmd.OutOrStdout(), st)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&metaAddr, "meta", "", "address of the meta service, host:port (or several, comma-separated: the first that answers)")
	fl.StringVar(&dir, "dir", "", "cluster directory of weft up (or a weft meta --dir) to find the meta service in")
	fl.BoolVar(&listChains, "chains", false, "list every chain with its version and members")
	fl.BoolVar(&asJSON, "json", false, "print machine-readable JSON (with every chain)")
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
	cc, err := rpc.Dial(data.MetaTarget(addr)) // a list: the first that answers
	if err != nil {
		return nil, nil, metaUnreachable(addr, err)
	}
	return weftv1.NewMetaClient(cc), func() { cc.Close() }, nil
}

// fetchStatus asks the meta service at addr for the cluster status.
func fetchStatus(ctx context.Context, addr string) (*weftv1.StatusResponse, error) {
	if strings.Contains(addr, ",") {
		return fetchStatusAny(ctx, addr) // statusmeta.go
	}
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
	fmt.Fprintf(w, "cluster:\n")
	fmt.Fprintf(w, "  id:       %s\n", st.GetClusterId())
	fmt.Fprintf(w, "  health:   %s\n", healthLine(st))
	fmt.Fprintf(w, "  engine:   %s\n", st.GetEngine())
	fmt.Fprintf(w, "  meta:     %s\n", addr)
	fmt.Fprintf(w, "\nservers: %d/%d online, %d chains\n", online, len(servers), st.GetChains())
	for _, s := range servers {
		state := "online"
		if retired(s) {
			state = "retired (every target removed)"
		} else if !s.GetOnline() {
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
			switch {
			case t.GetRemoved():
				tstate = "  REMOVED"
			case !t.GetOnline():
				tstate = "  OFFLINE"
			case t.GetFaultKind() != "":
				tstate = "  " + strings.ToUpper(t.GetFaultKind())
			}
			fmt.Fprintf(w, "    target %d  used %s, free %s of %s, %d chunks%s  %s\n", t.GetId(),
				formatSize(t.GetUsedBytes()), formatSize(t.GetFreeBytes()), formatSize(t.GetTotalBytes()), t.GetChunks(), tstate, t.GetPath())
			if k := t.GetFaultKind(); k != "" && !t.GetRemoved() {
				fmt.Fprintf(w, "      %s: %s\n", k, t.GetFault())
			}
			fmt.Fprintf(w, "      %s\n", scrubString(t))
		}
	}
	writeChainHealth(w, st)
	fmt.Fprintf(w, "\ncapacity: used %s, free %s of %s (online targets)\n",
		formatSize(st.GetUsedBytes()), formatSize(st.GetFreeBytes()), formatSize(st.GetTotalBytes()))
	fmt.Fprintf(w, "\nnamespace:\n")
	fmt.Fprintf(w, "  files:        %d\n", st.GetFiles())
	fmt.Fprintf(w, "  directories:  %d\n", st.GetDirectories())
	fmt.Fprintf(w, "  sessions:     %d\n", st.GetSessions())
	fmt.Fprintf(w, "  gc pending:   %d\n", st.GetGcPending())
	if ms := st.GetOpenGraceLeftMs(); ms > 0 {
		fmt.Fprintf(w, "  open grace:   %s left (the meta service did not stop cleanly: unlinked files are kept until clients have replayed their opens)\n",
			(time.Duration(ms) * time.Millisecond).Round(time.Second))
	}
	fmt.Fprintf(w, "  default layout: %s\n", layoutString(st.GetDefaultLayout()))
	writeSessionList(w, st)
}

// statusJSON is the --json form of weft status; field names are stable.
type statusJSON struct {
	ClusterID     string       `json:"cluster_id"`
	Health        string       `json:"health"`
	HealthReasons []string     `json:"health_reasons"`
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
	OpenGraceMs   int64        `json:"open_grace_left_ms,omitempty"`
	DefaultLayout *layoutJSON  `json:"default_layout,omitempty"`
	// ChainSummaries counts the chains of each replica count by health.
	ChainSummaries []chainSummaryJSON `json:"chain_summaries"`
	SyncBytesLeft  uint64             `json:"sync_bytes_left"`
	// SyncETAMs estimates the time the sync takes: 0 nothing left, -1
	// rate not known yet.
	SyncETAMs int64       `json:"sync_eta_ms"`
	Warnings  []string    `json:"warnings"`
	ChainList []chainJSON `json:"chain_list"`
	// SessionList lists the clients (statussessions.go).
	SessionList []sessionJSON `json:"session_list"`
	// MetaServers lists the live meta servers (statusmeta.go).
	MetaServers []metaServerJSON `json:"meta_servers"`
}

type chainSummaryJSON struct {
	Replicas    uint32 `json:"replicas"`
	Total       uint32 `json:"total"`
	Healthy     uint32 `json:"healthy"`
	Degraded    uint32 `json:"degraded"`
	Syncing     uint32 `json:"syncing"`
	Unavailable uint32 `json:"unavailable"`
}

type chainJSON struct {
	ID       uint64       `json:"id"`
	Version  uint64       `json:"version"`
	Replicas uint32       `json:"replicas"`
	State    string       `json:"state"`
	Members  []memberJSON `json:"members"`
}

type memberJSON struct {
	TargetID uint64 `json:"target_id"`
	ServerID uint64 `json:"server_id"`
	Address  string `json:"address"`
	State    string `json:"state"`
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
	Removed    bool   `json:"removed"`
	TotalBytes uint64 `json:"total_bytes"`
	FreeBytes  uint64 `json:"free_bytes"`
	UsedBytes  uint64 `json:"used_bytes"`
	Chunks     uint64 `json:"chunks"`
	// Background scrub counters as last reported.
	ScrubbedBytes uint64 `json:"scrubbed_bytes"`
	ScrubErrors   uint64 `json:"scrub_errors"`
	ScrubRepaired uint64 `json:"scrub_repaired"`
	// FaultKind is the target's disk fault ("read-only", "failed",
	// "full", "too small"; empty when none) and Fault what failed.
	FaultKind    string `json:"fault_kind,omitempty"`
	Fault        string `json:"fault,omitempty"`
	FaultSinceMs int64  `json:"fault_since_ms,omitempty"`
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
		Files: st.GetFiles(), Directories: st.GetDirectories(), Sessions: st.GetSessions(), GCPending: st.GetGcPending(), OpenGraceMs: st.GetOpenGraceLeftMs(),
		DefaultLayout:  toLayoutJSON(st.GetDefaultLayout()),
		ChainSummaries: []chainSummaryJSON{}, SyncBytesLeft: st.GetSyncBytesLeft(), SyncETAMs: st.GetSyncEtaMs(),
		Warnings: append([]string{}, st.GetWarnings()...), ChainList: []chainJSON{},
		SessionList: toSessionJSON(st), MetaServers: toMetaServerJSON(st),
	}
	out.Health, out.HealthReasons = clusterHealth(st)
	if out.HealthReasons == nil {
		out.HealthReasons = []string{}
	}
	for _, s := range st.GetChainSummaries() {
		out.ChainSummaries = append(out.ChainSummaries, chainSummaryJSON{Replicas: s.GetReplicas(), Total: s.GetTotal(),
			Healthy: s.GetHealthy(), Degraded: s.GetDegraded(), Syncing: s.GetSyncing(), Unavailable: s.GetUnavailable()})
	}
	for _, c := range st.GetChainList() {
		cj := chainJSON{ID: c.GetId(), Version: c.GetVersion(), Replicas: max(c.GetReplicas(), 1), State: chainState(c), Members: []memberJSON{}}
		for _, m := range c.GetMembers() {
			cj.Members = append(cj.Members, memberJSON{TargetID: m.GetTargetId(), ServerID: m.GetServerId(), Address: m.GetAddress(), State: m.GetState()})
		}
		out.ChainList = append(out.ChainList, cj)
	}
	sort.Slice(out.ChainList, func(i, j int) bool { return out.ChainList[i].ID < out.ChainList[j].ID })
	for _, s := range st.GetServers() {
		sj := serverJSON{ID: s.GetId(), Address: s.GetAddress(), Hostname: s.GetHostname(), Online: s.GetOnline(),
			LastHeartbeatMs: s.GetLastHeartbeatMs(), Site: s.GetSite(), Rack: s.GetRack(), Targets: []targetJSON{}}
		for _, t := range s.GetTargets() {
			sj.Targets = append(sj.Targets, targetJSON{ID: t.GetId(), Path: t.GetPath(), Online: t.GetOnline(), Removed: t.GetRemoved(),
				TotalBytes: t.GetTotalBytes(), FreeBytes: t.GetFreeBytes(), UsedBytes: t.GetUsedBytes(), Chunks: t.GetChunks(),
				ScrubbedBytes: t.GetScrubbedBytes(), ScrubErrors: t.GetScrubErrors(), ScrubRepaired: t.GetScrubRepaired(),
				FaultKind: t.GetFaultKind(), Fault: t.GetFault(), FaultSinceMs: t.GetFaultSinceMs()})
		}
		out.Servers = append(out.Servers, sj)
	}
	sort.Slice(out.Servers, func(i, j int) bool { return out.Servers[i].ID < out.Servers[j].ID })
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
