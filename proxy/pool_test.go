package proxy

import "testing"

func TestFramePoolClasses(t *testing.T) {
	for _, tc := range []struct {
		n, capacity int
		pooled      bool
	}{
		{1, 1, false}, {32 << 10, 32 << 10, false}, {32<<10 + 1, 64 << 10, true}, {64 << 10, 64 << 10, true},
		{64<<10 + 1, 128 << 10, true}, {3 << 20, 4 << 20, true}, {8 << 20, 8 << 20, true}, {8<<20 + 1, 8<<20 + 1, false},
	} {
		_, capacity, ok := poolClass(tc.n)
		if ok != tc.pooled || capacity != tc.capacity {
			t.Errorf("poolClass(%d) = %d, %v; want %d, %v", tc.n, capacity, ok, tc.capacity, tc.pooled)
		}
		b := getFrame(tc.n)
		if len(b) != tc.n || cap(b) != tc.capacity {
			t.Errorf("getFrame(%d): len %d cap %d, want cap %d", tc.n, len(b), cap(b), tc.capacity)
		}
		putFrame(b)
		if c := getFrame(tc.n); len(c) != tc.n || cap(c) != tc.capacity {
			t.Errorf("getFrame(%d) after putFrame: len %d cap %d", tc.n, len(c), cap(c))
		}
	}
	// A buffer of another capacity (not from the pool) is not pooled.
	putFrame(make([]byte, 100<<10))
	if b := getFrame(100 << 10); cap(b) != 128<<10 {
		t.Errorf("a foreign buffer came back from the pool: cap %d", cap(b))
	}
}
