package cli

import "testing"

// cobra's "Did you mean" advice spans lines; it is folded into the one
// error line instead of "...; ; Did you mean this?; produce".
func TestUnknownCommandSuggestion(t *testing.T) {
	r := run(t, nil, "prodcue")
	if r.code != ExitUsage {
		t.Errorf("exit %d", r.code)
	}
	if want := "ferry: unknown command \"prodcue\" for \"ferry\" (did you mean produce?)\n"; r.stderr != want {
		t.Errorf("stderr %q, want %q", r.stderr, want)
	}
}
