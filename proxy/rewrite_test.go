package proxy

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// realAddr is a broker endpoint that must never survive a rewrite.
const realHost, realPort = "10.1.2.3", int32(9092)

func testMapper(t *testing.T) AddressMapper {
	return func(node int32, host string, port int32) (string, int32, error) {
		if host != realHost || port != realPort {
			t.Errorf("mapper got %s:%d, want the real endpoint", host, port)
		}
		return "proxy.local", 20000 + node, nil
	}
}

func TestRewriteResponse(t *testing.T) {
	type check func(kmsg.Response) []int32 // returns ports seen
	cases := []struct {
		name    string
		resp    kmsg.Response
		version int16
		ports   check
	}{
		{"Metadata v12", func() kmsg.Response {
			r := kmsg.NewPtrMetadataResponse()
			for _, id := range []int32{1, 2} {
				b := kmsg.NewMetadataResponseBroker()
				b.NodeID, b.Host, b.Port = id, realHost, realPort
				r.Brokers = append(r.Brokers, b)
			}
			return r
		}(), 12, func(r kmsg.Response) (p []int32) {
			for _, b := range r.(*kmsg.MetadataResponse).Brokers {
				p = append(p, b.Port)
			}
			return
		}},
		{"FindCoordinator v3", func() kmsg.Response {
			r := kmsg.NewPtrFindCoordinatorResponse()
			r.NodeID, r.Host, r.Port = 1, realHost, realPort
			return r
		}(), 3, func(r kmsg.Response) []int32 { return []int32{r.(*kmsg.FindCoordinatorResponse).Port} }},
		{"FindCoordinator v4 batched", func() kmsg.Response {
			r := kmsg.NewPtrFindCoordinatorResponse()
			for _, id := range []int32{1, 2} {
				c := kmsg.NewFindCoordinatorResponseCoordinator()
				c.Key, c.NodeID, c.Host, c.Port = "g", id, realHost, realPort
				r.Coordinators = append(r.Coordinators, c)
			}
			return r
		}(), 4, func(r kmsg.Response) (p []int32) {
			for _, c := range r.(*kmsg.FindCoordinatorResponse).Coordinators {
				p = append(p, c.Port)
			}
			return
		}},
		{"DescribeCluster v1", func() kmsg.Response {
			r := kmsg.NewPtrDescribeClusterResponse()
			b := kmsg.NewDescribeClusterResponseBroker()
			b.NodeID, b.Host, b.Port = 1, realHost, realPort
			r.Brokers = append(r.Brokers, b)
			return r
		}(), 1, func(r kmsg.Response) []int32 { return []int32{r.(*kmsg.DescribeClusterResponse).Brokers[0].Port} }},
		{"Produce v10 NodeEndpoints", func() kmsg.Response {
			r := kmsg.NewPtrProduceResponse()
			b := kmsg.NewProduceResponseBroker()
			b.NodeID, b.Host, b.Port = 2, realHost, realPort
			r.Brokers = append(r.Brokers, b)
			return r
		}(), 10, func(r kmsg.Response) []int32 { return []int32{r.(*kmsg.ProduceResponse).Brokers[0].Port} }},
		{"Fetch v16 NodeEndpoints", func() kmsg.Response {
			r := kmsg.NewPtrFetchResponse()
			b := kmsg.NewFetchResponseBroker()
			b.NodeID, b.Host, b.Port = 2, realHost, realPort
			r.Brokers = append(r.Brokers, b)
			return r
		}(), 16, func(r kmsg.Response) []int32 { return []int32{r.(*kmsg.FetchResponse).Brokers[0].Port} }},
		{"Produce v9 NodeEndpoints (tagged, below KIP-951's v10)", func() kmsg.Response {
			r := kmsg.NewPtrProduceResponse()
			b := kmsg.NewProduceResponseBroker()
			b.NodeID, b.Host, b.Port = 2, realHost, realPort
			r.Brokers = append(r.Brokers, b)
			return r
		}(), 9, func(r kmsg.Response) []int32 { return []int32{r.(*kmsg.ProduceResponse).Brokers[0].Port} }},
		{"Fetch v12 NodeEndpoints (tagged, below KIP-951's v16)", func() kmsg.Response {
			r := kmsg.NewPtrFetchResponse()
			b := kmsg.NewFetchResponseBroker()
			b.NodeID, b.Host, b.Port = 2, realHost, realPort
			r.Brokers = append(r.Brokers, b)
			return r
		}(), 12, func(r kmsg.Response) []int32 { return []int32{r.(*kmsg.FetchResponse).Brokers[0].Port} }},
		{"ShareFetch v1 NodeEndpoints", func() kmsg.Response {
			r := kmsg.NewPtrShareFetchResponse()
			b := kmsg.NewShareFetchResponseNodeEndpoint()
			b.NodeID, b.Host, b.Port = 2, realHost, realPort
			r.NodeEndpoints = append(r.NodeEndpoints, b)
			return r
		}(), 1, func(r kmsg.Response) []int32 { return []int32{r.(*kmsg.ShareFetchResponse).NodeEndpoints[0].Port} }},
		{"ShareAcknowledge v1 NodeEndpoints", func() kmsg.Response {
			r := kmsg.NewPtrShareAcknowledgeResponse()
			b := kmsg.NewShareAcknowledgeResponseNodeEndpoint()
			b.NodeID, b.Host, b.Port = 2, realHost, realPort
			r.NodeEndpoints = append(r.NodeEndpoints, b)
			return r
		}(), 1, func(r kmsg.Response) []int32 {
			return []int32{r.(*kmsg.ShareAcknowledgeResponse).NodeEndpoints[0].Port}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.resp.SetVersion(c.version)
			if !needsRewrite(c.resp.Key(), c.version) {
				t.Fatalf("needsRewrite(%d, %d) = false", c.resp.Key(), c.version)
			}
			out, changed, err := RewriteResponse(c.resp.Key(), c.version, c.resp.AppendTo(nil), testMapper(t))
			if err != nil || !changed {
				t.Fatalf("changed %v, err %v", changed, err)
			}
			back := kmsg.ResponseForKey(c.resp.Key())
			back.SetVersion(c.version)
			if err := back.ReadFrom(out); err != nil {
				t.Fatal(err)
			}
			for _, p := range c.ports(back) {
				if p == realPort || p < 20000 {
					t.Fatalf("port %d after rewrite", p)
				}
			}
		})
	}
}

func TestRewriteResponseUnchanged(t *testing.T) {
	// A Produce response without NodeEndpoints is forwarded as it is.
	r := kmsg.NewPtrProduceResponse()
	r.Version = 11
	out, changed, err := RewriteResponse(0, 11, r.AppendTo(nil), testMapper(t))
	if err != nil || changed || out != nil {
		t.Fatalf("out %x changed %v err %v", out, changed, err)
	}
	// A coordinator error (node -1, no host) has no endpoint to map.
	fc := kmsg.NewPtrFindCoordinatorResponse()
	fc.Version, fc.NodeID, fc.Port = 2, -1, -1
	if _, changed, err := RewriteResponse(10, 2, fc.AppendTo(nil), testMapper(t)); err != nil || changed {
		t.Fatalf("coordinator error: changed %v err %v", changed, err)
	}
}

func TestRewriteResponseErrors(t *testing.T) {
	meta := kmsg.NewPtrMetadataResponse()
	meta.Version = 12
	b := kmsg.NewMetadataResponseBroker()
	b.NodeID, b.Host, b.Port = 1, realHost, realPort
	meta.Brokers = append(meta.Brokers, b)
	body := meta.AppendTo(nil)
	if _, _, err := RewriteResponse(3, 12, body[:len(body)/2], testMapper(t)); err == nil {
		t.Fatal("truncated Metadata response: no error")
	}
	boom := errors.New("no port for node")
	_, _, err := RewriteResponse(3, 12, body, func(int32, string, int32) (string, int32, error) { return "", 0, boom })
	if !errors.Is(err, boom) {
		t.Fatalf("mapper error not returned: %v", err)
	}
}
