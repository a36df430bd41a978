//go:build cuda

package model

import (
	"fmt"

	"gorgonia.org/cu"
)

// cudaBackend is the Backend whose Sgemm runs the engine's GEMM kernel on
// host slices (copying them to the device and back each call): the
// conformance suite (backendtest) checks the kernel's accuracy contract
// through it. It panics on a device error (Sgemm has no error result).
type cudaBackend struct{ d *cudaDevice }

func (b cudaBackend) Name() string { return "cuda" }

func (b cudaBackend) Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, bb []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	err := b.d.do(func() error {
		var bufs []cu.DevicePtr
		defer func() {
			for _, p := range bufs {
				cu.MemFree(p)
			}
		}()
		up := func(s []float32) (cu.DevicePtr, error) {
			p, err := alloc(4 * len(s))
			if err != nil {
				return 0, err
			}
			bufs = append(bufs, p)
			return p, htod(p, s)
		}
		pa, err := up(a)
		if err != nil {
			return err
		}
		pb, err := up(bb)
		if err != nil {
			return err
		}
		pc, err := up(c)
		if err != nil {
			return err
		}
		if err := b.d.sgemm(transA, transB, m, n, k, alpha, pa, lda, pb, ldb, beta, pc, ldc); err != nil {
			return err
		}
		return dtoh(c, pc)
	})
	if err != nil {
		panic(fmt.Sprintf("model: cuda Sgemm: %v", err))
	}
}

// CUDABackend returns the Backend whose Sgemm runs the CUDA engine's GEMM
// kernel on host slices, for a device from OpenDevice("cuda:N"): what the
// conformance suite (model/backendtest) checks the kernel through. It
// copies its operands to the device and back on every call, so it is not a
// fast back end for the CPU engine.
func CUDABackend(d Device) (Backend, error) {
	cd, ok := d.(*cudaDevice)
	if !ok {
		return nil, fmt.Errorf("%w: %s is not a CUDA device", ErrNoDevice, d.Info().ID)
	}
	return cudaBackend{cd}, nil
}
