package privacyaudit

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/dpcluster/dpcluster/accounting"
)

// With g = G_μ(1 − x), CurveRejects is GDPRejects (one recursion).
func TestCurveRejectsGDPInstance(t *testing.T) {
	for _, c := range []struct{ m, r, v int }{{1000, 100, 80}, {1000, 200, 150}, {10000, 100, 74}, {100, 100, 100}, {1000, 500, 260}} {
		for _, mu := range []float64{0, 0.1, 0.5, 1, 2, 4} {
			want, err := GDPRejects(c.m, c.r, c.v, mu, 0.05)
			if err != nil {
				t.Fatal(err)
			}
			got, err := CurveRejects(c.m, c.r, c.v, func(x float64) float64 { return gdpInverseTradeoff(x, mu) }, 0.05)
			if err != nil || got != want {
				t.Fatalf("%+v μ = %v: CurveRejects %v, %v; GDPRejects %v", c, mu, got, err, want)
			}
		}
	}
}

// gdpProfile is the μ-GDP curve's (ε, δ) points on an ε grid of the
// given step up to 12, δ raised by a relative 10⁻⁶ (above GDPDelta's
// error on this range).
func gdpProfile(mu, step float64) []EpsDelta {
	var pts []EpsDelta
	for e := 0.0; e <= 12; e += step {
		pts = append(pts, EpsDelta{Epsilon: e, Delta: min(1, GDPDelta(mu, e)*(1+1e-6))})
	}
	return pts
}

// A profile of G_μ lies below G_μ (numeric direction), close to it on a
// dense grid, and nondecreasing.
func TestProfileInverseTradeoffBelowCurve(t *testing.T) {
	for _, mu := range []float64{0.3, 1, 2.5} {
		g := ProfileInverseTradeoff(gdpProfile(mu, 0.01))
		prev := 0.0
		for x := 1e-6; x < 1; x *= 1.1 {
			exact := gdpInverseTradeoffNearest(x, mu)
			got := g(x)
			if got > exact*(1+1e-9) || got < prev {
				t.Fatalf("μ = %v x = %v: profile g %v, G_μ %v, previous %v", mu, x, got, exact, prev)
			}
			if x > 1e-3 && got < exact-0.01 {
				t.Fatalf("μ = %v x = %v: profile g %v far below G_μ %v", mu, x, got, exact)
			}
			prev = got
		}
	}
	if g := ProfileInverseTradeoff([]EpsDelta{{0, 0.1}, {math.NaN(), 0}, {1, -1}, {1e6, 0}}); g(1) != 0.9-profileSlack || g(0.5) != 0.4-profileSlack || g(0) != 0 {
		t.Fatalf("profile of (0, 0.1): g(1) = %v, g(0.5) = %v, g(0) = %v", g(1), g(0.5), g(0))
	}
}

// The μ bound through a dense profile of G_μ is at most GDPLowerBound's
// (the profile is below G_μ) and within 3% of it.
func TestCurveRejectsAgreesWithGDP(t *testing.T) {
	for _, c := range []struct{ m, r, v int }{{1000, 100, 80}, {10000, 500, 420}, {10000, 100, 93}} {
		want := mustGDP(t, c.m, c.r, c.v, 0.05)
		rejects := func(mu float64) bool {
			ok, err := CurveRejects(c.m, c.r, c.v, ProfileInverseTradeoff(gdpProfile(mu, 0.02)), 0.05)
			if err != nil {
				t.Fatal(err)
			}
			return ok
		}
		lo, hi := 0.0, 8.0
		for hi-lo > 1e-3 {
			if mid := (lo + hi) / 2; rejects(mid) {
				lo = mid
			} else {
				hi = mid
			}
		}
		if lo > want+1e-3 || lo < 0.97*want {
			t.Fatalf("%+v: μ through the profile %v, GDPLowerBound %v", c, lo, want)
		}
	}
}

// testProfile is a sparser profile than ProfileDeltas, for speed: the
// family's validity does not depend on it.
var testProfile = []float64{0.3, 0.1, 0.03, 0.01, 1e-3, 1e-5}

// simulateAudit draws one ideal audit (Ideal's model) whose observations
// have noise multiplier sigma, and returns its per-split results.
func simulateAudit(t *testing.T, p Ideal, rng *rand.Rand) []Result {
	t.Helper()
	scores := make([]float64, p.Canaries)
	included := make([]bool, p.Canaries)
	for i := range scores {
		included[i] = rng.IntN(2) == 1
		scores[i] = idealScore(rng, included[i], p)
	}
	_, all, err := Audit(scores, included, p.Splits, p.Delta, p.Beta)
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// A perfect mechanism's simulated guesses never reject its own curve, and
// the family bound stays below the accountant's ε at its σ; a mechanism
// with a quarter of the noise is rejected at the claimed σ.
func TestRunCurvePerfectAndBroken(t *testing.T) {
	const q, steps, sigma = 1.0, 4, 2.0
	p := Ideal{Canaries: 1000, SampleRate: q, Steps: steps, Sigma: sigma, Delta: 1e-5, Beta: 0.05, Splits: reachSplits}
	fam := SubsampledGaussianFamily(q, steps, sigma)
	fam.Deltas = testProfile
	ledger, err := fam.Epsilon(sigma, p.Delta)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 31))
	var maxEps float64
	for range 20 {
		rc, err := RunCurveBound(p.Canaries, simulateAudit(t, p, rng), fam, p.Delta, p.Beta)
		if err != nil {
			t.Fatal(err)
		}
		if rc.Rejected || rc.Epsilon >= ledger || rc.Sigma != 0 && rc.Sigma <= sigma {
			t.Fatalf("perfect mechanism: %+v, ledger ε %v", rc, ledger)
		}
		maxEps = max(maxEps, rc.Epsilon)
	}
	if maxEps == 0 {
		t.Fatalf("perfect mechanism: the family bound was 0 in every repetition; want it to show something at σ = %v", sigma)
	}
	broken := p
	broken.Sigma = sigma / 4
	rc, err := RunCurveBound(p.Canaries, simulateAudit(t, broken, rng), fam, p.Delta, p.Beta)
	if err != nil {
		t.Fatal(err)
	}
	if !rc.Rejected || !(rc.Epsilon > ledger) || !(rc.Sigma < sigma) {
		t.Fatalf("σ/4 mechanism: %+v, want its own curve rejected, ε above the ledger's %v", rc, ledger)
	}
	t.Logf("perfect: largest family bound %.3f (ledger %.3f); σ/4: %+v", maxEps, ledger, rc)
}

// The test is monotone in σ' on the grid: rejected exactly from some σ'
// up (for several counts), and the family bound is nondecreasing in v.
func TestRunCurveMonotoneInSigma(t *testing.T) {
	fam := SubsampledGaussianFamily(1, 4, 2)
	fam.Deltas = testProfile
	prevEps := 0.0
	for _, v := range []int{60, 75, 90, 100} {
		res := []Result{{R: 100, V: v}}
		switched := false
		for k := -2 * RunCurveGridSteps; k <= 2*RunCurveGridSteps; k += 8 {
			g, err := fam.curve(k)
			if err != nil {
				t.Fatal(err)
			}
			rej := curveRejects(1000, 100, v, g, 0.05)
			if switched && !rej {
				t.Fatalf("v = %d: rejected below σ' = %v but not at it", v, fam.sigmaAt(k))
			}
			switched = switched || rej
		}
		rc, err := RunCurveBound(1000, res, fam, 1e-5, 0.05)
		if err != nil {
			t.Fatal(err)
		}
		if rc.Epsilon < prevEps {
			t.Fatalf("v = %d: family bound %v below the one at fewer right guesses, %v", v, rc.Epsilon, prevEps)
		}
		prevEps = rc.Epsilon
	}
	if prevEps == 0 {
		t.Fatal("100 of 100 right guesses gave no family bound")
	}
}

func TestRunCurveInvalid(t *testing.T) {
	fam := SubsampledGaussianFamily(0.5, 10, 2)
	good := []Result{{R: 10, V: 5}}
	for _, c := range []struct {
		res         []Result
		fam         *RunFamily
		delta, beta float64
	}{
		{nil, fam, 1e-5, 0.05},
		{good, nil, 1e-5, 0.05},
		{good, fam, 0, 0.05},
		{good, fam, 1e-5, 1},
		{[]Result{{R: 10, V: 11}}, fam, 1e-5, 0.05},
		{good, SubsampledGaussianFamily(0.5, 10, math.NaN()), 1e-5, 0.05},
	} {
		if _, err := RunCurveBound(100, c.res, c.fam, c.delta, c.beta); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%+v: error %v, want ErrInvalid", c, err)
		}
	}
	if _, err := CurveRejects(10, 5, 3, nil, 0.05); !errors.Is(err, ErrInvalid) {
		t.Fatalf("nil g: %v", err)
	}
	// An event the accountant cannot charge is its error, not a panic.
	bad := &RunFamily{Steps: 10, Sigma: 1, Event: func(float64) accounting.Event { return accounting.Event{} }}
	if _, err := RunCurveBound(100, good, bad, 1e-5, 0.05); err == nil {
		t.Fatal("an invalid event gave no error")
	}
}
