package accounting

import (
	"math"
	"testing"
)

// FuzzPLDEpsilon: for any valid subsampled Gaussian (q in (0, 1], σ in
// [0.3, 100], 1 to 1000 steps, δ in [10⁻¹², ½]) the PLD accountant
// answers without panicking, with a finite ε ≥ 0 at most the RDP
// accountant's (both are upper bounds on the same ε; PLD's is the tight
// one, up to its stated numeric error).
func FuzzPLDEpsilon(f *testing.F) {
	f.Add(0.01, 1.0, uint16(100), 1e-5)
	f.Add(0.5, 16.0, uint16(10), 1e-5) // an inverted window before (TestPLDLargeNoiseLargeRate)
	f.Add(1.0, 0.5, uint16(1), 0.5)
	f.Fuzz(func(t *testing.T, q, sigma float64, steps uint16, delta float64) {
		if !(q > 0 && q <= 1 && sigma >= 0.3 && sigma <= 100 && steps >= 1 && steps <= 1000 && delta >= 1e-12 && delta <= 0.5) {
			return
		}
		e := SubsampledGaussian(q, sigma)
		eps, err := PLD{}.Epsilon(e, int64(steps), delta)
		if err != nil {
			return // a refusal is an answer
		}
		rdp, rerr := RDP{}.Epsilon(e, int64(steps), delta)
		if math.IsNaN(eps) || math.IsInf(eps, 0) || eps < 0 || (rerr == nil && eps > rdp*(1+1e-3)+1e-6) {
			t.Errorf("q=%v σ=%v T=%d δ=%v: PLD ε = %v, RDP ε = %v (%v)", q, sigma, steps, delta, eps, rdp, rerr)
		}
	})
}
