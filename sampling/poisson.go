// Package sampling draws the Poisson-subsampled batches DP-SGD and
// DP-AdamBC assume: every example of a shard joins the batch independently
// with the same probability q, so the batch size is Binomial(n, q) and the
// privacy accountant's "Poisson subsampled Gaussian" analysis applies
// (Abadi et al. 2016; Mironov, Talwar, Zhang 2019, "Rényi Differential
// Privacy of the Sampled Gaussian Mechanism").
//
// The sampler sees only the shard size n, never the data, so inclusion
// cannot depend on an example's content. Production samplers draw from a
// cryptographically strong generator seeded from crypto/rand (see
// NewPoisson): the privacy analysis assumes the adversary cannot predict
// which examples were sampled.
//
//	p, err := sampling.NewPoisson(256.0 / 60000)
//	if err != nil { ... }
//	batch := make([]int, 0, 1024)
//	for step := range steps {
//		batch = p.Sample(batch[:0], shard.Len())
//		shard.Gather(x, y, batch)
//		...
//	}
package sampling

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
)

// Source is the stream of uniformly random 64-bit words a Poisson sampler
// consumes. *rand.ChaCha8 and *rand.PCG from math/rand/v2 implement it.
type Source interface {
	Uint64() uint64
}

// ErrInvalidQ is returned by the constructors when q is not in (0, 1].
var ErrInvalidQ = errors.New("sampling: sampling rate q must be in (0, 1]")

// shade is the relative amount by which the sampler lowers q before use, so
// that floating-point error cannot push an inclusion probability above q
// (see Poisson). 2⁻²⁴ ≈ 6e-8: it changes ε by a comparable negligible
// relative amount, yet exceeds the rounding effects by orders of magnitude.
const shade = 1.0 / (1 << 24)

// Poisson draws Poisson-subsampled batches: each index of [0, n) is included
// independently with probability q.
//
// Algorithm: geometric skipping. Instead of one Bernoulli(q) trial per
// index, it draws the gap to the next included index, G ~ Geometric(q) on
// {0, 1, ...} (the number of excluded indices before the next included one),
// by inversion: G = ⌊ln(1−W) / ln(1−q)⌋ with W uniform on [0, 1), since
// P(G ≥ g) = P(1−W ≤ (1−q)^g) = (1−q)^g. By memorylessness the included
// positions are exactly those of independent Bernoulli(q) trials (Devroye
// 1986, "Non-Uniform Random Variate Generation", §X.2, inversion for the
// geometric law; the skipping is the device of Vitter 1984, "Faster methods
// for random sampling", and Ahrens & Dieter). Cost: O(1 + qn) draws and
// logarithms per batch instead of n draws.
//
// Floating point, and why the rate is q·(1−2⁻²⁴) rather than exactly q:
// the inversion is exact in real arithmetic. In float64 the pitfall is the
// resolution of the uniform: small gaps, which decide inclusion of the next
// few indices, come from 1−W in a window of width ≈ q below 1, and a
// uniform on a 2⁻⁵³ grid has only q·2⁵³ points there (9000 for q = 1e-12),
// so P(G = 0) could be off by 1e-4 relative. Here W is drawn with full
// float64 resolution near 0 (exponent from leading zero bits, 52 fresh
// mantissa bits: every float in [2⁻ᵏ⁻¹, 2⁻ᵏ) equally likely, binade k with
// probability 2⁻ᵏ⁻¹), and ln(1−W), ln(1−q) are computed with log1p, accurate
// to about an ulp, so each P(G ≥ g) is off by at most a few 1e-16 relative
// to its size for small g, and a few 1e-16 absolute in the far tail. To make
// the residual error one-sided, gaps are drawn for q·(1−2⁻²⁴), which keeps
// every index's inclusion probability at or below q (the subsampled-
// Gaussian privacy bound grows with q, so accounting with q stays valid)
// and within 1e-7 relative of it (for normal q ≥ 2⁻¹⁰⁰⁰; in the
// subnormal range the product q·(1−2⁻²⁴) rounds back to q, and rates that
// small never arise in practice). q = 1 is handled exactly (every index).
// Gaps are compared with the remaining length in float64 before conversion,
// so a huge gap (tiny q) cannot overflow an int.
//
// A Poisson is not safe for concurrent use; give each goroutine its own.
type Poisson struct {
	q      float64
	invLog float64 // 1 / log1p(-q·(1-shade)); unused when q == 1
	all    bool
	src    Source
}

// NewPoisson returns a production sampler with rate q: its randomness is a
// ChaCha8 stream (math/rand/v2) keyed with 32 bytes from crypto/rand.
//
// Why not crypto/rand per draw: ChaCha8 is itself a cryptographically
// strong generator (math/rand/v2 documents it as such; it is the Go
// runtime's chacha8rand), so with a 256-bit secret key its output is
// computationally unpredictable to an adversary, which is what the privacy
// guarantee needs; drawing from it costs a few nanoseconds instead of a
// crypto/rand call per word. The key never leaves the sampler.
func NewPoisson(q float64) (*Poisson, error) {
	var seed [32]byte
	if _, err := crand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("sampling: seeding from crypto/rand: %w", err)
	}
	return NewPoissonFromSource(q, rand.NewChaCha8(seed))
}

// NewSeededPoisson returns a deterministic sampler (ChaCha8 keyed with seed)
// for tests and reproducible experiments. Its samples are predictable by
// anyone who knows the seed: never use it where privacy matters.
func NewSeededPoisson(q float64, seed uint64) (*Poisson, error) {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	return NewPoissonFromSource(q, rand.NewChaCha8(key))
}

// NewPoissonFromSource returns a sampler with rate q drawing from src. The
// privacy guarantee holds only if src is unpredictable to the adversary;
// production code uses NewPoisson.
func NewPoissonFromSource(q float64, src Source) (*Poisson, error) {
	if !(q > 0 && q <= 1) { // also rejects NaN
		return nil, fmt.Errorf("%w: got %v", ErrInvalidQ, q)
	}
	if src == nil {
		return nil, errors.New("sampling: nil Source")
	}
	p := &Poisson{q: q, src: src, all: q == 1}
	if !p.all {
		p.invLog = 1 / math.Log1p(-q*(1-shade))
	}
	return p, nil
}

// Q returns the sampling rate.
func (p *Poisson) Q() float64 { return p.q }

// Sample appends to dst the indices in [0, n) included in one Poisson
// batch, in increasing order, and returns the extended slice. It allocates
// only if dst lacks capacity (the batch size is Binomial(n, q); capacity
// of a few standard deviations above qn avoids growth). An empty batch is a
// legal outcome. n ≤ 0 appends nothing.
func (p *Poisson) Sample(dst []int, n int) []int {
	if p.all {
		for i := range max(n, 0) {
			dst = append(dst, i)
		}
		return dst
	}
	i := -1 // last included index
	for {
		gap := math.Floor(math.Log1p(-p.uniform()) * p.invLog) // ≥ 0: both factors ≤ 0
		// The next index is i+gap+1; stop if it is ≥ n. Compare in float64
		// first (a huge or NaN gap must not reach the int conversion), then
		// exactly in int (float64(n-1-i) may round up when n > 2⁵³).
		if !(gap < float64(n-1-i)) {
			return dst
		}
		g := int(gap)
		if g >= n-1-i {
			return dst
		}
		i += g + 1
		dst = append(dst, i)
	}
}

// uniform returns W uniform on [0, 1) with full float64 resolution: the
// binade [2⁻ᵏ⁻¹, 2⁻ᵏ) is chosen with probability 2⁻ᵏ⁻¹ by counting leading
// zero bits, and its 2⁵² floats are equally likely (cf. Downey 2007,
// "Generating pseudo-random floating-point values"). W = 0 has probability
// below 2⁻¹⁰⁸⁰.
func (p *Poisson) uniform() float64 {
	x := p.src.Uint64()
	exp := 0
	for x == 0 {
		exp += 64
		if exp > 1024 {
			return 0
		}
		x = p.src.Uint64()
	}
	lz := bits.LeadingZeros64(x)
	exp += lz
	m := x << lz // top bit set; the 63-lz bits below it are uniform
	if lz > 11 {
		// Fewer than 52 random bits remain below the leading one: fill
		// the lz zero bits at the bottom from a fresh word.
		m |= p.src.Uint64() >> (64 - lz)
	}
	return math.Ldexp(float64(m>>11), -53-exp) // m>>11 in [2⁵², 2⁵³): exact
}
