package integration

import "testing"

// viaProxy returns the bootstrap address the third-party client tests
// (clients_proxy_test.go) connect their clients to.
//
// For now it is a stand-in that returns the real broker (brokers(t)), so the
// client harness runs against Kafka directly. Once `ferry proxy` lands, with
// its startProxy helper in proxy_test.go, this becomes
//
//	return startProxy(t, brokers(t))
//
// and every client test goes through the proxy. Tests call it once and
// hand the address to the helpers (proxyClient, noRealBrokerPort...), so each
// test starts one proxy.
func viaProxy(t *testing.T) string {
	t.Helper()
	return brokers(t)
}
