package integration

import "testing"

// viaProxy starts an in-process `ferry proxy` in front of the real broker and
// returns its bootstrap address; the third-party client tests
// (clients_proxy_test.go) connect their clients to it. Tests call it once
// and hand the address to the helpers (viaClient, noRealBrokerPort...), so
// each test starts one proxy.
func viaProxy(t *testing.T) string {
	t.Helper()
	return startProxy(t, brokers(t))
}
