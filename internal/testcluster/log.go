package testcluster

import (
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
)

// newTestLogger logs to t.Log at the level of $WEFT_TEST_LOG (default
// warn); after the returned close, lines are dropped (the test is over).
func newTestLogger(t testing.TB) (*slog.Logger, func()) {
	level := slog.LevelWarn
	switch strings.ToLower(os.Getenv("WEFT_TEST_LOG")) {
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	case "error":
		level = slog.LevelError
	}
	w := &tbWriter{t: t}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})), w.close
}

// tbWriter writes log lines to t.Log until closed.
type tbWriter struct {
	mu     sync.Mutex
	t      testing.TB
	closed bool
}

func (w *tbWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *tbWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}
