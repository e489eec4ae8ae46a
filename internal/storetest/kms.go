package storetest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// KMSKeyURL returns the gocloud.dev/secrets URL (awskms://alias/...?region=
// ...&endpoint=...) of one of the three AES keys seeded in the test KMS server
// (local-kms, started by scripts/object-stores): which is "" for
// alias/ferry-test, "old" for alias/ferry-test-old, "other" for
// alias/ferry-test-other. The keeper finds its credentials in
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (local-kms takes any). Without
// the servers' environment the test skips, and under CI it fails (NeedEnv).
//
// The keeper of such a URL decrypts a ciphertext of any of the keys: gocloud's
// awskms sends no KeyId with Decrypt, so KMS uses the key the ciphertext
// names (so does AWS KMS). Only Encrypt is bound to the URL's key.
func KMSKeyURL(t testing.TB, which string) string {
	t.Helper()
	var name string
	switch which {
	case "":
		name = "FERRY_KMS_KEY_URL"
	case "old":
		name = "FERRY_KMS_KEY_URL_OLD"
	case "other":
		name = "FERRY_KMS_KEY_URL_OTHER"
	default:
		t.Fatalf("storetest.KMSKeyURL: unknown key %q (want \"\", \"old\" or \"other\")", which)
	}
	return NeedEnv(t, name, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")[0]
}

// KMSStop stops the test KMS server (scripts/object-stores kms-stop): a KMS
// outage until KMSStart, or until the end of the test, which starts it again
// on the same port with the same keys. The server is shared by every test
// package that uses it, so a test that stops it must not run beside other KMS
// tests.
func KMSStop(t testing.TB) {
	t.Helper()
	kmsCtl(t, "kms-stop")
	t.Cleanup(func() { kmsCtl(t, "kms-start") })
}

// KMSStart starts the test KMS server again after KMSStop and waits until it
// answers; it does nothing when the server runs.
func KMSStart(t testing.TB) {
	t.Helper()
	kmsCtl(t, "kms-start")
}

// kmsCtl runs scripts/object-stores with cmd for the servers of
// FERRY_STORES_STATE.
func kmsCtl(t testing.TB, cmd string) {
	t.Helper()
	NeedEnv(t, "FERRY_KMS_ENDPOINT", "FERRY_STORES_STATE")
	script := objectStoresScript(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, script, cmd).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", script, cmd, err, out)
	}
}

// objectStoresScript finds scripts/object-stores in the working directory
// (go test runs in the package's directory) or a parent of it.
func objectStoresScript(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		p := filepath.Join(dir, "scripts", "object-stores")
		if _, err := os.Stat(p); err == nil {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("scripts/object-stores not found in the working directory or a parent of it")
		}
		dir = parent
	}
}
