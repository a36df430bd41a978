package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestBackendConformance checks every built back end's Sgemm against a
// float64 triple loop over all transpose combinations, padded leading
// dimensions, alpha/beta values and degenerate sizes. Guard values around
// C's rows must be left untouched.
func TestBackendConformance(t *testing.T) {
	backends := []Backend{Gonum{}}
	if d := DefaultBackend(); d.Name() != "gonum" {
		backends = append(backends, d)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	const guard = -12345
	for _, be := range backends {
		for _, dims := range [][3]int{{1, 1, 1}, {3, 5, 7}, {70, 65, 130}, {16, 196, 64}, {5, 3, 0}, {1, 9, 300}} {
			for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
				for _, ab := range [][2]float32{{1, 0}, {0.5, 2}} {
					m, n, k := dims[0], dims[1], dims[2]
					name := fmt.Sprintf("%s/%dx%dx%d/t%v/ab%v", be.Name(), m, n, k, tr, ab)
					ar, ac := m, k
					if tr[0] {
						ar, ac = k, m
					}
					br, bc := k, n
					if tr[1] {
						br, bc = n, k
					}
					lda, ldb, ldc := ac+2, bc+1, n+3
					a := make([]float32, max(ar*lda, 1))
					b := make([]float32, max(br*ldb, 1))
					c := make([]float32, m*ldc)
					for i := range a {
						a[i] = float32(rng.NormFloat64())
					}
					for i := range b {
						b[i] = float32(rng.NormFloat64())
					}
					for i := range c {
						c[i] = guard
						if i%ldc < n {
							c[i] = float32(rng.NormFloat64())
						}
					}
					want := make([]float64, m*n)
					for i := 0; i < m; i++ {
						for j := 0; j < n; j++ {
							var s float64
							for p := 0; p < k; p++ {
								ai, bi := i*lda+p, p*ldb+j
								if tr[0] {
									ai = p*lda + i
								}
								if tr[1] {
									bi = j*ldb + p
								}
								av, bv := a[ai], b[bi]
								s += float64(av) * float64(bv)
							}
							want[i*n+j] = float64(ab[0])*s + float64(ab[1])*float64(c[i*ldc+j])
						}
					}
					be.Sgemm(tr[0], tr[1], m, n, k, ab[0], a, lda, b, ldb, ab[1], c, ldc)
					for i := 0; i < m; i++ {
						for j := 0; j < ldc; j++ {
							got := float64(c[i*ldc+j])
							if j >= n {
								if got != guard {
									t.Fatalf("%s: wrote outside C at (%d,%d)", name, i, j)
								}
								continue
							}
							// float32 accumulation: error ≲ k·ε32·Σ|a||b|; allow 1e-5·(k+1)·scale.
							if d := math.Abs(got - want[i*n+j]); d > 1e-5*float64(k+1)*math.Max(1, math.Abs(want[i*n+j])) {
								t.Fatalf("%s: C[%d,%d] = %v, want %v", name, i, j, got, want[i*n+j])
							}
						}
					}
				}
			}
		}
	}
}
