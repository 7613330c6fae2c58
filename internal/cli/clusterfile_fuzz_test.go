package cli

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzClusterFile loads whatever D/cluster.json may hold (written by a
// person, or cut short by a crash): a record or an error naming the file.
func FuzzClusterFile(f *testing.F) {
	f.Add([]byte(`{"meta_address":"127.0.0.1:7000","data_addresses":["127.0.0.1:7100"],"mount_point":"m"}`))
	f.Add([]byte(`{"data_addresses":[1,2]}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, clusterFileName), b, 0o600); err != nil {
			t.Fatal(err)
		}
		cf, exists, err := loadClusterFile(dir)
		if !exists {
			t.Fatalf("a cluster file that exists loaded as missing (%v)", err)
		}
		if err == nil {
			_ = reuseAddr(cf.MetaAddr, "127.0.0.1:0")
		}
	})
}
