package mechanism

import (
	"math/big"
	"math/bits"
	"math/rand/v2"
)

// maxScale bounds the noise scale t in lattice units, so that 2t² < 2⁹⁷
// and every fast-path quantity fits the 128-bit arithmetic.
const maxScale = 1 << 48

// fastLimit is the magnitude below which discrete Laplace proposals stay in
// 64/128-bit arithmetic. A proposal beyond it (probability below e^(−2¹⁴)
// per draw for t ≤ 2⁴⁸) is finished in math/big, so the sampler is exact on
// all of ℤ.
const fastLimit = 1 << 62

// sampler draws exact discrete Laplace and discrete Gaussian deviates from a
// ChaCha8 stream with integer arithmetic only, after Canonne, Kamath and
// Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020),
// Algorithms 1–3: no floating point and no table, so every output has
// exactly the target probability (given uniform bits). Uniform integers are
// drawn without modulo bias and Bernoulli(n/d) trials by comparing random
// bits with the binary expansion of n/d, two bits on average. A sampler is
// not safe for concurrent use.
type sampler struct {
	bits bitReader
	// limit is fastLimit; tests lower it to run the math/big path.
	limit uint64
}

func newSampler(src *rand.ChaCha8) sampler {
	return sampler{bits: bitReader{src: src}, limit: fastLimit}
}

// bitReader hands out a ChaCha8 stream as whole words or as single bits
// (low bit first, from a buffered word).
type bitReader struct {
	src *rand.ChaCha8
	buf uint64
	n   uint // bits left in buf
}

func (b *bitReader) word() uint64 { return b.src.Uint64() }

func (b *bitReader) bit() bool {
	if b.n == 0 {
		b.buf, b.n = b.src.Uint64(), 64
	}
	v := b.buf&1 == 1
	b.buf >>= 1
	b.n--
	return v
}

// take returns n uniform bits, 1 ≤ n ≤ 64, as an integer in [0, 2ⁿ). It is
// small enough to inline; takeRefill is its rare path.
func (b *bitReader) take(n uint) uint64 {
	if n <= b.n {
		v := b.buf & (1<<n - 1) // shifts by 64 give 0 in Go: all ones for n = 64
		b.buf >>= n
		b.n -= n
		return v
	}
	return b.takeRefill(n)
}

// takeRefill is take for n > b.n: all the buffered bits, low, then the
// other n − b.n from a fresh word.
func (b *bitReader) takeRefill(n uint) uint64 {
	lo, have := b.buf, b.n
	need := n - have // 1 ≤ need ≤ 64
	w := b.src.Uint64()
	b.buf, b.n = w>>need, 64-need // a shift by 64 gives 0
	return lo | (w&(1<<need-1))<<have
}

// below returns a uniform integer in [0, m), m ≥ 1, by Lemire's
// multiply-and-reject method ("Fast Random Integer Generation in an
// Interval", ACM TOMACS 29(1), 2019): unbiased. m = 1 draws nothing.
func (s *sampler) below(m uint64) uint64 {
	if m == 1 {
		return 0
	}
	hi, lo := bits.Mul64(s.bits.word(), m)
	if lo < m {
		thresh := -m % m
		for lo < thresh {
			hi, lo = bits.Mul64(s.bits.word(), m)
		}
	}
	return hi
}

// bernoulli returns true with probability n/d, 0 ≤ n, 1 ≤ d, d < 2¹²⁷: it
// reads uniform bits b₁b₂… as U = 0.b₁b₂… and compares them with the binary
// expansion of n/d, produced digit by digit by long division, returning
// U < n/d at the first difference (after two bits on average). A
// terminating expansion whose digits all matched means U ≥ n/d (U = n/d has
// probability 0).
func (s *sampler) bernoulli(n, d u128) bool {
	if !n.less(d) {
		return true
	}
	if d.hi == 0 && d.lo < 1<<63 {
		return s.bernoulli64(n.lo, d.lo)
	}
	r := n
	for {
		r = u128{r.hi<<1 | r.lo>>63, r.lo << 1}
		digit := !r.less(d)
		if digit {
			r = r.sub(d)
		}
		if s.bits.bit() != digit {
			return digit
		}
		if r.isZero() {
			return false
		}
	}
}

// bernoulli64 is bernoulli for n < d < 2⁶³, in 64-bit arithmetic, with
// the bit buffer held in registers.
func (s *sampler) bernoulli64(n, d uint64) bool {
	r, buf, left := n, s.bits.buf, s.bits.n
	for {
		if left == 0 {
			buf, left = s.bits.src.Uint64(), 64
		}
		b := buf&1 == 1
		buf >>= 1
		left--
		r <<= 1
		digit := r >= d
		if digit {
			r -= d
		}
		if b != digit || r == 0 {
			s.bits.buf, s.bits.n = buf, left
			return digit && b != digit
		}
	}
}

// oneIn returns true with probability 1/k, k ≥ 1 (k < 2⁶³: reaching even
// k = 64 in the loops below has probability below 1/63!).
func (s *sampler) oneIn(k uint64) bool { return k == 1 || s.bernoulli64(1, k) }

// bernoulliExpFrac returns true with probability exp(−n/d) for
// 0 ≤ n < d, that is γ = n/d in [0, 1): CKS Algorithm 1 (von Neumann's
// method): K ← 1; while Bernoulli(γ/K) { K ← K+1 }; return K odd. The
// Bernoulli(n/(dK)) is drawn as Bernoulli(1/K) ∧ Bernoulli(n/d), which has
// the same probability and needs no product dK.
func (s *sampler) bernoulliExpFrac(n, d u128) bool {
	if n.isZero() {
		return true
	}
	k := uint64(1)
	for s.oneIn(k) && s.bernoulli(n, d) {
		k++
	}
	return k%2 == 1
}

// bernoulliExpOne returns true with probability 1/e: CKS Algorithm 1 at
// γ = 1, where Bernoulli(γ/K) is Bernoulli(1/K).
func (s *sampler) bernoulliExpOne() bool {
	k := uint64(1)
	for s.oneIn(k) {
		k++
	}
	return k%2 == 1
}

// bernoulliExp returns true with probability exp(−n/d), d ≥ 1: ⌊γ⌋ draws
// of Bernoulli(1/e), stopping at the first failure, then one of
// Bernoulli(exp(−(γ − ⌊γ⌋))) (CKS, Sec. 5.1).
func (s *sampler) bernoulliExp(n, d u128) bool {
	q, r := divmod(n, d)
	for ; !q.isZero(); q = q.sub(from64(1)) {
		if !s.bernoulliExpOne() {
			return false
		}
	}
	return s.bernoulliExpFrac(r, d)
}

// discreteLaplace draws y with P(y) ∝ exp(−|y|/t) on ℤ, t ≥ 1 (CKS
// Algorithm 2 with s = 1): a magnitude from expMagnitude and a uniform
// sign, rejecting "−0". It returns |y| and the sign, or, when
// |y| ≥ s.limit, |y| in big.
func (s *sampler) discreteLaplace(t uint64) (mag uint64, bigMag *big.Int, neg bool) {
	for {
		mag, bigMag = s.expMagnitude(t)
		neg = s.bits.bit()
		if neg && bigMag == nil && mag == 0 {
			continue
		}
		return mag, bigMag, neg
	}
}

// expMagnitude draws x ≥ 0 with P(x) ∝ exp(−x/t): U uniform on [0, t) kept
// with probability exp(−U/t); V geometric, the number of Bernoulli(1/e)
// successes before the first failure; x = U + tV (CKS Algorithm 2). It
// returns x, or, when x ≥ s.limit, x in big.
func (s *sampler) expMagnitude(t uint64) (uint64, *big.Int) {
	for {
		u := s.below(t)
		if !s.bernoulliExpFrac(from64(u), from64(t)) {
			continue
		}
		var v uint64
		for s.bernoulliExpOne() {
			v++
		}
		hi, lo := bits.Mul64(t, v)
		lo, carry := bits.Add64(lo, u, 0)
		hi += carry
		if hi == 0 && lo < s.limit {
			return lo, nil
		}
		x := new(big.Int).SetUint64(t)
		x.Mul(x, new(big.Int).SetUint64(v))
		return 0, x.Add(x, new(big.Int).SetUint64(u))
	}
}

// discreteGaussian draws z ~ N_Z(0, t²), P(z) ∝ exp(−z²/(2t²)) on ℤ, for
// 1 ≤ t ≤ maxScale: CKS Algorithm 3 with σ² = t² and Laplace scale t:
// propose y from discreteLaplace(t) and accept it with probability
// exp(−(|y| − t)²/(2t²)) (the ratio of the target to the proposal, scaled
// to at most 1; accepts with probability about e^(−1/2)·√(π/2) ≈ 0.76).
// The result is z, or, when |z| ≥ s.limit, z in big.
func (s *sampler) discreteGaussian(t uint64) (int64, *big.Int) {
	tt := mul64(t, t)
	d := u128{tt.hi<<1 | tt.lo>>63, tt.lo << 1} // 2t² < 2⁹⁷
	for {
		mag, bigMag, neg := s.discreteLaplace(t)
		if bigMag != nil {
			if s.acceptBig(bigMag, t, d) {
				if neg {
					bigMag.Neg(bigMag)
				}
				return 0, bigMag
			}
			continue
		}
		diff := t - mag
		if mag >= t {
			diff = mag - t
		}
		if s.bernoulliExp(mul64(diff, diff), d) {
			if neg {
				return -int64(mag), nil
			}
			return int64(mag), nil
		}
	}
}

// acceptBig is the acceptance test of discreteGaussian for a proposal
// |y| = x ≥ s.limit: bernoulliExp((x − t)², 2t²) with the whole part of γ in
// math/big. The remainder is below 2t² and goes back to 128 bits, so the
// randomness drawn is the same as bernoulliExp's.
func (s *sampler) acceptBig(x *big.Int, t uint64, d u128) bool {
	diff := new(big.Int).Sub(x, new(big.Int).SetUint64(t))
	n := new(big.Int).Mul(diff, diff)
	bd := new(big.Int).Lsh(new(big.Int).SetUint64(d.hi), 64)
	bd.Or(bd, new(big.Int).SetUint64(d.lo))
	q, r := new(big.Int).QuoRem(n, bd, new(big.Int))
	for one := big.NewInt(1); q.Sign() > 0; q.Sub(q, one) {
		if !s.bernoulliExpOne() {
			return false
		}
	}
	lo := new(big.Int).And(r, new(big.Int).SetUint64(^uint64(0))).Uint64()
	hi := new(big.Int).Rsh(r, 64).Uint64()
	return s.bernoulliExpFrac(u128{hi, lo}, d)
}
