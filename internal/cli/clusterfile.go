package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
)

// clusterFileName is the file in a weft up directory that records the
// addresses its daemons listened on, so that a restart reuses them.
const clusterFileName = "cluster.json"

// clusterFile is the content of D/cluster.json.
type clusterFile struct {
	MetaAddr   string   `json:"meta_address"`
	DataAddrs  []string `json:"data_addresses"`
	MountPoint string   `json:"mount_point,omitempty"`
}

// loadClusterFile reads D/cluster.json; a missing file is an empty record
// and exists is false.
func loadClusterFile(dir string) (cf clusterFile, exists bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, clusterFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return cf, false, nil
	}
	if err != nil {
		return cf, false, err
	}
	if err := json.Unmarshal(b, &cf); err != nil {
		return cf, true, fmt.Errorf("%s is damaged: %w", filepath.Join(dir, clusterFileName), err)
	}
	return cf, true, nil
}

// save writes D/cluster.json atomically.
func (cf clusterFile) save(dir string) error {
	b, err := json.MarshalIndent(cf, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(dir, clusterFileName)
	if err := os.WriteFile(p+".tmp", append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// addrFree reports whether addr can be listened on now.
func addrFree(addr string) bool {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	lis.Close()
	return true
}

// anyPort keeps the host of addr and lets the system pick the port.
func anyPort(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, "0")
}

// reuseAddr picks the address a daemon listens on: the recorded one if it
// is still free, otherwise fallback.
func reuseAddr(recorded, fallback string) string {
	if recorded != "" && addrFree(recorded) {
		return recorded
	}
	return fallback
}
