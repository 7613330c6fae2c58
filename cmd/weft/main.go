// Command weft is the weft distributed file system: its daemons (meta,
// data), its FUSE client (mount), the one-machine cluster (up) and the
// admin commands (status, layout). See internal/cli for the commands.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/weft-fs/weft/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
