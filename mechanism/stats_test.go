package mechanism

import (
	"fmt"
	"math"
	"math/big"
	"testing"
)

// Statistical tests of the exact samplers. All are seeded, so they are
// deterministic; the stated false-failure probability is the chance that a
// correct sampler on a fresh seed would fail the check.

// chiSquareCheck fails the test if Pearson's statistic of the observed
// counts against probabilities p(i) (summing to 1 over the bins) exceeds
// the Laurent–Massart bound k + 2√(kx) + 2x, x = 20, for k = bins − 1
// degrees of freedom: a χ²_k variable exceeds it with probability at most
// e⁻²⁰ ≈ 2e-9 (Laurent and Massart 2000, Lemma 1). Bins should expect at
// least ~50 draws for the χ² approximation to hold.
func chiSquareCheck(t *testing.T, count []float64, p func(i int) float64, n float64, what string, param any) {
	t.Helper()
	var stat, total float64
	minExp := math.Inf(1)
	for i, c := range count {
		e := n * p(i)
		minExp = min(minExp, e)
		stat += (c - e) * (c - e) / e
		total += c
	}
	if total != n {
		t.Fatalf("%s(%v): counts sum to %v, want %v", what, param, total, n)
	}
	if minExp < 50 {
		t.Fatalf("%s(%v): a bin expects only %.1f draws", what, param, minExp)
	}
	k := float64(len(count) - 1)
	const x = 20
	if bound := k + 2*math.Sqrt(k*x) + 2*x; stat > bound {
		t.Errorf("%s(%v): χ² = %.1f over %v degrees of freedom, bound %.1f", what, param, stat, k, bound)
	}
}

// gaussPMF returns P(Z = x) for Z ~ N_Z(0, s²), by direct summation of the
// normalizer over |x| ≤ 40s (the rest is below e^(−800) relative).
func gaussPMF(s float64) func(x float64) float64 {
	norm := 0.0
	for x := -math.Ceil(40 * s); x <= math.Ceil(40*s); x++ {
		norm += math.Exp(-x * x / (2 * s * s))
	}
	return func(x float64) float64 { return math.Exp(-x*x/(2*s*s)) / norm }
}

// binnedCounts draws n deviates and counts them in bins [edges[i],
// edges[i+1]) plus two tail bins (below edges[0], at or above the last
// edge).
func binnedCounts(draw func() int64, n int, edges []int64) []float64 {
	count := make([]float64, len(edges)+1)
	for range n {
		z := draw()
		i := 0
		for i < len(edges) && z >= edges[i] {
			i++
		}
		count[i]++
	}
	return count
}

// binProbs returns the probabilities of binnedCounts' bins under the pmf,
// summed over |x| ≤ lim (the pmf beyond lim is negligible).
func binProbs(pmf func(float64) float64, edges []int64, lim int64) []float64 {
	p := make([]float64, len(edges)+1)
	for x := -lim; x <= lim; x++ {
		i := 0
		for i < len(edges) && x >= edges[i] {
			i++
		}
		p[i] += pmf(float64(x))
	}
	return p
}

// TestDiscreteGaussianChiSquare: for small scales, the draws' histogram
// (one bin per value over ±3s, tails pooled) matches the exact pmf of
// N_Z(0, s²); for s = 300 over 40 bins of equal width.
func TestDiscreteGaussianChiSquare(t *testing.T) {
	const n = 400000
	for _, scale := range []uint64{1, 2, 3, 10, 300} {
		s := newSampler(seeded(100 + scale))
		var edges []int64
		w := max(1, int64(scale)*6/40)
		for e := -3 * int64(scale); e <= 3*int64(scale); e += w {
			edges = append(edges, e)
		}
		count := binnedCounts(func() int64 { z, _ := s.discreteGaussian(scale); return z }, n, edges)
		p := binProbs(gaussPMF(float64(scale)), edges, 60*int64(scale))
		chiSquareCheck(t, count, func(i int) float64 { return p[i] }, n, "discreteGaussian", scale)
	}
}

// TestDiscreteLaplaceChiSquare: the proposal is the discrete Laplace with
// P(y) ∝ exp(−|y|/t).
func TestDiscreteLaplaceChiSquare(t *testing.T) {
	const n = 400000
	for _, scale := range []uint64{1, 4, 50} {
		s := newSampler(seeded(200 + scale))
		r := math.Exp(-1 / float64(scale))
		pmf := func(x float64) float64 { return (1 - r) / (1 + r) * math.Pow(r, math.Abs(x)) }
		var edges []int64
		w := max(1, int64(scale)/5)
		for e := -4 * int64(scale); e <= 4*int64(scale); e += w {
			edges = append(edges, e)
		}
		count := binnedCounts(func() int64 {
			m, _, neg := s.discreteLaplace(scale)
			if neg {
				return -int64(m)
			}
			return int64(m)
		}, n, edges)
		p := binProbs(pmf, edges, 200*int64(scale))
		chiSquareCheck(t, count, func(i int) float64 { return p[i] }, n, "discreteLaplace", scale)
	}
}

// TestDiscreteGaussianMoments: at the scales the mechanism uses (2²⁰ to
// 2⁴⁰, the latter through 128-bit arithmetic) the mean, the variance, the
// tails beyond 2s and 3s and the balance of signs match N_Z(0, s²), whose
// variance and tails equal the continuous Gaussian's to a relative
// 8π²s²e^(−2π²s²) + 1/s² (Poisson summation; Euler–Maclaurin), i.e.
// exactly in float64. Each bound is 6 standard deviations. It checks both
// samplers: CKS Algorithm 3 and the table sampler.
func TestDiscreteGaussianMoments(t *testing.T) {
	for _, scale := range []uint64{1 << 20, 3_000_000_019, 1<<40 + 1} {
		t.Run(fmt.Sprintf("cks/%d", scale), func(t *testing.T) {
			s := newSampler(seeded(300 + scale&0xff))
			checkMoments(t, scale, func() (int64, bool) { z, b := s.discreteGaussian(scale); return z, b == nil })
		})
		t.Run(fmt.Sprintf("table/%d", scale), func(t *testing.T) {
			s := newSampler(seeded(400 + scale&0xff))
			g := newGaussTable(scale, tailFactor)
			checkMoments(t, scale, func() (int64, bool) { z, b := s.tableGaussian(g); return z, b == nil })
		})
	}
}

func checkMoments(t *testing.T, scale uint64, draw func() (int64, bool)) {
	t.Helper()
	const n = 400000
	sf := float64(scale)
	var sum, sumSq float64
	var pos, neg, over2, over3 int
	for range n {
		z, ok := draw()
		if !ok {
			t.Fatalf("scale %d: a deviate beyond the fast path", scale)
		}
		x := float64(z) / sf
		sum += x
		sumSq += x * x
		switch {
		case z > 0:
			pos++
		case z < 0:
			neg++
		}
		if math.Abs(x) >= 2 {
			over2++
		}
		if math.Abs(x) >= 3 {
			over3++
		}
	}
	mean, variance := sum/n, sumSq/n
	if math.Abs(mean) > sixSigma/math.Sqrt(n) {
		t.Errorf("mean %v s, want 0 ± %v", mean, 1/math.Sqrt(n))
	}
	if math.Abs(variance-1) > sixSigma*math.Sqrt(2.0/n) {
		t.Errorf("variance %v s², want 1 ± %v", variance, math.Sqrt(2.0/n))
	}
	if d := float64(pos - neg); math.Abs(d) > sixSigma*math.Sqrt(n) {
		t.Errorf("%d positive, %d negative", pos, neg)
	}
	for _, tail := range []struct {
		k     float64
		count int
	}{{2, over2}, {3, over3}} {
		p := math.Erfc(tail.k / math.Sqrt2)
		if sd := math.Sqrt(n * p * (1 - p)); math.Abs(float64(tail.count)-n*p) > sixSigma*sd {
			t.Errorf("P(|z| ≥ %vs): %d of %d, want %.0f ± %.0f", tail.k, tail.count, n, n*p, sd)
		}
	}
}

// TestTableChiSquare: the table sampler's histogram matches the exact pmf
// of N_Z(0, t²) at its smallest scale, with the tail at 8t (production)
// and at 1t and 2t, where the tail path draws a third and a twentieth of
// the deviates, over 56 bins of width t/8 from −3.5t to 3.5t plus two tail
// bins. False failure: below 2e-9 per case (chiSquareCheck).
func TestTableChiSquare(t *testing.T) {
	const n = 400000
	const scale = minTableScale
	for _, factor := range []uint64{tailFactor, 1, 2} {
		g := newGaussTable(scale, factor)
		s := newSampler(seeded(500 + factor))
		var edges []int64
		for e := -7 * int64(scale) / 2; e <= 7*int64(scale)/2; e += scale / 8 {
			edges = append(edges, e)
		}
		count := binnedCounts(func() int64 {
			z, b := s.tableGaussian(g)
			if b != nil {
				t.Fatalf("deviate %v beyond the fast path", b)
			}
			return z
		}, n, edges)
		p := binProbs(gaussPMF(scale), edges, 40*scale)
		chiSquareCheck(t, count, func(i int) float64 { return p[i] }, n, "tableGaussian, tail factor", factor)
	}
}

// TestTableEnvelope checks the table's certificates with independent
// bounds at 192 bits: every block's envelope dominates ρ over the block
// (W_b·w/(λ·w_b) ≥ ρ(bw)), the tail's dominates ρ(T + y) for all y, the
// weights sum to 2^v with little left for "again", the stored digits of
// c_i are its first 64 binary digits, and the alias table gives column j
// exactly the probability W_j/2^v.
func TestTableEnvelope(t *testing.T) {
	for _, tc := range []struct{ scale, factor uint64 }{{minTableScale, tailFactor}, {775_946 * 64, tailFactor}, {1<<40 + 1, tailFactor}, {5000, 1}} {
		g := newGaussTable(tc.scale, tc.factor)
		const p = 192
		if g.weight[0] != g.lambda || g.width[0] != g.w || !g.cone[0] {
			t.Fatalf("t=%d: block 0 is not exact (ρ(0) = 1)", tc.scale)
		}
		lam := new(big.Int).SetUint64(g.lambda)
		for b := 1; b < g.blocks; b++ {
			_, hi := g.rho(uint64(b)*g.w, p)
			env := new(big.Int).SetUint64(g.weight[b]) // W_b·w·2^p ≥ λ·w_b·hi
			env.Lsh(env, p+g.e)
			need := new(big.Int).Mul(hi, new(big.Int).SetUint64(g.width[b]))
			if env.Cmp(need.Mul(need, lam)) < 0 {
				t.Fatalf("t=%d block %d: weight %d below ρ", tc.scale, b, g.weight[b])
			}
		}
		// Tail: W·w·(2^p − r) ≥ λ·ρ(T), with r's and ρ's upper bounds.
		_, rhoHi := g.rho(g.tail, p)
		_, rHi := g.tailRatio(p)
		lhs := new(big.Int).SetUint64(g.weight[g.blocks])
		lhs.Mul(lhs, new(big.Int).SetUint64(g.w))
		lhs.Mul(lhs, new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), p), rHi))
		if lhs.Cmp(rhoHi.Mul(rhoHi, lam)) < 0 {
			t.Fatalf("t=%d: tail weight %d too small", tc.scale, g.weight[g.blocks])
		}
		var sum uint64
		for _, w := range g.weight {
			sum += w
		}
		if sum != 1<<g.vBits || g.weight[g.blocks+1] > sum>>12 {
			t.Fatalf("t=%d: weights sum to %d, want 2^%d; \"again\" has %d", tc.scale, sum, g.vBits, g.weight[g.blocks+1])
		}
		for i := 1; i <= g.blocks; i += max(1, g.blocks/17) {
			d128 := g.cDigits(i, 128)
			if d128.Rsh(d128, 64).Uint64() != g.cdig[i] {
				t.Fatalf("t=%d column %d: digits %x disagree with the 128-digit expansion", tc.scale, i, g.cdig[i])
			}
		}
		n := len(g.weight)
		got := make([]*big.Int, n) // units per column, out of n·2^vBits
		for j := range got {
			got[j] = new(big.Int)
		}
		for i := range n {
			got[i].Add(got[i], new(big.Int).SetUint64(g.cut[i]))
			got[g.alias[i]].Add(got[g.alias[i]], new(big.Int).SetUint64(1<<g.vBits-g.cut[i]))
		}
		for j := range got {
			if want := new(big.Int).Mul(new(big.Int).SetUint64(g.weight[j]), big.NewInt(int64(n))); got[j].Cmp(want) != 0 {
				t.Fatalf("t=%d column %d: alias gives %v units, want %v", tc.scale, j, got[j], want)
			}
		}
	}
}

// TestExpNegBounds: the certified bounds bracket exp(−γ) tightly, agree
// with math.Exp to float64 precision, and nest across precisions.
func TestExpNegBounds(t *testing.T) {
	for _, g := range [][2]int64{{0, 1}, {1, 3}, {1, 1}, {5, 2}, {32, 1}, {63, 2}, {12345, 1000}, {1, 1 << 40}} {
		n, d := big.NewInt(g[0]), big.NewInt(g[1])
		lo, hi := expNegBounds(n, d, 80)
		if diff := new(big.Int).Sub(hi, lo); diff.Sign() < 0 || diff.Cmp(big.NewInt(3)) > 0 {
			t.Errorf("γ=%d/%d: bounds %v, %v", g[0], g[1], lo, hi)
		}
		f, _ := new(big.Float).SetInt(lo).Float64()
		if want := math.Ldexp(math.Exp(-float64(g[0])/float64(g[1])), 80); math.Abs(f-want) > 1e-14*want+1 {
			t.Errorf("γ=%d/%d: %v, math.Exp says %v", g[0], g[1], f, want)
		}
		lo2, hi2 := expNegBounds(n, d, 112)
		lo2.Rsh(lo2, 32)
		hi2.Add(hi2, new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 32), big.NewInt(1))).Rsh(hi2, 32)
		if lo2.Cmp(hi) > 0 || hi2.Cmp(lo) < 0 {
			t.Errorf("γ=%d/%d: bounds at 112 bits [%v, %v] miss [%v, %v]", g[0], g[1], lo2, hi2, lo, hi)
		}
	}
}
