package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferrykit/ferry/interceptor"
)

// A Produce request under socket.request.max.bytes that the interceptors
// grow past it (encrypt seals each value) is answered MESSAGE_TOO_LARGE,
// naming the key, rather than forwarded for the broker to close the
// connection on it (a bare EOF: found by a helper); nothing reaches the
// broker and the connection serves on.
func TestProduceGrownPastMaxRequest(t *testing.T) {
	const maxRequest = 64 << 10
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := startProxy(t, Config{Upstream: c.ListenAddrs(), MaxRequestBytes: maxRequest, Logger: slog.New(slog.DiscardHandler),
		Interceptors: []interceptor.Spec{encryptSpec("")}})
	values := make([]string, 500)
	for i := range values {
		values[i] = fmt.Sprintf("%03d%s", i, strings.Repeat("v", 97))
	}
	frame := produceV9Frame(1, "p", 1, values...)
	if len(frame)-4 > maxRequest {
		t.Fatalf("the request is %d bytes as sent: the test wants it under %d", len(frame)-4, maxRequest)
	}
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := conn.Write(frame); err != nil {
		t.Fatal(err)
	}
	resp := kmsg.NewPtrProduceResponse()
	resp.Version = 9
	if err := resp.ReadFrom(readResponse(t, conn, 1)[5:]); err != nil { // past the correlation id and the header's tags
		t.Fatal(err)
	}
	p := resp.Topics[0].Partitions[0]
	if p.ErrorCode != kerr.MessageTooLarge.Code || p.ErrorMessage == nil || !strings.Contains(*p.ErrorMessage, "over socket.request.max.bytes 65536") {
		t.Fatalf("partition answered %d %v, want MESSAGE_TOO_LARGE naming socket.request.max.bytes", p.ErrorCode, p.ErrorMessage)
	}
	// The connection serves on; nothing reached the broker.
	if _, err := conn.Write(produceV9Frame(2, "p", 1, "small")); err != nil {
		t.Fatal(err)
	}
	readResponse(t, conn, 2)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := ends.Lookup("t", 0); o.Offset != 1 {
		t.Fatalf("the topic ends at offset %d, want 1 (only the small record)", o.Offset)
	}
}
