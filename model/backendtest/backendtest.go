// Package backendtest is the conformance suite every model.Backend
// implementation runs (the pure-Go Gonum back end, OpenBLAS under
// -tags openblas, and any future CUDA back end under -tags cuda).
package backendtest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/dpcluster/dpcluster/model"
)

// Run checks be.Sgemm against a float64 triple loop over all transpose
// combinations, padded leading dimensions, alpha/beta values and
// degenerate sizes (k = 0), checks that padding columns of C are left
// untouched, and checks the error bound of the Backend contract. The
// 300×80×100 case is large enough for back ends that split products over
// goroutines (OpenBLAS). Tolerance: float32 accumulation error
// ≲ k·2⁻²⁴·Σ|a||b|, so 1e-5·(k+1) relative to max(1, |want|).
func Run(t *testing.T, be model.Backend) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 1))
	const guard = -12345
	for _, dims := range [][3]int{{1, 1, 1}, {3, 5, 7}, {70, 65, 130}, {16, 196, 64}, {5, 3, 0}, {1, 9, 300}, {300, 80, 100}} {
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
				want, mag := reference(tr, ab, m, n, k, a, lda, b, ldb, c, ldc)
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
						d := math.Abs(got - want[i*n+j])
						if d > 1e-5*float64(k+1)*math.Max(1, math.Abs(want[i*n+j])) {
							t.Fatalf("%s: C[%d,%d] = %v, want %v", name, i, j, got, want[i*n+j])
						}
						// The contract (model.Backend): with alpha = 1 and
						// beta = 0 the error is at most γ_k·Σ|a·b|, with
						// γ_k = k·u/(1−k·u), u = 2⁻²⁴ (the float64 reference
						// is exact to 1e-12 relative here).
						if ab == [2]float32{1, 0} {
							ku := float64(k) * 0x1p-24
							if bound := ku/(1-ku)*mag[i*n+j] + 1e-12*mag[i*n+j]; d > bound {
								t.Fatalf("%s: C[%d,%d] = %v, want %v: error %.3g above the bound γ_k·Σ|a·b| = %.3g",
									name, i, j, got, want[i*n+j], d, bound)
							}
						}
					}
				}
			}
		}
	}
}

// reference returns want = alpha·op(A)·op(B) + beta·C (ab = alpha, beta),
// computed in float64 by a triple loop, and mag = Σ|a·b| per element of C,
// for the error bound.
func reference(tr [2]bool, ab [2]float32, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) (want, mag []float64) {
	want = make([]float64, m*n)
	mag = make([]float64, m*n) // Σ|a·b|, for the error bound
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s, sa float64
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
				sa += math.Abs(float64(av) * float64(bv))
			}
			want[i*n+j] = float64(ab[0])*s + float64(ab[1])*float64(c[i*ldc+j])
			mag[i*n+j] = sa
		}
	}
	return want, mag
}
