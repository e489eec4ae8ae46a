package interceptor

import (
	"math/bits"
	"slices"
	"sync"
)

// Rewritten batches that are copied before their outcome is released (a
// Produce request's batches, which the proxy encodes into the request it
// forwards) are encoded into buffers pooled by size class, so a producer's
// every request does not allocate (and the runtime zero and collect) a
// batch: encrypt seals every batch of every request. A class is a quarter
// of an octave (capacities 2^k × 1, 1.25, 1.5, 1.75), so a buffer is at
// most a quarter larger than asked; it is charged to the memory budget at
// its capacity while in use. Idle in a pool it is not charged, and a pool
// holds no more than was in use at once before, until garbage collection
// empties it.
const (
	minOutShift = 12 // 4 KiB: smaller batches are allocated
	maxOutShift = 23 // 8 MiB: larger ones too
)

var outPools [(maxOutShift - minOutShift + 1) * 4]sync.Pool

// outClass is the class of a buffer of n bytes and its capacity; ok false:
// not pooled.
func outClass(n int) (class, capacity int, ok bool) {
	if n <= 1<<minOutShift || n > 1<<maxOutShift {
		return 0, n, false
	}
	shift := bits.Len(uint(n-1)) - 1 // 2^shift < n <= 2^(shift+1)
	step := 1 << (shift - 2)         // a quarter of 2^shift
	q := (n - 1<<shift + step - 1) / step
	return (shift-minOutShift)*4 + q - 1, 1<<shift + q*step, true
}

// getOut returns an empty buffer of capacity outClass(n), from its pool
// when it has one.
func getOut(n int) []byte {
	class, capacity, ok := outClass(n)
	if !ok {
		return make([]byte, 0, n)
	}
	if p, _ := outPools[class].Get().(*[]byte); p != nil {
		return (*p)[:0]
	}
	return make([]byte, 0, capacity)
}

// growOut returns b with room for n more bytes: b itself when it has it,
// else a copy in a buffer from the pools that l gives back when released
// (pooled), or b grown by the runtime.
func growOut(l *ledger, pooled bool, b []byte, n int) []byte {
	switch {
	case cap(b)-len(b) >= n:
		return b
	case pooled && l != nil:
		nb := append(getOut(len(b)+n), b...)
		l.outs = append(l.outs, nb)
		return nb
	}
	return slices.Grow(b, n)
}

// putOut gives b back to its class's pool; nothing may use b afterwards.
func putOut(b []byte) {
	class, capacity, ok := outClass(cap(b))
	if !ok || capacity != cap(b) {
		return
	}
	if poisonOuts {
		b = b[:cap(b)]
		for i := range b {
			b[i] = 0xdb
		}
	}
	b = b[:0]
	outPools[class].Put(&b)
}

// poisonOuts: putOut overwrites what it gives back (the package's tests
// set it, so that a batch read after its outcome's Release shows).
var poisonOuts bool
