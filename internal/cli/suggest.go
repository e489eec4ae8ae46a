package cli

import (
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferrykit/ferry/internal/suggest"
)

// unknownCommand is root's Args: a word that names no command is a usage
// error, with the commands it is likely a misspelling of (suggest.Nearest). It
// stands in for cobra's suggestions, which offer any command within two
// edits, and with two-letter names ("gc") that is any two-letter word.
func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	return usageErrorf("unknown command %q for %q%s", args[0], cmd.CommandPath(), didYouMean(args[0], commandNames(cmd)))
}

// didYouMean is " (did you mean X?)" for the commands word may be a
// misspelling of, or "".
func didYouMean(word string, names []string) string {
	s := suggest.Nearest(word, names, true)
	if len(s) == 0 {
		return ""
	}
	return " (did you mean " + suggest.OrList(s) + "?)"
}

// commandNames are the names and aliases of cmd's visible subcommands.
func commandNames(cmd *cobra.Command) []string {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() || c.Name() == "help" {
			names = append(names, c.Name())
			names = append(names, c.Aliases...)
		}
	}
	return names
}

// helpCommand is "ferry help [COMMAND...]": cobra's, except that an unknown
// topic is a usage error with suggestions (exit 2), not the root's usage
// printed with exit 0.
func helpCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		Long:  "Help prints the help of any command: ferry help COMMAND (the same as ferry COMMAND --help).",
		RunE: func(_ *cobra.Command, args []string) error {
			c := root
			for _, a := range args {
				next := findSub(c, a)
				if next == nil {
					return usageErrorf("no help for %q: unknown command %q for %q%s",
						strings.Join(args, " "), a, c.CommandPath(), didYouMean(a, commandNames(c)))
				}
				c = next
			}
			return c.Help()
		},
	}
}

// findSub is cmd's subcommand named (or aliased) name, or nil.
func findSub(cmd *cobra.Command, name string) *cobra.Command {
	for _, c := range cmd.Commands() {
		if c.Name() == name || slices.Contains(c.Aliases, name) {
			return c
		}
	}
	return nil
}
