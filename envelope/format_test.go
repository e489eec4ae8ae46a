package envelope

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
)

// The test vectors of docs/FORMAT.md §9.5, checked byte for byte: the doc's
// sealed bytes open to its plaintext under its KEK, and sealing the plaintext
// again with the doc's data key, salt, nonce prefix (or nonce) gives exactly
// the doc's bytes.

const formatDoc = "../docs/FORMAT.md"

var vectorRow = regexp.MustCompile("^\\|\\s*(E\\d)\\s+([a-z ]+?)\\s*\\|\\s*`([^`]*)`\\s*\\|")

// vectors reads the rows "| E1 field | `value` |" of the doc; hex values may
// span several rows of the same field, which are joined.
func vectors(t *testing.T) map[string]map[string]string {
	t.Helper()
	f, err := os.Open(formatDoc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := vectorRow.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		if out[m[1]] == nil {
			out[m[1]] = map[string]string{}
		}
		out[m[1]][m[2]] += m[3]
	}
	return out
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatalf("hex %q: %v", s, err)
	}
	return b
}

func TestFormatVectors(t *testing.T) {
	vs := vectors(t)
	for _, name := range []string{"E1", "E2"} {
		if len(vs[name]) == 0 {
			t.Fatalf("docs/FORMAT.md has no vector %s (rows \"| %s field | `value` |\")", name, name)
		}
	}
	ctx := context.Background()
	for name, v := range vs {
		t.Run(name, func(t *testing.T) {
			k := openTest(t, Config{KeyURL: v["kek url"]})
			id, _ := KeyIDOf(v["kek url"])
			if got := hex.EncodeToString(id[:]); got != strings.ReplaceAll(v["key id"], " ", "") {
				t.Errorf("key id %s, doc says %s", got, v["key id"])
			}
			sealed := unhex(t, v["sealed"])
			dk := dataKey{key: unhex(t, v["data key"]), wrapped: unhex(t, v["wrapped key"]), kek: id}
			var err error
			if dk.gcm, err = newGCM(dk.key); err != nil {
				t.Fatal(err)
			}
			plain := []byte(v["plaintext"])
			var again []byte
			switch name {
			case "E1":
				a := PayloadAAD{Topic: v["topic"], Key: v["object key"]}
				r, err := k.OpenStream(ctx, bytes.NewReader(sealed), a)
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(r)
				if err != nil || !bytes.Equal(got, plain) {
					t.Fatalf("opened %q, %v; doc says %q", got, err, plain)
				}
				s := newStreamSealer(dk, unhex(t, v["salt"]), unhex(t, v["nonce prefix"]))
				var buf bytes.Buffer
				w, err := s.NewWriter(&buf, a)
				if err != nil {
					t.Fatal(err)
				}
				w.Write(plain)
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
				again = buf.Bytes()
				if s.SealedSize(int64(len(plain))) != int64(len(sealed)) {
					t.Errorf("SealedSize %d, the vector is %d bytes", s.SealedSize(int64(len(plain))), len(sealed))
				}
			case "E2":
				a := RecordAAD{Topic: v["topic"], Field: v["field"]}
				got, err := k.OpenRecord(ctx, nil, sealed, a)
				if err != nil || !bytes.Equal(got, plain) {
					t.Fatalf("opened %q, %v; doc says %q", got, err, plain)
				}
				nonce := unhex(t, v["nonce"])
				if again, err = sealRecord(nil, dk, func(b []byte) (int, error) { return copy(b, nonce), nil }, plain, a); err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(again, sealed) {
				t.Errorf("sealed again:\n%x\ndoc:\n%x", again, sealed)
			}
			if os.Getenv("FERRY_PRINT_VECTORS") != "" {
				t.Logf("%s sealed %x", name, again)
			}
		})
	}
}

// TestPrintNewVectors prints fresh vectors (a wrapped key from the KEK) for
// the doc when FERRY_NEW_VECTORS is set; it checks nothing otherwise.
func TestPrintNewVectors(t *testing.T) {
	if os.Getenv("FERRY_NEW_VECTORS") == "" {
		t.Skip("set FERRY_NEW_VECTORS=1 to print new vectors for docs/FORMAT.md")
	}
	kekURL := "base64key://AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
	k := openTest(t, Config{KeyURL: kekURL})
	key := unhex(t, "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf")
	wrapped, err := k.current.keeper.Encrypt(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := KeyIDOf(kekURL)
	t.Logf("key id %x wrapped %x", id[:], wrapped)
}
