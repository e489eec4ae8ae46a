package proxy

import (
	"bytes"
	"strings"
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
	pending       int    // SaslAuthenticate (or handshake) requests not yet answered
	mechanism     string // from the last SaslHandshake request, upper case
	closed        bool
	// upstream reports whether the upstream listener requires SASL
	// (Server.authRequired), waiting for a probe when wait is set and
	// nothing is known yet (else: true, fail closed); asked only when an
	// interception is due.
	upstream func(wait bool) bool
}

func (a *saslState) init(upstream func(wait bool) bool) {
	a.cond = sync.NewCond(&a.mu)
	a.upstream = upstream
}

// handshake records a SaslHandshake request (body: past its header): this
// connection authenticates (again, for a re-authentication) from now on,
// with the mechanism it names.
func (a *saslState) handshake(version int16, body []byte) {
	mech := ""
	req := kmsg.NewPtrSASLHandshakeRequest()
	req.SetVersion(version)
	if req.ReadFrom(body) == nil {
		mech = strings.ToUpper(req.Mechanism)
	}
	a.mu.Lock()
	a.required = true
	a.pending++
	a.mechanism = mech
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
// SaslAuthenticate answer authenticates the connection only when it ends
// the exchange successfully, which depends on the mechanism: PLAIN's one
// step; SCRAM's server-final message ("v=…"; its first answer, "r=…", only
// continues the exchange and needs no password); OAUTHBEARER's empty
// answer (a non-empty one is an error report). Other mechanisms (GSSAPI)
// cannot be followed: such connections are never intercepted. A failed
// exchange, or a handshake the broker refused, does not authenticate (the
// broker closes the connection after a failed authentication anyway).
func (a *saslState) response(key, version int16, body []byte) {
	ok, final := false, true
	switch key {
	case keySASLAuthenticate:
		resp := kmsg.NewPtrSASLAuthenticateResponse()
		resp.SetVersion(version)
		if resp.ReadFrom(body) == nil && resp.ErrorCode == 0 {
			a.mu.Lock()
			mech := a.mechanism
			a.mu.Unlock()
			switch {
			case mech == "PLAIN":
				ok = true
			case strings.HasPrefix(mech, "SCRAM-"):
				ok = bytes.HasPrefix(resp.SASLAuthBytes, []byte("v="))
				// "r=…" continues the exchange: the state stays as it
				// was (a re-authentication keeps the connection's).
				final = !bytes.HasPrefix(resp.SASLAuthBytes, []byte("r="))
			case mech == "OAUTHBEARER":
				ok = len(resp.SASLAuthBytes) == 0
			}
		}
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
	if key == keySASLAuthenticate && final {
		a.authenticated = ok
	}
	a.cond.Broadcast()
	a.mu.Unlock()
}

// await waits until no SASL exchange is in flight and reports whether the
// connection may be intercepted: authentication is not required, or it
// succeeded. It returns false at once when done is closed. The reader's
// only: it may wait for a probe of the upstream, watching the client's
// socket meanwhile (Server.authRequired).
func (a *saslState) await(done <-chan struct{}) bool {
	up := a.upstream != nil && a.upstream(true)
	a.mu.Lock()
	defer a.mu.Unlock()
	if up {
		a.required = true
	}
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

// ok reports, without waiting, whether the connection may be intercepted
// (while nothing is known of the upstream listener: only once
// authenticated).
func (a *saslState) ok() bool {
	up := a.upstream != nil && a.upstream(false)
	a.mu.Lock()
	defer a.mu.Unlock()
	return !(a.required || up) || a.authenticated
}

// wake releases waiters when the connection closes.
func (a *saslState) wake() {
	a.mu.Lock()
	a.closed = true
	a.cond.Broadcast()
	a.mu.Unlock()
}
