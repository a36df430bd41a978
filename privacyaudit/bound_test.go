package privacyaudit

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// The values the paper prints (App. D, p. 46, and §7, Fig. 11, of arXiv
// 2305.08846v1), to the three decimals it prints: 0.702 rounds, 2.675
// truncates 2.6758, so the tolerance is one unit of the last digit.
func TestEpsilonLowerBoundPublished(t *testing.T) {
	for _, c := range []struct {
		m, r, v     int
		delta, beta float64
		want        float64
	}{
		{100, 100, 75, 0, 0.05, 0.702},
		{100, 100, 75, 1e-4, 0.05, 0.699},
		{1000, 100, 75, 1e-4, 0.05, 0.673},
		{100000, 1510, 1439, 1e-5, 0.05, 2.675},
	} {
		got, err := EpsilonLowerBound(c.m, c.r, c.v, c.delta, c.beta)
		if err != nil || math.Abs(got-c.want) > 1e-3 {
			t.Errorf("EpsilonLowerBound(%d, %d, %d, %v, %v) = %v, %v; want %v ± 1e-3", c.m, c.r, c.v, c.delta, c.beta, got, err, c.want)
		}
	}
}

// naivePValue is Appendix D's p_value_DP_audit written out with
// BinomialTail, every i from 1 to v and no truncation: the reference the
// log-space, truncated logPValue is checked against.
func naivePValue(m, r, v int, eps, delta float64) float64 {
	q := 1 / (1 + math.Exp(-eps))
	f := BinomialTail(r, v, q)
	alpha := 0.0
	for i := 1; i <= v; i++ {
		alpha = max(alpha, (BinomialTail(r, v-i, q)-f)/float64(i))
	}
	return min(1, f+alpha*delta*2*float64(m))
}

func TestPValueMatchesNaive(t *testing.T) {
	for _, r := range []int{1, 2, 7, 50, 300} {
		for _, m := range []int{r, 10 * r, 1000 * r} {
			for _, delta := range []float64{0, 1e-6, 1e-3, 0.2} {
				for _, eps := range []float64{0, 0.3, 1, 3, 8} {
					for v := 0; v <= r; v += max(1, r/23) {
						got, err := PValue(m, r, v, eps, delta)
						want := naivePValue(m, r, v, eps, delta)
						// The naive f(v−i) − f(v) cancels: its absolute error is
						// a few ulps of 1, hence the 1e-13 absolute term.
						if err != nil || math.Abs(got-want) > 1e-9*want+1e-13 {
							t.Errorf("PValue(%d, %d, %d, %v, %v) = %v, %v; naive %v", m, r, v, eps, delta, got, err, want)
						}
					}
				}
			}
		}
	}
}

// With v ≤ r/2 correct guesses, ε = 0 is not rejected at any β < ½: by
// symmetry P[Binomial(r, ½) ≥ v] ≥ ½, and the δ term only adds. The bound
// is 0.
func TestEpsilonLowerBoundZeroAtChance(t *testing.T) {
	for r := 1; r <= 200; r++ {
		for v := 0; 2*v <= r; v++ {
			for _, delta := range []float64{0, 1e-5, 1e-2} {
				got, err := EpsilonLowerBound(10*r, r, v, delta, 0.4)
				if err != nil || got != 0 {
					t.Fatalf("EpsilonLowerBound(%d, %d, %d, %v, 0.4) = %v, %v; want 0", 10*r, r, v, delta, got, err)
				}
			}
		}
	}
}

func mustBound(t *testing.T, m, r, v int, delta, beta float64) float64 {
	t.Helper()
	got, err := EpsilonLowerBound(m, r, v, delta, beta)
	if err != nil {
		t.Fatalf("EpsilonLowerBound(%d, %d, %d, %v, %v): %v", m, r, v, delta, beta, err)
	}
	return got
}

// Monotonicity in v, for 2mδ ≤ 1 (proved in doc.go) and beyond it, up to
// 2mδ = 200 (tested here, not proved).
func TestEpsilonLowerBoundMonotoneInV(t *testing.T) {
	for _, c := range []struct {
		m, r  int
		delta float64
	}{
		{100, 100, 0}, {1000, 100, 1e-4}, {1000, 500, 1e-3}, {10000, 200, 1e-3}, {100000, 1000, 1e-3}, {50, 37, 0.1},
	} {
		prev := 0.0
		for v := 0; v <= c.r; v++ {
			got := mustBound(t, c.m, c.r, v, c.delta, 0.05)
			if got < prev {
				t.Errorf("m=%d r=%d δ=%v: bound %v at v=%d below %v at v=%d", c.m, c.r, c.delta, got, v, prev, v-1)
			}
			prev = got
		}
	}
}

// The p-value is nondecreasing in ε on a grid, including 2mδ > 1: the
// property that makes the search's answer the largest rejected ε.
func TestPValueMonotoneInEpsilon(t *testing.T) {
	for _, c := range []struct {
		m, r  int
		delta float64
	}{
		{100, 100, 0}, {1000, 100, 1e-4}, {10000, 200, 1e-3}, {100000, 1000, 1e-3}, {50, 37, 0.1},
	} {
		for v := 0; v <= c.r; v += max(1, c.r/40) {
			prev := 0.0
			for eps := 0.0; eps <= 12; eps += 1.0 / 64 {
				got, err := PValue(c.m, c.r, v, eps, c.delta)
				if err != nil || got < prev*(1-1e-12) {
					t.Fatalf("m=%d r=%d v=%d δ=%v: p-value %v at ε=%v below %v at ε−1/64 (%v)", c.m, c.r, v, c.delta, got, eps, prev, err)
				}
				prev = got
			}
		}
	}
}

// For fixed v, more guesses mean a weaker bound (δ = 0: Binomial(r+1, q)
// dominates Binomial(r, q)); more confidence (smaller β), a larger δ or
// more canaries m (the 2mδ term) never raise it.
func TestEpsilonLowerBoundMonotoneInRBetaDeltaM(t *testing.T) {
	for _, delta := range []float64{0, 1e-5} {
		prev := math.Inf(1)
		for r := 60; r <= 400; r++ {
			got := mustBound(t, 1000, r, 60, delta, 0.05)
			if got > prev {
				t.Errorf("δ=%v: bound %v at r=%d above %v at r=%d", delta, got, r, prev, r-1)
			}
			prev = got
		}
	}
	prev := 0.0
	for _, beta := range []float64{1e-12, 1e-6, 0.001, 0.01, 0.05, 0.1, 0.3, 0.5, 0.9, 0.999} {
		got := mustBound(t, 1000, 500, 400, 1e-5, beta)
		if got < prev {
			t.Errorf("bound %v at β=%v below %v at a smaller β", got, beta, prev)
		}
		prev = got
	}
	prev = math.Inf(1)
	for _, delta := range []float64{0, 1e-9, 1e-6, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 0.99} {
		got := mustBound(t, 1000, 500, 400, delta, 0.05)
		if got > prev {
			t.Errorf("bound %v at δ=%v above %v at a smaller δ", got, delta, prev)
		}
		prev = got
	}
	prev = math.Inf(1)
	for _, m := range []int{500, 1000, 10000, 100000, 1 << 40} {
		got := mustBound(t, m, 500, 400, 1e-5, 0.05)
		if got > prev {
			t.Errorf("bound %v at m=%d above %v at a smaller m", got, m, prev)
		}
		prev = got
	}
}

// The ceiling is the bound at v = r, above every other bound, and for
// δ = 0 the closed form ln(β^{1/r}/(1−β^{1/r})) to within Tolerance.
func TestCeiling(t *testing.T) {
	for _, r := range []int{1, 5, 100, 1000, 100000} {
		for _, delta := range []float64{0, 1e-5} {
			got, err := Ceiling(2*r, r, delta, 0.05)
			if err != nil || got != mustBound(t, 2*r, r, r, delta, 0.05) {
				t.Errorf("Ceiling(%d, %d, %v, 0.05) = %v, %v; want the bound at v = r", 2*r, r, delta, got, err)
			}
			if below := mustBound(t, 2*r, r, r-1, delta, 0.05); below > got {
				t.Errorf("r=%d δ=%v: bound %v at v=r−1 above the ceiling %v", r, delta, below, got)
			}
			if delta == 0 {
				x := math.Pow(0.05, 1/float64(r))
				want := math.Log(x / (1 - x))
				if !(got <= want && want-got <= Tolerance*(1+1e-6)) && want > 0 {
					t.Errorf("Ceiling(%d, %d, 0, 0.05) = %v, closed form %v", 2*r, r, got, want)
				}
			}
		}
	}
}

func TestInvalidArguments(t *testing.T) {
	nan := math.NaN()
	for _, c := range []struct {
		name        string
		m, r, v     int
		delta, beta float64
	}{
		{"r = 0", 10, 0, 0, 0, 0.05},
		{"r < 0", 10, -1, 0, 0, 0.05},
		{"r > m", 10, 11, 5, 0, 0.05},
		{"r > MaxGuesses", MaxGuesses + 2, MaxGuesses + 1, 5, 0, 0.05},
		{"v > r", 10, 5, 6, 0, 0.05},
		{"v < 0", 10, 5, -1, 0, 0.05},
		{"δ = 1", 10, 5, 3, 1, 0.05},
		{"δ < 0", 10, 5, 3, -1e-9, 0.05},
		{"δ NaN", 10, 5, 3, nan, 0.05},
		{"δ +Inf", 10, 5, 3, math.Inf(1), 0.05},
		{"β = 0", 10, 5, 3, 0, 0},
		{"β = 1", 10, 5, 3, 0, 1},
		{"β NaN", 10, 5, 3, 0, nan},
		{"β > 1", 10, 5, 3, 0, 2},
	} {
		if got, err := EpsilonLowerBound(c.m, c.r, c.v, c.delta, c.beta); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: EpsilonLowerBound = %v, %v; want ErrInvalid", c.name, got, err)
		}
		if c.v == c.r || c.v == 0 {
			if got, err := Ceiling(c.m, c.r, c.delta, c.beta); !errors.Is(err, ErrInvalid) && c.r >= 1 && c.r <= c.m {
				t.Errorf("%s: Ceiling = %v, %v; want ErrInvalid", c.name, got, err)
			}
		}
	}
	for _, eps := range []float64{-1, nan} {
		if _, err := PValue(10, 5, 3, eps, 0); !errors.Is(err, ErrInvalid) {
			t.Errorf("PValue at ε = %v: %v, want ErrInvalid", eps, err)
		}
	}
}

// coverage returns the exact probability that the bound exceeds the true ε
// when the number of correct guesses is Binomial(r, e^ε/(1+e^ε)), the
// worst case of Theorem 3.1 (randomized response), and the bound for each
// v.
func coverage(t *testing.T, m, r int, eps, delta, beta float64) (float64, []float64) {
	t.Helper()
	q := 1 / (1 + math.Exp(-eps))
	bounds := make([]float64, r+1)
	p := 0.0
	for v := 0; v <= r; v++ {
		bounds[v] = mustBound(t, m, r, v, delta, beta)
		if bounds[v] > eps {
			p += BinomialTail(r, v, q) - BinomialTail(r, v+1, q)
		}
	}
	return p, bounds
}

// The bound's false-positive rate: for an ε-DP randomized response, the
// bound exceeds ε with probability at most β. Exactly (summed over all v)
// and by simulation with a seeded RNG: 4000 draws at β = 0.05 have a
// standard deviation of at most √(0.05·0.95/4000) = 0.0034, so the
// observed rate stays below β + 0.02 (over 5 standard deviations) unless
// the bound is wrong.
func TestEpsilonLowerBoundCoverage(t *testing.T) {
	const beta, trials = 0.05, 4000
	rng := rand.New(rand.NewPCG(31, 2305))
	for _, c := range []struct {
		m, r       int
		eps, delta float64
	}{
		{100, 100, 0.5, 0}, {1000, 1000, 2, 0}, {10000, 500, 1, 1e-5}, {300, 300, 4, 1e-4},
	} {
		exact, bounds := coverage(t, c.m, c.r, c.eps, c.delta, beta)
		if exact > beta {
			t.Errorf("m=%d r=%d ε=%v δ=%v: P[bound > ε] = %v, over β = %v", c.m, c.r, c.eps, c.delta, exact, beta)
		}
		q := 1 / (1 + math.Exp(-c.eps))
		over := 0
		for range trials {
			w := 0
			for range c.r {
				if rng.Float64() < q {
					w++
				}
			}
			if bounds[w] > c.eps {
				over++
			}
		}
		if rate := float64(over) / trials; rate > beta+0.02 {
			t.Errorf("m=%d r=%d ε=%v δ=%v: bound above ε in %.4f of %d draws, over β + 0.02", c.m, c.r, c.eps, c.delta, rate, trials)
		}
	}
}

// End to end through Guess: m canaries, each included with probability ½,
// scored by ε-randomized response of their inclusion (an ε-DP release),
// k₊ = k₋ = 100 guesses. The bound exceeds ε in at most β + 0.03 of 1000
// seeded runs (the standard deviation is at most 0.007; the margin is over
// 4 of them), and it is nonzero in most runs (the audit has power).
func TestAuditOfRandomizedResponse(t *testing.T) {
	const m, eps, beta, runs = 1000, 2.0, 0.05, 1000
	rng := rand.New(rand.NewPCG(2023, 8846))
	q := 1 / (1 + math.Exp(-eps))
	cache := map[int]float64{}
	over, positive := 0, 0
	scores, included := make([]float64, m), make([]bool, m)
	for range runs {
		for i := range m {
			included[i] = rng.IntN(2) == 1
			truthful := rng.Float64() < q
			if included[i] == truthful {
				scores[i] = 1 + rng.Float64() // the bit says "in"
			} else {
				scores[i] = rng.Float64()
			}
		}
		r, v, err := Guess(scores, included, 100, 100)
		if err != nil {
			t.Fatal(err)
		}
		b, ok := cache[v]
		if !ok {
			b = mustBound(t, m, r, v, 1e-5, beta)
			cache[v] = b
		}
		if b > eps {
			over++
		}
		if b > 0 {
			positive++
		}
	}
	if rate := float64(over) / runs; rate > beta+0.03 {
		t.Errorf("bound above ε = %v in %.3f of runs, over β + 0.03", eps, rate)
	}
	if positive < runs/2 {
		t.Errorf("bound positive in only %d of %d runs", positive, runs)
	}
}
