// Package crc32c computes CRC-32C (Castagnoli), the checksum of Kafka's
// record batches (KIP-98), and combines the CRCs of two adjacent byte
// ranges without reading them again: the proxy writes the CRC of a batch
// whose payload it has not read yet from the CRC of the bytes around the
// payload and the payload's own CRC, recorded when it was published.
package crc32c

import "hash/crc32"

// Table is the Castagnoli table of hash/crc32.
var Table = crc32.MakeTable(crc32.Castagnoli)

// Checksum returns the CRC-32C of b.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, Table) }

// Update returns the CRC-32C of the bytes crc covers followed by b.
func Update(crc uint32, b []byte) uint32 { return crc32.Update(crc, Table, b) }

// poly is the Castagnoli polynomial, reversed (bit i is x^(31-i)).
const poly = 0x82f63b78

// Combine returns the CRC-32C of A followed by B, given crcA of A, crcB of
// B and lenB, B's length in bytes (zlib's crc32_combine for Castagnoli).
//
// The CRC's register update is linear over GF(2): appending a zero bit
// multiplies the 32-bit state by a fixed matrix M (a shift, plus the
// polynomial when the bit shifted out is set). The pre- and post-inversion
// of the CRC cancel out over the concatenation, so
// crc(A‖B) = M^(8·lenB)·crc(A) ⊕ crc(B). M^(8·lenB) is applied by squaring:
// the operators for 1, 2, 4, … zero bytes, one per bit of lenB, so the cost
// is O(log lenB) 32×32 matrix products, whatever lenB is.
func Combine(crcA, crcB uint32, lenB int64) uint32 {
	if lenB <= 0 {
		return crcA
	}
	// odd is the operator for one zero bit: column 0 is the polynomial (the
	// bit shifted out of the low end comes back as the polynomial), column
	// i is x^(i-1) (a plain shift right).
	var odd, even [32]uint32
	odd[0] = poly
	row := uint32(1)
	for i := 1; i < 32; i++ {
		odd[i] = row
		row <<= 1
	}
	square(&even, &odd) // two zero bits
	square(&odd, &even) // four zero bits
	// From here each pass squares once more: 8 bits (one byte), 16, ...,
	// applying the operator when lenB's matching bit is set.
	for {
		square(&even, &odd)
		if lenB&1 != 0 {
			crcA = times(&even, crcA)
		}
		lenB >>= 1
		if lenB == 0 {
			break
		}
		square(&odd, &even)
		if lenB&1 != 0 {
			crcA = times(&odd, crcA)
		}
		lenB >>= 1
		if lenB == 0 {
			break
		}
	}
	return crcA ^ crcB
}

// times returns the matrix m applied to the vector v over GF(2): the sum
// (xor) of the columns of m whose bit in v is set.
func times(m *[32]uint32, v uint32) uint32 {
	var sum uint32
	for i := 0; v != 0; i, v = i+1, v>>1 {
		if v&1 != 0 {
			sum ^= m[i]
		}
	}
	return sum
}

// square sets dst to m·m.
func square(dst, m *[32]uint32) {
	for i := range 32 {
		dst[i] = times(m, m[i])
	}
}
