package model

import (
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// Backend is the compute back end the layers run their matrix products on.
// Matrices are row-major; Sgemm computes
//
//	C = alpha·op(A)·op(B) + beta·C,  op(X) = Xᵀ if trans, else X,
//
// with op(A) m×k, op(B) k×n and C m×n, exactly as BLAS sgemm (row-major, as
// gonum's blas32 and CBLAS with CblasRowMajor). Implementations must be safe
// for concurrent use (layers issue independent per-example products from
// several goroutines) and deterministic: the same inputs give the same bits.
// ClippedSum's privacy guarantee relies on their accuracy: with alpha = 1
// and beta = 0, every element of C must be within γ_k·Σₚ|a_ip·b_pj| (plus
// k·2⁻¹⁵⁰ for products that underflow) of the exact product, with
// γ_k = k·u/(1−k·u) and u = 2⁻²⁴: the standard bound for float32 inner
// products in any summation order, with or without fused multiply-adds
// (Higham 2002, §3.1 and §3.5). Any IEEE float32 kernel that does not flush
// subnormals to zero meets it; backendtest checks it.
// Elementwise kernels stay in Go for now; a CUDA back end (behind a "cuda"
// build tag) would extend this interface with device buffers.
type Backend interface {
	// Name identifies the back end in logs and benchmark output.
	Name() string
	Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)
}

// Gonum is the pure-Go back end: gonum's BLAS implementation
// (gonum.org/v1/gonum/blas/gonum), which splits large products over
// GOMAXPROCS goroutines, each C block summed sequentially along k, so its
// results are deterministic. It is always built.
type Gonum struct{}

// Name returns "gonum".
func (Gonum) Name() string { return "gonum" }

// Sgemm implements Backend.
func (Gonum) Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	ta, tb := blas.NoTrans, blas.NoTrans
	if transA {
		ta = blas.Trans
	}
	if transB {
		tb = blas.Trans
	}
	if k == 0 {
		// gonum requires k ≥ 1 for valid leading dimensions; C = beta·C.
		for i := 0; i < m; i++ {
			row := c[i*ldc : i*ldc+n]
			for j := range row {
				if beta == 0 {
					row[j] = 0
				} else {
					row[j] *= beta
				}
			}
		}
		return
	}
	gonum.Implementation{}.Sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// DefaultBackend returns the back end New uses: Gonum in the default build,
// OpenBLAS when built with -tags openblas.
func DefaultBackend() Backend { return defaultBackend() }
