package rpc

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"time"
)

// PprofEnv names the environment variable that turns on profiling: when it
// holds a directory, every weft process (they all import this package)
// serves CPU and heap profiles (/debug/pprof/profile?seconds=N and
// /debug/pprof/heap, the paths of net/http/pprof) on a free 127.0.0.1 port and writes that address to
// DIR/<program>-<pid>.addr, e.g.
//
//	WEFT_PPROF=/tmp/prof weft up ...
//	go tool pprof -seconds 20 http://$(cat /tmp/prof/weft-1234.addr)/debug/pprof/profile
const PprofEnv = "WEFT_PPROF"

func init() {
	dir := os.Getenv(PprofEnv)
	if dir == "" {
		return
	}
	if err := servePprof(dir); err != nil {
		fmt.Fprintf(os.Stderr, "weft: %s=%s: profiling not served: %v\n", PprofEnv, dir, err)
	}
}

func servePprof(dir string) error {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	name := fmt.Sprintf("%s-%d.addr", filepath.Base(os.Args[0]), os.Getpid())
	if err := os.WriteFile(filepath.Join(dir, name), []byte(lis.Addr().String()), 0o644); err != nil {
		lis.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/profile", func(w http.ResponseWriter, r *http.Request) {
		secs, err := strconv.Atoi(r.FormValue("seconds"))
		if err != nil || secs <= 0 {
			secs = 30
		}
		if err := pprof.StartCPUProfile(w); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		select {
		case <-time.After(time.Duration(secs) * time.Second):
		case <-r.Context().Done():
		}
		pprof.StopCPUProfile()
	})
	mux.HandleFunc("/debug/pprof/heap", func(w http.ResponseWriter, r *http.Request) {
		_ = pprof.Lookup("heap").WriteTo(w, 0)
	})
	go http.Serve(lis, mux) //nolint:errcheck // lives as long as the process
	return nil
}
