package mechanism

import (
	"fmt"
	"math"
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
// exactly in float64. Each bound is 6 standard deviations.
func TestDiscreteGaussianMoments(t *testing.T) {
	const n = 400000
	for _, scale := range []uint64{1 << 20, 3_000_000_019, 1<<40 + 1} {
		t.Run(fmt.Sprint(scale), func(t *testing.T) {
			s := newSampler(seeded(300 + scale&0xff))
			sf := float64(scale)
			var sum, sumSq float64
			var pos, neg, over2, over3 int
			for range n {
				z, b := s.discreteGaussian(scale)
				if b != nil {
					t.Fatalf("scale %d: deviate %v beyond the fast path", scale, b)
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
		})
	}
}
