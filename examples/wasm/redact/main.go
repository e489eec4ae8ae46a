// Command redact is a Ferry WebAssembly interceptor (examples/wasm): the
// built-in redact interceptor as a module, sharing its code
// (internal/jsonvalue), so both answer alike byte for byte: the masked
// value, or the same refusal. Its configuration (the interceptor's
// wasm.config.* entries, prefix removed) is the built-in's: redact.fields,
// redact.mask, redact.case.sensitive, json.max.depth; and side (produce,
// the default, fetch or both), the sides it reports to the host.
package main

import (
	"context"
	"fmt"

	"github.com/ferrykit/ferry/internal/jsonvalue"
	"github.com/ferrykit/ferry/wasm/sdk"
)

func init() {
	sdk.OnInit(func(config map[string]string) error {
		rd, err := jsonvalue.NewRedactor(config)
		if err != nil {
			return err
		}
		fn := func(r *sdk.Record) sdk.Result {
			if r.Value == nil {
				return sdk.Keep()
			}
			v, err := rd.Redact(context.Background(), r.Value) // the host bounds the call's time
			if err != nil {
				return sdk.Reject(err.Error())
			}
			r.Value = v
			return sdk.Keep()
		}
		sdk.OnProduce(nil)
		sdk.OnFetch(nil)
		switch side := config["side"]; side {
		case "", "produce":
			sdk.OnProduce(fn)
		case "fetch":
			sdk.OnFetch(fn)
		case "both":
			sdk.OnProduce(fn)
			sdk.OnFetch(fn)
		default:
			return fmt.Errorf("side: %q is not produce, fetch or both", side)
		}
		return nil
	})
}

func main() {}
