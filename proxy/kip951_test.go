package proxy

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// KIP-951 node endpoints are tagged field 0 of a Produce or Fetch
// response: an upstream can send them below the KIP's versions (kfake does,
// at Produce v9 and Fetch v12, with NOT_LEADER_OR_FOLLOWER), and franz-go
// clients read them there. Through the proxy they must name the proxy's
// listeners, never the broker's own address.
func TestKIP951EndpointsRewrittenBelowKIPVersions(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(2), kfake.SeedTopics(1, "moved"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	real := brokerAddrs(c)
	s, err := New(Config{Upstream: c.ListenAddrs(), Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())

	for _, tc := range []struct {
		name    string
		key     kmsg.Key
		version int16
	}{{"Produce v9", kmsg.Produce, 9}, {"Fetch v12", kmsg.Fetch, 12}} {
		t.Run(tc.name, func(t *testing.T) {
			versions := kversion.Stable()
			versions.SetMaxKeyVersion(int16(tc.key), tc.version)
			cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()), kgo.MaxVersions(versions))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := cl.Request(ctx, kmsg.NewPtrMetadataRequest()); err != nil {
				t.Fatal(err)
			}
			// The partition's leader moves: the old leader answers
			// NOT_LEADER_OR_FOLLOWER with every broker's endpoint.
			old := c.LeaderFor("moved", 0)
			if err := c.MoveTopicPartition("moved", 0, 1-old); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = c.MoveTopicPartition("moved", 0, old) }()
			var req kmsg.Request
			if tc.key == kmsg.Produce {
				r := kmsg.NewPtrProduceRequest()
				r.Acks, r.TimeoutMillis = 1, 5000
				rt := kmsg.NewProduceRequestTopic()
				rt.Topic = "moved"
				rp := kmsg.NewProduceRequestTopicPartition()
				rp.Records = seedBatch(0, "v")
				rt.Partitions = append(rt.Partitions, rp)
				r.Topics = append(r.Topics, rt)
				req = r
			} else {
				r := kmsg.NewPtrFetchRequest()
				r.MaxWaitMillis, r.MaxBytes = 10, 1<<20
				rt := kmsg.NewFetchRequestTopic()
				rt.Topic = "moved"
				rt.TopicID = c.TopicInfo("moved").TopicID
				rp := kmsg.NewFetchRequestTopicPartition()
				rp.PartitionMaxBytes = 1 << 20
				rp.CurrentLeaderEpoch = -1
				rt.Partitions = append(rt.Partitions, rp)
				r.Topics = append(r.Topics, rt)
				req = r
			}
			resp, err := cl.Broker(int(old)).Request(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if v := resp.GetVersion(); v != tc.version {
				t.Fatalf("response v%d, want v%d (the client's cap)", v, tc.version)
			}
			type ep struct {
				node int32
				host string
				port int32
			}
			var eps []ep
			switch r := resp.(type) {
			case *kmsg.ProduceResponse:
				for _, b := range r.Brokers {
					eps = append(eps, ep{b.NodeID, b.Host, b.Port})
				}
			case *kmsg.FetchResponse:
				for _, b := range r.Brokers {
					eps = append(eps, ep{b.NodeID, b.Host, b.Port})
				}
			}
			if len(eps) != 2 {
				t.Fatalf("%d node endpoints in the response, want 2 (kfake names every broker with NOT_LEADER_OR_FOLLOWER)", len(eps))
			}
			for _, e := range eps {
				addr := net.JoinHostPort(e.host, strconv.Itoa(int(e.port)))
				if real[addr] {
					t.Fatalf("node %d: the broker's own address %s reached the client", e.node, addr)
				}
				if got, ok := s.BrokerAddr(e.node); !ok || got != addr {
					t.Fatalf("node %d: endpoint %s, want the proxy's listener %s", e.node, addr, got)
				}
			}
		})
	}
}

// brokerAddrs is the set of c's brokers' own addresses (host:port), which
// must never reach a client of the proxy.
func brokerAddrs(c *kfake.Cluster) map[string]bool {
	real := map[string]bool{}
	for _, a := range c.ListenAddrs() {
		real[a] = true
	}
	return real
}
