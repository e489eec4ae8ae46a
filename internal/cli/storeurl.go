package cli

import (
	"fmt"
	"net/url"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/ferrykit/ferry/payloadstore"
)

// storeForms is the expected form of each known scheme's URL, for errors.
var storeForms = map[string]string{
	"s3":     "s3://BUCKET/PREFIX",
	"gs":     "gs://BUCKET/PREFIX",
	"azblob": "azblob://CONTAINER/PREFIX",
	"file":   "file:///ABSOLUTE/DIR or a directory path",
	"mem":    "mem://NAME",
}

// storeSchemes lists the registered store schemes (payloadstore.Schemes)
// for help texts, "s3://, gs://, azblob://, file://": those of storeForms
// in that order, then any other in the registry but mem://, which the
// commands refuse (a store in ferry's own memory is gone when it exits).
func storeSchemes() string {
	order := []string{"s3", "gs", "azblob", "file"}
	var out []string
	for _, s := range order {
		if slices.Contains(payloadstore.Schemes(), s) {
			out = append(out, s+"://")
		}
	}
	for _, s := range payloadstore.Schemes() {
		if !slices.Contains(order, s) && s != "mem" {
			out = append(out, s+"://")
		}
	}
	return strings.Join(out, ", ")
}

// parseStoreURL checks a payload store URL strictly, or turns a plain
// directory path into file://ABS. A string with a ':' before any '/' (other
// than a drive letter, C:\ or C:/, on Windows) is taken as a URL, never as a
// path: "s3:/bucket", "file:dir" or "sftp://host/x" are errors, not
// folders named after them. A URL must be SCHEME://..., with a registered
// scheme (payloadstore.Schemes) and, for the known schemes, their
// bucket/container/name (file: an absolute path). A directory whose name
// really starts with "NAME:" is written ./NAME:...
//
// Malformed escapes and the like are left to payloadstore.Open, which
// reports them without echoing secrets. Errors do not repeat the input (the
// caller names it with shownStoreURL).
func parseStoreURL(raw string) (string, error) {
	s := strings.TrimSpace(raw)
	if s == "" {
		return "", nil
	}
	colon := strings.IndexByte(s, ':')
	slash := strings.IndexByte(s, '/')
	if colon < 0 || (slash >= 0 && slash < colon) || isDrivePath(s) {
		return dirURL(s)
	}
	known := payloadstore.Schemes()
	scheme := strings.ToLower(s[:colon])
	if !slices.Contains(known, scheme) {
		hint := ""
		if !strings.HasPrefix(s[colon+1:], "//") {
			hint = "; a directory whose name contains ':' is written ./NAME"
		}
		return "", fmt.Errorf("not a store URL: unknown scheme %q (known schemes: %s)%s", s[:colon], strings.Join(known, ", "), hint)
	}
	want := func() error {
		form, ok := storeForms[scheme]
		if !ok {
			form = scheme + "://..."
		}
		return fmt.Errorf("not a store URL: want %s (known schemes: %s)", form, strings.Join(known, ", "))
	}
	if !strings.HasPrefix(s[colon+1:], "//") {
		return "", want()
	}
	u, err := url.Parse(s)
	if err != nil {
		return s, nil // payloadstore.Open names the fault without the secrets
	}
	switch scheme {
	case "file":
		if (u.Host != "" && u.Host != "localhost") || !strings.HasPrefix(u.Path, "/") {
			return "", want()
		}
	case "s3", "gs", "azblob", "mem":
		if u.Host == "" {
			return "", want()
		}
	}
	return s, nil
}

// isDrivePath reports whether s starts with a Windows drive letter and a
// separator (C:\ or C:/) on Windows: a path, not a URL with the scheme "c".
// Elsewhere such a string is refused like any unknown scheme.
func isDrivePath(s string) bool {
	return runtime.GOOS == "windows" && len(s) >= 3 && s[1] == ':' && (s[2] == '\\' || s[2] == '/') &&
		(s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z')
}

// dirURL is the file:// URL of the directory path p, made absolute.
func dirURL(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	abs = filepath.ToSlash(abs)
	if runtime.GOOS == "windows" && !strings.HasPrefix(abs, "/") {
		abs = "/" + abs // file:///C:/dir
	}
	return (&url.URL{Scheme: "file", Path: abs}).String(), nil
}

// shownStoreURL is a store URL as given, fit for an error: a query (which
// may hold signatures) and anything before an '@' (user info) are masked.
func shownStoreURL(s string) string {
	if i := strings.IndexByte(s, '?'); i >= 0 {
		s = s[:i] + "?..."
	}
	if at := strings.LastIndexByte(s, '@'); at >= 0 {
		start := strings.IndexByte(s, ':') + 1
		for start < at && s[start] == '/' {
			start++
		}
		if start <= at {
			s = s[:start] + "..." + s[at:]
		}
	}
	return s
}
