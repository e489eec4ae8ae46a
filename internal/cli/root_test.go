package cli

import (
	"strings"
	"testing"
)

// A misspelled command gets one error line naming the commands it may be a
// misspelling of (a swap, a missing or extra letter, a prefix), and none
// when nothing is near: "ls" is not a typo of "gc".
func TestUnknownCommandSuggestion(t *testing.T) {
	for _, c := range []struct{ typed, want string }{
		{"prodcue", ` (did you mean produce?)`},
		{"consme", ` (did you mean consume?)`},
		{"gcc", ` (did you mean gc?)`},
		{"demoo", ` (did you mean demo?)`},
		{"Proxy", ` (did you mean proxy?)`},
		{"p", ` (did you mean proxy or produce?)`},
		{"ls", ``},
		{"d", ` (did you mean demo?)`},
		{"run", ``},
	} {
		r := run(t, nil, c.typed)
		if r.code != ExitUsage {
			t.Errorf("ferry %s: exit %d, want %d", c.typed, r.code, ExitUsage)
		}
		want := "ferry: unknown command \"" + c.typed + "\" for \"ferry\"" + c.want + "\n"
		if r.stderr != want || r.stdout != "" {
			t.Errorf("ferry %s: stderr %q, stdout %q; want stderr %q", c.typed, r.stderr, r.stdout, want)
		}
	}
}

// A misspelled flag gets one error line naming the flags of that command
// it may be a misspelling of (within two edits, or a prefix; inherited
// flags included), and none when nothing is near; a long name given with
// one dash, which pflag reads as shorthands, is matched as a whole. Cobra
// itself suggests only commands.
func TestUnknownFlagSuggestion(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"proxy", "--uptream", "h:1"}, `unknown flag: --uptream (did you mean --upstream?)`},
		{[]string{"produce", "--brokrs", "h:1", "f"}, `unknown flag: --brokrs (did you mean --brokers?)`},
		{[]string{"consume", "--form-beginning"}, `unknown flag: --form-beginning (did you mean --from-beginning?)`},
		{[]string{"consume", "--tim", "1s"}, `unknown flag: --tim (did you mean --timeout?)`},
		{[]string{"gc", "--confg", "c.properties"}, `unknown flag: --confg (did you mean --config?)`},
		{[]string{"gc", "--stroe", "/tmp/s"}, `unknown flag: --stroe (did you mean --store?)`},
		{[]string{"--log-levle", "debug", "demo"}, `unknown flag: --log-levle (did you mean --log-level?)`},
		{[]string{"proxy", "-upstream", "h:1"}, `unknown shorthand flag: 'u' in -upstream (did you mean --upstream?)`},
		{[]string{"consume", "-b", "h:1"}, `unknown shorthand flag: 'b' in -b (did you mean --brokers?)`},
		{[]string{"consume", "--zzzz"}, `unknown flag: --zzzz`},
		{[]string{"consume", "-z"}, `unknown shorthand flag: 'z' in -z`},
		{[]string{"produce", "--out", "d", "f"}, `unknown flag: --out`}, // consume's flag, not produce's
	} {
		r := run(t, nil, c.args...)
		if want := "ferry: " + c.want + "\n"; r.code != ExitUsage || r.stdout != "" || r.stderr != want {
			t.Errorf("ferry %v: exit %d, stdout %q, stderr %q; want exit %d, stderr %q", c.args, r.code, r.stdout, r.stderr, ExitUsage, want)
		}
	}
}

// "ferry help TYPO" is a usage error with the suggestion, not the root's
// usage with exit 0; "ferry help COMMAND" and a bare "ferry" print help.
func TestHelpTopics(t *testing.T) {
	r := run(t, nil, "help", "prodce")
	if r.code != ExitUsage || r.stdout != "" {
		t.Errorf("help prodce: exit %d, stdout %q", r.code, r.stdout)
	}
	oneErrorLine(t, r, `unknown command "prodce" for "ferry" (did you mean produce?)`)
	r = run(t, nil, "help", "consume")
	if r.code != 0 || !strings.Contains(r.stdout, "ferry consume --brokers") {
		t.Errorf("help consume: exit %d, stdout %q", r.code, r.stdout)
	}
	r = run(t, nil)
	if r.code != 0 || !strings.Contains(r.stdout, "Available Commands:") {
		t.Errorf("ferry: exit %d, stdout %q", r.code, r.stdout)
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}} {
		r := run(t, nil, args...)
		if r.code != 0 || !strings.HasPrefix(r.stdout, "ferry version ") || !strings.Contains(r.stdout, "go1.") {
			t.Fatalf("ferry %v: exit %d, stdout %q", args, r.code, r.stdout)
		}
	}
}
