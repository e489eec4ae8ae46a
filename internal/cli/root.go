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
	"regexp"
	"strings"
	"sync/atomic"
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
	// A command stopped by a signal exits 128 + the signal's number, as
	// shells report it: 130 for SIGINT (Ctrl-C), 143 for SIGTERM.
	ExitInterrupted = 130
)

// Interrupted is the cause of the context Execute cancels on SIGINT or
// SIGTERM (context.Cause); RunIO then exits with its ExitCode.
type Interrupted struct{ Signal os.Signal }

func (e *Interrupted) Error() string { return "interrupted by " + signalName(e.Signal) }

// ExitCode is 128 + the signal's number (130 for SIGINT, 143 for SIGTERM).
func (e *Interrupted) ExitCode() int {
	if n, ok := e.Signal.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return ExitInterrupted
}

func signalName(s os.Signal) string {
	switch s {
	case os.Interrupt:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return s.String()
}

// Execute runs ferry with the process's arguments and standard streams and
// returns the exit code. The first SIGINT (Ctrl-C) or SIGTERM cancels the
// work: the command stops, cleans up what it can and says what it had done
// (exit 130 or 143). A second one exits at once, without cleaning up.
func Execute() int {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		first := <-sigs
		cancel(&Interrupted{Signal: first})
		again := &Interrupted{Signal: <-sigs}
		left := ""
		if p := leftBehind.Load(); p != nil && *p != "" {
			left = " (" + *p + " stays: remove it by hand)"
		}
		fmt.Fprintf(os.Stderr, "ferry: %s again: exiting without cleaning up%s\n", again, left)
		os.Exit(again.ExitCode())
	}()
	return RunIO(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
}

// leftBehind names what a command would clean up on its way out (the
// demo's temporary directory), for the message of a second signal, which
// exits at once.
var leftBehind atomic.Pointer[string]

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
	msg := keyURLs.ReplaceAllString(oneLine(err.Error()), "base64key://…")
	var intr *Interrupted
	if ctx.Err() != nil && errors.As(context.Cause(ctx), &intr) {
		if !strings.Contains(msg, intr.Error()) {
			msg = intr.Error() + ": " + msg
		}
		fmt.Fprintln(stderr, "ferry: "+msg)
		return intr.ExitCode()
	}
	fmt.Fprintln(stderr, "ferry: "+msg)
	var ue *usageError
	if errors.As(err, &ue) || !a.ran {
		// Errors before a command's RunE are cobra's: unknown command or
		// flag, wrong number of arguments.
		return ExitUsage
	}
	return ExitFailure
}

// keyURLs matches a base64key:// key URL, which is the key itself: an error
// that quotes one (cobra's "unknown command" for a key URL given after a
// stray space) shows only its scheme.
var keyURLs = regexp.MustCompile(`(?i)base64key:[^\s"'` + "`" + `]+`)

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
		Use:     "ferry",
		Version: version(),
		Short:   "Produce and consume large Kafka messages through a payload store (KIP-1159)",
		Long: `ferry moves records of any size through Apache Kafka: a record too large for
its topic's max.message.bytes has its value (or key, or both) published to a
payload store and Kafka carries a small reference instead (KIP-1159 large
messages). Consumers resolve the reference transparently.

Payload stores (--store URL): ` + storeSchemes() + `, or a
directory path (docs/OPERATIONS.md has each URL's form and credentials).

Client settings are Kafka-style properties: --config FILE.properties, then
-X key=value overrides (bootstrap.servers, client.id, compression.type,
max.request.size, fetch.max.bytes, max.partition.fetch.bytes,
receive.message.max.bytes, the large.message.* keys, and TLS/SASL as a Java client or
librdkafka takes them: security.protocol, sasl.mechanism, sasl.jaas.config,
sasl.username, ssl.truststore.*, ssl.ca.location, ...; docs/SECURITY.md).

Errors are one line on stderr. Exit status: 0 done, 1 failed (a broker or
store that fails or refuses, e.g. a read-only store directory), 2 usage or
configuration error (flags, arguments, properties, a malformed store URL, a
bucket that does not exist, a store directory that does not exist and cannot
be created), 130 stopped by SIGINT (Ctrl-C), 143 by SIGTERM;
a second signal exits without cleaning up. ferry proxy exits 0 when a
signal stops it (it drains its connections first).`,
		SilenceUsage:      true,
		SilenceErrors:     true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			a.ran = true
			return a.setupLogging()
		},
		// Runnable, so that its Args (a misspelled command) is checked.
		Args: unknownCommand,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	root.SetHelpCommand(helpCommand(root))
	pf := root.PersistentFlags()
	pf.StringVar(&a.configFile, "config", "", "Kafka-style properties `FILE` (e.g. client.properties; ferry proxy's is YAML)")
	pf.StringArrayVarP(&a.overrides, "property", "X", nil, "set a property, `key=value`; repeatable, overrides --config")
	pf.StringVar(&a.logLevel, "log-level", "warn", "log level on stderr: debug, info, warn or error (ferry proxy: its own, default info)")
	root.SetFlagErrorFunc(flagError)
	root.AddCommand(a.demoCommand(), a.produceCommand(), a.consumeCommand(), a.gcCommand(), a.proxyCommand(), a.versionCommand())
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

// oneLine folds a multi-line error (errors.Join) onto one line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}
