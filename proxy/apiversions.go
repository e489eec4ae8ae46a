package proxy

import (
	"encoding/binary"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// IntersectApiVersions narrows an ApiVersions response to what the proxy's
// codec (kmsg) can decode: keys kmsg does not know are dropped, each max
// version is capped at kmsg's, and a key whose broker range lies entirely
// above kmsg's is dropped. The broker's minimum versions are kept (kmsg
// decodes every version from 0). So client and broker never agree on a
// version the proxy cannot parse.
func IntersectApiVersions(resp *kmsg.ApiVersionsResponse) {
	keep := resp.ApiKeys[:0]
	for _, k := range resp.ApiKeys {
		maxV, ok := CodecMaxVersion(k.ApiKey)
		if !ok {
			continue
		}
		if k.MaxVersion > maxV {
			k.MaxVersion = maxV
		}
		if k.MinVersion > k.MaxVersion {
			continue
		}
		keep = append(keep, k)
	}
	resp.ApiKeys = keep
}

// unsupportedApiVersionsResponse returns the whole frame (size prefix,
// response header v0, body v0) Kafka sends for an ApiVersions request of a
// version it does not know (KIP-511): UNSUPPORTED_VERSION (35) and the range
// of ApiVersions the proxy supports, so the client retries with one of them.
func unsupportedApiVersionsResponse(correlationID int32) []byte {
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = 0
	resp.ErrorCode = kerr.UnsupportedVersion.Code
	maxV, _ := CodecMaxVersion(apiVersionsKey)
	k := kmsg.NewApiVersionsResponseApiKey()
	k.ApiKey = apiVersionsKey
	k.MinVersion = 0
	k.MaxVersion = maxV
	resp.ApiKeys = append(resp.ApiKeys, k)
	frame := make([]byte, 4, 64)
	frame = kbin.AppendInt32(frame, correlationID)
	frame = resp.AppendTo(frame)
	binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
	return frame
}

// rewriteApiVersions decodes an ApiVersions response body at version,
// intersects it with kmsg's versions and re-encodes it. A broker that does
// not know the request's version answers UNSUPPORTED_VERSION in v0 (KIP-511);
// such a body is decoded and re-encoded as v0.
func rewriteApiVersions(body []byte, version int16) ([]byte, error) {
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = version
	if len(body) >= 2 && int16(binary.BigEndian.Uint16(body)) == kerr.UnsupportedVersion.Code {
		resp.Version = 0
	}
	if err := resp.ReadFrom(body); err != nil {
		return nil, err
	}
	IntersectApiVersions(resp)
	return resp.AppendTo(nil), nil
}
