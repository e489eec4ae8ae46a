package cli

import (
	"errors"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

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

// flagError is root's FlagErrorFunc (cobra uses the nearest ancestor's, so
// it serves every command): a flag mistake is a usage error (exit 2), and an
// unknown flag is followed by the command's flags it is likely a misspelling
// of, which cobra does not offer ("unknown flag: --uptream (did you mean
// --upstream?)").
func flagError(cmd *cobra.Command, err error) error {
	var ne *pflag.NotExistError
	if errors.As(err, &ne) {
		if near := nearFlags(cmd, ne); len(near) > 0 {
			return usageErrorf("%v (did you mean %s?)", err, suggest.OrList(near))
		}
	}
	return usageErrorf("%v", err)
}

// nearFlags are "--NAME" for cmd's flags (its own and those it inherits)
// that the unknown one may be meant as: within two edits of it, or names
// it begins. A long name given with one dash ("-upstream") reaches pflag as
// shorthands and fails on its first letter: the whole group is compared
// with the long names then, and a single unknown letter ("-b") suggests
// the long names it begins.
func nearFlags(cmd *cobra.Command, ne *pflag.NotExistError) []string {
	var names []string
	add := func(f *pflag.Flag) {
		if !f.Hidden && !slices.Contains(names, f.Name) {
			names = append(names, f.Name)
		}
	}
	cmd.Flags().VisitAll(add)
	cmd.InheritedFlags().VisitAll(add)
	word, edits := ne.GetSpecifiedName(), 2
	if group := ne.GetSpecifiedShortnames(); group != "" {
		word = group
		if slices.Contains(names, group) {
			return []string{"--" + group}
		}
		if len(group) == 1 {
			edits = 0 // a letter is within two edits of every short name
		}
	}
	near := suggest.Within(word, names, edits, true)
	for i, n := range near {
		near[i] = "--" + n
	}
	return near
}
