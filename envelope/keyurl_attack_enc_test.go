package envelope

import (
	"bytes"
	"context"
	"encoding/base64"
	"testing"
)

// Attack (security review of issue #13): OpenKeyring refuses
// "base64key://" without a key, because gocloud's localsecrets then makes a
// random key that is lost at exit (every payload and record sealed under it
// becomes unreadable on restart). The check looks for the exact prefix
// "base64key://", but gocloud reads the scheme case-insensitively and a URL
// without "//" (base64key:KEY, an easy slip in a YAML file) has no host
// either: both open a random key without a word, and the operator learns it
// when the process restarts and nothing opens.
func TestAttackEncBase64KeyURLSpellingsOpenRandomKey(t *testing.T) {
	ctx := context.Background()
	key := base64.URLEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	for _, u := range []string{"base64key:" + key, "BASE64KEY://", "Base64Key://"} {
		k1, err := OpenKeyring(ctx, Config{KeyURL: u})
		if err != nil {
			continue // refused: fine
		}
		a := PayloadAAD{Topic: "orders", Key: "orders/3a/x"}
		sealed, _ := seal(t, k1, []byte("hello"), a)
		k1.Close()
		// The same configuration after a restart.
		k2, err := OpenKeyring(ctx, Config{KeyURL: u})
		if err != nil {
			t.Fatalf("%.12s…: accepted once, refused the second time: %v", u, err)
		}
		_, err = open(k2, sealed, a)
		k2.Close()
		if err != nil {
			t.Errorf("key URL %.12s… is accepted, but what it sealed does not open after a restart with the same URL (a random key): %v", u, err)
		}
	}
}
