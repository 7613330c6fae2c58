// Package cli implements the weft command line: one file per subcommand,
// all reachable through Main, which is a plain function of its arguments
// and output streams so that scripts (testdata/script/*.txtar) can run it.
//
// Exit codes: 0 success, 1 a runtime error (printed as one line
// "weft: <what failed>: <why>; <what to do>"), 2 a usage error (bad flag,
// wrong arguments), printed with the command's usage.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// Exit codes of Main.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// Main runs the weft command line with args (without the program name),
// writing normal output to stdout and diagnostics to stderr, and returns
// the process exit code. ctx ends the long-running commands (meta, data,
// mount, up) cleanly; main wires it to SIGINT and SIGTERM.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	root.SetContext(ctx)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	var uerr *usageError
	if errors.As(err, &uerr) || isCobraUsageError(err) {
		fmt.Fprintf(stderr, "weft: %v\n", err)
		if cmd != nil {
			fmt.Fprintf(stderr, "\n%s", cmd.UsageString())
		}
		return exitUsage
	}
	fmt.Fprintf(stderr, "weft: %v\n", err)
	if ec, ok := errors.AsType[interface {
		error
		ExitCode() int
	}](err); ok {
		return ec.ExitCode() // a command with its own exit statuses (fsck)
	}
	return exitError
}

// newRootCmd builds a fresh command tree; nothing is kept in package
// globals, so Main can run many times in one process.
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "weft",
		Short: "weft is a distributed POSIX file system",
		Long: `weft is a distributed POSIX file system.

Start a whole cluster on this machine with "weft up", or run the daemons
separately: "weft meta", "weft data" and "weft mount". "weft status" shows
the health of a cluster, "weft layout" the striping and replicas of files and
directories; "weft target remove" replaces a lost disk in its chains;
"weft scrub" verifies every chunk now and repairs bad copies.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return &usageError{err: err}
	})
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(
		newMetaCmd(),
		newDataCmd(),
		newMountCmd(),
		newUpCmd(),
		newStatusCmd(),
		newLayoutCmd(),
		newTargetCmd(),
		newScrubCmd(),
		newFsckCmd(),
		newVersionCmd(),
		newBenchCmd(),
		newBenchWorkerCmd(),
		newLoopbackCmd(),
	)
	return root
}

// usageError is a mistake in how a command was called: Main prints it with
// the command's usage and exits with status 2.
type usageError struct {
	err error
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// usagef returns a usageError with a formatted message.
func usagef(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}

// isCobraUsageError recognises the errors cobra itself returns for unknown
// subcommands.
func isCobraUsageError(err error) bool {
	return strings.HasPrefix(err.Error(), "unknown command ")
}

// noArgs refuses positional arguments with a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), strings.Join(args, " "))
	}
	return nil
}

// exactArgs wants n positional arguments named by what.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s needs %s, got %d argument(s)", cmd.CommandPath(), what, len(args))
		}
		return nil
	}
}

// runError is a runtime failure explained for a person: what failed, why,
// and what to do about it. Its text is
// "<what failed>: <why>; <what to do>".
type runError struct {
	what string
	why  error
	todo string
}

func (e *runError) Error() string {
	s := e.what
	if e.why != nil {
		s += ": " + oneLine(e.why.Error())
	}
	if e.todo != "" {
		s += "; " + e.todo
	}
	return s
}

func (e *runError) Unwrap() error { return e.why }

// failure builds a runError.
func failure(what string, why error, todo string) error {
	return &runError{what: what, why: why, todo: todo}
}

// oneLine keeps an error message on one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
