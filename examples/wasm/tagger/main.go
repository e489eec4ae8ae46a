// Command tagger is a Ferry WebAssembly interceptor (examples/wasm): a
// header-based tagger at produce. Its configuration (the interceptor's
// wasm.config.* entries, prefix removed):
//
//	tag.header   the header to set (required)
//	tag.value    its value (default: empty)
//	skip.header  records carrying this header are dropped (KIP-905 skip;
//	             only in batches without idempotence, as Kafka's own
//	             interceptors: idempotent producers get INVALID_RECORD)
//
// A record that already has tag.header with tag.value is kept as it came;
// otherwise the header is set (the first one replaced, others removed).
package main

import (
	"bytes"
	"errors"

	"github.com/ferrykit/ferry/wasm/sdk"
)

var (
	tagHeader, skipHeader string
	tagValue              []byte
)

func init() {
	sdk.OnInit(func(config map[string]string) error {
		tagHeader, skipHeader = config["tag.header"], config["skip.header"]
		tagValue = []byte(config["tag.value"])
		if tagHeader == "" {
			return errors.New("tagger: set wasm.config.tag.header, the header to set")
		}
		return nil
	})
	sdk.OnProduce(tag)
}

func tag(r *sdk.Record) sdk.Result {
	if skipHeader != "" {
		if _, ok := r.Header(skipHeader); ok {
			return sdk.Skip()
		}
	}
	n := 0
	for _, h := range r.Headers {
		if h.Key == tagHeader {
			n++
		}
	}
	if v, _ := r.Header(tagHeader); n == 1 && v != nil && bytes.Equal(v, tagValue) {
		return sdk.Keep()
	}
	r.SetHeader(tagHeader, tagValue)
	return sdk.Keep()
}

func main() {}
