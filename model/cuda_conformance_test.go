//go:build cuda

package model_test

import (
	"testing"

	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/model/backendtest"
)

// TestCUDABackendConformance runs the back-end conformance suite on the
// CUDA engine's GEMM kernel (all transpose combinations, padded leading
// dimensions, k = 0, and the error bound of the Backend contract).
func TestCUDABackendConformance(t *testing.T) {
	d, err := model.OpenDevice("cuda:0")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	be, err := model.CUDABackend(d)
	if err != nil {
		t.Fatal(err)
	}
	backendtest.Run(t, be)
}
