package accounting

import (
	"errors"
	"fmt"
	"math"
	"testing"
)

// logSumExp returns log Σ exp(v).
func logSumExp(v []float64) float64 {
	m := math.Inf(-1)
	for _, x := range v {
		m = math.Max(m, x)
	}
	s := 0.0
	for _, x := range v {
		s += math.Exp(x - m)
	}
	return m + math.Log(s)
}

// exactSubsampledDiscreteRDP computes, by direct summation over the
// lattice, both Rényi divergences of order alpha between P0 = N_Z(0, s²I)
// and P = (1−q)P0 + qP1, P1 = N_Z(v, s²I), for an integer shift v in one
// or two dimensions: add = D_α(P‖P0), remove = D_α(P0‖P).
func exactSubsampledDiscreteRDP(q, s float64, v []int, alpha float64) (add, remove float64) {
	// The tilted measures P0^{1−i}P1^i peak at i·v, up to α·v.
	maxV := 0
	for _, x := range v {
		maxV = max(maxV, x, -x)
	}
	lim := int(math.Ceil(40*s+alpha)) * (maxV + 1)
	var lp0, lp1 []float64
	var walk func(x []int)
	walk = func(x []int) {
		if len(x) == len(v) {
			var a, b float64
			for i, xi := range x {
				a -= float64(xi*xi) / (2 * s * s)
				d := float64(xi - v[i])
				b -= d * d / (2 * s * s)
			}
			lp0, lp1 = append(lp0, a), append(lp1, b)
			return
		}
		for xi := -lim; xi <= lim; xi++ {
			walk(append(x, xi))
		}
	}
	walk(nil)
	// Same normalizer for P0 and P1 (an integer shift of the lattice).
	norm := logSumExp(lp0)
	var ta, tr []float64
	for i := range lp0 {
		p0 := lp0[i] - norm
		p := logAdd(math.Log1p(-q)+p0, math.Log(q)+lp1[i]-norm)
		ta = append(ta, alpha*p+(1-alpha)*p0)
		tr = append(tr, alpha*p0+(1-alpha)*p)
	}
	return logSumExp(ta) / (alpha - 1), logSumExp(tr) / (alpha - 1)
}

// TestSubsampledDiscreteGaussianRDPBoundsExact checks the accounting of
// the discrete mechanism against the exact divergences, in both adjacency
// directions, at integer and fractional orders, for small scales where the
// discrete Gaussian is far from the continuous one and for a
// two-dimensional shift: the bound holds everywhere, and at integer orders
// the "add" direction equals it (the closed form is exact there).
func TestSubsampledDiscreteGaussianRDPBoundsExact(t *testing.T) {
	orders := []float64{1.01, 1.5, 1.9, 2, 2.3, 3, 4.7, 5, 8, 10.5, 16, 32}
	for _, tc := range []struct {
		q, s float64
		v    []int
	}{
		{0.01, 0.6, []int{1}}, {0.1, 1, []int{1}}, {0.5, 0.8, []int{1}}, {0.05, 2.5, []int{2}},
		{0.2, 3, []int{1}}, {0.1, 1.2, []int{1, 1}}, {0.3, 1.5, []int{2, -1}},
	} {
		norm2 := 0.0
		for _, x := range tc.v {
			norm2 += float64(x * x)
		}
		sigma := tc.s / math.Sqrt(norm2)
		for _, a := range orders {
			t.Run(fmt.Sprintf("q=%v/s=%v/v=%v/α=%v", tc.q, tc.s, tc.v, a), func(t *testing.T) {
				bound := SubsampledDiscreteGaussianRDP(tc.q, sigma, a)
				add, remove := exactSubsampledDiscreteRDP(tc.q, tc.s, tc.v, a)
				const tol = 1e-9
				if add > bound*(1+tol)+1e-13 || remove > bound*(1+tol)+1e-13 {
					t.Errorf("exact add %v, remove %v above the bound %v", add, remove, bound)
				}
				if a == math.Trunc(a) && math.Abs(add-bound) > 1e-8*bound+1e-13 {
					t.Errorf("integer order: exact add %v, closed form %v", add, bound)
				}
				if cont := SubsampledGaussianRDP(tc.q, sigma, a); bound < cont*(1-1e-12) {
					t.Errorf("discrete bound %v below the continuous %v", bound, cont)
				}
			})
		}
	}
	if got, want := SubsampledDiscreteGaussianRDP(1, 2, 3.5), 3.5/8; got != want {
		t.Errorf("q = 1: %v, want %v", got, want)
	}
	if SubsampledDiscreteGaussianRDP(0, 1, 2) != 0 || !math.IsInf(SubsampledDiscreteGaussianRDP(0.1, 0, 2), 1) {
		t.Error("q = 0 or σ = 0")
	}
}

// TestDiscreteEventAccounting: the accountant charges the discrete event
// with SubsampledDiscreteGaussianRDP, its ε is within a hair of the
// continuous Gaussian's at the same σ (the fractional orders are
// interpolated), and the event round-trips.
func TestDiscreteEventAccounting(t *testing.T) {
	acc := RDP{}.NewComposition()
	e := SubsampledDiscreteGaussian(0.01, 1.1)
	if err := acc.Compose(e, 3); err != nil {
		t.Fatal(err)
	}
	for i, o := range acc.Orders() {
		if want := 3 * SubsampledDiscreteGaussianRDP(0.01, 1.1, o); acc.RDP()[i] != want {
			t.Fatalf("order %v: %v, want %v", o, acc.RDP()[i], want)
		}
	}
	if err := acc.Compose(DiscreteGaussian(2), 1); err != nil {
		t.Fatal(err)
	}
	disc, _, err := RDP{}.EpsilonOrder(SubsampledDiscreteGaussian(0.004266666666666667, 0.74), 2343, 1e-5)
	if err != nil {
		t.Fatal(err)
	}
	cont, _, _ := RDP{}.EpsilonOrder(SubsampledGaussian(0.004266666666666667, 0.74), 2343, 1e-5)
	if disc < cont || disc > cont*1.01 {
		t.Errorf("discrete ε %v, continuous %v", disc, cont)
	}
	b, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := UnmarshalEvent(b); err != nil || got.Event.Kind != KindDiscreteGaussian || got.Event.NoiseMultiplier != 1.1 {
		t.Errorf("round trip: %+v, %v", got, err)
	}
	if err := DiscreteGaussian(0).Validate(); !errors.Is(err, ErrInvalidEvent) {
		t.Errorf("σ = 0: %v", err)
	}
}

// TestCalibrateEvent: Calibrate through the event a run charges returns
// the smallest σ whose ε meets the target, and the accountant New returns
// by name calibrates the same σ.
func TestCalibrateEvent(t *testing.T) {
	const eps, q, delta, steps = 3, 0.004266666666666667, 1e-5, 2343
	want, err := RDP{}.Calibrate(eps, steps, delta, func(s float64) Event { return SubsampledGaussian(q, s) })
	if err != nil {
		t.Fatal(err)
	}
	byName, err := New(NameRDP)
	if err != nil {
		t.Fatal(err)
	}
	got, err := byName.Calibrate(eps, steps, delta, func(s float64) Event { return SubsampledGaussian(q, s) })
	if err != nil || got != want {
		t.Errorf("New(NameRDP).Calibrate = %v, %v; RDP{}.Calibrate = %v", got, err, want)
	}
	disc, err := RDP{}.Calibrate(eps, steps, delta, func(s float64) Event { return SubsampledDiscreteGaussian(q, s) })
	if err != nil {
		t.Fatal(err)
	}
	e, _, _ := RDP{}.EpsilonOrder(SubsampledDiscreteGaussian(q, disc), steps, delta)
	e2, _, _ := RDP{}.EpsilonOrder(SubsampledDiscreteGaussian(q, disc*(1-1e-6)), steps, delta)
	if e > eps || e2 <= eps || disc < want {
		t.Errorf("discrete σ %v (Gaussian %v): ε %v, at σ(1−1e-6) %v", disc, want, e, e2)
	}
	if _, err := (RDP{}).Calibrate(eps, 0, delta, func(s float64) Event { return Gaussian(s) }); !errors.Is(err, ErrInvalidParameter) {
		t.Errorf("zero steps: %v", err)
	}
}
