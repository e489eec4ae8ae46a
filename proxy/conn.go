package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
)

// API keys the proxy looks at, by name.
var (
	keyProduce                 = kmsg.Produce.Int16()
	keyFetch                   = kmsg.Fetch.Int16()
	keyMetadata                = kmsg.Metadata.Int16()
	keySASLHandshake           = kmsg.SASLHandshake.Int16()
	keySASLAuthenticate        = kmsg.SASLAuthenticate.Int16()
	keyDescribeTopicPartitions = kmsg.DescribeTopicPartitions.Int16()
)

// inflight is one request waiting for its response.
type inflight struct {
	key, version int16
	corr         int32
	start        time.Time
	local        []byte // a response frame the proxy answers itself (KIP-511, interceptors)
	// produce: what the interceptors did to a Produce request: partitions
	// they answered (merged into the broker's response) and the work they
	// committed (undone for partitions the broker refuses).
	produce *interceptor.ProduceOutcome
	// refused: the interceptors answered a partition of the Produce
	// request with an error (with acks=0 the connection then closes).
	refused bool
	// acks0: a Produce request with acks=0 (no response expected).
	acks0 bool
	// fetchLimits: a Fetch request's limits, which the fetch interceptors
	// keep the rewritten response within.
	fetchLimits interceptor.FetchLimits
	// decode: the response must be read whole and decoded (rewritten,
	// intercepted, or watched); otherwise it streams through.
	decode bool
	// release gives back memory held until the response is written
	// (the decoded Fetch request's limits); nil: none. Set before the
	// request is queued; safe to call more than once.
	release func()
	// newSession: the state of the fetch session the request opens
	// (epoch 0), bound to the id its response gives.
	newSession *fetchSession
	// parts: the response frame as a vector, when the proxy rewrote it
	// with large record sets left where they lie, and streamed values
	// read from the store as they are written (fetchframe.go).
	parts *framePlan
	// frameFree: once written, nothing reads the broker's response frame
	// any more (it goes back to its pool).
	frameFree bool
	// streams: a Produce request's values that went to the store as they
	// arrived (producestream.go); the chain defers them like its own.
	streams *interceptor.Streams
	// gen: the interceptor chain in force when the request was read, which
	// also handles its response (hot reload); held from enqueue to drop.
	gen     *chainGen
	genHeld atomic.Bool
}

// conn is one client connection and its upstream connection. The reader
// goroutine reads requests, queues them in pending and forwards them; the
// writer goroutine takes each queued request, reads its response from
// upstream (Kafka answers in order on a connection), rewrites it if needed
// and writes it to the client. Frames that need no decoding stream through
// without being held whole; the others are read into buffers charged to the
// proxy's memory budget (proxy.memory.max.bytes).
type conn struct {
	s      *Server
	client net.Conn
	cr     *bufio.Reader // the client side, reading through activityReader
	nodeID int32
	log    *slog.Logger

	upMu     sync.Mutex // guards upstream's assignment against close()
	upstream net.Conn
	ur       *bufio.Reader
	upReady  chan struct{} // closed once upstream is dialled
	upErr    error         // why the dial failed (set before upReady closes; nil: dialled)

	pending chan *inflight
	done    chan struct{}   // closed by close()
	ctx     context.Context // ends with the connection (interceptor calls)
	cancel  context.CancelFunc
	// fetchCtx: ctx, ended too when the client resets its connection
	// (readError): the work of a Fetch response (its fetch interceptors,
	// downloads) is only for the client to read, and a reset socket reads
	// nothing. (A Produce response's work, confirming or undoing what was
	// published, goes on under ctx.)
	fetchCtx    context.Context
	cancelFetch context.CancelFunc
	closeOnce   sync.Once
	draining    atomic.Bool
	active      atomic.Int64 // unix nanoseconds of the last whole frame read from or written to the client
	inFlight    atomic.Int32 // requests queued and not yet answered (including the one being answered)
	served      atomic.Bool  // a response other than ApiVersions or SASL has been written (abortive)
	clientEOF   atomic.Bool  // the client closed its side (readError): a reset on a write then is its

	writeDeadline time.Time // the client's write deadline (writer goroutine only)

	// parked: the writer waits on the upstream connection with nothing
	// queued (waitUpstream); kicked: the reader has woken it since
	// (kickWriter), by a read deadline the writer clears. Under parkMu.
	parkMu sync.Mutex
	parked bool
	kicked bool
	ended  bool // pending is closed (readerEnded)

	// firstDone: the client has sent a whole request (or one waits for the
	// proxy); until then firstTimer closes the connection at
	// connections.first.request.timeout.ms (limits.go).
	firstDone  atomic.Bool
	firstTimer *time.Timer

	// headOnly: the client's last frame streamed through by splice and was
	// larger than the read buffer; readCap: while set, the most one read of
	// the client's socket takes (peekRequest). Both are the reader
	// goroutine's (watchClient's peek runs while the reader waits for it).
	headOnly bool
	readCap  int
	headBuf  [headRead]byte // peekHead's copy of a frame's head

	auth     saslState
	sessions fetchSessions // the client's incremental fetch sessions (KIP-227)
}

func newConn(s *Server, c net.Conn, nodeID int32) *conn {
	cn := &conn{s: s, client: c, nodeID: nodeID, pending: make(chan *inflight, s.cfg.MaxInFlight), done: make(chan struct{}),
		upReady: make(chan struct{}), log: s.log.With("client", c.RemoteAddr().String(), "node", nodeID)}
	// The undo of the connection's abandoned work (deletes of payloads no
	// acknowledged record references) outlives the connection, until
	// Shutdown's deadline (Server.undo).
	cn.ctx, cn.cancel = context.WithCancel(s.undo.With(context.Background()))
	cn.fetchCtx, cn.cancelFetch = context.WithCancel(cn.ctx)
	cn.active.Store(time.Now().UnixNano())
	cn.auth.init(func(wait bool) bool { return s.authRequired(cn, wait) })
	cn.sessions.s = s
	return cn
}

// close closes both sides once; safe from any goroutine.
func (c *conn) close() {
	c.closeOnce.Do(func() {
		close(c.done)
		c.cancel()
		c.client.Close()
		c.upMu.Lock()
		if c.upstream != nil {
			c.upstream.Close()
		}
		c.upMu.Unlock()
		c.auth.wake()
	})
}

// idleSince reports whether c has had nothing in flight and no frame read or
// written since before t.
func (c *conn) idleSince(t time.Time) bool {
	return c.inFlight.Load() == 0 && c.active.Load() < t.UnixNano()
}

// drain stops reading requests; responses still owed are written, then the
// connection closes (Shutdown).
func (c *conn) drain() {
	c.draining.Store(true)
	_ = c.client.SetReadDeadline(time.Now())
}

// setReadDeadline sets the client's read deadline to t, unless Shutdown
// is draining: its deadline in the past stays. Set first, draining looked
// at after: drain sets draining before its deadline, so a drain that comes
// between the two still has the last word (a look before the set let a
// drain landing between them be overwritten, and the reader read on).
func (c *conn) setReadDeadline(t time.Time) {
	_ = c.client.SetReadDeadline(t)
	if c.draining.Load() {
		_ = c.client.SetReadDeadline(time.Now())
	}
}

// fail logs why the connection closes, counts it and closes it. A
// connection already closed (by the other goroutine, the idle reaper,
// Shutdown) is not counted again: what failed then (a charge to the memory
// budget on its cancelled context, a wait for SASL ended by the close) is
// the close's consequence, and whoever closed it said why.
func (c *conn) fail(kind string, msg string, err error) {
	if c.closed() {
		return
	}
	c.s.m.errors.WithLabelValues(kind).Inc()
	c.log.Warn(msg+"; closing the connection", "err", err)
	c.close()
}

// writeFailed ends the connection after a write to the client failed. A
// client that closed its connection while a response was owed (EPIPE, or
// ECONNRESET when it is the client's: a consumer that closes with a fetch
// outstanding, as Kafka's clients do on close) ends it as the broker sees
// it: logged at debug, not counted as an error. Any other failure (the
// write deadline: a client that stopped reading) is client_io. reset: the
// error is the client's alone (a plain write), so ECONNRESET counts as the
// client's close; on a splice, which reads the broker too, only once the
// client has closed its side (clientEOF) or a reset closed its socket
// (peerReset; TestClientResetMidFetchResponse).
func (c *conn) writeFailed(err error, reset bool) {
	if c.closed() {
		return
	}
	// A splice's ECONNRESET (reset false) may be the broker's: the
	// client's when the reader saw the client end the connection, or when
	// the client's socket is closed (peerReset: a killed consumer's reset
	// reached the writer before the reader).
	if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) && (reset || c.clientEOF.Load() || peerReset(c.client)) {
		c.log.Debug("client closed the connection before its response was written", "err", err)
		c.close()
		return
	}
	c.fail("client_io", "write to client failed", err)
}

func (c *conn) recoverPanic() {
	if r := recover(); r != nil {
		c.s.m.errors.WithLabelValues("panic").Inc()
		c.log.Error("panic in connection handler; closing the connection", "panic", r, "stack", string(debug.Stack()))
		c.close()
	}
}

func (c *conn) closed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *conn) serve() {
	defer c.s.wg.Done()
	defer c.s.removeConn(c)
	defer c.recoverPanic()
	c.s.m.connsActive.Inc()
	defer c.s.m.connsActive.Dec()
	c.abortive(true)
	c.startFirstRequestTimer()
	defer c.firstRequestDone()

	if tc, ok := c.client.(interface {
		HandshakeContext(context.Context) error
	}); ok {
		ctx, cancel := context.WithTimeout(context.Background(), c.s.cfg.DialTimeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if errors.Is(err, ErrSNIUnknown) {
			c.close() // counted and logged by refuseSNI
			return
		}
		if err != nil {
			c.fail("client_tls", "client TLS handshake failed", err)
			return
		}
	}
	if c.nodeID == nodeSNI && !c.routeSNI() {
		return
	}
	c.cr = bufio.NewReaderSize(activityReader{c}, readerSize)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer c.recoverPanic()
		c.writeLoop()
	}()
	c.readLoop()
	wg.Wait()
	c.close()
	c.sessions.close()
}

// ensureUpstream dials the upstream broker on first use: a client that
// sends nothing, or only requests the proxy answers itself, costs no
// upstream connection. An unreachable broker is dialled again for up to
// upstream.connect.timeout.ms while the client's request waits (dialHeld);
// then the client's connection is reset (resetUnanswered).
func (c *conn) ensureUpstream() bool {
	// A request larger than the read buffer, held while the broker is
	// dialled: the wait is the proxy's, not the client's.
	c.firstRequestDone()
	select {
	case <-c.upReady:
		return c.upErr == nil
	default:
	}
	up, err := c.dialHeld()
	if err == nil {
		c.upMu.Lock()
		if c.closed() { // closed by Shutdown while dialing
			up.Close()
			err = net.ErrClosed
		} else {
			c.upstream, c.ur = up, bufio.NewReaderSize(up, readerSize)
		}
		c.upMu.Unlock()
	}
	if err != nil && !errors.Is(err, errClientLeft) && !c.closed() {
		// Before upReady closes: the writer, woken by it, closes the
		// connection too, and the reset must come first.
		c.resetUnanswered()
	}
	c.upErr = err
	if err != nil {
		// Counted before upReady wakes the writer, which would close
		// the connection first and leave the failure uncounted.
		switch {
		case c.closed():
		case errors.Is(err, errClientLeft):
			c.log.Debug("client closed the connection while its request waited for the upstream broker")
			c.close()
		case errors.Is(err, errUnknownNode):
			// A node id the cluster does not name (an SNI host of a
			// broker that never existed, a listener left from a removed
			// broker): one line every refusalLogEvery, not per connection.
			c.s.m.errors.WithLabelValues("unknown_node").Inc()
			if n, ok := c.s.unknownNodeLog.allow(refusalLogEvery); ok {
				c.log.Warn("connection closed: the upstream cluster names no broker with this node id (logged at most every 10s)",
					"err", err, "closed", n)
			}
			c.close()
		default:
			c.fail("upstream_dial", "cannot reach the upstream broker", err)
		}
		close(c.upReady)
		return false
	}
	close(c.upReady)
	c.log.Debug("connection open", "upstream", up.RemoteAddr().String())
	return true
}

// readerSize is the buffer of each side's bufio.Reader: small frames are
// read through it; larger ones stream or are read into their own buffers.
const readerSize = 32 << 10

// readLoop reads requests from the client and forwards them upstream.
func (c *conn) readLoop() {
	defer c.readerEnded()
	for {
		if !c.readRequest() {
			return
		}
	}
}

// readerEnded closes pending once the reader has stopped and wakes the
// writer (kickWriter). ended is set too, under parkMu: a writer that found
// pending empty before the close and parks after the kick (which found it
// not parked) sees it there, as len(pending) does not show a close.
func (c *conn) readerEnded() {
	close(c.pending)
	c.parkMu.Lock()
	c.ended = true
	c.parkMu.Unlock()
	c.kickWriter()
}

// readRequest handles one request; false ends the loop.
func (c *conn) readRequest() bool {
	size, head, err := c.peekRequest()
	if err != nil {
		c.readError(err)
		return false
	}
	if len(head) == 4+int(size) {
		c.firstRequestDone() // the whole frame is here
	}
	h, err := ParseRequestHeader(head[4:])
	if err != nil && !(errors.Is(err, ErrTruncatedHeader) && len(head) < 4+int(size)) {
		if errors.Is(err, ErrUnsupportedVersion) && h.Key == apiVersionsKey {
			// KIP-511: answer with the versions we know; the client retries.
			if _, err := c.cr.Discard(4 + int(size)); err != nil {
				c.readError(err)
				return false
			}
			return c.enqueue(&inflight{key: h.Key, version: 0, corr: h.CorrelationID, start: time.Now(),
				local: unsupportedApiVersionsResponse(h.CorrelationID)})
		}
		kind := "malformed"
		switch {
		case errors.Is(err, ErrUnknownKey):
			kind = "unknown_key"
		case errors.Is(err, ErrUnsupportedVersion):
			kind = "unsupported_version"
		}
		c.fail(kind, "bad request from client", err)
		return false
	}
	// The chain in force now handles this request and its response, whatever
	// a reload installs meanwhile (reload.go).
	g := c.s.acquireChain()
	defer g.release()
	whole := err != nil || c.wantsRequest(h, g)
	if whole && err == nil && h.Key == keyProduce && len(head) == 4+int(size) && c.auth.ok() &&
		c.produceUntouched(h, head[4+h.Len:], g.chain) {
		// A Produce frame that is all in the read buffer and that no
		// interceptor needs (a skim, intercept.go) goes as the plain
		// proxy sends it.
		whole = false
	}
	acks := int16(1)
	if !whole && h.Key == keyProduce {
		// acks sits after the transactional id: in the peeked bytes, or
		// the request is read whole.
		if a, aerr := produceAcks(head[4+h.Len:], h.Version, h.Flexible); aerr == nil {
			acks = a
		} else {
			whole = true
		}
	}
	if !whole {
		c.s.m.request(h.Key)
		c.s.m.bytesIn.Add(float64(4 + size))
		f := &inflight{key: h.Key, version: h.Version, corr: h.CorrelationID, start: time.Now(), decode: c.wantsResponse(h.Key, h.Version, g), gen: g}
		if acks != 0 && !c.enqueue(f) {
			return false
		}
		if !c.ensureUpstream() {
			return false
		}
		if err := stream(c.upstream, c.cr, c.client, int64(4+size), c.markActive); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				// The client's side ended mid-frame (the broker's
				// connection, holding part of it, closes with it).
				c.fail("client_io", "client disconnected mid-request", err)
			} else {
				c.forwardError(err)
			}
			return false
		}
		// A frame larger than the read buffer went mostly by splice: the
		// client's next frame is likely as large, and only its head is read.
		c.headOnly = 4+int(size) > readerSize && c.splices()
		c.firstRequestDone()
		c.active.Store(time.Now().UnixNano())
		return true
	}
	if (h.Key == keyProduce && g.hasProduce() || h.Key == keyFetch && g.hasFetch()) && !c.auth.ok() &&
		!c.auth.await(c.done) {
		// Decided before the frame is read (and its memory charged): a
		// client that has not authenticated holds none of the budget.
		c.fail("unauthenticated", apiName(h.Key)+" request before SASL authentication completed (the broker closes such a connection too)", nil)
		return false
	}
	if (h.Key == keyProduce || h.Key == keyFetch) && !c.ensureUpstream() {
		// Reached (or held for: dialHeld) before the frame is read: a
		// request waiting for an unreachable broker holds none of the
		// memory budget, and the interceptors do not run (publish
		// payloads) for a request that may never be forwarded.
		return false
	}
	var frame []byte
	var release func()
	var streams *interceptor.Streams // values read as streams (producestream.go)
	var pooled bool                  // frame is from a pool (pool.go)
	if err == nil && h.Key == keyProduce && h.Version >= 3 && g.hasProduce() && g.chain.CanStream() && size >= minStreamedFrame {
		frame, release, streams, err = c.readProduce(h, size, g)
	} else {
		frame, release, pooled, err = c.readWhole(size, h.Key == keyProduce && g.hasProduce())
	}
	if err != nil {
		if errors.Is(err, errProduceFrame) {
			c.fail("malformed", "bad Produce request from client", err)
		} else {
			c.readError(err)
		}
		return false
	}
	c.firstRequestDone()
	ok, free := c.handleWhole(frame, g, streams)
	release()
	if pooled && free {
		requestFramesFreed.Add(1)
		putFrame(frame)
	}
	// Streamed values whose records the chain did not take (a refused
	// partition, a request that never reached it) are referenced by
	// nothing.
	streams.AbortUncommitted(c.ctx)
	c.s.collectLarge(int64(size))
	return ok
}

// headRead is how much of the client's socket one read takes while its
// frames are larger than the read buffer (conn.headOnly): enough for a
// request header and a Produce request's acks, which decide how the frame
// goes; the rest of the frame is spliced socket to socket (stream) rather
// than copied through the proxy twice.
const headRead = 512

// peekRequest peeks at the client's next frame: its size (after the
// prefix, checked against socket.request.max.bytes) and its head, the whole
// frame when it fits the read buffer. While the client sends large frames
// that stream through (headOnly), the head is only what one short read of
// headRead bytes brought, when that holds the request header (and a
// Produce request's acks); else it is read as usual. A client gone
// mid-frame is io.ErrUnexpectedEOF (or its reset, ECONNRESET); a reset with
// nothing of a frame read is errClientReset.
func (c *conn) peekRequest() (size int32, head []byte, err error) {
	if c.headOnly {
		c.headOnly = false
		if c.cr.Buffered() == 0 {
			if size, head, ok := c.peekHead(); ok {
				return size, head, nil
			}
		}
		c.readCap = headRead
		defer func() { c.readCap = 0 }()
	}
	if size, err = peekSize(c.cr, c.s.cfg.MaxRequestBytes); err != nil {
		if c.cr.Buffered() == 0 && errors.Is(err, syscall.ECONNRESET) {
			// Nothing of a request read: the client's close, by a reset.
			err = fmt.Errorf("%w: %w", errClientReset, err)
		}
		return 0, nil, err
	}
	want := int(min(4+int64(size), readerSize))
	if c.readCap > 0 && want > c.readCap {
		head, err = c.cr.Peek(c.readCap)
		if err == nil && requestHeadComplete(head[4:]) {
			return size, head, nil
		}
		c.readCap = 0
	}
	head, err = c.cr.Peek(want)
	if err != nil && len(head) < 4+int(size) {
		return size, head, eofInFrame(err) // the client went away mid-frame
	}
	return size, head, nil
}

// peekHead looks at the head of the client's next frame in its socket
// without taking it (peekSocket): when the frame is larger than the read
// buffer and the head holds its request header (requestHeadComplete), the
// whole frame, its head included, can then be spliced to the broker, one
// system call fewer than reading the head and writing it. ok false: read
// as usual (a smaller frame, a head that arrived short, the end of the
// connection).
func (c *conn) peekHead() (size int32, head []byte, ok bool) {
	n, ok := peekSocket(c.client, c.headBuf[:])
	if !ok || n < 4 {
		return 0, nil, false
	}
	head = c.headBuf[:n]
	size = int32(binary.BigEndian.Uint32(head))
	if size < 0 || size > c.s.cfg.MaxRequestBytes || 4+int(size) <= readerSize || !requestHeadComplete(head[4:]) {
		return 0, nil, false
	}
	c.active.Store(time.Now().UnixNano())
	return size, head, true
}

// requestHeadComplete reports whether msg, the start of a request message,
// holds all that readRequest reads before the frame's body: the request
// header, and a Produce request's acks. A header that does not parse for
// another reason than its length counts as complete (readRequest refuses
// it either way).
func requestHeadComplete(msg []byte) bool {
	h, err := ParseRequestHeader(msg)
	if err != nil {
		return !errors.Is(err, ErrTruncatedHeader)
	}
	if h.Key != keyProduce {
		return true
	}
	_, err = produceAcks(msg[h.Len:], h.Version, h.Flexible)
	return err == nil
}

// splices reports whether stream can splice the client's bytes to the
// upstream broker: both are plain TCP connections (no TLS).
func (c *conn) splices() bool {
	_, cl := c.client.(*net.TCPConn)
	_, up := c.upstream.(*net.TCPConn)
	return cl && up
}

// wantsRequest reports whether a request must be read whole: the proxy
// decodes it (interceptors, SASL state, an acks it could not peek).
func (c *conn) wantsRequest(h RequestHeader, g *chainGen) bool {
	switch h.Key {
	case keyProduce:
		return g.hasProduce()
	case keyFetch:
		return g.hasFetch()
	case keySASLHandshake, keySASLAuthenticate, apiVersionsKey:
		return true
	}
	return false
}

// wantsResponse reports whether the response to key at version must be
// read whole and decoded: endpoints to rewrite, ApiVersions to narrow, the
// interceptors' work, topic ids to learn, SASL outcomes to follow.
func (c *conn) wantsResponse(key, version int16, g *chainGen) bool {
	if key == apiVersionsKey || needsRewrite(key, version) || key == keySASLHandshake || key == keySASLAuthenticate {
		return true
	}
	if g.active() {
		switch key {
		case keyMetadata, keyDescribeTopicPartitions:
			return true
		case keyProduce:
			return g.hasProduce()
		case keyFetch:
			return g.hasFetch()
		}
	}
	return false
}

// readWhole reads a frame of size bytes (after its prefix) into a buffer
// that grows with the bytes that arrive, each growth charged to the memory
// budget first (a client that stalls mid-frame holds only what it sent);
// release gives it back.
//
// pool: a frame of up to frameStep bytes larger than the read buffer is
// read into a pooled buffer (pool.go), charged at its class size (the
// first step readFrameCharged would charge), for the caller to give back
// with putFrame when nothing holds it: a Produce request the skim forwards
// as it came (ProducerPerformance's requests are ~46 KB; allocated per
// request, they were the proxy-lm produce path's garbage: 17 % of its CPU
// in garbage collection, docs/BENCHMARKS.md).
// requestFramesPooled counts the request frames readWhole read into a
// pooled buffer (for tests: the pooled path was taken).
var requestFramesPooled atomic.Int64

// requestFramesFreed counts the pooled request frames readRequest gave
// back once handled (for tests: a rewritten request's frame went back too).
var requestFramesFreed atomic.Int64

func (c *conn) readWhole(size int32, pool bool) (frame []byte, release func(), pooled bool, err error) {
	if n := 4 + int(size); pool && n > readerSize && n <= frameStep {
		_, charged, _ := poolClass(n)
		if err := c.s.mem.TakeUnqueued(c.ctx, int64(charged)); err != nil {
			return nil, nil, false, err
		}
		frame := getFrame(n)
		if _, err := io.ReadFull(c.cr, frame); err != nil {
			c.s.mem.Give(int64(charged))
			putFrame(frame)
			return nil, nil, false, eofInFrame(err)
		}
		requestFramesPooled.Add(1)
		return frame, func() { c.s.mem.Give(int64(charged)) }, true, nil
	}
	if 4+int(size) <= readerSize {
		// A small frame: within the connection's own allowance (its
		// read buffer), so a full budget never stops ApiVersions, SASL
		// or small requests.
		frame, err := readFrame(c.cr, c.s.cfg.MaxRequestBytes, nil)
		return frame, func() {}, false, err
	}
	var charged int64
	release = func() { c.s.mem.Give(charged) }
	frame, err = readFrameCharged(c.cr, c.s.cfg.MaxRequestBytes, c.s.mem.Limit(), func(n int64) error {
		if err := c.s.mem.TakeUnqueued(c.ctx, n); err != nil {
			return err
		}
		charged += n
		return nil
	}, func(n int64) {
		c.s.mem.Give(n)
		charged -= n
	})
	if err != nil {
		release()
		return nil, nil, false, err
	}
	return frame, release, false, nil
}

// handleWhole handles a request read whole; streams are the values of a
// Produce request that went to the store as they arrived (nil: none).
//
// free: the request went upstream as the frame's bytes and nothing holds
// the frame (a Produce request the skim passed: interceptProduce kept no
// part of it), so the caller may reuse it.
func (c *conn) handleWhole(frame []byte, g *chainGen, streams *interceptor.Streams) (ok, free bool) {
	whole := frame
	c.s.m.bytesIn.Add(float64(len(frame)))
	c.active.Store(time.Now().UnixNano())
	h, err := ParseRequestHeader(frame[4:])
	if err != nil {
		c.fail("malformed", "bad request from client", err)
		return false, false
	}
	expectResponse := true
	if h.Key == keyProduce {
		acks, err := produceAcks(frame[4+h.Len:], h.Version, h.Flexible)
		if err != nil {
			c.fail("malformed", "bad Produce request from client", err)
			return false, false
		}
		expectResponse = acks != 0
	}
	c.s.m.request(h.Key)
	f := &inflight{key: h.Key, version: h.Version, corr: h.CorrelationID, start: time.Now(), decode: c.wantsResponse(h.Key, h.Version, g), gen: g, streams: streams,
		acks0: !expectResponse}
	switch h.Key {
	case keySASLHandshake:
		c.auth.handshake(h.Version, frame[4+h.Len:])
	case keySASLAuthenticate:
		c.auth.authenticating()
	case keyFetch:
		if g.hasFetch() {
			if !c.auth.await(c.done) {
				c.fail("unauthenticated", "Fetch request before SASL authentication completed (the broker closes such a connection too)", nil)
				return false, false
			}
			release, ok := c.chargeShape(h, frame)
			if !ok {
				return false, false
			}
			// The limits live until the response is written or the
			// connection closes (reader and writer may both give back).
			f.release = sync.OnceFunc(release)
			// A request that does not decode goes on: the broker answers it.
			if req, err := decodeFetch(h.Version, frame[4+h.Len:]); err == nil {
				f.fetchLimits, f.newSession = c.sessions.limits(req)
			}
		}
	case keyProduce:
		if g.hasProduce() {
			if !c.auth.await(c.done) {
				c.fail("unauthenticated", "Produce request before SASL authentication completed (the broker closes such a connection too)", nil)
				return false, false
			}
			release, ok := c.chargeShape(h, frame)
			if !ok {
				return false, false
			}
			defer release()
			out, forward, err := c.interceptProduce(h, frame, f)
			if err != nil {
				c.fail("malformed", "bad Produce request from client", err)
				return false, false
			}
			if !forward {
				// Every partition was answered by the interceptors.
				if !expectResponse {
					return !c.closeRefusedAcks0(f), false
				}
				return c.enqueue(f), false
			}
			if out != nil {
				// The rewritten request: a copy nothing keeps once it
				// is written (the chain's outcome holds no bytes of it).
				frame = out
				defer putFrame(out)
			}
		}
	}
	if (expectResponse && !c.enqueue(f)) || !c.ensureUpstream() {
		f.abandon(c.ctx)
		return false, false
	}
	if _, err := c.upstream.Write(frame); err != nil {
		f.abandon(c.ctx)
		c.forwardError(err)
		return false, false
	}
	if !expectResponse && c.closeRefusedAcks0(f) {
		return false, false
	}
	// A Produce request forwarded as its frame's bytes, the skim's or
	// with no produce interceptor: nothing refers to the frame (the
	// chain's outcome, f.produce, would). Or rewritten into a copy, by
	// interceptor calls that all returned and left nothing that reads the
	// request (encrypt's sealed records): the frame is free once the copy
	// is encoded, not only when the response comes (the next request of
	// the connection takes it from the pool rather than a fresh 64 KiB).
	if h.Key != keyProduce {
		return true, false
	}
	if &frame[0] == &whole[0] {
		return true, f.produce == nil
	}
	return true, !f.produce.HoldsRequest()
}

// closeRefusedAcks0 reports whether the connection must close after an
// acks=0 Produce request of which the interceptors refused a partition
// (the rest, if any, was forwarded): the producer expects no response, so
// the close is its only signal, as from the broker (Kafka's
// KafkaApis.handleProduceRequest closes the connection on an error with
// acks=0, and the producer refreshes its metadata). The caller stops
// reading; the writer answers what is still owed (the broker has then
// read the forwarded request too), then closes.
func (c *conn) closeRefusedAcks0(f *inflight) bool {
	if !f.refused {
		return false
	}
	c.log.Info("closing the connection: the interceptors refused a partition of an acks=0 Produce request (the broker closes it too; the producer gets no response)")
	return true
}

// chargeShape counts the topics and partitions of a request the proxy is
// about to decode and charges what decoding allocates to the memory budget
// (scan.go); release gives it back. A request that cannot be counted is
// decoded by no one: the broker answers it. false: the connection closed
// (more than the whole budget).
func (c *conn) chargeShape(h RequestHeader, frame []byte) (release func(), ok bool) {
	body := frame[4+h.Len:]
	shape := produceShape
	if h.Key == keyFetch {
		shape = fetchShape
	}
	topics, partitions, err := shape(h.Version, body, h.Flexible)
	if err != nil {
		return func() {}, true
	}
	n := decodedBytes(topics, partitions, h.Key)
	if held := int64(len(frame)); held+n > c.s.mem.Limit() {
		// The frame holds its bytes of the budget while it waits: the
		// wait could never end (nor give them back).
		c.fail("memory", fmt.Sprintf("%s request of %d bytes, %d topics and %d partitions: it needs %d bytes of proxy.memory.max.bytes more than the whole budget, %d, while it holds its frame", apiName(h.Key), len(frame), topics, partitions, held+n-c.s.mem.Limit(), c.s.mem.Limit()), interceptor.ErrMemoryBusy)
		return nil, false
	}
	if err := c.s.mem.Take(c.ctx, n); err != nil {
		c.fail("memory", fmt.Sprintf("%s request of %d topics and %d partitions: no room in proxy.memory.max.bytes", apiName(h.Key), topics, partitions), err)
		return nil, false
	}
	return func() { c.s.mem.Give(n) }, true
}

// abandon undoes a request's interceptor work that will not reach the
// broker (the connection closed before it was forwarded). The undo goes on
// after ctx, the connection's, ends, until Shutdown's deadline stops
// Server.undo (payloadstore.Undo).
func (f *inflight) abandon(ctx context.Context) {
	if f.produce != nil {
		f.produce.AbortAll(ctx)
	}
	f.drop()
}

// drop gives back the memory f holds, and its hold on the chain that
// handled it. Its interceptor work stays: a forwarded Produce request may
// have been appended. Safe to call more than once, from reader and writer.
func (f *inflight) drop() {
	if f == nil {
		return
	}
	if f.release != nil {
		f.release()
	}
	if f.genHeld.Swap(false) {
		f.gen.release()
	}
}

func (c *conn) forwardError(err error) {
	if !c.closed() {
		c.resetUnanswered()
		c.fail("upstream_io", "write to the upstream broker failed", err)
	}
}

// stream copies n bytes of a frame from src (whose bufio.Reader is r) to
// dst: first what r holds, then straight from the connection, which lets
// the kernel splice TCP to TCP; a frame that ends early is
// io.ErrUnexpectedEOF. Reading a frame of up to 256 KiB whole into a pooled
// buffer and writing it once instead was measured (docs/BENCHMARKS.md, the
// plain proxy's profile): 6 % fewer system calls, 11 % more CPU per GB
// produced, so a splice stays. While a client's frames are larger than the
// read buffer, r holds none of the next one (peekRequest peeked at its head
// in the socket) or only its head, and nearly all of it is spliced.
//
// progress is called before each streamChunk bytes (and before what r
// holds): the caller marks the connection active or moves the client's
// write deadline, so that connections.max.idle.ms bounds a stall, not a
// slow transfer of a large frame (found by a helper: a 1 MB acks=0 frame
// sent over 6 s, and a slow reader of a 23 MB response, were cut at a 2 s
// idle bound).
func stream(dst io.Writer, r *bufio.Reader, src io.Reader, n int64, progress func()) error {
	if n > 0 && r.Buffered() > 0 {
		progress()
	}
	for n > 0 && r.Buffered() > 0 {
		b, _ := r.Peek(int(min(int64(r.Buffered()), n)))
		if _, err := dst.Write(b); err != nil {
			return err
		}
		_, _ = r.Discard(len(b))
		n -= int64(len(b))
	}
	rf, splices := dst.(io.ReaderFrom)
	for n > 0 {
		progress()
		k := min(n, streamChunk)
		if !splices {
			if _, err := io.CopyN(dst, src, k); err != nil {
				return eofInFrame(err)
			}
		} else if m, err := rf.ReadFrom(io.LimitReader(src, k)); err != nil {
			return err
		} else if m < k {
			return io.ErrUnexpectedEOF
		}
		n -= k
	}
	return nil
}

// streamChunk is the most stream copies between two calls of its
// progress: 1 MiB, the most one splice moves in Go (internal/poll's
// maxSpliceSize), so chunks add no system call. A client moving at least
// this much per connections.max.idle.ms is never cut mid-frame.
const streamChunk = 1 << 20

// markActive notes that bytes of the client's moved (the idle reaper's
// clock, idleSince).
func (c *conn) markActive() { c.active.Store(time.Now().UnixNano()) }

func (c *conn) enqueue(f *inflight) bool {
	c.inFlight.Add(1)
	if f.gen != nil {
		f.gen.retain() // released by drop, once answered or abandoned
		f.genHeld.Store(true)
	}
	select {
	case c.pending <- f:
		if f.local != nil {
			c.kickWriter() // no response from the broker will wake it
		}
		return true
	case <-c.done:
		f.drop()
		return false
	}
}

// errClientReset wraps ECONNRESET when the client reset its connection
// between requests (peekRequest): nothing of a request was read.
var errClientReset = errors.New("client reset the connection between requests")

// readError ends reading after a read from the client failed. A client
// that closes its connection between requests ends it as the broker sees
// it (Kafka's Selector logs a peer's reset at debug and counts nothing),
// whether it closes with a FIN (io.EOF) or a reset (errClientReset: a
// socket with SO_LINGER 0, as librdkafka's clients and killed processes
// close): logged at debug, not counted. A client gone with part of a
// request read, by a FIN (io.ErrUnexpectedEOF) or a reset (ECONNRESET),
// is client_io "client disconnected mid-request".
func (c *conn) readError(err error) {
	switch {
	case c.draining.Load() && errors.Is(err, os.ErrDeadlineExceeded):
		// Shutdown: stop reading; the writer answers what is in flight.
	case c.closed():
	case errors.Is(err, net.ErrClosed):
		// The proxy closed the client's socket itself (resetUnanswered,
		// before the failure that called it is counted): whoever closed
		// it says why.
	case errors.Is(err, io.EOF):
		// The client closed (or half-closed) its side. The writer still
		// answers what is in flight (a half-closed client reads it, as it
		// would from the broker), then closes once the queue is done.
		c.log.Debug("client closed the connection")
		c.clientEOF.Store(true)
		c.served.Store(true) // the client ended it: what is owed goes out, then a plain close
		c.abortive(false)
	case errors.Is(err, errClientReset):
		// As io.EOF, but the socket is gone: the writer still reads what
		// is owed from the broker (its Produce outcomes confirmed or
		// undone), and its write to the client fails, at debug
		// (writeFailed: clientEOF).
		c.log.Debug("client reset the connection", "err", err)
		c.clientEOF.Store(true)
		c.served.Store(true)
		c.cancelFetch() // no one reads the Fetch responses still owed
	case errors.Is(err, ErrFrameTooLarge), errors.Is(err, ErrNegativeSize):
		c.fail("frame_too_large", "request size prefix over socket.request.max.bytes", err)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		c.fail("client_io", "client disconnected mid-request", err)
	case errors.Is(err, interceptor.ErrMemoryBusy):
		c.fail("memory", "no room in proxy.memory.max.bytes for the request", err)
	default:
		c.fail("client_io", "read from client failed", err)
	}
}

// tryPending receives from pending without waiting: queued reports whether
// it received (ok false: pending is closed).
func tryPending(pending <-chan *inflight) (f *inflight, ok, queued bool) {
	select {
	case f, ok = <-pending:
		return f, ok, true
	default:
		return nil, false, false
	}
}

// writeLoop answers queued requests in order: each queued request takes the
// next frame from the broker (Kafka answers in order on a connection).
//
//	next request (nextRequest) ─► an answer the proxy made itself (local)
//	                           └► the broker's response (answer)
func (c *conn) writeLoop() {
	var f *inflight // the request being answered
	defer func() {
		c.close()
		// Requests that will not be answered give back what they hold;
		// the reader closes pending once it has stopped.
		f.drop()
		for g := range c.pending {
			g.drop()
		}
	}()
	w := &writer{}
	defer func() { w.next.drop() }()
	for {
		var ok bool
		if f, ok = c.nextRequest(w); !ok {
			return
		}
		if f.local != nil {
			if !c.write(f, f.local) {
				return
			}
			continue
		}
		if !c.dialled() || !c.answer(f, w) {
			return
		}
	}
}

// dialled waits until the reader has dialled the upstream broker (it queues
// a request before it dials); false: the dial failed, or the connection
// closed meanwhile.
func (c *conn) dialled() bool {
	select {
	case <-c.upReady:
		return c.upErr == nil
	case <-c.done:
		return false
	}
}

// writer is the writer goroutine's state between responses.
type writer struct {
	// next: a request taken from pending by answerRun that was not in
	// its run; nextRequest returns it before anything else.
	next *inflight
	run  []*inflight // answerRun's requests (kept to reuse its array)
}

// nextRequest returns the next queued request, waiting for one; false ends
// the loop: the reader closed pending, or the upstream failed or closed, or
// it sent a response to no request.
//
// With nothing queued the writer waits on the upstream connection itself
// (waitUpstream), not on pending: a request forwarded to the broker is
// queued before it is written, so it is in pending when its response's
// bytes wake the writer, and the reader need not wake the writer for it
// (a goroutine wake-up per request, and a thread's with it: runtime.wakep,
// futex). The reader wakes it (kickWriter) only for what no response
// announces: an answer the proxy makes itself, and the end of pending. A
// broker closing an idle connection is seen at once, and the client's
// connection closes too, as it would have without the proxy.
func (c *conn) nextRequest(w *writer) (*inflight, bool) {
	if f := w.next; f != nil {
		w.next = nil
		return f, true
	}
	for {
		if f, ok, queued := tryPending(c.pending); queued {
			return f, ok
		}
		select {
		case <-c.upReady:
		default:
			// Not dialled yet (the reader dials): only a queued request
			// or the dial's end can come.
			select {
			case f, ok := <-c.pending:
				return f, ok
			case <-c.upReady:
				continue
			case <-c.done:
				return nil, false
			}
		}
		if c.upErr != nil {
			return nil, false // (the reader counted and closed)
		}
		if kicked, err := c.waitUpstream(); err != nil || !kicked {
			// Bytes (a response, whose request is in pending by now) or
			// the upstream's end.
			if f, ok, queued := tryPending(c.pending); queued {
				return f, ok
			}
			c.upstreamIdleEnd(err)
			return nil, false
		}
	}
}

// waitUpstream waits, with nothing queued, until the upstream connection has
// bytes to read (err nil) or fails or closes, or the reader wakes the writer
// (kicked). The reader's wake sets a read deadline in the past, which
// waitUpstream clears before it returns: reads of a response never see it.
func (c *conn) waitUpstream() (kicked bool, err error) {
	c.parkMu.Lock()
	c.parked = true
	ended := c.ended
	c.parkMu.Unlock()
	// A request queued, or pending closed, before parked was set was not
	// kicked for: looked for here, after it.
	if len(c.pending) == 0 && !ended {
		_, err = c.ur.Peek(1)
	}
	c.parkMu.Lock()
	c.parked = false
	kicked, c.kicked = c.kicked, false
	if kicked {
		_ = c.upstream.SetReadDeadline(time.Time{})
	}
	c.parkMu.Unlock()
	if kicked && errors.Is(err, os.ErrDeadlineExceeded) {
		err = nil
	}
	if err == nil && c.ur.Buffered() == 0 {
		kicked = true // nothing read: look at pending again
	}
	return kicked, err
}

// kickWriter wakes the writer if it waits on the upstream connection
// (waitUpstream): the reader queued a request no response from the broker
// will announce (an answer of the proxy's own), or closed pending. Only the
// reader calls it; a closed pending is seen without it too once the upstream
// ends, but the writer must answer at once.
func (c *conn) kickWriter() {
	c.parkMu.Lock()
	if c.parked && !c.kicked {
		c.kicked = true
		_ = c.upstream.SetReadDeadline(aLongTimeAgo)
	}
	c.parkMu.Unlock()
}

// aLongTimeAgo is a deadline that has passed: it ends a read in progress.
var aLongTimeAgo = time.Unix(1, 0)

// upstreamIdleEnd handles what the writer saw with nothing in flight:
// bytes (a response to no request) or the broker closing the connection,
// which the client's connection then follows.
func (c *conn) upstreamIdleEnd(err error) {
	if err == nil {
		c.fail("upstream_io", "response from the upstream broker without a request", nil)
		return
	}
	if !c.closed() {
		c.s.m.errors.WithLabelValues("upstream_io").Inc()
		c.log.Info("the upstream broker closed the connection; closing the client's", "err", err)
		c.resetUnanswered()
	}
}

// answer reads f's response from upstream and writes it to the client.
func (c *conn) answer(f *inflight, w *writer) bool {
	head, err := c.ur.Peek(8)
	if err != nil {
		if !c.closed() {
			c.resetUnanswered()
			c.fail("upstream_io", "read from the upstream broker failed", err)
		}
		return false
	}
	size := int32(binary.BigEndian.Uint32(head))
	if size < 4 || size > c.s.cfg.MaxResponseBytes {
		c.fail("upstream_io", "bad response size from the upstream broker", fmt.Errorf("%d bytes (upstream.response.max.bytes %d)", size, c.s.cfg.MaxResponseBytes))
		return false
	}
	if corr := int32(binary.BigEndian.Uint32(head[4:])); corr != f.corr {
		c.fail("rewrite", "bad response from the upstream broker", fmt.Errorf("response correlation id %d, want %d (%s v%d)", corr, f.corr, apiName(f.key), f.version))
		return false
	}
	if n := 4 + int(size); n <= c.ur.Buffered() {
		if frame, _ := c.ur.Peek(n); c.passes(f, frame) {
			return c.answerRun(f, n, w)
		}
	}
	if !f.decode {
		if err := stream(c.client, c.ur, c.upstream, int64(4+size), c.setWriteDeadline); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) && !c.closed() {
				// The broker's side ended mid-frame: the client holds part
				// of a response that cannot be completed.
				c.resetUnanswered()
				c.fail("upstream_io", "read from the upstream broker failed", err)
				return false
			}
			c.writeFailed(err, false) // a reset may be the broker's
			return false
		}
		c.answered(f, int64(4+size))
		return true
	}
	if f.key == keyFetch && f.version >= fetchFirstFlexible && !f.gen.active() && 4+int(size) > readerSize {
		// A Fetch response only its endpoints could make the proxy
		// change: written as it arrives (fetchstream.go).
		if err := c.streamFetch(f, size); err != nil {
			if !c.closed() {
				var up upstreamReadError
				switch {
				case errors.As(err, &up):
					c.resetUnanswered()
					c.fail("upstream_io", "read from the upstream broker failed", err)
				case errors.Is(err, errFetchWalk):
					c.fail("rewrite", "bad response from the upstream broker", err)
				default: // stream's: the client's write, or the broker's splice
					c.writeFailed(err, false)
				}
			}
			return false
		}
		c.answered(f, int64(4+size))
		return true
	}
	if n := 4 + int(size); n <= readerSize && !(f.gen.active() && (f.key == keyProduce || f.key == keyFetch)) {
		// A small frame no interceptor reads is looked at where it lies,
		// in the connection's read buffer, and discarded once written.
		frame, err := c.ur.Peek(n)
		if err != nil {
			c.fail("upstream_io", "read from the upstream broker failed", eofInFrame(err))
			return false
		}
		out, release, err := c.response(f, frame)
		if err != nil {
			release() // nothing is written: the interceptors' memory and downloads are given back
			c.fail("rewrite", "bad response from the upstream broker", err)
			return false
		}
		ok := c.write(f, out)
		release()
		_, _ = c.ur.Discard(n)
		return ok
	}
	// The broker (trusted) sends the whole frame at once: it is read into
	// a pooled buffer of its size class, charged to the budget first.
	_, charged, _ := poolClass(4 + int(size))
	if err := c.s.mem.TakeUnqueued(c.ctx, int64(charged)); err != nil {
		c.fail("memory", "no room in proxy.memory.max.bytes for a response from the upstream broker", err)
		return false
	}
	defer c.s.mem.Give(int64(charged))
	frame := getFrame(4 + int(size))
	if _, err := io.ReadFull(c.ur, frame); err != nil {
		c.fail("upstream_io", "read from the upstream broker failed", eofInFrame(err))
		return false
	}
	out, release, err := c.response(f, frame)
	if err != nil {
		release() // nothing is written: the interceptors' memory and downloads are given back
		c.fail("rewrite", "bad response from the upstream broker", err)
		return false
	}
	var ok bool
	written := int64(len(out))
	if out == nil && f.parts != nil {
		for _, b := range f.parts.bufs {
			written += int64(len(b))
		}
		ok = c.writeParts(f)
	} else {
		ok = c.write(f, out)
	}
	release()
	c.s.collectLarge(max(int64(size), written))
	if ok && (len(out) > 0 && &out[0] == &frame[0] || f.frameFree) {
		// Forwarded as it came, or rewritten by interceptor calls that
		// have all returned: nothing holds it now (an interceptor call
		// that ran over its time budget may still read it, and then its
		// partition failed and frameFree is false).
		putFrame(frame)
	}
	return ok
}

// passes reports whether frame, the response to f, goes to the client as it
// came, which response would find too: the proxy does not decode it, or
// decodes it only for broker endpoints (Produce, Fetch: KIP-951) and it
// names none, with no interceptor in force; with interceptors, a Produce
// response to a request the skim passed that refuses nothing as
// MESSAGE_TOO_LARGE and names no endpoint (produceAsIs).
func (c *conn) passes(f *inflight, frame []byte) bool {
	if !f.decode {
		return true
	}
	if !(f.key == keyProduce || f.key == keyFetch) {
		return false
	}
	_, hlen, err := parseResponseHeader(frame[4:], ResponseHeaderFlexible(f.key, f.version))
	if err != nil {
		return false
	}
	if f.gen.active() {
		// A Produce response to a request the skim forwarded as it came
		// (nothing to merge, undo or confirm), as interceptResponse finds.
		return f.key == keyProduce && f.produce == nil && c.produceAsIs(f.version, frame[4+hlen:])
	}
	if !needsRewrite(f.key, f.version) {
		return false
	}
	named, err := namesBrokers(f.key, f.version, frame[4+hlen:])
	return err == nil && !named
}

// maxRun bounds the responses answerRun writes at once (a run is at most
// the upstream read buffer in any case).
const maxRun = 64

// answerRun writes f's response, n bytes lying whole in the upstream read
// buffer, with one write together with the responses that follow it there,
// each whole and answering the request queued next, while they go to the
// client as they came (passes): a client that pipelines small requests
// (Produce with acks, 132-byte responses) gets the responses the broker
// sent together in one write rather than one each. A request taken from
// pending that does not fit the run is answered next (w.next).
func (c *conn) answerRun(f *inflight, n int, w *writer) bool {
	run := append(w.run[:0], f)
	sizes := [maxRun]int{n}
	for len(run) < maxRun && n+8 <= c.ur.Buffered() {
		b, _ := c.ur.Peek(n + 8)
		size := int32(binary.BigEndian.Uint32(b[n:]))
		if size < 4 || size > c.s.cfg.MaxResponseBytes || n+4+int(size) > c.ur.Buffered() {
			break // (a bad size fails in answer, as its own response)
		}
		g, ok, queued := tryPending(c.pending)
		if !queued || !ok {
			break // (a closed pending is seen again by nextRequest)
		}
		next := 4 + int(size)
		if g.local != nil || int32(binary.BigEndian.Uint32(b[n+4:])) != g.corr {
			w.next = g // answered on its own (or refused: the correlation id)
			break
		}
		if frame, _ := c.ur.Peek(n + next); !c.passes(g, frame[n:]) {
			w.next = g
			break
		}
		sizes[len(run)] = next
		run = append(run, g)
		n += next
	}
	w.run = run[:0]
	b, _ := c.ur.Peek(n)
	c.setWriteDeadline()
	_, err := c.client.Write(b)
	_, _ = c.ur.Discard(n)
	if err != nil {
		for _, g := range run[1:] {
			g.drop() // f is dropped by writeLoop
		}
		c.writeFailed(err, true)
		return false
	}
	for i, g := range run {
		c.answered(g, int64(sizes[i]))
	}
	clear(run)
	return true
}

// write writes a whole response frame to the client.
func (c *conn) write(f *inflight, out []byte) bool {
	c.setWriteDeadline()
	if _, err := c.client.Write(out); err != nil {
		c.writeFailed(err, true)
		return false
	}
	c.answered(f, int64(len(out)))
	return true
}

// writeParts writes f's response frame given as a vector (writev), each
// streamed value read from the store as it is written (Hole.Stream). A
// streamed value that fails its checks or its store mid-stream closes the
// connection: the client holds part of a frame that cannot be completed.
func (c *conn) writeParts(f *inflight) bool {
	fp := f.parts
	f.parts = nil
	n := fp.size()
	from := 0
	flush := func(to int) error {
		if to == from {
			return nil
		}
		c.setWriteDeadline()
		bufs := slices.Clone(fp.bufs[from:to]) // WriteTo consumes its slice
		from = to
		_, err := bufs.WriteTo(c.client)
		return err
	}
	for i := 0; i <= len(fp.bufs); i++ {
		h := fp.holes[i]
		if h == nil && i < len(fp.bufs) {
			continue
		}
		if err := flush(i); err != nil {
			c.writeFailed(err, true)
			return false
		}
		if h == nil {
			break
		}
		if _, err := h.Stream(deadlineWriter{c}); err != nil {
			if !errors.Is(err, interceptor.ErrStreamedPayload) {
				c.writeFailed(err, false)
				return false
			}
			// The consumer reconnects and fetches the record again: logged
			// once a minute per partition, counted each time.
			c.s.m.errors.WithLabelValues("fetch_stream").Inc()
			if c.s.ic == nil || c.s.ic.shouldLog(h.Topic, h.Partition) {
				c.log.Warn("a streamed record value failed after its fetch response was committed; closing the connection (logged once per minute)", "topic", h.Topic, "partition", h.Partition, "offset", h.Offset, "err", err)
			}
			c.close()
			return false
		}
	}
	c.answered(f, n)
	return true
}

// deadlineWriter writes to the client, moving the write deadline as bytes
// go (a streamed value is written a chunk at a time).
type deadlineWriter struct{ c *conn }

func (w deadlineWriter) Write(p []byte) (int, error) {
	w.c.setWriteDeadline()
	return w.c.client.Write(p)
}

// setWriteDeadline: a client that stops reading for connections.max.idle.ms
// is idle, as the broker sees it (its idle clock moves only with socket
// progress): the write fails and the connection closes, releasing what was
// held for it.
//
// The deadline moves at most every hundredth of the timeout (at most every
// second): a blocked write fails between 99% and 100% of
// connections.max.idle.ms after the last progress, and a busy connection
// does not reset a timer per response.
func (c *conn) setWriteDeadline() {
	idle := c.s.cfg.IdleTimeout
	if idle <= 0 {
		return
	}
	now := time.Now()
	if c.writeDeadline.Sub(now) > idle-min(idle/100, time.Second) {
		return
	}
	c.writeDeadline = now.Add(idle)
	_ = c.client.SetWriteDeadline(c.writeDeadline)
}

// answered accounts for a response written.
func (c *conn) answered(f *inflight, n int64) {
	f.drop()
	if !c.served.Load() && f.key != apiVersionsKey && f.key != keySASLHandshake && f.key != keySASLAuthenticate {
		c.served.Store(true)
		c.abortive(false)
	}
	c.s.m.bytesOut.Add(float64(n))
	now := time.Now()
	c.active.Store(now.UnixNano())
	c.inFlight.Add(-1)
	c.s.m.observeLatency(f.key, now.Sub(f.start).Seconds())
}

// response checks a response frame against its request and returns the
// frame to send to the client: the same bytes, or re-encoded with rewritten
// broker endpoints / narrowed ApiVersions / the interceptors' work; release
// gives back what the interceptors held.
func (c *conn) response(f *inflight, frame []byte) ([]byte, func(), error) {
	nop := func() {}
	msg := frame[4:]
	_, hlen, err := parseResponseHeader(msg, ResponseHeaderFlexible(f.key, f.version))
	if err != nil {
		return nil, nop, err
	}
	switch f.key {
	case keySASLHandshake, keySASLAuthenticate:
		c.auth.response(f.key, f.version, msg[hlen:])
	}
	if f.gen.active() {
		switch f.key {
		case keyProduce, keyFetch, keyMetadata, keyDescribeTopicPartitions:
			return c.interceptResponse(f, frame, msg, hlen)
		}
	}
	var body []byte
	switch {
	case f.key == apiVersionsKey:
		body, err = rewriteApiVersions(msg[hlen:], f.version)
		if err != nil {
			return nil, nop, err
		}
	case needsRewrite(f.key, f.version):
		if f.key == keyProduce || f.key == keyFetch {
			if named, err := namesBrokers(f.key, f.version, msg[hlen:]); err == nil && !named {
				return frame, nop, nil // no endpoint: forwarded without decoding
			}
		}
		var changed bool
		body, changed, err = RewriteResponse(f.key, f.version, msg[hlen:], c.s.mapAddress)
		if err != nil {
			return nil, nop, err
		}
		if !changed {
			return frame, nop, nil
		}
		c.s.m.rewrites.WithLabelValues(apiName(f.key)).Inc()
	default:
		return frame, nop, nil
	}
	return joinFrame(msg[:hlen], body), nop, nil
}

// joinFrame encodes a frame: the size prefix, header (a request or
// response header, kept as it came), then body.
func joinFrame(header, body []byte) []byte {
	out := make([]byte, 4, 4+len(header)+len(body))
	out = append(out, header...)
	out = append(out, body...)
	binary.BigEndian.PutUint32(out, uint32(len(out)-4))
	return out
}

// discoverBrokers sends one Metadata request (no topics) on up and maps every
// broker it names, which opens their listeners.
func discoverBrokers(up net.Conn, m AddressMapper) error {
	req := kmsg.NewPtrMetadataRequest()
	req.Version = 12
	req.Topics = []kmsg.MetadataRequestTopic{}
	clientID := "ferry-proxy"
	frame := make([]byte, 4, 64)
	frame = kbin.AppendInt16(frame, req.Key())
	frame = kbin.AppendInt16(frame, req.Version)
	frame = kbin.AppendInt32(frame, 1)
	frame = kbin.AppendNullableString(frame, &clientID)
	frame = append(frame, 0) // no tagged fields
	frame = req.AppendTo(frame)
	binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
	if _, err := up.Write(frame); err != nil {
		return err
	}
	resp, err := ReadFrame(bufio.NewReader(up), DefaultMaxResponseBytes)
	if err != nil {
		return err
	}
	_, hlen, err := parseResponseHeader(resp[4:], true)
	if err != nil {
		return err
	}
	_, _, err = RewriteResponse(req.Key(), req.Version, resp[4+hlen:], m)
	return err
}

// activityReader reads the client connection and marks the connection
// active on every read that returns bytes, so a large request arriving
// slowly is not taken for an idle connection. While c.readCap is set
// (peekRequest), one read takes at most that many bytes.
type activityReader struct{ c *conn }

func (a activityReader) Read(p []byte) (int, error) {
	if m := a.c.readCap; m > 0 && len(p) > m {
		p = p[:m]
	}
	n, err := a.c.client.Read(p)
	if n > 0 {
		a.c.active.Store(time.Now().UnixNano())
	}
	return n, err
}
