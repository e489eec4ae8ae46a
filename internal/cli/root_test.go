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
