package model

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/dpcluster/dpcluster/dataset"
)

// ErrNoDevice is returned (wrapped) by OpenDevice for a device this binary
// cannot use: an unknown name, a CUDA device in a binary built without the
// "cuda" build tag, or a GPU that is absent or failed to initialize.
var ErrNoDevice = errors.New("model: device not available")

// ErrUnsupportedLayer is returned (wrapped) by Device.NewEngine when a
// device has no kernels for one of the model's layers; the message names
// the layer.
var ErrUnsupportedLayer = errors.New("model: layer not supported on this device")

// Engine computes a node's clipped gradient sums for one model. The CPU
// engine is a *Workspace; a GPU engine (build tag "cuda") keeps θ, the batch
// and every activation in device memory. Every engine gives the privacy
// guarantee of Workspace.ClippedSum (the clip rule, its error bound and
// zero for non-finite examples) and deterministic results; the bits of the
// sum may differ between engines by rounding.
type Engine interface {
	// ClippedSumIndexed is Workspace.ClippedSumIndexed.
	ClippedSumIndexed(dst, theta []float32, d *dataset.Dataset, idx []int, clip float64) (int, error)
	// MaxBatch is the number of examples one pass computes; longer index
	// lists are computed in chunks, summed in float64.
	MaxBatch() int
	// Close releases the engine's buffers. The engine is unusable after.
	Close() error
}

// HostAllocator is implemented by an Engine whose transfers are fastest
// from and into host memory it allocates itself: the CUDA engine's
// page-locked memory, which the GPU reads and writes directly. A θ or a
// sum buffer taken from AllocHost and passed to ClippedSumIndexed crosses
// the link with no copy through a staging buffer (at 20M parameters on an
// H200, two 80 MB host copies of the 6.3 ms the transfers took:
// docs/BENCHMARKS.md, "Where the transfers go"). Any slice works, so a
// caller that cannot get such memory passes its own and loses only speed.
//
// The memory is the engine's: Close releases it, and a buffer must not be
// touched after its engine is closed (an access then faults).
type HostAllocator interface {
	// AllocHost returns n ≥ 1 zeroed float32 values of the engine's host
	// memory, or an error (page-locked memory is a limited resource).
	AllocHost(n int) ([]float32, error)
}

// DeviceInfo describes a device for logs and metrics.
type DeviceInfo struct {
	// ID is the name OpenDevice accepted: "cpu" or "cuda:N".
	ID string
	// Name is the hardware's own name ("NVIDIA H100 80GB HBM3"), or the
	// CPU back end's name.
	Name string
	// MemoryBytes is the device's total memory (0 for the CPU).
	MemoryBytes int64
	// ComputeCapability is "major.minor" for a CUDA device, "" otherwise.
	ComputeCapability string
}

// Device is where engines compute: the CPU (always available) or a CUDA
// GPU (binaries built with -tags cuda). A Device is safe for concurrent
// use; each engine it makes is used by one goroutine at a time.
type Device interface {
	Info() DeviceInfo
	// NewEngine allocates an engine for batches of up to maxBatch examples.
	// Errors: ErrShape (maxBatch < 1), ErrUnsupportedLayer, and device
	// errors (out of memory, say).
	NewEngine(m *Model, maxBatch int) (Engine, error)
	// Close releases the device; engines made by it must be closed first.
	Close() error
}

// cudaOpen opens CUDA device ordinal; nil unless built with -tags cuda.
var cudaOpen func(ordinal int) (Device, error)

// CUDAAvailable reports whether this binary was built with CUDA support
// (the "cuda" build tag). It says nothing about whether a GPU is present.
func CUDAAvailable() bool { return cudaOpen != nil }

// OpenDevice opens a device by name: "" or "cpu" for the CPU (the model's
// own back end), "cuda:N" (or "cuda", meaning cuda:0) for CUDA device N.
// Errors wrap ErrNoDevice.
func OpenDevice(name string) (Device, error) {
	switch {
	case name == "" || name == "cpu":
		return cpuDevice{}, nil
	case name == "cuda" || strings.HasPrefix(name, "cuda:"):
		ord := 0
		if s, ok := strings.CutPrefix(name, "cuda:"); ok {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 || n > 1024 {
				return nil, fmt.Errorf("%w: %q: want cuda:N with N a device number ≥ 0", ErrNoDevice, name)
			}
			ord = n
		}
		if cudaOpen == nil {
			return nil, fmt.Errorf("%w: %q: this binary was built without CUDA support (build it with -tags cuda; see docs/GPU.md)", ErrNoDevice, name)
		}
		return cudaOpen(ord)
	}
	return nil, fmt.Errorf("%w: unknown device %q (want cpu or cuda:N)", ErrNoDevice, name)
}

// cpuDevice computes with Workspaces on the model's own back end.
type cpuDevice struct{}

func (cpuDevice) Info() DeviceInfo {
	return DeviceInfo{ID: "cpu", Name: DefaultBackend().Name()}
}

func (cpuDevice) NewEngine(m *Model, maxBatch int) (Engine, error) { return m.NewWorkspace(maxBatch) }

func (cpuDevice) Close() error { return nil }

// Close implements Engine; a Workspace holds only Go memory.
func (w *Workspace) Close() error { return nil }
