//go:build cuda

package model

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"gorgonia.org/cu"
)

// Page-locked staging of the engine's two big transfers, θ up and the
// d-vector sum down. A copy from pageable memory goes through the
// driver's own bounce buffer, one piece at a time; from page-locked memory
// the GPU reads and writes the host's memory directly at the link's rate.
// The engine therefore keeps one page-locked buffer per direction (4·d
// bytes each) and moves a vector in pieces of stagePiece values: θ is
// copied into the buffer piece by piece (on several cores) while the
// previous piece is already on its way to the device; the sum comes back
// piece by piece, each copied out of the buffer as soon as its event says
// it has landed. Transfers and kernels share the default stream, so the
// kernels see θ only once it is whole and the sum is read only once the
// kernels that write it are done.
//
// A caller can skip the staging altogether: AllocHost (model.HostAllocator)
// hands out page-locked memory of the engine's own, and a θ or a sum in it
// crosses the link in one direct copy. The node keeps its θ versions and
// its sum there, so its steps make no host copy at all (at 20M parameters
// on an H200 the link alone took 2.9 ms of the staged path's 6.3 ms), and
// the staging buffers are never made.

// cudaStaging turns page-locked staging on for new engines; the benchmarks
// turn it off to measure the pageable path beside it.
var cudaStaging = true

const (
	// stagePiece is the number of float32 values per staged piece (16 MiB).
	stagePiece = 1 << 22
	// stageMin is the smallest vector that is staged; smaller ones are
	// copied directly: on an H200 the staging cost the mlp preset (269k
	// values) 0.03 ms per step and the textbag preset (644k) 0.1 ms, and
	// halved the transfers of a 20M-parameter model (BenchmarkCUDA*).
	stageMin = 1 << 20
)

// pinned is a page-locked host buffer of float32 values.
type pinned struct{ v []float32 }

// allocPinned allocates n float32 values of page-locked host memory in the
// current context.
func allocPinned(n int) (pinned, error) {
	var p unsafe.Pointer
	if r := C.cuMemAllocHost(&p, C.size_t(4*n)); r != C.CUDA_SUCCESS {
		return pinned{}, fmt.Errorf("model: cuda: allocating %d bytes of page-locked memory: CUresult %d", 4*n, int(r))
	}
	return pinned{v: unsafe.Slice((*float32)(p), n)}, nil
}

func (p pinned) free() error {
	if p.v == nil {
		return nil
	}
	return cu.MemFreeHost(unsafe.Pointer(&p.v[0]))
}

// stager holds an engine's staging buffers and one event per piece.
type stager struct {
	up, down pinned
	ev       []cu.Event
}

// newStager allocates staging for vectors of n values, or returns nil when
// staging is off, n is small, or the memory cannot be had (the engine then
// copies directly: slower, not wrong).
func newStager(n int) *stager {
	if !cudaStaging || n < stageMin {
		return nil
	}
	s := &stager{}
	var err error
	if s.up, err = allocPinned(n); err != nil {
		return nil
	}
	if s.down, err = allocPinned(n); err != nil {
		s.close()
		return nil
	}
	for range (n + stagePiece - 1) / stagePiece {
		ev, err := cu.MakeEvent(cu.DisableTiming)
		if err != nil {
			s.close()
			return nil
		}
		s.ev = append(s.ev, ev)
	}
	return s
}

// stager returns the staging through which v crosses the link, or nil
// for a direct copy: v is in the engine's own page-locked memory
// (AllocHost), which the GPU reads and writes at the link's rate, or v is
// small, or staging is off or could not be had. The staging buffers are
// made on first need, so an engine whose caller always passes its own
// page-locked memory holds none (2 × 4·d bytes saved). Called with the
// engine's context current.
func (e *cudaEngine) stager(v []float32) *stager {
	if e.ownsHost(v) {
		return nil
	}
	if !e.staged {
		e.staged = true
		e.stage = newStager(e.m.numParams)
	}
	return e.stage
}

// AllocHost implements HostAllocator: n zeroed values of page-locked
// memory, held until Close. The engine moves θ from such a buffer, and the
// sum into one, with no copy through its staging buffers.
func (e *cudaEngine) AllocHost(n int) ([]float32, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: %d host values", ErrShape, n)
	}
	if e.closed {
		return nil, fmt.Errorf("%w: engine closed", ErrNoDevice)
	}
	var p pinned
	err := e.d.do(func() error {
		var err error
		p, err = allocPinned(n)
		return err
	})
	if err != nil {
		return nil, err
	}
	clear(p.v)
	e.host = append(e.host, p)
	return p.v, nil
}

// ownsHost reports whether v lies wholly inside one of the buffers
// AllocHost handed out.
func (e *cudaEngine) ownsHost(v []float32) bool {
	if len(v) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(&v[0]))
	hi := lo + 4*uintptr(len(v))
	for _, p := range e.host {
		plo := uintptr(unsafe.Pointer(&p.v[0]))
		if lo >= plo && hi <= plo+4*uintptr(len(p.v)) {
			return true
		}
	}
	return false
}

func (s *stager) close() error {
	errs := []error{s.up.free(), s.down.free()}
	for i := range s.ev {
		errs = append(errs, cu.DestroyEvent(&s.ev[i]))
	}
	return errors.Join(errs...)
}

// upload copies src into the device buffer dst: each piece into the
// page-locked buffer, then queued for the device, so that the next piece's
// copy overlaps the previous piece's transfer.
func (s *stager) upload(dst cu.DevicePtr, src []float32) error {
	for lo := 0; lo < len(src); lo += stagePiece {
		hi := min(lo+stagePiece, len(src))
		parallelCopy(s.up.v[lo:hi], src[lo:hi])
		if err := cu.MemcpyHtoDAsync(off4(dst, lo), unsafe.Pointer(&s.up.v[lo]), int64(4*(hi-lo)), cu.Stream{}); err != nil {
			return err
		}
	}
	return nil
}

// download copies the device buffer src into dst: every piece is queued
// with an event behind it, and copied out of the page-locked buffer once
// its event has completed, while the later pieces are still in flight.
func (s *stager) download(dst []float32, src cu.DevicePtr) error {
	for j, lo := 0, 0; lo < len(dst); j, lo = j+1, lo+stagePiece {
		hi := min(lo+stagePiece, len(dst))
		if err := cu.MemcpyDtoHAsync(unsafe.Pointer(&s.down.v[lo]), off4(src, lo), int64(4*(hi-lo)), cu.Stream{}); err != nil {
			return err
		}
		if err := s.ev[j].Record(cu.Stream{}); err != nil {
			return err
		}
	}
	for j, lo := 0, 0; lo < len(dst); j, lo = j+1, lo+stagePiece {
		hi := min(lo+stagePiece, len(dst))
		if err := s.ev[j].Synchronize(); err != nil {
			return err
		}
		parallelCopy(dst[lo:hi], s.down.v[lo:hi])
	}
	return nil
}

// parallelCopy copies src into dst (the same length) on up to 8
// goroutines: one core copies at well under the link's rate.
func parallelCopy(dst, src []float32) {
	const minPart = 1 << 18
	parts := min(8, (len(src)+minPart-1)/minPart)
	if parts <= 1 {
		copy(dst, src)
		return
	}
	var wg sync.WaitGroup
	for p := range parts {
		lo, hi := p*len(src)/parts, (p+1)*len(src)/parts
		wg.Add(1)
		go func() {
			defer wg.Done()
			copy(dst[lo:hi], src[lo:hi])
		}()
	}
	wg.Wait()
}
