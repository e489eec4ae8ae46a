package props

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadFileThenOverrides(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "client.properties")
	content := `# a comment
bootstrap.servers = broker1:9092,broker2:9092
compression.type=gzip
large.message.payload.store.url=file:///var/ferry
sasl.jaas.config=x required password="${file:/secret}";
client.id : from-file
`
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Load(file, []string{"compression.type=zstd", "max.request.size = 2000000", "a.b=c=d"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"bootstrap.servers":               "broker1:9092,broker2:9092",
		"compression.type":                "zstd",
		"large.message.payload.store.url": "file:///var/ferry",
		"sasl.jaas.config":                `x required password="${file:/secret}";`,
		"client.id":                       "from-file",
		"max.request.size":                "2000000",
		"a.b":                             "c=d",
	}
	if len(got) != len(want) {
		t.Errorf("got %d keys %v, want %d", len(got), Keys(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

func TestLoadNothing(t *testing.T) {
	got, err := Load("", nil)
	if err != nil || len(got) != 0 {
		t.Fatalf("Load(\"\", nil) = %v, %v", got, err)
	}
}

func TestLoadErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.properties")
	for _, tc := range []struct {
		file      string
		overrides []string
		want      string
	}{
		{missing, nil, "config file " + missing + " does not exist"},
		{"", []string{"novalue"}, `-X "novalue": expected key=value`},
		{"", []string{"=v"}, "key before '=' is empty"},
	} {
		_, err := Load(tc.file, tc.overrides)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Load(%q, %q) error = %v, want it to contain %q", tc.file, tc.overrides, err, tc.want)
		}
	}
}
