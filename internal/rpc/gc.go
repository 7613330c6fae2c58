package rpc

import (
	"os"
	"runtime/debug"
	"sync"
)

var gcOnce sync.Once

// TuneGC sets the garbage collector's percent for a process that moves
// bulk data (data servers, clients): every chunk read or written is a fresh
// buffer of up to a chunk, so with Go's default of 100 and a small live heap
// the collector runs every few requests (measured: 11 to 17% of a data
// server's CPU on reads). A GOGC in the environment wins. The first call in
// a process decides.
func TuneGC(percent int) {
	gcOnce.Do(func() {
		if os.Getenv("GOGC") == "" {
			debug.SetGCPercent(percent)
		}
	})
}
