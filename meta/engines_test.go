package meta

import (
	"fmt"
	"sync"
	"testing"

	"github.com/weft-fs/weft/internal/etcdtest"
	"github.com/weft-fs/weft/meta/kv"
)

// envMaker makes a test's env (newEnv on one engine).
type envMaker func(t *testing.T) *env

// onEngines runs f as a subtest on each metadata engine: the embedded
// pebble engine and a real etcd (one etcd server per call, each env on a
// prefix of its own). The namespace conformance tests run this way, so
// both engines must give the same answers.
func onEngines(t *testing.T, f func(t *testing.T, newEnv envMaker)) {
	t.Run("pebble", func(t *testing.T) { f(t, newEnv) })
	t.Run("etcd", func(t *testing.T) {
		var once sync.Once
		var srv *etcdtest.Server
		n := 0
		var mu sync.Mutex
		f(t, func(et *testing.T) *env {
			et.Helper()
			once.Do(func() { srv = etcdtest.Start(t) })
			mu.Lock()
			n++
			prefix := fmt.Sprintf("/env%d/", n)
			mu.Unlock()
			return newEnvEngine(et, func() kv.Engine { return openEtcd(et, srv, prefix) })
		})
	})
}
