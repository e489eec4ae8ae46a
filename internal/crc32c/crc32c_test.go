package crc32c

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestCombineRandomSplits checks Combine against the CRC computed over the
// whole, for random data split at random places (empty halves included).
func TestCombineRandomSplits(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		n := rng.IntN(5000)
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		at := 0
		if n > 0 {
			at = rng.IntN(n + 1)
		}
		want := crc32.Checksum(b, Table)
		got := Combine(Checksum(b[:at]), Checksum(b[at:]), int64(n-at))
		if got != want {
			t.Fatalf("%d bytes split at %d: Combine gives %08x, the whole's CRC is %08x", n, at, got, want)
		}
	}
}

// TestCombineThreeParts is how the proxy uses it: bytes before a payload,
// the payload, the bytes after.
func TestCombineThreeParts(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	for range 100 {
		i, j := rng.IntN(len(b)), rng.IntN(len(b))
		if i > j {
			i, j = j, i
		}
		c := Combine(Checksum(b[:i]), Checksum(b[i:j]), int64(j-i))
		c = Update(c, b[j:])
		if want := Checksum(b); c != want {
			t.Fatalf("split at %d and %d: %08x, want %08x", i, j, c, want)
		}
	}
}

// TestCombineOneGiB combines over a 1 GiB second part (the largest record
// librdkafka allows is 1,000,000,000 bytes). The 1 GiB is zeros computed
// directly once, and also as 1024 combined 1 MiB blocks of random bytes.
func TestCombineOneGiB(t *testing.T) {
	if testing.Short() {
		t.Skip("reads 2 GiB")
	}
	const mib = 1 << 20
	rng := rand.New(rand.NewPCG(5, 6))
	block := make([]byte, mib)
	head := []byte("the bytes before the payload")
	// Direct: running CRC over head then 1024 × block, each block
	// different (its first 8 bytes numbered).
	direct := Checksum(head)
	combined := Checksum(head)
	payload := uint32(0)
	for i := range 1024 {
		for j := range block {
			if j%4096 == 0 {
				block[j] = byte(rng.Uint32())
			}
		}
		block[0], block[1] = byte(i), byte(i>>8)
		direct = Update(direct, block)
		payload = Combine(payload, Checksum(block), mib)
	}
	combined = Combine(combined, payload, 1<<30)
	if combined != direct {
		t.Fatalf("1 GiB: combined %08x, direct %08x", combined, direct)
	}
	// And with 1,000,000,000 bytes (not a power of two).
	zeros := make([]byte, mib)
	direct = Checksum(head)
	left := 1_000_000_000
	for left > 0 {
		n := min(left, len(zeros))
		direct = Update(direct, zeros[:n])
		left -= n
	}
	var zcrc uint32
	left = 1_000_000_000
	for left > 0 {
		n := min(left, len(zeros))
		zcrc = Update(zcrc, zeros[:n])
		left -= n
	}
	if got := Combine(Checksum(head), zcrc, 1_000_000_000); got != direct {
		t.Fatalf("1,000,000,000 bytes: combined %08x, direct %08x", got, direct)
	}
}

func BenchmarkCombine1GiB(b *testing.B) {
	for b.Loop() {
		Combine(0x12345678, 0x9abcdef0, 1<<30)
	}
}
