//go:build openblas

package model

/*
#cgo LDFLAGS: -lopenblas
#include <cblas-openblas.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// OpenBLAS is the back end built with -tags openblas: a thin cgo wrapper
// around cblas_sgemm (Debian package libopenblas-dev).
//
// OpenBLAS's own threads busy-wait between calls and fight the Go scheduler
// (and the goroutines that issue per-example products concurrently), so the
// library is set to one thread and large products are split here by rows of
// C over GOMAXPROCS goroutines. Each row block is an independent product
// with the same k order, so results do not depend on the split.
type OpenBLAS struct{}

func init() { C.openblas_set_num_threads(1) }

// parallelFlops is the size (m·n·k) above which a product is split.
const parallelFlops = 1 << 21

// Name returns "openblas".
func (OpenBLAS) Name() string { return "openblas" }

// Sgemm implements Backend. It panics if a slice is too short for the
// given dimensions (programmer error: C code must never read past a slice).
func (OpenBLAS) Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		Gonum{}.Sgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	ar, ac := m, k
	ta := uint32(C.CblasNoTrans)
	if transA {
		ar, ac = k, m
		ta = C.CblasTrans
	}
	br, bc := k, n
	tb := uint32(C.CblasNoTrans)
	if transB {
		br, bc = n, k
		tb = C.CblasTrans
	}
	if lda < max(1, ac) || ldb < max(1, bc) || ldc < max(1, n) ||
		len(a) < (ar-1)*lda+ac || len(b) < (br-1)*ldb+bc || len(c) < (m-1)*ldc+n {
		panic(fmt.Sprintf("model: OpenBLAS Sgemm: bad dimensions m=%d n=%d k=%d lda=%d ldb=%d ldc=%d len=%d,%d,%d",
			m, n, k, lda, ldb, ldc, len(a), len(b), len(c)))
	}
	workers := min(runtime.GOMAXPROCS(0), m/16)
	if workers < 2 || m*n*k < parallelFlops {
		sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	sgemmRows(workers, ta, tb, transA, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// sgemmRows splits C's rows over workers goroutines. It is a separate
// function so that the serial path above allocates nothing.
func sgemmRows(workers int, ta, tb uint32, transA bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	var wg sync.WaitGroup
	chunk := (m + workers - 1) / workers
	for r0 := 0; r0 < m; r0 += chunk {
		rows := min(chunk, m-r0)
		aOff := r0 * lda // rows of A
		if transA {
			aOff = r0 // columns of Aᵀ's storage
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sgemm(ta, tb, rows, n, k, alpha, a[aOff:], lda, b, ldb, beta, c[r0*ldc:], ldc)
		}()
	}
	wg.Wait()
}

func sgemm(ta, tb uint32, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	C.cblas_sgemm(C.CblasRowMajor, ta, tb, C.blasint(m), C.blasint(n), C.blasint(k),
		C.float(alpha), (*C.float)(unsafe.Pointer(&a[0])), C.blasint(lda),
		(*C.float)(unsafe.Pointer(&b[0])), C.blasint(ldb),
		C.float(beta), (*C.float)(unsafe.Pointer(&c[0])), C.blasint(ldc))
}

func defaultBackend() Backend { return OpenBLAS{} }
