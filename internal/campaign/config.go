package campaign

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Kind is a kind of fault the campaign injects.
type Kind string

// The fault kinds. A process fault picks one process of its class; a
// network fault one proxied server (see README.md, "Network").
const (
	// DataKill kills a data server with SIGKILL and restarts it, after
	// the fault's duration, on the same ports.
	DataKill Kind = "data-kill"
	// DataNewPort kills a data server with SIGKILL and restarts it after
	// the fault's duration on new ports (as weft up's supervisor does).
	DataNewPort Kind = "data-newport"
	// DataStop stops a data server cleanly (SIGTERM) and restarts it on
	// the same ports.
	DataStop Kind = "data-stop"
	// DataPause stops a data server's process (SIGSTOP) and continues it
	// (SIGCONT): a hung machine that comes back.
	DataPause Kind = "data-pause"
	// DataPartition cuts a proxied data server off: its inbound traffic
	// and its link to the meta service.
	DataPartition Kind = "data-partition"
	// DataSlow delays every segment of a proxied data server's inbound
	// traffic.
	DataSlow Kind = "data-slow"
	// MetaKill kills a meta server with SIGKILL and restarts it.
	MetaKill Kind = "meta-kill"
	// MetaStop stops a meta server cleanly and restarts it.
	MetaStop Kind = "meta-stop"
	// MetaPartition cuts a meta server off: from its clients and data
	// servers (embedded engine) or from etcd (etcd engine).
	MetaPartition Kind = "meta-partition"
	// MetaSlow delays every segment to and from a meta server.
	MetaSlow Kind = "meta-slow"
	// ClientKill kills a mount with SIGKILL and mounts again.
	ClientKill Kind = "client-kill"
	// ClientStop stops a mount cleanly (SIGTERM: flush and unmount) and
	// mounts again.
	ClientStop Kind = "client-stop"
	// ClientPause stops a mount's process (SIGSTOP), often for longer
	// than its session lease, and continues it.
	ClientPause Kind = "client-pause"
)

// AllKinds lists every fault kind.
var AllKinds = []Kind{DataKill, DataNewPort, DataStop, DataPause, DataPartition, DataSlow,
	MetaKill, MetaStop, MetaPartition, MetaSlow, ClientKill, ClientStop, ClientPause}

// class is what a kind's target is: a data server, a meta server or a
// mount.
func (k Kind) class() string {
	return strings.SplitN(string(k), "-", 2)[0]
}

// network reports whether k needs its target behind a proxy.
func (k Kind) network() bool {
	return k == DataPartition || k == DataSlow || k == MetaPartition || k == MetaSlow
}

// ParseKinds parses a comma-separated list of kinds; "all" is every kind,
// a class name ("data", "meta", "client") every kind of the class, a
// leading "-" removes kinds ("all,-data-newport"), and "none" (or an
// empty list) is no kind: the workloads run without faults.
func ParseKinds(s string) ([]Kind, error) {
	out := []Kind{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		remove := strings.HasPrefix(f, "-")
		f = strings.TrimPrefix(f, "-")
		var ks []Kind
		switch f {
		case "none":
		case "all":
			ks = AllKinds
		case "data", "meta", "client":
			for _, k := range AllKinds {
				if k.class() == f {
					ks = append(ks, k)
				}
			}
		default:
			if !slices.Contains(AllKinds, Kind(f)) {
				return nil, fmt.Errorf("unknown fault kind %q (known: all, data, meta, client, %s)", f, joinKinds(AllKinds))
			}
			ks = []Kind{Kind(f)}
		}
		for _, k := range ks {
			if remove {
				out = slices.DeleteFunc(out, func(x Kind) bool { return x == k })
			} else if !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	return out, nil
}

func joinKinds(ks []Kind) string {
	if len(ks) == 0 {
		return "none"
	}
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return strings.Join(s, ",")
}

// Engine is the meta service's metadata engine.
type Engine string

// The engines.
const (
	// Embedded is one weft meta on its embedded engine.
	Embedded Engine = "embedded"
	// Etcd is MetaServers weft meta over one etcd server.
	Etcd Engine = "etcd"
)

// Config describes a campaign. Zero fields take the defaults noted.
type Config struct {
	// Weft is the path of the weft binary (required).
	Weft string
	// Dir holds every process's state and log (required; the caller
	// removes it).
	Dir string
	// Seed makes the schedule and the workloads; 0 picks one from the
	// clock.
	Seed int64
	// Duration is how long faults are injected (default 40s); the
	// recovery, the quiet phase and the checks come after it.
	Duration time.Duration
	// Kinds are the fault kinds the schedule draws from (default
	// AllKinds); none: the workloads run without faults.
	Kinds []Kind
	// Engine is the metadata engine (default Embedded).
	Engine Engine
	// MetaServers is the number of meta servers with the etcd engine
	// (default 2; always 1 embedded).
	MetaServers int
	// DataServers is the number of data servers (default 4, at least 3:
	// the workloads use replicas 2 and 3).
	DataServers int
	// Mounts is the number of mounts the workloads run on (default 2).
	Mounts int
	// RecoveryBound is how long after a fault ends errors may still
	// happen (default 20s): an operation that starts later than that
	// after the end of every fault must succeed.
	RecoveryBound time.Duration
	// Quiet is how long the workloads run on after every fault is
	// healed (default RecoveryBound + 10s); what they do after
	// RecoveryBound must succeed.
	Quiet time.Duration
	// UnavailableTimeout is the mounts' --unavailable-timeout (default
	// 5s: shorter than many outages of a chain, so that they reach the
	// workloads as errors and exercise the error paths).
	UnavailableTimeout time.Duration
	// Overlap is the probability that a fault starts before the last
	// one ended (default 0.2; negative: never).
	Overlap float64
	// Logf receives the campaign's progress (required).
	Logf func(format string, args ...any)
}

// Defaults of Config.
const (
	defaultDuration      = 40 * time.Second
	defaultMetaServers   = 2
	defaultDataServers   = 4
	defaultMounts        = 2
	defaultRecoveryBound = 20 * time.Second
	defaultOverlap       = 0.2
)

// withDefaults fills in zero fields and checks the others.
func (c Config) withDefaults() (Config, error) {
	if c.Weft == "" || c.Dir == "" || c.Logf == nil {
		return c, fmt.Errorf("campaign: Weft, Dir and Logf are required")
	}
	if c.Seed == 0 {
		c.Seed = time.Now().UnixNano() % 1_000_000_000
	}
	if c.Duration <= 0 {
		c.Duration = defaultDuration
	}
	if c.Kinds == nil {
		c.Kinds = AllKinds
	}
	if c.Engine == "" {
		c.Engine = Embedded
	}
	if c.Engine != Embedded && c.Engine != Etcd {
		return c, fmt.Errorf("campaign: unknown engine %q (embedded or etcd)", c.Engine)
	}
	if c.Engine == Embedded {
		c.MetaServers = 1
	} else if c.MetaServers <= 0 {
		c.MetaServers = defaultMetaServers
	}
	if c.DataServers <= 0 {
		c.DataServers = defaultDataServers
	}
	if c.DataServers < 3 {
		return c, fmt.Errorf("campaign: %d data servers; at least 3 (files have replicas 2 and 3)", c.DataServers)
	}
	if c.Mounts <= 0 {
		c.Mounts = defaultMounts
	}
	if c.RecoveryBound <= 0 {
		c.RecoveryBound = defaultRecoveryBound
	}
	if c.Quiet <= 0 {
		c.Quiet = c.RecoveryBound + 10*time.Second
	}
	if c.Quiet <= c.RecoveryBound {
		return c, fmt.Errorf("campaign: the quiet phase (%v) must be longer than the recovery bound (%v)", c.Quiet, c.RecoveryBound)
	}
	if c.UnavailableTimeout <= 0 {
		c.UnavailableTimeout = 5 * time.Second
	}
	if c.Overlap == 0 {
		c.Overlap = defaultOverlap
	}
	return c, nil
}

// Replay is the part of a campaign's description that, with the seed,
// makes the same schedule: say it to replay one.
func (c Config) Replay() string {
	return fmt.Sprintf("-seed %d -duration %v -kinds %s -engine %s -meta-servers %d -data-servers %d -mounts %d",
		c.Seed, c.Duration, joinKinds(c.Kinds), c.Engine, c.MetaServers, c.DataServers, c.Mounts)
}
