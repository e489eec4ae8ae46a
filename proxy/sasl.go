package proxy

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// saslState follows a connection's SASL authentication as the broker
// answers it (SaslHandshake, SaslAuthenticate, KIP-368 re-authentication
// included), so that the interceptors, and their store writes, run only
// for a client the broker has authenticated.
//
// A connection needs authentication when the upstream listener uses SASL
// (upstream.sasl.mechanism is set, or the start-up probe found the broker
// closing unauthenticated connections), or once the client itself sends a
// SaslHandshake. Requests the interceptors must see (Produce) wait while a
// SaslAuthenticate is in flight; with none in flight and no success, the
// proxy closes the connection, as the broker would.
type saslState struct {
	mu            sync.Mutex
	cond          *sync.Cond
	required      bool
	authenticated bool
	pending       int // SaslAuthenticate (or handshake) requests not yet answered
	closed        bool
}

func (a *saslState) init(required bool) {
	a.cond = sync.NewCond(&a.mu)
	a.required = required
}

// handshake records a SaslHandshake request: this connection authenticates
// (again, for a re-authentication) from now on.
func (a *saslState) handshake() {
	a.mu.Lock()
	a.required = true
	a.pending++
	a.mu.Unlock()
}

// authenticating records a SaslAuthenticate request.
func (a *saslState) authenticating() {
	a.mu.Lock()
	a.required = true
	a.pending++
	a.mu.Unlock()
}

// response records the broker's answer to a SaslHandshake or
// SaslAuthenticate request (body: the response past its header). A
// successful SaslAuthenticate authenticates the connection; a failed one,
// or a handshake the broker refused, does not (the broker closes the
// connection after a failed authentication anyway).
func (a *saslState) response(key, version int16, body []byte) {
	ok := false
	switch key {
	case keySASLAuthenticate:
		resp := kmsg.NewPtrSASLAuthenticateResponse()
		resp.SetVersion(version)
		ok = resp.ReadFrom(body) == nil && resp.ErrorCode == 0
	case keySASLHandshake:
		resp := kmsg.NewPtrSASLHandshakeResponse()
		resp.SetVersion(version)
		if resp.ReadFrom(body) != nil || resp.ErrorCode != 0 {
			a.mu.Lock()
			a.authenticated = false
			a.pending = max(a.pending-1, 0)
			a.cond.Broadcast()
			a.mu.Unlock()
			return
		}
	}
	a.mu.Lock()
	a.pending = max(a.pending-1, 0)
	if key == keySASLAuthenticate {
		a.authenticated = ok
	}
	a.cond.Broadcast()
	a.mu.Unlock()
}

// await waits until no SASL exchange is in flight and reports whether the
// connection may be intercepted: authentication is not required, or it
// succeeded. It returns false at once when done is closed.
func (a *saslState) await(done <-chan struct{}) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for a.required && a.pending > 0 && !a.closed {
		select {
		case <-done:
			return false
		default:
		}
		a.cond.Wait()
	}
	return !a.closed && (!a.required || a.authenticated)
}

// ok reports, without waiting, whether the connection may be intercepted.
func (a *saslState) ok() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return !a.required || a.authenticated
}

// wake releases waiters when the connection closes.
func (a *saslState) wake() {
	a.mu.Lock()
	a.closed = true
	a.cond.Broadcast()
	a.mu.Unlock()
}
