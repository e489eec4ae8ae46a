// Package cli is the ferry command: "ferry produce", "ferry consume",
// "ferry gc" and "ferry demo" over package largemessage (KIP-1159 large messages on
// franz-go). Run is the whole command as a function, for tests.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/ferrykit/ferry/internal/props"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1 // a runtime failure: unreachable broker or store, a record that did not resolve
	ExitUsage   = 2 // bad flags, arguments or properties
)

// Execute runs ferry with the process's arguments and standard streams and
// returns the exit code; Ctrl-C (SIGINT) and SIGTERM cancel the work.
func Execute() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return RunIO(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
}

// Run runs ferry with args (without the program name), reading stdin from
// os.Stdin, and returns the exit code. Errors are printed to stderr as one
// line starting with "ferry: ".
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return RunIO(ctx, args, os.Stdin, stdout, stderr)
}

// RunIO is Run with an explicit standard input (for "ferry produce -").
func RunIO(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	fmt.Fprintln(stderr, "ferry: "+oneLine(foldSuggestion(err.Error())))
	var ue *usageError
	if errors.As(err, &ue) || !a.ran {
		// Errors before a command's RunE are cobra's: unknown command or
		// flag, wrong number of arguments.
		return ExitUsage
	}
	return ExitFailure
}

// app holds one invocation's streams and global flags.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer

	configFile string
	overrides  []string
	logLevel   string

	ran bool // a command's RunE started
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "ferry",
		Short: "Produce and consume large Kafka messages through a payload store (KIP-1159)",
		Long: `ferry moves records of any size through Apache Kafka: a record too large for
its topic's max.message.bytes has its value published to a payload store
(file://, mem://, ...) and Kafka carries a small reference instead
(KIP-1159 large messages). Consumers resolve the reference transparently.

Client settings are Kafka-style properties: --config FILE.properties, then
-X key=value overrides (bootstrap.servers, client.id, compression.type,
max.request.size and the large.message.* keys).`,
		SilenceUsage:      true,
		SilenceErrors:     true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			a.ran = true
			return a.setupLogging()
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.configFile, "config", "", "Kafka-style properties `FILE` (e.g. client.properties)")
	pf.StringArrayVarP(&a.overrides, "property", "X", nil, "set a property, `key=value`; repeatable, overrides --config")
	pf.StringVar(&a.logLevel, "log-level", "warn", "log level on stderr: debug, info, warn or error")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageErrorf("%v", err) })
	root.AddCommand(a.demoCommand(), a.produceCommand(), a.consumeCommand(), a.gcCommand(), a.proxyCommand())
	for _, c := range root.Commands() {
		c.SilenceUsage, c.SilenceErrors = true, true
	}
	return root
}

// props loads --config and -X. Errors are usage errors.
func (a *app) props() (map[string]string, error) {
	p, err := props.Load(a.configFile, a.overrides)
	if err != nil {
		return nil, &usageError{err: err}
	}
	slog.Debug("properties loaded", "keys", props.Keys(p))
	return p, nil
}

func (a *app) setupLogging() error {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(a.logLevel)); err != nil {
		return usageErrorf("--log-level %q: want debug, info, warn or error", a.logLevel)
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: lvl,
		ReplaceAttr: func(groups []string, at slog.Attr) slog.Attr {
			if len(groups) == 0 && at.Key == slog.TimeKey && lvl > slog.LevelDebug {
				return slog.Attr{} // a command's messages need no timestamp
			}
			return at
		}})))
	return nil
}

// isTerminal reports whether w is a terminal (for progress bars).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// usageError is a mistake in the command line or the properties (exit 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}

// foldSuggestion turns cobra's "unknown command" advice, which spans lines
// ("...\n\nDid you mean this?\n\tproduce\n"), into "... (did you mean
// produce?)".
func foldSuggestion(s string) string {
	head, tail, ok := strings.Cut(s, "\n\nDid you mean this?\n")
	if !ok {
		return s
	}
	return head + " (did you mean " + strings.Join(strings.Fields(tail), " or ") + "?)"
}

// oneLine folds a multi-line error (errors.Join) onto one line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}
