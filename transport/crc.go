package transport

// CRC32C arithmetic for combining checksums, so that a chunked transfer is
// hashed once: the whole-message CRC32C is built from the chunks' data
// CRCs, and a chunk's CRC from its header's and its data's.
//
// A CRC32C value in the reflected form crc32 uses is a polynomial over
// GF(2) with x⁰ in the top bit. For crc32.Checksum (initial value and final
// xor all ones), CRC(A‖B) = CRC(A)·x^(8·|B|) mod P ⊕ CRC(B): the all-ones
// terms cancel. crc32cCombine computes that product in O(log |B|) steps.

// castagnoliPoly is the reflected CRC32C polynomial (crc32.Castagnoli).
const castagnoliPoly = 0x82f63b78

// crcPow2 holds x^(2^k) mod P for k = 0…66 (enough for crcXPow8N of any
// uint64), in reflected form.
var crcPow2 = func() (t [67]uint32) {
	p := uint32(1) << 30 // x¹
	for k := range t {
		t[k] = p
		p = crcMulMod(p, p)
	}
	return t
}()

// crcMulMod returns a·b mod P (reflected form).
func crcMulMod(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; a != 0; m >>= 1 { // m: the term x^i of a; b holds b·x^i
		if a&m != 0 {
			p ^= b
			a &^= m
		}
		if b&1 != 0 {
			b = b>>1 ^ castagnoliPoly
		} else {
			b >>= 1
		}
	}
	return p
}

// crcXPow8N returns x^(8·n) mod P (reflected form).
func crcXPow8N(n uint64) uint32 {
	p := uint32(1) << 31 // x⁰
	for k := 3; n != 0; k, n = k+1, n>>1 {
		if n&1 != 0 {
			p = crcMulMod(crcPow2[k], p)
		}
	}
	return p
}

// crc32cCombine returns the CRC32C of A‖B given crcA = CRC32C(A), crcB =
// CRC32C(B) and lenB = |B|, as crc32.Checksum(…, castagnoli) computes them.
func crc32cCombine(crcA, crcB uint32, lenB uint64) uint32 {
	return crcMulMod(crcXPow8N(lenB), crcA) ^ crcB
}
