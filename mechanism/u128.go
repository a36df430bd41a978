package mechanism

import "math/bits"

// u128 is an unsigned 128-bit integer, hi·2⁶⁴ + lo. The sampler's
// rationals (γ = n/d with d = 2s², s ≤ 2⁴⁸) need more than 64 bits; math/bits
// keeps them off math/big on the hot path.
type u128 struct{ hi, lo uint64 }

func from64(x uint64) u128 { return u128{0, x} }

// mul64 returns a·b exactly.
func mul64(a, b uint64) u128 {
	hi, lo := bits.Mul64(a, b)
	return u128{hi, lo}
}

func (x u128) isZero() bool { return x.hi == 0 && x.lo == 0 }

func (x u128) less(y u128) bool { return x.hi < y.hi || (x.hi == y.hi && x.lo < y.lo) }

// sub returns x − y; the caller guarantees y ≤ x.
func (x u128) sub(y u128) u128 {
	lo, b := bits.Sub64(x.lo, y.lo, 0)
	return u128{x.hi - y.hi - b, lo}
}

// mulLo returns the low 128 bits of x·y for a 64-bit y.
func (x u128) mulLo(y uint64) u128 {
	hi, lo := bits.Mul64(x.lo, y)
	return u128{hi + x.hi*y, lo}
}

// divmod returns ⌊n/d⌋ and n mod d for d ≠ 0 (Hacker's Delight, 2nd ed.,
// Sec. 9-5: a 128/128 division through one 128/64 hardware division after
// normalizing the divisor).
func divmod(n, d u128) (q, r u128) {
	if d.hi == 0 {
		q.hi = n.hi / d.lo
		var rem uint64
		q.lo, rem = bits.Div64(n.hi%d.lo, n.lo, d.lo)
		return q, from64(rem)
	}
	// d ≥ 2⁶⁴, so the quotient fits in 64 bits.
	s := uint(bits.LeadingZeros64(d.hi))
	v1 := d.hi<<s | d.lo>>(64-s)              // top 64 bits of d<<s (a shift by 64 is 0)
	u1 := u128{n.hi >> 1, n.hi<<63 | n.lo>>1} // n>>1, so u1.hi < v1
	q1, _ := bits.Div64(u1.hi, u1.lo, v1)
	// Undo the normalization and the halving, (q1<<s)>>63 in 128 bits; after
	// the decrement q0 is q or q−1.
	q0 := (q1>>(64-s))<<1 | (q1<<s)>>63
	if q0 != 0 {
		q0--
	}
	r = n.sub(d.mulLo(q0))
	if !r.less(d) {
		q0++
		r = r.sub(d)
	}
	return from64(q0), r
}
