package accounting

import (
	"encoding/binary"
	"math"
	"sync"

	"gonum.org/v1/gonum/dsp/fourier"
)

// This file holds what the PLD accountant remembers between calls: its
// results, its prepared compositions and its FFT plans. None of it changes
// a result, only what it costs.

// pldMemo remembers EpsilonSteps's results, keyed by its exact
// inputs (the bits of δ and of every live event's fields, in order). The
// function is deterministic and costly (two FFT compositions: about 0.25 s
// for 10⁴ steps, tens of seconds under the race detector), and one process
// asks for the same values again and again: each bisection step of a σ
// calibration that the coordinator and every node of the same run repeat,
// and the state machine's budget checks. A hit returns the very value the
// computation returned. Bounded: cleared when it holds pldMemoMax results.
var pldMemo struct {
	sync.Mutex
	m map[string]float64
}

const pldMemoMax = 1024

// ResetCaches drops what the PLD accountant remembers: its results and its
// prepared compositions. Results do not change, only what the next ones
// cost; benchmarks and tests that time or compare cold computations call
// it first.
func ResetCaches() {
	pldMemo.Lock()
	pldMemo.m = nil
	pldMemo.Unlock()
	pldPrepCache.Lock()
	pldPrepCache.m, pldPrepCache.size = nil, 0
	pldPrepCache.Unlock()
}

func pldMemoKey(live []PLDEvent, delta float64) string {
	b := make([]byte, 0, 8+40*len(live))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(delta))
	for _, e := range live {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(e.SampleRate))
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(e.NoiseMultiplier))
		b = binary.LittleEndian.AppendUint64(b, uint64(e.Count))
		b = binary.LittleEndian.AppendUint64(b, uint64(e.Dimension))
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(e.LatticeScale))
	}
	return string(b)
}

func pldMemoGet(key string) (float64, bool) {
	pldMemo.Lock()
	defer pldMemo.Unlock()
	eps, ok := pldMemo.m[key]
	return eps, ok
}

func pldMemoPut(key string, eps float64) {
	pldMemo.Lock()
	defer pldMemo.Unlock()
	if pldMemo.m == nil || len(pldMemo.m) >= pldMemoMax {
		pldMemo.m = make(map[string]float64)
	}
	pldMemo.m[key] = eps
}

// fftPlans keeps FFT plans (their twiddle factors) by size: a plan is
// not safe for concurrent use, so each caller takes one and puts it back.
var fftPlans sync.Map // int → *sync.Pool of *fourier.FFT

func getFFT(n int) *fourier.FFT {
	p, _ := fftPlans.LoadOrStore(n, &sync.Pool{New: func() any { return fourier.NewFFT(n) }})
	return p.(*sync.Pool).Get().(*fourier.FFT)
}

func putFFT(f *fourier.FFT) {
	if p, ok := fftPlans.Load(f.Len()); ok {
		p.(*sync.Pool).Put(f)
	}
}

// pldPrepCache holds recently prepared compositions, up to
// pldPrepCacheBytes of Fourier coefficients (cleared when full).
var pldPrepCache prepCache

const pldPrepCacheBytes = 64 << 20

type prepCache struct {
	sync.Mutex
	m    map[string]*pldPrepared
	size int
}

func (c *prepCache) get(key string) *pldPrepared {
	c.Lock()
	defer c.Unlock()
	return c.m[key]
}

func (c *prepCache) put(key string, p *pldPrepared) {
	c.Lock()
	defer c.Unlock()
	if c.m == nil || c.size+p.size > pldPrepCacheBytes {
		c.m, c.size = map[string]*pldPrepared{}, 0
	}
	if p.size <= pldPrepCacheBytes {
		c.m[key] = p
		c.size += p.size
	}
}
