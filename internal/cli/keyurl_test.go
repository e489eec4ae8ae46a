package cli

import (
	"strings"
	"testing"
)

// A base64key:// URL is the key: an error that quotes one (a stray space
// after "-X key=" makes it a positional argument) shows only its scheme.
func TestErrorsHideKeyURLs(t *testing.T) {
	const secret = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
	for _, args := range [][]string{
		{"proxy", "-X", "encrypt.key.url=", "base64key://" + secret + "="},
		{"produce", "-X", "large.message.payload.encryption.key.url=", "BASE64KEY:" + secret, "--topic", "t", "x", "y"},
		{"base64key://" + secret},
	} {
		r := run(t, nil, args...)
		if r.code == 0 {
			t.Errorf("%q: exit 0", args)
		}
		if strings.Contains(r.stderr+r.stdout, secret) {
			t.Errorf("%q printed the key: %s", args, r.stderr)
		}
	}
}

// A key URL Ferry cannot open is a configuration error: exit 2.
func TestBadKeyURLIsUsage(t *testing.T) {
	dir := t.TempDir()
	for _, u := range []string{"kms://alias/x", "base64key://", "awskms:alias"} {
		r := run(t, nil, "produce", "--brokers", "127.0.0.1:1", "--topic", "t", "--store", dir,
			"-X", "large.message.payload.encryption.key.url="+u, "x")
		if r.code != ExitUsage {
			t.Errorf("%s: exit %d, want %d: %s", u, r.code, ExitUsage, r.stderr)
		}
	}
}
