package cluster

import (
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/weft-fs/weft/meta/kv"
)

// Key schema of the cluster manager. Every key starts with "c/" (the
// namespace owns "n/"). Ids are written as 16 hex digits so keys sort by
// id and stay readable in a dump.
//
//	key                       value
//	c/server/<id>             serverRecord (JSON)
//	c/target/<id>             targetRecord (JSON)
//	c/chain/<id>              chainRecord (JSON)
//	c/chaintable              chain table version (8 bytes big endian)
//	c/next/server             last server id handed out (8 bytes big endian)
//	c/next/target             last target id handed out
//	c/next/chain              last chain id handed out
//	c/widths                  chain widths (replica counts >= 2) asked for, JSON list
//	c/usedmarks               present (8 bytes, 1) once chains record Used
//
// Live state (heartbeat times, capacity reports) is kept in memory only:
// it is rebuilt from the first heartbeats after a restart.
const (
	prefixServer = "c/server/"
	prefixTarget = "c/target/"
	prefixChain  = "c/chain/"

	keyChainTableVersion = "c/chaintable"
	keyNextServer        = "c/next/server"
	keyNextTarget        = "c/next/target"
	keyNextChain         = "c/next/chain"
	keyWidths            = "c/widths"
	keyUsedMarks         = "c/usedmarks"
)

// Member states of a chain, as sent in weftv1.ChainMember.state.
const (
	stateServing = "serving"
	stateSyncing = "syncing"
	stateOffline = "offline"
)

// serverRecord is the persisted identity of a data server.
type serverRecord struct {
	ID       uint64 `json:"id"`
	UUID     string `json:"uuid"`
	Address  string `json:"address"`
	Hostname string `json:"hostname,omitempty"`
	Site     string `json:"site,omitempty"`
	Rack     string `json:"rack,omitempty"`

	// WireAddress is the server's lean data path address ("" if none).
	WireAddress string `json:"wire_address,omitempty"`
	// Incarnation is the server process the addresses belong to (see
	// RegisterServer): a registration of another one is a restart.
	Incarnation string `json:"incarnation,omitempty"`
}

// targetRecord is the persisted identity of a target (a disk directory).
type targetRecord struct {
	ID       uint64 `json:"id"`
	UUID     string `json:"uuid"`
	ServerID uint64 `json:"server_id"`
	Path     string `json:"path"`
	// Removed: taken out of service (RemoveTarget); it gets no new chains
	// and is replaced in its chains, even if its server reports it again.
	Removed bool `json:"removed,omitempty"`
}

// chainRecord is a persisted chain: its members in order, head first.
// Version changes whenever membership or a member's state changes.
type chainRecord struct {
	ID      uint64         `json:"id"`
	Version uint64         `json:"version"`
	Members []memberRecord `json:"members"`
	// Replicas is the chain's width (0 in records of the first releases:
	// 1). Members may be fewer while no replacement for a lost one exists.
	Replicas uint32 `json:"replicas,omitempty"`
	// Home is the target the chain was built for (each target heads one
	// chain of each width when the chain is made).
	Home uint64 `json:"home,omitempty"`
	// SharedServer: two members are on one data server, because nothing
	// else fitted; Status warns about it.
	SharedServer bool `json:"shared_server,omitempty"`
	// Used: PickChains has placed a file on this replicated chain, so it
	// may hold data and keeps its members (only repair replaces them).
	// Unused chains are planned again whenever targets come or go.
	Used bool `json:"used,omitempty"`
}

// memberRecord is one target of a chain and its state.
type memberRecord struct {
	TargetID uint64 `json:"target_id"`
	State    string `json:"state"`
	// For an offline member of a replicated chain: the chain version at
	// which it went offline (members that left later hold newer data),
	// whether it was serving then (had every acknowledged write), and
	// when (Unix nanoseconds; the repair delay counts from it).
	Left        uint64 `json:"left,omitempty"`
	LeftServing bool   `json:"left_serving,omitempty"`
	Since       int64  `json:"since,omitempty"`
}

// width returns the number of replicas the chain is meant to have.
func (c *chainRecord) width() int {
	if c.Replicas == 0 {
		return 1
	}
	return int(c.Replicas)
}

func (c *chainRecord) clone() *chainRecord {
	out := *c
	out.Members = append([]memberRecord(nil), c.Members...)
	return &out
}

func idKey(prefix string, id uint64) []byte {
	return fmt.Appendf(nil, "%s%016x", prefix, id)
}

func putJSON(t kv.Txn, key []byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", key, err)
	}
	return t.Set(key, b)
}

func putUint64(t kv.Txn, key string, v uint64) error {
	return t.Set([]byte(key), binary.BigEndian.AppendUint64(nil, v))
}

func getUint64(t kv.Txn, key string) (uint64, error) {
	b, ok, err := t.Get([]byte(key))
	if err != nil || !ok {
		return 0, err
	}
	if len(b) != 8 {
		return 0, fmt.Errorf("cluster state key %s holds %d bytes, want 8: the metadata database is damaged", key, len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

// getWidths reads the list of chain widths asked for.
func getWidths(t kv.Txn) ([]uint32, error) {
	b, ok, err := t.Get([]byte(keyWidths))
	if err != nil || !ok {
		return nil, err
	}
	var w []uint32
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, fmt.Errorf("decode cluster state key %s: %w (the metadata database is damaged)", keyWidths, err)
	}
	return w, nil
}

// scanJSON decodes every value under prefix into a fresh T and hands it to
// add.
func scanJSON[T any](t kv.Txn, prefix string, add func(*T)) error {
	p := []byte(prefix)
	return t.Scan(p, kv.PrefixEnd(p), func(k, v []byte) (bool, error) {
		rec := new(T)
		if err := json.Unmarshal(v, rec); err != nil {
			return false, fmt.Errorf("decode cluster state key %s: %w (the metadata database is damaged)", k, err)
		}
		add(rec)
		return true, nil
	})
}
