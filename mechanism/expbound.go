package mechanism

import "math/big"

// Certified bounds on exp(−γ) for rational γ ≥ 0, in integer arithmetic:
// the sampler's tables need constants such as 2⁵²·exp(−x²/(2t²)) rounded
// in a known direction, which float64's math.Exp cannot promise. Only table
// construction uses math/big; sampling does not.

// expNegBounds returns integers lo ≤ 2^p·exp(−n/d) ≤ hi with hi − lo ≤ 3,
// for n ≥ 0, d ≥ 1 and γ = n/d ≤ 2²⁰.
//
// Method: γ = m + f with m = ⌊γ⌋ and f ∈ [0, 1). exp(−f) is the alternating
// Taylor series Σ(−f)^k/k!, whose terms decrease, so the first omitted term
// bounds the remainder; exp(−m) is exp(−1)^m by repeated squaring. Every
// product and quotient is computed twice, rounded down for the lower bound
// and up for the upper, at p + 64 + 2·bitlen(m) bits, and the guard bits
// are dropped at the end: the accumulated rounding (a few units per
// operation, about 2·(k + bitlen(m)) operations) stays far below 2⁶⁴ units.
func expNegBounds(n, d *big.Int, p uint) (lo, hi *big.Int) {
	m, r := new(big.Int).QuoRem(n, d, new(big.Int))
	guard := 64 + 2*uint(m.BitLen())
	P := p + guard
	one := new(big.Int).Lsh(big.NewInt(1), P)
	fLo, fHi := expNegFrac(r, d, P, one)
	if m.Sign() > 0 {
		eLo, eHi := expNegFrac(big.NewInt(1), big.NewInt(1), P, one) // exp(−1)
		pLo, pHi := powBounds(eLo, eHi, m, P, one)
		fLo = mulDown(fLo, pLo, P)
		fHi = mulUp(fHi, pHi, P)
	}
	lo = new(big.Int).Rsh(fLo, guard)
	hi = new(big.Int).Rsh(new(big.Int).Add(fHi, new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), guard), big.NewInt(1))), guard)
	return lo, hi
}

// expNegFrac bounds 2^P·exp(−f), f = r/d ∈ [0, 1], by the alternating
// series; one is 2^P.
func expNegFrac(r, d *big.Int, P uint, one *big.Int) (lo, hi *big.Int) {
	lo, hi = new(big.Int).Set(one), new(big.Int).Set(one) // k = 0 term
	tLo, tHi := new(big.Int).Set(one), new(big.Int).Set(one)
	num, den := new(big.Int), new(big.Int)
	for k := int64(1); ; k++ {
		// t_k = t_{k−1}·f/k, rounded down and up.
		den.Mul(d, big.NewInt(k))
		tLo.Quo(num.Mul(tLo, r), den)
		num.Mul(tHi, r)
		tHi.Add(num, new(big.Int).Sub(den, big.NewInt(1)))
		tHi.Quo(tHi, den)
		if k%2 == 1 {
			lo.Sub(lo, tHi)
			hi.Sub(hi, tLo)
		} else {
			lo.Add(lo, tLo)
			hi.Add(hi, tHi)
		}
		if tHi.Cmp(big.NewInt(1)) <= 0 {
			// The remainder is at most the next term, below one unit.
			lo.Sub(lo, big.NewInt(1))
			hi.Add(hi, big.NewInt(1))
			if lo.Sign() < 0 {
				lo.SetInt64(0)
			}
			return lo, hi
		}
	}
}

// powBounds bounds (x)^m for x in [xLo, xHi] (scaled by 2^P, x ≤ 1) by
// square-and-multiply with directed rounding.
func powBounds(xLo, xHi, m *big.Int, P uint, one *big.Int) (lo, hi *big.Int) {
	lo, hi = new(big.Int).Set(one), new(big.Int).Set(one)
	bLo, bHi := new(big.Int).Set(xLo), new(big.Int).Set(xHi)
	for i := 0; i < m.BitLen(); i++ {
		if m.Bit(i) == 1 {
			lo, hi = mulDown(lo, bLo, P), mulUp(hi, bHi, P)
		}
		bLo, bHi = mulDown(bLo, bLo, P), mulUp(bHi, bHi, P)
	}
	return lo, hi
}

func mulDown(a, b *big.Int, P uint) *big.Int {
	return new(big.Int).Rsh(new(big.Int).Mul(a, b), P)
}

func mulUp(a, b *big.Int, P uint) *big.Int {
	x := new(big.Int).Mul(a, b)
	x.Add(x, new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), P), big.NewInt(1)))
	return x.Rsh(x, P)
}
