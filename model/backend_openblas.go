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
// library is set to one thread and large products are split here into row
// blocks of C, run over GOMAXPROCS goroutines. OpenBLAS's bits for a row
// do depend on the block it is computed in (its kernels treat edge rows
// differently), so the blocks are a function of the product's shape alone,
// never of GOMAXPROCS: the same product gives the same bits on any machine
// running the same OpenBLAS build.
type OpenBLAS struct{}

func init() { C.openblas_set_num_threads(1) }

// parallelFlops is the size (m·n·k) above which a product is split.
const parallelFlops = 1 << 21

// A split product has at most maxRowBlocks blocks of at least minRowBlock
// rows, each a multiple of 16 rows (the micro-kernels' heights), except the
// last. Every block call packs all of B again, so few large blocks beat many
// small ones (on 2 cores, 128/4 was at least as fast as the old
// GOMAXPROCS-way split and faster than 64/16 for the cnn preset); the cost
// is that one product uses at most 4 goroutines on bigger machines.
const (
	minRowBlock  = 128
	maxRowBlocks = 4
)

// rowBlock returns the block height for a product with m rows of C: a
// function of m only.
func rowBlock(m int) int {
	blocks := min((m+minRowBlock-1)/minRowBlock, maxRowBlocks)
	return ((m+blocks-1)/blocks + 15) &^ 15
}

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
	if m*n*k < parallelFlops || m <= minRowBlock {
		sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	blk := rowBlock(m)
	blocks := (m + blk - 1) / blk
	workers := min(runtime.GOMAXPROCS(0), blocks)
	if workers < 2 {
		for i := range blocks {
			sgemmBlock(i, blk, ta, tb, transA, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		}
		return
	}
	sgemmRows(workers, blocks, blk, ta, tb, transA, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// sgemmBlock computes rows [i·blk, min((i+1)·blk, m)) of C.
func sgemmBlock(i, blk int, ta, tb uint32, transA bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	r0 := i * blk
	aOff := r0 * lda // rows of A
	if transA {
		aOff = r0 // columns of Aᵀ's storage
	}
	sgemm(ta, tb, min(blk, m-r0), n, k, alpha, a[aOff:], lda, b, ldb, beta, c[r0*ldc:], ldc)
}

// sgemmRows runs the row blocks over workers goroutines (block i on worker
// i mod workers). It is a separate function so that the serial paths above
// allocate nothing.
func sgemmRows(workers, blocks, blk int, ta, tb uint32, transA bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < blocks; i += workers {
				sgemmBlock(i, blk, ta, tb, transA, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
			}
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
