package aggregation

import (
	"math"
	"testing"
)

// binomialUpperTail returns P(X > k) for X ~ Binomial(n, q), summed in
// log space from the far end (exact to float64 rounding for the n here).
func binomialUpperTail(n, k int64, q float64) float64 {
	lq, l1q := math.Log(q), math.Log1p(-q)
	lgn, _ := math.Lgamma(float64(n + 1))
	var sum float64
	for i := n; i > k; i-- {
		lgi, _ := math.Lgamma(float64(i + 1))
		lgni, _ := math.Lgamma(float64(n - i + 1))
		sum += math.Exp(lgn - lgi - lgni + float64(i)*lq + float64(n-i)*l1q)
	}
	return sum
}

// TestCountBound: the bound is exceeded with probability at most
// CountTail (checked against the exact binomial tail), never exceeds n,
// grows with n and q, and is far below n for the shards nodes hold.
func TestCountBound(t *testing.T) {
	for _, tc := range []struct {
		n int64
		q float64
	}{
		{10, 0.5}, {100, 0.01}, {1000, 0.01}, {5000, 0.0256}, {20000, 0.01}, {60000, 256.0 / 60000}, {3000, 0.3},
	} {
		k := CountBound(tc.n, tc.q)
		if k > tc.n || float64(k) < float64(tc.n)*tc.q {
			t.Errorf("CountBound(%d, %v) = %d: outside [n·q, n]", tc.n, tc.q, k)
		}
		if k < tc.n {
			if p := binomialUpperTail(tc.n, k, tc.q); p > CountTail {
				t.Errorf("CountBound(%d, %v) = %d: P(X > k) = %g > 2^-64", tc.n, tc.q, k, p)
			}
		}
		if k2 := CountBound(2*tc.n, tc.q); k2 < k {
			t.Errorf("CountBound(%d, %v) = %d < CountBound(%d) = %d", 2*tc.n, tc.q, k2, tc.n, k)
		}
	}
	// The case: a node's whole shard was its bound; now about
	// μ + √(2μL) + L.
	if k := CountBound(20000, 0.01); k > 400 {
		t.Errorf("CountBound(20000, 0.01) = %d, want ≤ 400 (μ = 200)", k)
	}
	for _, tc := range []struct {
		n    int64
		q    float64
		want int64
	}{{0, 0.5, 0}, {-3, 0.5, 0}, {100, 0, 0}, {100, math.NaN(), 0}, {100, 1, 100}, {100, 2, 100}} {
		if got := CountBound(tc.n, tc.q); got != tc.want {
			t.Errorf("CountBound(%d, %v) = %d, want %d", tc.n, tc.q, got, tc.want)
		}
	}
}
