package mechanism

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

func toBig(x u128) *big.Int {
	b := new(big.Int).Lsh(new(big.Int).SetUint64(x.hi), 64)
	return b.Or(b, new(big.Int).SetUint64(x.lo))
}

// TestDivmodMatchesBig checks the 128-bit division against math/big on
// edge cases and on random operands of every pair of bit lengths.
func TestDivmodMatchesBig(t *testing.T) {
	max := ^uint64(0)
	cases := [][2]u128{
		{{0, 0}, {0, 1}}, {{max, max}, {0, 1}}, {{max, max}, {max, max}}, {{1, 0}, {1, 0}},
		{{max, max}, {1, 0}}, {{max, max}, {1, 1}}, {{1 << 63, 0}, {1 << 63, 1}}, {{5, 7}, {0, max}},
		{{0, 12345}, {1, 0}}, {{max, 0}, {max >> 1, max}},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rnd := func(n int) u128 { // a uniform value of bit length n (0..128)
		var x u128
		switch {
		case n == 0:
		case n <= 64:
			x.lo = rng.Uint64()>>(64-n) | 1<<(n-1)
		default:
			x.hi, x.lo = rng.Uint64()>>(128-n)|1<<(n-65), rng.Uint64()
		}
		return x
	}
	for nb := 0; nb <= 128; nb += 3 {
		for db := 1; db <= 128; db += 3 {
			for range 20 {
				cases = append(cases, [2]u128{rnd(nb), rnd(db)})
			}
		}
	}
	for _, c := range cases {
		n, d := c[0], c[1]
		q, r := divmod(n, d)
		wq, wr := new(big.Int).QuoRem(toBig(n), toBig(d), new(big.Int))
		if toBig(q).Cmp(wq) != 0 || toBig(r).Cmp(wr) != 0 {
			t.Fatalf("divmod(%v, %v) = %v, %v; want %v, %v", toBig(n), toBig(d), toBig(q), toBig(r), wq, wr)
		}
	}
	if got := toBig(mul64(max, max)); got.Cmp(new(big.Int).Mul(toBig(from64(max)), toBig(from64(max)))) != 0 {
		t.Errorf("mul64(max, max) = %v", got)
	}
}

// refSampler is the naive reference: CKS Algorithms 1–3 with every
// quantity in math/big, reading the stream through the same bitReader in
// the same order as sampler. The fast sampler must produce the same values
// from the same stream: this checks its 128-bit arithmetic and its
// overflow handling, not the algorithm (the statistical tests do that).
type refSampler struct{ bits bitReader }

var two64 = new(big.Int).Lsh(big.NewInt(1), 64)

// below is Lemire's method in math/big, for m < 2⁶⁴.
func (r *refSampler) below(m *big.Int) *big.Int {
	if m.Cmp(big.NewInt(1)) == 0 {
		return new(big.Int)
	}
	neg := new(big.Int).Mod(new(big.Int).Sub(two64, m), m) // (2⁶⁴ − m) mod m
	for {
		p := new(big.Int).Mul(new(big.Int).SetUint64(r.bits.word()), m)
		hi, lo := new(big.Int).QuoRem(p, two64, new(big.Int))
		if lo.Cmp(m) >= 0 || lo.Cmp(neg) >= 0 {
			return hi
		}
	}
}

// bernoulli compares random bits with the binary digits of n/d.
func (r *refSampler) bernoulli(n, d *big.Int) bool {
	if n.Cmp(d) >= 0 {
		return true
	}
	rem := new(big.Int).Set(n)
	for {
		rem.Lsh(rem, 1)
		digit := rem.Cmp(d) >= 0
		if digit {
			rem.Sub(rem, d)
		}
		if r.bits.bit() != digit {
			return digit
		}
		if rem.Sign() == 0 {
			return false
		}
	}
}

func (r *refSampler) expFrac(n, d *big.Int) bool {
	if n.Sign() == 0 {
		return true
	}
	k := big.NewInt(1)
	for r.bernoulli(big.NewInt(1), k) && r.bernoulli(n, d) {
		k.Add(k, big.NewInt(1))
	}
	return k.Bit(0) == 1
}

func (r *refSampler) expOne() bool {
	k := big.NewInt(1)
	for r.bernoulli(big.NewInt(1), k) {
		k.Add(k, big.NewInt(1))
	}
	return k.Bit(0) == 1
}

func (r *refSampler) exp(n, d *big.Int) bool {
	q, rem := new(big.Int).QuoRem(n, d, new(big.Int))
	for ; q.Sign() > 0; q.Sub(q, big.NewInt(1)) {
		if !r.expOne() {
			return false
		}
	}
	return r.expFrac(rem, d)
}

func (r *refSampler) laplace(t *big.Int) *big.Int {
	for {
		u := r.below(t)
		if !r.expFrac(u, t) {
			continue
		}
		v := new(big.Int)
		for r.expOne() {
			v.Add(v, big.NewInt(1))
		}
		neg := r.bits.bit()
		x := new(big.Int).Add(u, new(big.Int).Mul(t, v))
		if neg && x.Sign() == 0 {
			continue
		}
		if neg {
			x.Neg(x)
		}
		return x
	}
}

func (r *refSampler) gaussian(t *big.Int) *big.Int {
	d := new(big.Int).Lsh(new(big.Int).Mul(t, t), 1)
	for {
		y := r.laplace(t)
		diff := new(big.Int).Sub(new(big.Int).Abs(y), t)
		if r.exp(new(big.Int).Mul(diff, diff), d) {
			return y
		}
	}
}

func seeded(seed uint64) *rand.ChaCha8 {
	var key [32]byte
	key[0], key[1] = byte(seed), byte(seed>>8)
	return rand.NewChaCha8(key)
}

// value returns the fast sampler's result as a big.Int.
func value(z int64, b *big.Int) *big.Int {
	if b != nil {
		return b
	}
	return big.NewInt(z)
}

// TestSamplerMatchesReference: on the same ChaCha8 stream the fast sampler
// and the math/big reference produce the same deviates, for scales whose
// 2t² fits 64 bits and scales that need 128 (t > 2^31.5), and with the
// math/big tail path forced on (limit lowered) for part of the outputs.
func TestSamplerMatchesReference(t *testing.T) {
	for _, tc := range []struct {
		scale uint64
		limit uint64
		n     int
	}{
		{1, fastLimit, 20000}, {2, fastLimit, 20000}, {3, fastLimit, 20000}, {7, fastLimit, 10000},
		{1000, fastLimit, 5000}, {1<<20 + 3, fastLimit, 3000}, {3_037_000_499, fastLimit, 2000},
		{1<<33 + 5, fastLimit, 2000}, {maxScale, fastLimit, 1000},
		{5, 9, 5000}, {1000, 2500, 3000}, {1 << 20, 1 << 21, 2000}, {1<<40 + 1, 1<<41 + 7, 1000},
	} {
		fast := sampler{bits: bitReader{src: seeded(tc.scale)}, limit: tc.limit}
		ref := refSampler{bits: bitReader{src: seeded(tc.scale)}}
		bigT := new(big.Int).SetUint64(tc.scale)
		slow := 0
		for i := range tc.n {
			z, b := fast.discreteGaussian(tc.scale)
			if b != nil {
				slow++
			}
			if got, want := value(z, b), ref.gaussian(bigT); got.Cmp(want) != 0 {
				t.Fatalf("scale %d limit %d draw %d: fast %v, reference %v", tc.scale, tc.limit, i, got, want)
			}
		}
		if tc.limit != fastLimit && slow == 0 {
			t.Errorf("scale %d limit %d: the math/big path never ran", tc.scale, tc.limit)
		}
	}
}

// TestSamplerSlowPathSameStream: lowering the fast-path limit changes which
// arithmetic runs, not the deviates.
func TestSamplerSlowPathSameStream(t *testing.T) {
	const scale = 777
	a := newSampler(seeded(3))
	b := sampler{bits: bitReader{src: seeded(3)}, limit: scale / 2}
	slow := 0
	for i := range 50000 {
		za, _ := a.discreteGaussian(scale)
		zb, bb := b.discreteGaussian(scale)
		if bb != nil {
			slow++
			if !bb.IsInt64() || bb.Int64() != za {
				t.Fatalf("draw %d: slow path %v, fast %d", i, bb, za)
			}
		} else if zb != za {
			t.Fatalf("draw %d: %d vs %d", i, zb, za)
		}
	}
	if slow < 10000 {
		t.Fatalf("only %d draws took the slow path", slow)
	}
}

// sixSigma: every test below bounds a statistic by 6 standard deviations
// of its (asymptotically normal) distribution; each such check fails by
// chance with probability below 2e-9.
const sixSigma = 6

// TestBernoulliExp checks P(true) = exp(−γ) for rational γ = n/d, including
// γ > 1 (whole part through Bernoulli(1/e)), d ≥ 2⁶⁴ (128-bit uniforms) and
// a γ so large that no success may appear.
func TestBernoulliExp(t *testing.T) {
	const draws = 400000
	s := newSampler(seeded(11))
	big1 := u128{1, 12345} // a divisor above 2⁶⁴
	for _, tc := range []struct {
		n, d u128
	}{
		{from64(0), from64(1)}, {from64(3), from64(10)}, {from64(1), from64(1)}, {from64(5), from64(2)},
		{from64(7), from64(3)}, {u128{0, 1 << 63}, big1}, {big1.mulLo(3).sub(from64(1)), big1},
		{from64(40), from64(1)},
	} {
		gamma, _ := new(big.Rat).SetFrac(toBig(tc.n), toBig(tc.d)).Float64()
		p := math.Exp(-gamma)
		hits := 0
		for range draws {
			if s.bernoulliExp(tc.n, tc.d) {
				hits++
			}
		}
		sd := math.Sqrt(draws * p * (1 - p))
		if math.Abs(float64(hits)-draws*p) > sixSigma*sd+1 {
			t.Errorf("γ = %v: %d of %d, want %.1f ± %.1f", gamma, hits, draws, draws*p, sd)
		}
	}
	hits := 0
	for range draws {
		if s.bernoulliExpOne() {
			hits++
		}
	}
	if p := 1 / math.E; math.Abs(float64(hits)-draws*p) > sixSigma*math.Sqrt(draws*p*(1-p)) {
		t.Errorf("Bernoulli(1/e): %d of %d", hits, draws)
	}
}

// TestBelowUniform: below is uniform, including a modulus just above 2⁶³
// (about half the words are rejected), and m = 1 draws nothing.
func TestBelowUniform(t *testing.T) {
	s := newSampler(seeded(5))
	const draws = 300000
	for _, m := range []uint64{2, 3, 7} {
		count := make([]float64, m)
		for range draws {
			count[s.below(m)]++
		}
		chiSquareCheck(t, count, func(int) float64 { return 1 / float64(m) }, draws, "below", m)
	}
	// 2⁶³+1 by its top three bits (the value 2⁶³ itself, probability
	// 2⁻⁶³, would index bin 8).
	count := make([]float64, 8)
	for range draws {
		count[s.below(1<<63+1)>>60]++
	}
	chiSquareCheck(t, count, func(int) float64 { return 1.0 / 8 }, draws, "below", uint64(1<<63+1))
	before, _ := s.bits.src.MarshalBinary()
	v := s.below(1)
	after, _ := s.bits.src.MarshalBinary()
	if v != 0 || string(before) != string(after) {
		t.Error("below(1) drew randomness")
	}
}

// TestBernoulli: Bernoulli(n/d) by lazy comparison has probability n/d,
// for terminating and non-terminating expansions and d above 2⁶⁴.
func TestBernoulli(t *testing.T) {
	const draws = 400000
	s := newSampler(seeded(6))
	for _, tc := range [][2]u128{
		{from64(0), from64(1)}, {from64(1), from64(1)}, {from64(1), from64(2)}, {from64(1), from64(3)},
		{from64(3), from64(8)}, {from64(2), from64(7)}, {u128{0, 1 << 62}, u128{1, 0}}, {u128{1, 5}, u128{2, 7}},
	} {
		p, _ := new(big.Rat).SetFrac(toBig(tc[0]), toBig(tc[1])).Float64()
		hits := 0
		for range draws {
			if s.bernoulli(tc[0], tc[1]) {
				hits++
			}
		}
		if sd := math.Sqrt(draws * p * (1 - p)); math.Abs(float64(hits)-draws*p) > sixSigma*sd {
			t.Errorf("Bernoulli(%v): %d of %d", p, hits, draws)
		}
	}
}
