package proxy

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Pipelined requests are answered in order, 3,600 of them in rounds of 12
// on one connection. CI's TestProxyPipelinedInOrder once closed the
// connection with "response from the upstream broker without a request":
// after answering one request the writer peeks at the upstream again, and
// with the next response already there the peek's answer and the next
// queued request can both be ready when the writer selects (Go picks
// either). This test did not reproduce that here (it passes on the code
// before the fix too); it checks the order the fix must keep.
func TestPipelinedResponseAndRequestReadyAtOnce(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := New(Config{Upstream: c.ListenAddrs(), Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	conn, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	frame := func(corr int32) []byte {
		b := binary.BigEndian.AppendUint32(nil, 0)
		b = binary.BigEndian.AppendUint16(b, 18) // ApiVersions v0
		b = binary.BigEndian.AppendUint16(b, 0)
		b = binary.BigEndian.AppendUint32(b, uint32(corr))
		b = binary.BigEndian.AppendUint16(b, 1)
		b = append(b, 'p')
		b = kmsg.NewPtrApiVersionsRequest().AppendTo(b)
		binary.BigEndian.PutUint32(b, uint32(len(b)-4))
		return b
	}
	corr := int32(0)
	for round := range 300 {
		var batch []byte
		first := corr
		for range 12 {
			batch = append(batch, frame(corr)...)
			corr++
		}
		if _, err := conn.Write(batch); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for want := first; want < corr; want++ {
			var size [4]byte
			if _, err := io.ReadFull(conn, size[:]); err != nil {
				t.Fatalf("round %d: response to correlation id %d: %v", round, want, err)
			}
			body := make([]byte, binary.BigEndian.Uint32(size[:]))
			if _, err := io.ReadFull(conn, body); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			if got := int32(binary.BigEndian.Uint32(body)); got != want {
				t.Fatalf("round %d: correlation id %d, want %d", round, got, want)
			}
		}
	}
}
