package proxy

import (
	"math/bits"
	"sync"
)

// Frame buffers read whole from brokers (responses the proxy must look at)
// come from pools by size class, powers of two from 64 KiB to 8 MiB, so a
// busy connection does not allocate (and the runtime zero) a fresh buffer
// per response. A buffer is charged to the memory budget at its class size
// while in use (at most twice the frame, at most 4 MiB more); idle in a
// pool it is not charged, and the pool holds no more than was in use at
// once before, until garbage collection empties it. Smaller frames are read
// through the connection's bufio.Reader; larger ones get their own buffer
// of their exact size.
const (
	minPoolShift = 16
	maxPoolShift = 23
)

var framePools [maxPoolShift - minPoolShift + 1]sync.Pool

// poolClass is the class of a buffer of n bytes, and its capacity; ok
// false: not pooled.
func poolClass(n int) (class, capacity int, ok bool) {
	if n <= 1<<minPoolShift/2 || n > 1<<maxPoolShift {
		return 0, n, false
	}
	shift := max(bits.Len(uint(n-1)), minPoolShift)
	return shift - minPoolShift, 1 << shift, true
}

// getFrame returns a buffer of length n: from its class's pool when pooled
// (capacity: the class size), else allocated.
func getFrame(n int) []byte {
	class, capacity, ok := poolClass(n)
	if !ok {
		return make([]byte, n)
	}
	if p, _ := framePools[class].Get().(*[]byte); p != nil {
		return (*p)[:n]
	}
	return make([]byte, n, capacity)
}

// putFrame gives b back to its pool; nothing may use b afterwards.
func putFrame(b []byte) {
	class, capacity, ok := poolClass(cap(b))
	if !ok || capacity != cap(b) {
		return
	}
	if poisonFrames {
		b = b[:cap(b)]
		for i := range b {
			b[i] = 0xdb
		}
	}
	b = b[:0]
	framePools[class].Put(&b)
}

// poisonFrames: putFrame overwrites what it gives back (the package's tests
// set it, so that a frame read or forwarded after it went back shows).
var poisonFrames bool
