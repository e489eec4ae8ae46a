package shaper

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"
)

// A server that answers each 1-byte request with size bytes.
func serveBytes(t *testing.T, data []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var one [1]byte
				for {
					if _, err := io.ReadFull(c, one[:]); err != nil {
						return
					}
					if _, err := c.Write(data); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// The bytes come through whole; the rate never exceeds the configured one
// (a lower bound on time, which a busy machine cannot break), a request and
// its answer take at least the latency each way, and a reused connection
// is accepted once.
func TestShaperRateAndLatency(t *testing.T) {
	data := make([]byte, 4<<20)
	rand.Read(data)
	const rate, latency = 16 << 20, 20 * time.Millisecond
	p, err := Start(Config{Upstream: serveBytes(t, data), BytesPerSecond: rate, Latency: latency})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for round := range 2 {
		start := time.Now()
		if _, err := c.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(data))
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatal(err)
		}
		el := time.Since(start)
		if !bytes.Equal(got, data) {
			t.Fatalf("round %d: the bytes differ", round)
		}
		floor := 2*latency + time.Duration(float64(len(data))/rate*0.9*float64(time.Second))
		if el < floor {
			t.Fatalf("round %d: %d bytes in %v, faster than %d B/s with %v latency each way (at least %v)", round, len(data), el, rate, latency, floor)
		}
		t.Logf("round %d: %d bytes in %v (%.1f MiB/s; configured %d MiB/s, %v each way)", round, len(data), el, float64(len(data))/el.Seconds()/(1<<20), rate>>20, latency)
	}
	if n := p.Accepted(); n != 1 {
		t.Fatalf("%d connections accepted, want 1 (the client reused its connection)", n)
	}
}
