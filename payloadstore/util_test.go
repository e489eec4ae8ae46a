package payloadstore_test

import (
	"crypto/rand"
	"testing"
)

// randPayload returns n random bytes.
func randPayload(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}
