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
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
)

// maxInFlight bounds the requests read from one client and not yet answered;
// the proxy stops reading that client while the queue is full.
const maxInFlight = 512

// inflight is one request waiting for its response.
type inflight struct {
	key, version int16
	corr         int32
	start        time.Time
	local        []byte // a response frame the proxy answers itself (KIP-511, interceptors)
	// produce: the partitions the interceptors answered, merged into the
	// broker's Produce response (nil: none).
	produce *interceptor.ProduceOutcome
	// fetchLimits: a Fetch request's max_bytes and partition_max_bytes,
	// which the fetch interceptors keep the rewritten response within.
	fetchLimits interceptor.FetchLimits
	// intercepted: a Produce request the interceptors saw; its response is
	// decoded to notice MESSAGE_TOO_LARGE (a stale max.message.bytes).
	intercepted bool
}

// conn is one client connection and its upstream connection. The reader
// goroutine forwards requests and queues them in pending; the writer
// goroutine takes each queued request, reads its response from upstream
// (Kafka answers in order on a connection), rewrites it if needed and writes
// it to the client.
type conn struct {
	s        *Server
	client   net.Conn
	upstream net.Conn
	nodeID   int32
	log      *slog.Logger

	pending   chan *inflight
	done      chan struct{}   // closed by close()
	ctx       context.Context // ends with the connection (interceptor calls)
	cancel    context.CancelFunc
	closeOnce sync.Once
	draining  atomic.Bool
	upMu      sync.Mutex   // guards upstream's assignment against close()
	free      chan []byte  // response frames already written, for upstreamLoop to reuse
	active    atomic.Int64 // unix nanoseconds of the last whole frame read from or written to the client
	inFlight  atomic.Int32 // requests queued and not yet answered (including the one being answered)
}

func newConn(s *Server, c net.Conn, nodeID int32) *conn {
	cn := &conn{s: s, client: c, nodeID: nodeID, pending: make(chan *inflight, maxInFlight), done: make(chan struct{}),
		log: s.log.With("client", c.RemoteAddr().String(), "node", nodeID)}
	cn.ctx, cn.cancel = context.WithCancel(context.Background())
	cn.active.Store(time.Now().UnixNano())
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

// fail logs why the connection closes, counts it and closes it.
func (c *conn) fail(kind string, msg string, err error) {
	c.s.m.errors.WithLabelValues(kind).Inc()
	c.log.Warn(msg+"; closing the connection", "err", err)
	c.close()
}

func (c *conn) recoverPanic() {
	if r := recover(); r != nil {
		c.s.m.errors.WithLabelValues("panic").Inc()
		c.log.Error("panic in connection handler; closing the connection", "panic", r, "stack", string(debug.Stack()))
		c.close()
	}
}

func (c *conn) serve() {
	defer c.s.wg.Done()
	defer c.s.removeConn(c)
	defer c.recoverPanic()
	c.s.m.connsActive.Inc()
	defer c.s.m.connsActive.Dec()

	if tc, ok := c.client.(interface {
		HandshakeContext(context.Context) error
	}); ok {
		ctx, cancel := context.WithTimeout(context.Background(), c.s.cfg.DialTimeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			c.fail("client_tls", "client TLS handshake failed", err)
			return
		}
	}
	up, err := c.s.dialUpstream(context.Background(), c.nodeID)
	if err != nil {
		c.fail("upstream_dial", "cannot reach the upstream broker", err)
		return
	}
	c.upMu.Lock()
	c.upstream = up
	c.upMu.Unlock()
	if c.closed() { // closed by Shutdown while dialing
		up.Close()
		return
	}
	c.log.Debug("connection open", "upstream", up.RemoteAddr().String())

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
}

// readLoop reads requests from the client and forwards them upstream.
func (c *conn) readLoop() {
	defer close(c.pending)
	r := readerPool.Get().(*bufio.Reader)
	r.Reset(activityReader{c})
	defer func() { r.Reset(nil); readerPool.Put(r) }()
	var buf []byte // reused once a request has been forwarded
	for {
		frame, err := readFrame(r, c.s.cfg.MaxRequestBytes, buf)
		if err != nil {
			c.readError(err)
			return
		}
		c.s.m.bytesIn.Add(float64(len(frame)))
		c.active.Store(time.Now().UnixNano())
		h, err := ParseRequestHeader(frame[4:])
		if err != nil {
			if errors.Is(err, ErrUnsupportedVersion) && h.Key == apiVersionsKey {
				// KIP-511: answer with the versions we know; the client retries.
				if !c.enqueue(&inflight{key: h.Key, version: 0, corr: h.CorrelationID, start: time.Now(),
					local: unsupportedApiVersionsResponse(h.CorrelationID)}) {
					return
				}
				continue
			}
			kind := "malformed"
			switch {
			case errors.Is(err, ErrUnknownKey):
				kind = "unknown_key"
			case errors.Is(err, ErrUnsupportedVersion):
				kind = "unsupported_version"
			}
			c.fail(kind, "bad request from client", err)
			return
		}
		expectResponse := true
		var acks int16
		if h.Key == 0 {
			acks, err = produceAcks(frame[4+h.Len:], h.Version, h.Flexible)
			if err != nil {
				c.fail("malformed", "bad Produce request from client", err)
				return
			}
			expectResponse = acks != 0
		}
		c.s.m.requests.WithLabelValues(apiName(h.Key)).Inc()
		f := &inflight{key: h.Key, version: h.Version, corr: h.CorrelationID, start: time.Now()}
		if h.Key == 1 && c.s.ic != nil && c.s.ic.chain.HasFetch() {
			// A request that does not decode goes on: the broker answers it.
			if req, err := decodeFetch(h.Version, frame[4+h.Len:]); err == nil {
				f.fetchLimits = interceptor.FetchLimitsOf(req)
			}
		}
		if h.Key == 0 && c.s.ic != nil && c.s.ic.chain.HasProduce() {
			f.intercepted = true
			out, forward, err := c.interceptProduce(h, frame, f)
			if err != nil {
				c.fail("malformed", "bad Produce request from client", err)
				return
			}
			if !forward {
				// Every partition was answered by the interceptors.
				if expectResponse && !c.enqueue(f) {
					return
				}
				continue
			}
			if out != nil {
				frame = out
			}
		}
		if expectResponse {
			if !c.enqueue(f) {
				return
			}
		}
		if _, err := c.upstream.Write(frame); err != nil {
			if !c.closed() {
				c.fail("upstream_io", "write to the upstream broker failed", err)
			}
			return
		}
		if cap(frame) <= maxReusedFrame {
			buf = frame
		}
	}
}

func (c *conn) enqueue(f *inflight) bool {
	c.inFlight.Add(1)
	select {
	case c.pending <- f:
		return true
	case <-c.done:
		return false
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

func (c *conn) readError(err error) {
	switch {
	case c.draining.Load() && errors.Is(err, os.ErrDeadlineExceeded):
		// Shutdown: stop reading; the writer answers what is in flight.
	case c.closed():
	case errors.Is(err, io.EOF):
		// The client closed (or half-closed) its side. The writer still
		// answers what is in flight (a half-closed client reads it, as it
		// would from the broker), then closes once the queue is done.
		c.log.Debug("client closed the connection")
	case errors.Is(err, ErrFrameTooLarge), errors.Is(err, ErrNegativeSize):
		c.fail("frame_too_large", "request size prefix over socket.request.max.bytes", err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		c.fail("client_io", "client disconnected mid-request", err)
	default:
		c.fail("client_io", "read from client failed", err)
	}
}

// upstreamFrame is one frame read from the broker, or the error that ended
// the upstream connection.
type upstreamFrame struct {
	frame []byte
	err   error
}

// upstreamLoop reads response frames from the broker all the time, so that a
// broker closing an idle connection (restart, connections.max.idle.ms) is
// seen at once and the client's connection closes too, as it would have
// without the proxy. frames is unbuffered: at most two responses of a
// connection are in the proxy's memory (one here, one in the writer); the
// rest wait in the broker's socket, as without the proxy.
func (c *conn) upstreamLoop(frames chan<- upstreamFrame, free <-chan []byte) {
	r := readerPool.Get().(*bufio.Reader)
	r.Reset(c.upstream)
	defer func() { r.Reset(nil); readerPool.Put(r) }()
	for {
		var buf []byte
		select {
		case buf = <-free:
		default:
		}
		frame, err := readFrame(r, c.s.cfg.MaxResponseBytes, buf)
		select {
		case frames <- upstreamFrame{frame, err}:
		case <-c.done:
			return
		}
		if err != nil {
			return
		}
	}
}

// writeLoop answers queued requests in order: each queued request takes the
// next frame from the broker (Kafka answers in order on a connection).
func (c *conn) writeLoop() {
	defer c.close()
	frames := make(chan upstreamFrame)
	c.free = make(chan []byte, 2) // response buffers written to the client, for reuse
	go func() {
		defer c.recoverPanic()
		c.upstreamLoop(frames, c.free)
	}()
	for {
		select {
		case f, ok := <-c.pending:
			if !ok {
				return
			}
			if !c.answer(f, nil, frames) {
				return
			}
		case uf := <-frames:
			if uf.err != nil {
				if c.closed() {
					return
				}
				if len(c.pending) == 0 {
					// The broker ended the connection with nothing in flight.
					c.s.m.errors.WithLabelValues("upstream_io").Inc()
					c.log.Info("the upstream broker closed the connection; closing the client's", "err", uf.err)
					return
				}
				c.fail("upstream_io", "read from the upstream broker failed", uf.err)
				return
			}
			// A response that came before the writer took its request
			// off the queue: the request is queued already (the reader
			// queues before it forwards), after any local answers.
			for {
				var f *inflight
				var ok bool
				select {
				case f, ok = <-c.pending:
				default:
				}
				if f == nil || !ok {
					c.fail("upstream_io", "response from the upstream broker without a request", nil)
					return
				}
				if f.local != nil {
					if !c.answer(f, nil, frames) {
						return
					}
					continue
				}
				if !c.answer(f, &uf, frames) {
					return
				}
				break
			}
		}
	}
}

// answer writes the response to f: its local answer, or uf, or the next
// frame from the broker. It returns false when the connection is done.
func (c *conn) answer(f *inflight, uf *upstreamFrame, frames <-chan upstreamFrame) bool {
	out := f.local
	if out == nil {
		if uf == nil {
			select {
			case u := <-frames:
				uf = &u
			case <-c.done:
				return false
			}
		}
		if uf.err != nil {
			if !c.closed() {
				c.fail("upstream_io", "read from the upstream broker failed", uf.err)
			}
			return false
		}
		var err error
		out, err = c.response(f, uf.frame)
		if err != nil {
			c.fail("rewrite", "bad response from the upstream broker", err)
			return false
		}
	}
	// A client that stops reading for connections.max.idle.ms is idle,
	// as the broker sees it (its idle clock moves only with socket
	// progress): the write fails and the connection closes, releasing the
	// response held for it.
	if c.s.cfg.IdleTimeout > 0 {
		_ = c.client.SetWriteDeadline(time.Now().Add(c.s.cfg.IdleTimeout))
	}
	if _, err := c.client.Write(out); err != nil {
		if !c.closed() {
			c.fail("client_io", "write to client failed", err)
		}
		return false
	}
	c.s.m.bytesOut.Add(float64(len(out)))
	now := time.Now()
	c.active.Store(now.UnixNano())
	c.inFlight.Add(-1)
	c.s.m.latency.WithLabelValues(apiName(f.key)).Observe(now.Sub(f.start).Seconds())
	if uf != nil && cap(uf.frame) <= maxReusedFrame {
		// Written (out is uf.frame or a fresh encoding of it): reusable.
		select {
		case c.free <- uf.frame:
		default:
		}
	}
	return true
}

// response checks a response frame against its request and returns the
// frame to send to the client: the same bytes, or re-encoded with rewritten
// broker endpoints / narrowed ApiVersions.
func (c *conn) response(f *inflight, frame []byte) ([]byte, error) {
	msg := frame[4:]
	corr, hlen, err := parseResponseHeader(msg, ResponseHeaderFlexible(f.key, f.version))
	if err != nil {
		return nil, err
	}
	if corr != f.corr {
		return nil, fmt.Errorf("response correlation id %d, want %d (%s v%d)", corr, f.corr, apiName(f.key), f.version)
	}
	if f.produce != nil || f.intercepted || (f.key == 1 && c.s.ic != nil && c.s.ic.chain.HasFetch()) || (f.key == 3 && c.s.ic != nil) {
		return c.interceptResponse(f, frame, msg, hlen)
	}
	var body []byte
	switch {
	case f.key == apiVersionsKey:
		body, err = rewriteApiVersions(msg[hlen:], f.version)
		if err != nil {
			return nil, err
		}
	case needsRewrite(f.key, f.version):
		var changed bool
		body, changed, err = RewriteResponse(f.key, f.version, msg[hlen:], c.s.mapAddress)
		if err != nil {
			return nil, err
		}
		if !changed {
			return frame, nil
		}
		c.s.m.rewrites.WithLabelValues(apiName(f.key)).Inc()
	default:
		return frame, nil
	}
	return joinFrame(msg[:hlen], body), nil
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
// slowly is not taken for an idle connection.
type activityReader struct{ c *conn }

func (a activityReader) Read(p []byte) (int, error) {
	n, err := a.c.client.Read(p)
	if n > 0 {
		a.c.active.Store(time.Now().UnixNano())
	}
	return n, err
}
