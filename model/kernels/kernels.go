// Package kernels holds the CUDA kernels of the model package's GPU engine:
// their source (cuda_kernels.cu), the PTX generated from it
// (cuda_kernels.ptx, by gen_ptx.sh through go generate), and that PTX
// embedded for the engine to load. It has no cgo and no build tag: the
// engine (model/cuda_*.go, build tag cuda) is what links the driver.
//
// The PTX targets compute_80; the driver compiles it for the device when
// the engine opens it, so a binary needs no CUDA toolkit at run time. Its
// first line records the SHA-256 of the source it was generated from,
// which model's TestCUDAPTXMatchesSource checks.
package kernels

import _ "embed"

//go:generate bash gen_ptx.sh

//go:embed cuda_kernels.ptx
var ptx string

// PTX returns the kernels' PTX text, as the CUDA driver's module loader
// (cuModuleLoadData) takes it.
func PTX() string { return ptx }
