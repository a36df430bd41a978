package mechanism

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/internal/parallel"
)

// ErrInvalid is returned (wrapped) for mechanism parameters out of range: a
// noise multiplier, clip norm or batch size that is not positive and
// finite, a dimension below 1, a noise scale too large for the sampler, or
// vectors whose length is not the mechanism's dimension; also by
// NoiseSource.NoisyGradient and NoisyGradient64 for a negative or non-finite
// noise multiplier, a non-positive clip norm or batch size, or mismatched
// lengths.
var ErrInvalid = errors.New("mechanism: invalid parameters")

// ErrSumRange is returned by Apply and Release, before anything is
// released (by Release before any noise is drawn), when a
// coordinate of the sum is not finite or is 2⁶² grid steps or more from 0.
// Sums validated by package aggregation (‖S‖ ≤ count·C(1+1e-6)) stay below
// it whenever N·√d < 2⁴⁴ (Λ > C/(2¹⁷√d)), i.e. for every realistic run.
var ErrSumRange = errors.New("mechanism: sum out of the grid's range")

// GridFraction bounds the grid's share of the sensitivity: the grid step Λ
// is the largest power of two with √d·Λ ≤ GridFraction·C.
const GridFraction = 1.0 / (1 << 16)

// chunkSize is how many coordinates one CSPRNG stream covers. The
// coordinates are split into fixed chunks, each with its own ChaCha8 stream
// keyed from the caller's source in chunk order, so the output is the same
// whatever the number of workers.
const chunkSize = 1 << 14

// DiscreteGaussian is the secure Gaussian mechanism for a sum S ∈ ℝ^d of
// per-example vectors clipped to L2 norm C, released as
//
//	k = round(S/Λ)              per coordinate, ties to even; Λ = 2^GridExp
//	z_j ~ N_Z(0, Scale²)        i.i.d., sampled exactly (Draw; package doc)
//	g̃ = Λ(k + z)/B             rounded once to float32
//
// (Canonne, Kamath and Steinke 2020, "The Discrete Gaussian for Differential
// Privacy", with the sum snapped to a grid). g̃ is a function of the integer
// vector k + z and public constants only, so it carries no information
// about S beyond the discrete Gaussian mechanism's output: no low-order
// bits, no floating-point lattice (Mironov 2012).
//
// Sensitivity. Adding one record moves S by at most C in L2; rounding moves
// each coordinate by at most Λ/2, so ‖k − k′‖₂ ≤ C/Λ + √d = Sensitivity
// (grid steps). The release is the discrete Gaussian mechanism with noise
// multiplier Sigma = Scale/Sensitivity ≥ σ/(1 + GridFraction) (less the
// 2⁻⁴⁹ of conservative rounding), the value the
// ledger charges (Event). Because k − k′ is an integer vector, the
// discrete Gaussian's Rényi divergence is at most the continuous
// Gaussian's at every order and equal to it at integer orders, coordinate
// by coordinate, and divergences of independent coordinates add: the
// multivariate bound needs no τ·d correction in Rényi DP (CKS's τ term
// belongs to their direct (ε, δ) analysis, which the ledger does not use).
// accounting.SubsampledDiscreteGaussianRDP writes out the argument, including
// Poisson subsampling.
//
// Noise variance. Var N_Z(0, s²) ≤ s² (CKS 2020), and by Poisson summation
// the gap is a relative 8π²s²e^(−2π²s²) to first order, which underflows
// float64 for the scales used here (s ≥ 2¹⁶σ√d, above 10⁶ in practice); ScaleΛ
// exceeds σC by less than Λ, a relative 2⁻¹⁶/(σ√d) at most. DP-AdamBC's
// Φ = (σC/B)² is therefore the noise variance of g̃ to far better than
// float32 precision, and dpadam keeps using σ.
type DiscreteGaussian struct {
	// Dim is d, the length of the sums the mechanism releases.
	Dim int
	// GridExp is the grid step's exponent: Λ = 2^GridExp.
	GridExp int
	// Scale is the noise standard deviation in grid steps,
	// ⌈σC/Λ⌉ ≥ σC/Λ.
	Scale uint64
	// Sensitivity is C/Λ + √d, the L2 sensitivity of the snapped sum in
	// grid steps.
	Sensitivity float64
	// Sigma is the effective noise multiplier Scale/Sensitivity, rounded
	// down (a relative 2⁻⁴⁹, more than the float64 error of its three
	// operations, < 4·2⁻⁵³).
	Sigma float64
}

// NewDiscreteGaussian returns the mechanism for noise multiplier sigma,
// clip norm clip and dimension dim. It returns an error wrapping ErrInvalid
// for parameters that are not positive and finite, and for a noise scale
// σC/Λ above 2⁴⁸ (σ·√d above about 2³¹).
func NewDiscreteGaussian(sigma, clip float64, dim int) (DiscreteGaussian, error) {
	if !(sigma > 0) || math.IsInf(sigma, 0) || !(clip > 0) || math.IsInf(clip, 0) || dim < 1 {
		return DiscreteGaussian{}, fmt.Errorf("%w: sigma %v, clip %v, dim %d", ErrInvalid, sigma, clip, dim)
	}
	rootD := math.Sqrt(float64(dim))
	frac, exp := math.Frexp(GridFraction * clip / rootD)
	if frac == 0 || exp-1 < -1000 || exp-1 > 1000 {
		return DiscreteGaussian{}, fmt.Errorf("%w: clip %v gives no usable grid for dim %d", ErrInvalid, clip, dim)
	}
	m := DiscreteGaussian{Dim: dim, GridExp: exp - 1} // Λ = 2^(exp−1) ≤ frac·2^exp
	scale := math.Ceil(math.Ldexp(sigma*clip, -m.GridExp))
	if !(scale >= 1 && scale <= maxScale) {
		return DiscreteGaussian{}, fmt.Errorf("%w: noise scale σC/Λ = %v grid steps is above 2^48 (σ %v, dim %d)", ErrInvalid, scale, sigma, dim)
	}
	m.Scale = uint64(scale)
	m.Sensitivity = math.Ldexp(clip, -m.GridExp) + rootD
	m.Sigma = scale / m.Sensitivity * (1 - 0x1p-49)
	return m, nil
}

// Grid returns the grid step Λ.
func (m DiscreteGaussian) Grid() float64 { return math.Ldexp(1, m.GridExp) }

// Event returns the ledger event of one release on a Poisson sample with
// rate q: the subsampled discrete Gaussian at the effective noise
// multiplier.
func (m DiscreteGaussian) Event(q float64) accounting.Event {
	return accounting.SubsampledDiscreteGaussian(q, m.Sigma)
}

// LatticeEvent is Event naming the lattice as well (d coordinates, noise
// scale s = Scale in grid steps), which the PLD accountant needs to charge
// the discrete Gaussian (accounting/pld_discrete.go).
func (m DiscreteGaussian) LatticeEvent(q float64) accounting.Event {
	return accounting.PoissonSampled(q, accounting.DiscreteGaussianLattice(m.Sigma, float64(m.Scale), int64(m.Dim)))
}

// Source is the uniform randomness a release is keyed from: 64 uniform bits
// per call, from a cryptographically secure generator in production.
type Source interface {
	Uint64() uint64
}

// Noise is the noise of one release, z ~ N_Z(0, Scale²)^d, drawn before
// the sum it will privatize is known: it does not depend on the data, so
// the leader draws it while the nodes compute. It is as secret as the sum
// (the release, less the noise, is the snapped sum): Apply zeroes it after
// use, so it is never used twice. Its buffer (8 bytes per coordinate) is
// reused from draw to draw. The zero Noise is empty.
type Noise struct {
	mech DiscreteGaussian
	z    []int64
	// tail holds the values beyond int64's fast range, by coordinate (in
	// practice never: probability below e^(−2¹⁴) per coordinate).
	tailMu sync.Mutex
	tail   map[int]*big.Int
	ready  bool
	// table is the sampler table for mech.Scale, kept from draw to draw.
	table *gaussTable
}

// Ready reports whether n holds drawn, unused noise.
func (n *Noise) Ready() bool { return n.ready }

// Clear zeroes the noise.
func (n *Noise) Clear() {
	clear(n.z)
	n.tail, n.ready = nil, false
}

func (m DiscreteGaussian) valid() error {
	if m.Dim < 1 || m.Scale < 1 || m.Scale > maxScale {
		return fmt.Errorf("%w: mechanism of dimension %d, scale %d", ErrInvalid, m.Dim, m.Scale)
	}
	return nil
}

// Draw fills n with fresh noise for m. Randomness: one 32-byte ChaCha8 key
// per chunk of 16384 coordinates is read from src, in chunk order; chunks
// are then sampled in parallel on up to GOMAXPROCS goroutines, which have
// all exited when Draw returns. With a seeded src the noise is therefore
// the same bit for bit whatever GOMAXPROCS is. src is used only by the
// calling goroutine. It returns ErrInvalid, drawing nothing, for a
// mechanism not made by NewDiscreteGaussian.
func (m DiscreteGaussian) Draw(n *Noise, src Source) error {
	d, err := m.StartDraw(n, src, runtime.GOMAXPROCS(0))
	if err != nil {
		return err
	}
	d.Wait(0)
	return nil
}

// A Drawing is a draw under way (StartDraw). Its goroutines each take the
// next undrawn chunk until none is left; Wait adds more and returns once
// all have exited.
type Drawing struct {
	chunks int
	next   atomic.Int64
	wg     sync.WaitGroup
	fn     func(c, lo, hi int, rng *rand.ChaCha8)
	dim    int
	keys   [][32]byte
}

// StartDraw starts drawing fresh noise for m into n, as Draw does, on
// workers goroutines (at least one), and returns at once. Randomness is
// read from src before it returns (one key per chunk), so src is free
// again then; n must not be touched until Wait returns. A caller that
// draws ahead, beside other work, leaves that work cores this way, and
// lends the draw its own when it needs the noise (Wait). It returns
// ErrInvalid, starting nothing, for a mechanism not made by
// NewDiscreteGaussian.
func (m DiscreteGaussian) StartDraw(n *Noise, src Source, workers int) (*Drawing, error) {
	if err := m.valid(); err != nil {
		return nil, err
	}
	chunks := (m.Dim + chunkSize - 1) / chunkSize
	keys := make([][32]byte, chunks)
	for c := range keys {
		for w := 0; w < 32; w += 8 {
			binary.LittleEndian.PutUint64(keys[c][w:], src.Uint64())
		}
	}
	if cap(n.z) < m.Dim {
		n.z = make([]int64, m.Dim)
	}
	if m.Scale >= minTableScale && (n.table == nil || n.table.t != m.Scale) {
		n.table = newGaussTable(m.Scale, tailFactor)
	}
	table := n.table
	if m.Scale < minTableScale {
		table = nil
	}
	n.mech, n.z, n.tail, n.ready = m, n.z[:m.Dim], nil, true
	d := &Drawing{chunks: chunks, dim: m.Dim, keys: keys}
	d.fn = func(c, lo, hi int, rng *rand.ChaCha8) {
		rng.Seed(keys[c])
		s := newSampler(rng)
		for j := lo; j < hi; j++ {
			var z int64
			var bigZ *big.Int
			if table != nil {
				z, bigZ = s.tableGaussian(table)
			} else {
				z, bigZ = s.discreteGaussian(m.Scale)
			}
			n.z[j] = z
			if bigZ != nil {
				n.tailMu.Lock()
				if n.tail == nil {
					n.tail = make(map[int]*big.Int)
				}
				n.tail[j] = bigZ
				n.tailMu.Unlock()
			}
		}
	}
	d.add(max(1, workers))
	return d, nil
}

// Wait lends the draw up to help more goroutines (none once every chunk
// has been taken), waits for all of its goroutines to exit, and clears
// the chunk keys. The noise is then in the Noise given to StartDraw.
func (d *Drawing) Wait(help int) {
	if left := d.chunks - int(d.next.Load()); left > 0 {
		d.add(min(help, left))
	}
	d.wg.Wait()
	clear(d.keys)
}

// add starts k goroutines that draw chunks until none is left.
func (d *Drawing) add(k int) {
	for range k {
		d.wg.Go(func() {
			rng := rand.NewChaCha8([32]byte{})
			for {
				c := int(d.next.Add(1) - 1)
				if c >= d.chunks {
					return
				}
				lo := c * chunkSize
				d.fn(c, lo, min(lo+chunkSize, d.dim), rng)
			}
		})
	}
}

// Apply writes g̃ = Λ(round(S/Λ) + z)/B into dst, rounded once to float32,
// for the sum S in sum, the noise z in n and the public expected batch size
// B, and then zeroes n. dst and sum must both have Dim values, B must be
// positive and finite, and n must hold noise drawn for m (else ErrInvalid);
// every sum coordinate must be finite and within 2⁶² grid steps of 0 (else
// ErrSumRange). On error dst and n are unchanged.
func (m DiscreteGaussian) Apply(dst []float32, sum []float64, expectedBatch float64, n *Noise) error {
	if err := m.check(dst, sum, expectedBatch); err != nil {
		return err
	}
	if !n.ready || n.mech != m {
		return fmt.Errorf("%w: no noise drawn for this mechanism", ErrInvalid)
	}
	inv, grid := math.Ldexp(1, -m.GridExp), m.Grid() // exact powers of two
	parallel.Chunks(m.Dim, chunkSize, func(_, lo, hi int) {
		for j := lo; j < hi; j++ {
			// S/Λ is exact (a power-of-two scaling; a subnormal result
			// rounds, but then |S/Λ| ≪ 1/2 and k = 0 either way), and so
			// is k: |k| < 2⁶² (check).
			k := int64(math.RoundToEven(sum[j] * inv))
			if n.tail != nil {
				if z, ok := n.tail[j]; ok {
					dst[j] = m.output(new(big.Int).Add(z, big.NewInt(k)), grid, expectedBatch)
					continue
				}
			}
			// |k|, |z| < 2⁶²: no overflow. float64(k+z) rounds only
			// beyond 2⁵³, deterministically: g̃ stays a function of k + z.
			dst[j] = float32(float64(k+n.z[j]) * grid / expectedBatch)
		}
	})
	n.Clear()
	return nil
}

// Release is Draw followed by Apply: it writes g̃ = Λ(round(S/Λ) + z)/B
// into dst with fresh noise keyed from src, drawn into scratch (which may
// be nil; reusing one keeps its buffer and its sampler table, built once
// per scale in about 25 ms). It checks its arguments first (the errors of
// Apply), so on error nothing is drawn and dst is unchanged.
func (m DiscreteGaussian) Release(dst []float32, sum []float64, expectedBatch float64, src Source, scratch *Noise) error {
	if err := m.check(dst, sum, expectedBatch); err != nil {
		return err
	}
	if scratch == nil {
		scratch = new(Noise)
	}
	if err := m.Draw(scratch, src); err != nil {
		return err
	}
	return m.Apply(dst, sum, expectedBatch, scratch)
}

// check validates Apply's arguments other than the noise.
func (m DiscreteGaussian) check(dst []float32, sum []float64, expectedBatch float64) error {
	if err := m.valid(); err != nil {
		return err
	}
	if len(dst) != m.Dim || len(sum) != m.Dim {
		return fmt.Errorf("%w: dst has %d values, sum %d, the mechanism %d", ErrInvalid, len(dst), len(sum), m.Dim)
	}
	if !(expectedBatch > 0) || math.IsInf(expectedBatch, 0) {
		return fmt.Errorf("%w: expected batch size %v", ErrInvalid, expectedBatch)
	}
	inv := math.Ldexp(1, -m.GridExp)
	for j, v := range sum {
		if !(math.Abs(v*inv) < fastLimit) { // NaN, ±Inf, overflow, or beyond 2⁶²
			return fmt.Errorf("%w: coordinate %d", ErrSumRange, j)
		}
	}
	return nil
}

// output is g̃ for an integer k + z beyond int64's fast range: the same
// function of k + z as the fast path, float64(k+z)·Λ/B rounded to float32.
func (m DiscreteGaussian) output(kz *big.Int, grid, expectedBatch float64) float32 {
	f, _ := new(big.Float).SetInt(kz).Float64()
	return float32(f * grid / expectedBatch)
}
