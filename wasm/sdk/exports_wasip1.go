//go:build wasip1

package sdk

import "unsafe"

// The exports of ABI version 1 (wasm/abi's names). Each returns, where it
// returns bytes, abi.PackResult's (ptr << 32) | len, pointing into a
// package variable that stays alive until the next call.

var (
	st     runner
	input  []byte // ferry_alloc's buffer, where the host writes a call's input
	errMsg []byte // ferry_init's refusal
)

//go:wasmexport ferry_abi_v1
func ferryABIv1() {}

// ferryAlloc returns a buffer of size bytes for the host to write the
// next call's input into: the same buffer from call to call while it is
// large enough (and not far too large). 0 when size is negative.
//
//go:wasmexport ferry_alloc
func ferryAlloc(size int32) int32 {
	if size < 0 {
		return 0
	}
	if int(size) > cap(input) || cap(input) > keepBufBytes && int(size) < cap(input)/4 {
		input = nil // let the old one go before the new one is made
		input = make([]byte, max(size, 64))
	}
	input = input[:size]
	return int32(uintptr(unsafe.Pointer(unsafe.SliceData(input))))
}

//go:wasmexport ferry_init
func ferryInit(ptr, n int32) int64 {
	errMsg = initModule(hostBytes(ptr, n))
	return packed(errMsg)
}

//go:wasmexport ferry_on_produce
func ferryOnProduce(ptr, n int32) int64 { return packed(st.run(produceFn, hostBytes(ptr, n))) }

//go:wasmexport ferry_on_fetch
func ferryOnFetch(ptr, n int32) int64 { return packed(st.run(fetchFn, hostBytes(ptr, n))) }

// ferrySides reports the sides that have a function, after ferry_init:
// bit 0 produce, bit 1 fetch (see docs/INTERCEPTORS.md).
//
//go:wasmexport ferry_sides
func ferrySides() int32 { return sides() }

// hostBytes is the input the host wrote at ptr, which must be the
// ferry_alloc buffer (anything else is a host bug: the call fails).
func hostBytes(ptr, n int32) []byte {
	if n <= 0 {
		return nil
	}
	if int(n) > cap(input) || int32(uintptr(unsafe.Pointer(unsafe.SliceData(input)))) != ptr {
		panic("ferry wasm sdk: the input is not in the buffer ferry_alloc returned")
	}
	return input[:n]
}

// packed is b's pointer and length as an ABI result; 0 for no bytes.
func packed(b []byte) int64 {
	if len(b) == 0 {
		return 0
	}
	return int64(uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))<<32 | uint64(len(b)))
}
