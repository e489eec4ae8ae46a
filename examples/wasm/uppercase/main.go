// Command uppercase is a Ferry WebAssembly interceptor (examples/wasm):
// at produce, each record's value is upper-cased (Unicode, bytes.ToUpper);
// a null value stays null and a value already upper case is kept as it
// came. Build it with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o uppercase.wasm ./examples/wasm/uppercase
//
// and load it with the proxy's wasm interceptor (wasm.module.path).
package main

import (
	"bytes"

	"github.com/ferrykit/ferry/wasm/sdk"
)

func init() {
	sdk.OnProduce(func(r *sdk.Record) sdk.Result {
		if up := bytes.ToUpper(r.Value); r.Value != nil && !bytes.Equal(up, r.Value) {
			r.Value = up
		}
		return sdk.Keep()
	})
}

func main() {}
