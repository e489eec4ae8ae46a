package cli

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// versionCommand is `ferry version`, the same line as `ferry --version`.
func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print ferry's version (module version, VCS revision, Go version)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintf(a.stdout, "ferry version %s\n", version())
			return err
		},
	}
}

// version is what `ferry --version` prints: the module version Go recorded
// at build time ("(devel)" for a build from a checkout), the VCS revision and
// whether the tree had changes, and the Go version, e.g.
// "(devel) 4c5ac4c1a2b3 (modified) go1.26.8".
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	parts := []string{bi.Main.Version}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "(modified)"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	parts = append(parts, rev, dirty, bi.GoVersion)
	return strings.Join(strings.Fields(strings.Join(parts, " ")), " ")
}
