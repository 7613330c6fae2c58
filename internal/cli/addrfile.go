package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// addressFileName is the file in a daemon's directory that holds the
// address it listens on, written once the listener is bound so that
// "weft up" and "weft status --dir" can find it.
const addressFileName = "address"

// writeAddressFile records addr in dir/address atomically (write to a
// temporary file, then rename), so a reader never sees a partial address.
func writeAddressFile(dir, addr string) error {
	tmp := filepath.Join(dir, addressFileName+".tmp")
	if err := os.WriteFile(tmp, []byte(addr+"\n"), 0o644); err != nil {
		return fmt.Errorf("write address file: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, addressFileName)); err != nil {
		return fmt.Errorf("write address file: %w", err)
	}
	return nil
}

// readAddressFile returns the address recorded in dir/address.
func readAddressFile(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, addressFileName))
	if err != nil {
		return "", err
	}
	addr := strings.TrimSpace(string(b))
	if addr == "" {
		return "", fmt.Errorf("%s is empty", filepath.Join(dir, addressFileName))
	}
	return addr, nil
}

// waitAddressFile polls dir/address until it exists, ctx ends or exited
// reports that the process that should write it is gone.
func waitAddressFile(ctx context.Context, dir string, exited <-chan struct{}) (string, error) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		addr, err := readAddressFile(dir)
		if err == nil {
			return addr, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-exited:
			return "", errors.New("the process exited before it was listening")
		case <-tick.C:
		}
	}
}

// listen binds addr and explains the usual failures.
func listen(addr, flag string) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err == nil {
		return lis, nil
	}
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return nil, failure("listen on "+addr, errors.New("the address is already in use"),
			fmt.Sprintf("stop the process using it or choose another address with %s", flag))
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return nil, failure("listen on "+addr, errors.New("no network interface of this machine has that address"),
			fmt.Sprintf("choose one of this machine's addresses with %s", flag))
	case errors.Is(err, syscall.EACCES):
		return nil, failure("listen on "+addr, errors.New("permission denied (ports below 1024 need root)"),
			fmt.Sprintf("choose a port above 1023 with %s", flag))
	}
	return nil, failure("listen on "+addr, err, fmt.Sprintf("check the address given with %s (host:port)", flag))
}

// ensureDir creates dir (and parents) and explains why it could not.
func ensureDir(dir, flag string) error {
	if dir == "" {
		return usagef("%s is required", flag)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return failure("create directory "+dir, err, fmt.Sprintf("choose a writable directory with %s", flag))
	}
	return nil
}

// newLogger returns the text logger of a daemon writing to w.
func newLogger(w interface{ Write([]byte) (int, error) }, debug bool) *slog.Logger {
	level := slog.LevelInfo
	if debug {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}
