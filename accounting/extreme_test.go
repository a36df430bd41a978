package accounting

import (
	"math"
	"testing"
)

// TestFractionalRDPNeverBelowItsIntegerNeighbour: the Rényi divergence is
// non-decreasing in the order, so one run's RDP at a fractional order lies
// between its values at the integers around it. The fractional series of
// Mironov, Talwar and Zhang (2019, Sec. 3.3) alternates in sign past α and,
// at large orders with large q, cancels below float64's resolution: before
// the fix it returned −0.50 at q = ½, σ = 16, α = 100.5 (the integers
// around it give 0.050 and 0.051), a bound that would understate ε for
// any accountant given such an order, and made the PLD accountant's window
// (which reads the RDP at continuous orders) inverted, a panic.
func TestFractionalRDPNeverBelowItsIntegerNeighbour(t *testing.T) {
	for _, q := range []float64{1e-3, 0.01, 0.1, 0.5, 0.9} {
		for _, sigma := range []float64{0.5, 1, 4, 16, 64} {
			for _, alpha := range []float64{1.5, 10.9, 33.3, 100.5, 250.25, 999.5, 2000.7} {
				got := SubsampledGaussianRDP(q, sigma, alpha)
				lo := 0.0 // RDP is ≥ 0; at order 1 it is the KL divergence, not computed here
				if alpha >= 2 {
					lo = SubsampledGaussianRDP(q, sigma, math.Floor(alpha))
				}
				hi := SubsampledGaussianRDP(q, sigma, math.Ceil(alpha))
				if math.IsNaN(got) || got < lo*(1-1e-9)-1e-12 || got > hi*(1+1e-9)+1e-12 {
					t.Errorf("q=%v σ=%v: RDP(%v) = %v, outside [RDP(%v), RDP(%v)] = [%v, %v]",
						q, sigma, alpha, got, math.Floor(alpha), math.Ceil(alpha), lo, hi)
				}
			}
		}
	}
}

// TestPLDLargeNoiseLargeRate: the PLD accountant answers, without
// panicking, for much noise at a large sampling rate (q = ½, σ from 16 to
// 47, T = 10), with an ε at most the RDP accountant's and not growing with
// σ. Before, its composition window came out inverted (a negative grid
// spacing, from the negative RDP above) and buildStep panicked
// ("makeslice: len out of range").
func TestPLDLargeNoiseLargeRate(t *testing.T) {
	for _, delta := range []float64{0.1, 1e-5} {
		prev := math.Inf(1)
		for _, sigma := range []float64{16, 20, 47} {
			e := SubsampledGaussian(0.5, sigma)
			eps, err := PLD{}.Epsilon(e, 10, delta)
			if err != nil {
				t.Fatalf("σ=%v δ=%v: %v", sigma, delta, err)
			}
			rdp, err := RDP{}.Epsilon(e, 10, delta)
			if err != nil {
				t.Fatal(err)
			}
			if !(eps >= 0) || eps > rdp*(1+1e-6) || eps > prev*(1+1e-6)+1e-9 {
				t.Errorf("σ=%v δ=%v: PLD ε = %v (RDP's %v, at the smaller σ %v)", sigma, delta, eps, rdp, prev)
			}
			prev = eps
		}
	}
}
