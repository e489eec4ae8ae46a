package proxy

import (
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// AddressMapper maps a broker's real endpoint, as a response names it, to the
// endpoint the proxy hands out for that node id. It is called once per
// endpoint in a response; an error fails the rewrite (and closes the client's
// connection: a real address must never reach it).
type AddressMapper func(nodeID int32, host string, port int32) (string, int32, error)

// rewriteKeys are the API keys whose responses carry broker endpoints.
var rewriteKeys = map[int16]bool{
	0:  true, // Produce: KIP-951 NodeEndpoints (tag 0, any flexible version: v9+)
	1:  true, // Fetch: KIP-951 NodeEndpoints (tag 0, any flexible version: v12+)
	3:  true, // Metadata: brokers
	10: true, // FindCoordinator: v0–v3 single, v4+ batched coordinators
	32: true, // DescribeConfigs: listener configs of brokers (masked)
	55: true, // DescribeQuorum: controller listeners (v2+, dropped)
	60: true, // DescribeCluster: brokers
	78: true, // ShareFetch: NodeEndpoints
	79: true, // ShareAcknowledge: NodeEndpoints
}

// needsRewrite reports whether the response to key at version can carry
// broker endpoints (so it must be decoded).
//
// KIP-951 gives Produce v10 and Fetch v16 the NodeEndpoints field, but it
// is a tagged field (tag 0 of the response): any flexible version can carry
// it, and kmsg decodes and encodes it at every flexible version (Produce v9,
// Fetch v12). An upstream that sends it below the KIP's version (franz-go's
// kfake does) reaches franz-go clients, which read it: so it is rewritten
// from the first flexible version on.
func needsRewrite(key, version int16) bool {
	switch key {
	case keyProduce:
		return version >= produceFirstFlexible
	case keyFetch:
		return version >= fetchFirstFlexible
	default:
		return rewriteKeys[key]
	}
}

// RewriteResponse decodes the response body (the message past the response
// header) of key at version with kmsg, maps every broker endpoint through m
// and re-encodes it. changed is false when the response named no endpoint
// (Produce and Fetch carry endpoints only with NOT_LEADER errors), and then
// out is nil: the original bytes can be forwarded as they are.
//
// Errors: a body kmsg cannot decode, or an error of m.
func RewriteResponse(key, version int16, body []byte, m AddressMapper) (out []byte, changed bool, err error) {
	resp := kmsg.ResponseForKey(key)
	if resp == nil {
		return nil, false, fmt.Errorf("%w %d", ErrUnknownKey, key)
	}
	resp.SetVersion(version)
	if err := resp.ReadFrom(body); err != nil {
		return nil, false, fmt.Errorf("decode %s v%d response: %w", kmsg.NameForKey(key), version, err)
	}
	if changed, err = rewriteDecoded(resp, m); err != nil || !changed {
		return nil, false, err
	}
	return resp.AppendTo(make([]byte, 0, len(body))), true, nil
}

// The first flexible versions of Produce and Fetch: from these on a
// response can carry KIP-951 NodeEndpoints as tagged field 0.
const (
	produceFirstFlexible = 9
	fetchFirstFlexible   = 12
)

// rewriteDecoded maps every broker endpoint of a decoded response through
// m, in place (RewriteResponse); changed: resp must be encoded again.
func rewriteDecoded(resp kmsg.Response, m AddressMapper) (changed bool, err error) {
	version := resp.GetVersion()
	mapOne := func(node int32, host *string, port *int32) error {
		h, p, err := m(node, *host, *port)
		if err != nil {
			return err
		}
		*host, *port = h, p
		changed = true
		return nil
	}
	switch r := resp.(type) {
	case *kmsg.MetadataResponse:
		for i := range r.Brokers {
			b := &r.Brokers[i]
			if err := mapOne(b.NodeID, &b.Host, &b.Port); err != nil {
				return false, err
			}
		}
	case *kmsg.FindCoordinatorResponse:
		if version <= 3 {
			if r.NodeID >= 0 && r.Host != "" {
				if err := mapOne(r.NodeID, &r.Host, &r.Port); err != nil {
					return false, err
				}
			}
		}
		for i := range r.Coordinators {
			c := &r.Coordinators[i]
			if c.NodeID >= 0 && c.Host != "" {
				if err := mapOne(c.NodeID, &c.Host, &c.Port); err != nil {
					return false, err
				}
			}
		}
	case *kmsg.DescribeClusterResponse:
		for i := range r.Brokers {
			b := &r.Brokers[i]
			if err := mapOne(b.NodeID, &b.Host, &b.Port); err != nil {
				return false, err
			}
		}
	case *kmsg.ProduceResponse:
		for i := range r.Brokers {
			b := &r.Brokers[i]
			if err := mapOne(b.NodeID, &b.Host, &b.Port); err != nil {
				return false, err
			}
		}
	case *kmsg.FetchResponse:
		for i := range r.Brokers {
			b := &r.Brokers[i]
			if err := mapOne(b.NodeID, &b.Host, &b.Port); err != nil {
				return false, err
			}
		}
	case *kmsg.ShareFetchResponse:
		for i := range r.NodeEndpoints {
			b := &r.NodeEndpoints[i]
			if err := mapOne(b.NodeID, &b.Host, &b.Port); err != nil {
				return false, err
			}
		}
	case *kmsg.ShareAcknowledgeResponse:
		for i := range r.NodeEndpoints {
			b := &r.NodeEndpoints[i]
			if err := mapOne(b.NodeID, &b.Host, &b.Port); err != nil {
				return false, err
			}
		}
	case *kmsg.DescribeConfigsResponse:
		// Broker configs name the real listeners (listeners,
		// advertised.listeners, controller.quorum.voters, ...). They are
		// masked the way Kafka hides a sensitive config: null value,
		// IsSensitive set. Other configs pass unchanged.
		for i := range r.Resources {
			res := &r.Resources[i]
			for j := range res.Configs {
				c := &res.Configs[j]
				if addressConfig(c.Name) && c.Value != nil {
					c.Value, c.IsSensitive, changed = nil, true, true
				}
				for k := range c.ConfigSynonyms {
					syn := &c.ConfigSynonyms[k]
					if addressConfig(syn.Name) && syn.Value != nil {
						syn.Value, changed = nil, true
					}
				}
			}
		}
	case *kmsg.DescribeQuorumResponse:
		// v2+ lists each controller's listeners: the proxy does not
		// proxy controllers, so their endpoints are dropped.
		for i := range r.Nodes {
			if len(r.Nodes[i].Listeners) > 0 {
				r.Nodes[i].Listeners, changed = nil, true
			}
		}
	}
	return changed, nil
}

// addressConfig reports whether a broker config names network endpoints
// (host:port) that a client of the proxy must not learn.
func addressConfig(name string) bool {
	switch name {
	case "listeners", "advertised.listeners", "controller.quorum.voters", "controller.quorum.bootstrap.servers":
		return true
	}
	return strings.HasSuffix(name, ".listeners") || strings.HasSuffix(name, "bootstrap.servers")
}
