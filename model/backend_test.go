package model_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/model/backendtest"
)

// backends returns the pure-Go back end and, if different, the default one
// (OpenBLAS under -tags openblas).
func backends() []model.Backend {
	bes := []model.Backend{model.Gonum{}}
	if be := model.DefaultBackend(); be.Name() != "gonum" {
		bes = append(bes, be)
	}
	return bes
}

// TestBackendConformance runs the conformance suite on every back end.
func TestBackendConformance(t *testing.T) {
	for _, be := range backends() {
		t.Run(be.Name(), func(t *testing.T) { backendtest.Run(t, be) })
	}
}

// TestBackendDeterministicAcrossGOMAXPROCS: a back end that splits large
// products over goroutines must split them the same way whatever
// GOMAXPROCS is, so the same product gives the same bits on every machine.
// The shapes are the mlp preset's at B = 256 (forward and weight gradient)
// and odd row counts, all above the OpenBLAS split threshold (m·n·k ≥ 2²¹).
func TestBackendDeterministicAcrossGOMAXPROCS(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for _, be := range backends() {
		for _, dims := range [][3]int{{256, 256, 784}, {256, 784, 256}, {300, 80, 100}, {1000, 32, 144}, {4100, 16, 36}} {
			for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
				m, n, k := dims[0], dims[1], dims[2]
				a, b := make([]float32, m*k), make([]float32, k*n)
				for i := range a {
					a[i] = float32(rng.NormFloat64())
				}
				for i := range b {
					b[i] = float32(rng.NormFloat64())
				}
				lda, ldb := k, n
				if tr[0] {
					lda = m
				}
				if tr[1] {
					ldb = k
				}
				run := func(procs int) []float32 {
					defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
					c := make([]float32, m*n)
					be.Sgemm(tr[0], tr[1], m, n, k, 1, a, lda, b, ldb, 0, c, n)
					return c
				}
				want := run(1)
				for _, procs := range []int{2, 3, 8} {
					if got := run(procs); !slices.Equal(got, want) {
						t.Errorf("%s: %s: GOMAXPROCS=%d gives other bits than GOMAXPROCS=1", be.Name(), fmt.Sprintf("%dx%dx%d/t%v", m, n, k, tr), procs)
					}
				}
			}
		}
	}
}
