package interceptor

import (
	"flag"
	"os"
	"testing"
)

// TestMain poisons the batch buffers given back to the pool (poisonOuts)
// for the tests, not for the benchmarks, which measure what the proxy pays.
func TestMain(m *testing.M) {
	flag.Parse()
	poisonOuts = flag.Lookup("test.bench").Value.String() == ""
	os.Exit(m.Run())
}

// outClass's classes are a quarter of an octave: every size from just over
// 4 KiB to 8 MiB gets a capacity at least as large and at most a quarter
// larger, classes are numbered in order of capacity, and a capacity is its
// own class.
func TestOutClass(t *testing.T) {
	lastClass, lastCap := -1, 0
	for n := 1<<minOutShift + 1; n <= 1<<maxOutShift; n += 1 + n/1000 {
		class, capacity, ok := outClass(n)
		if !ok || capacity < n || capacity > n+n/4 || class < lastClass || class > lastClass+1 ||
			class == lastClass && capacity != lastCap || class >= len(outPools) {
			t.Fatalf("outClass(%d) = %d, %d, %v after class %d of %d", n, class, capacity, ok, lastClass, lastCap)
		}
		if c2, cap2, ok2 := outClass(capacity); !ok2 || c2 != class || cap2 != capacity {
			t.Fatalf("outClass(%d) = %d, %d; of its capacity %d, %d", n, class, capacity, c2, cap2)
		}
		lastClass, lastCap = class, capacity
	}
	for _, n := range []int{0, 1, 1 << minOutShift, 1<<maxOutShift + 1} {
		if _, capacity, ok := outClass(n); ok || capacity != n {
			t.Fatalf("outClass(%d) pooled", n)
		}
	}
	b := getOut(5000)
	if len(b) != 0 || cap(b) != 5120 {
		t.Fatalf("getOut(5000): len %d cap %d", len(b), cap(b))
	}
}
