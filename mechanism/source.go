package mechanism

import (
	"crypto/rand"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"sync"
)

// NoiseSource draws the Gaussian noise of the Gaussian  In
// production it is a ChaCha8 stream (math/rand/v2) keyed with 32 bytes from
// crypto/rand, a cryptographically secure generator, as differential
// privacy requires (cf. google/differential-privacy go/rand, which reads
// crypto/rand).
//
// It offers two mechanisms:
//
//   - DiscreteNoisyGradient64, the secure one the coordinator's leader uses
//     by default: the sum snapped to a grid plus exactly sampled discrete
//     Gaussian noise (DiscreteGaussian). Its output is a function of
//     integers only, so it carries no floating-point artifacts.
//   - NoisyGradient and NoisyGradient64, the legacy floating-point
//     sampler: normal deviates from rand.NormFloat64 (the ziggurat method of
//     Marsaglia and Tsang 2000), added in float64. It is NOT protected
//     against floating-point attacks: the ziggurat returns an int32 times one
//     of 128 float32 constants, so the noise lies on a coarse lattice, and
//     near zero the release reveals the sum's low-order bits (Mironov 2012;
//     Jin et al. 2022, "Are We There Yet? Timing and Floating-Point Attacks
//     on Differential Privacy Systems"). The coordinator uses it only for
//     runs configured with noise mode "float" (or before noise modes
//     existed); train.Run still uses it.
//
// A NoiseSource is safe for concurrent use; calls are serialized.
type NoiseSource struct {
	mu     sync.Mutex
	rng    *mrand.Rand
	seeded bool
	// scratch is DiscreteNoisyGradient64's noise buffer and sampler table,
	// kept between calls.
	scratch Noise
}

// NewNoiseSource returns a NoiseSource keyed from crypto/rand.
func NewNoiseSource() (*NoiseSource, error) {
	var key [32]byte
	if _, err := rand.Read(key[:]); err != nil {
		return nil, fmt.Errorf("mechanism: reading crypto/rand: %w", err)
	}
	return &NoiseSource{rng: mrand.New(mrand.NewChaCha8(key))}, nil
}

// NewSeededNoiseSource returns a deterministic NoiseSource for tests and
// reproducible experiments. Its output is predictable, so it provides no
// privacy: binaries must select it only through an explicit flag and log
// that they did.
func NewSeededNoiseSource(seed uint64) *NoiseSource {
	var key [32]byte
	for i := range 8 {
		key[i] = byte(seed >> (8 * i))
	}
	return &NoiseSource{rng: mrand.New(mrand.NewChaCha8(key)), seeded: true}
}

// Seeded reports whether the source is a deterministic test source.
func (n *NoiseSource) Seeded() bool { return n.seeded }

// Normal returns one N(0, 1) deviate.
func (n *NoiseSource) Normal() float64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.rng.NormFloat64()
}

// DiscreteNoisyGradient64 forms the privatized gradient with the secure
// discrete Gaussian mechanism m (DiscreteGaussian.Release):
//
//	dst = Λ(round(sum/Λ) + z)/expectedBatch,  z_j ~ N_Z(0, m.Scale²) i.i.d.,
//
// keying m's per-chunk streams from this source. Errors wrap
// ErrInvalid or ErrSumRange; nothing is drawn then.
func (n *NoiseSource) DiscreteNoisyGradient64(dst []float32, sum []float64, m DiscreteGaussian, expectedBatch float64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return m.Release(dst, sum, expectedBatch, n.rng, &n.scratch)
}

// StartDrawDiscrete starts drawing the noise of m's next release into dst,
// keyed from this source, on workers goroutines
// (DiscreteGaussian.StartDraw), for a later m.Apply once the Drawing's
// Wait has returned. The source is held only while the keys are read. The
// noise does not depend on the data, so the leader draws it while the
// nodes compute.
func (n *NoiseSource) StartDrawDiscrete(dst *Noise, m DiscreteGaussian, workers int) (*Drawing, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return m.StartDraw(dst, n.rng, workers)
}

// NoisyGradient forms the privatized gradient of the Gaussian mechanism
// (Abadi et al. 2016, Algorithm 1; docs/ARCHITECTURE.md, step 4):
//
//	dst[j] = (sum[j] + z_j) / expectedBatch,  z_j ~ N(0, (sigma·clip)²) i.i.d.,
//
// computed in float64 and rounded once. sum is the total of clipped
// per-example gradients and expectedBatch the public expected batch size B
// (not the realized count, which is private). dst and sum may be the same
// slice. sigma = 0 adds no noise (non-private runs only).
func (n *NoiseSource) NoisyGradient(dst, sum []float32, sigma, clip, expectedBatch float64) error {
	return noisyGradient(n, dst, sum, sigma, clip, expectedBatch)
}

// NoisyGradient64 is NoisyGradient for a sum accumulated in float64 (the
// coordinator's aggregate, package aggregation). The noise is added in
// float64 before the single rounding to float32. Like NoisyGradient it is
// the legacy floating-point sampler; the leader's default is
// DiscreteNoisyGradient64.
func (n *NoiseSource) NoisyGradient64(dst []float32, sum []float64, sigma, clip, expectedBatch float64) error {
	return noisyGradient(n, dst, sum, sigma, clip, expectedBatch)
}

func noisyGradient[F float32 | float64](n *NoiseSource, dst []float32, sum []F, sigma, clip, expectedBatch float64) error {
	if len(dst) != len(sum) {
		return fmt.Errorf("%w: dst has %d values, sum %d", ErrInvalid, len(dst), len(sum))
	}
	std := sigma * clip
	if !(sigma >= 0) || !(clip > 0) || math.IsInf(std, 0) {
		return fmt.Errorf("%w: sigma %v, clip %v", ErrInvalid, sigma, clip)
	}
	if !(expectedBatch > 0) || math.IsInf(expectedBatch, 0) {
		return fmt.Errorf("%w: expected batch size %v", ErrInvalid, expectedBatch)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for j, s := range sum {
		z := 0.0
		if std > 0 {
			z = std * n.rng.NormFloat64()
		}
		dst[j] = float32((float64(s) + z) / expectedBatch)
	}
	return nil
}
