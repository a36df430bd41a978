package dpadam

import (
	"errors"
	"fmt"
	"math"

	"github.com/dpcluster/dpcluster/internal/parallel"
)

// Errors returned by Step and New.
var (
	// ErrNonFinite is returned (wrapped, with the first offending index) by
	// Step when the noisy gradient holds a NaN, ±Inf, or a value of
	// magnitude ≥ 2^63 (MaxGradient; its square would overflow the float32
	// second moment). Nothing is modified: θ, the moments, the momentum
	// buffer and the step count are untouched.
	ErrNonFinite = errors.New("dpadam: non-finite noisy gradient")
	// ErrDimension is returned (wrapped) by New for a non-positive
	// dimension and by Step when θ or g̃ does not have Dim() elements.
	ErrDimension = errors.New("dpadam: dimension mismatch")
	// ErrUninitialized is returned by Step and MarshalBinary on an
	// Optimizer that was neither built by New nor filled by UnmarshalBinary.
	ErrUninitialized = errors.New("dpadam: optimizer not initialized (use New or UnmarshalBinary)")
	// ErrStepOverflow is returned by Step when the step count would
	// overflow int64. It cannot happen in practice; it keeps a crafted
	// snapshot from wrapping the counter.
	ErrStepOverflow = errors.New("dpadam: step count overflow")
)

// Diagnostics describes one step. It holds only privatized quantities
// (functions of g̃ and public constants), so it may be logged or exported.
type Diagnostics struct {
	// Step is the 1-based number t of the step just applied.
	Step int64
	// Phi is Config.Phi(), the DP bias (σC/B)²·PhiScale. It is reported
	// for every algorithm but only DP-AdamBC subtracts it.
	Phi float64
	// MeanVHat is the mean over coordinates of the bias-corrected second
	// moment v̂ = v/(1−β2^t) (Adam, AdamBC); 0 for SGD and SGDM.
	MeanVHat float64
	// FloorFraction is the fraction of coordinates where DP-AdamBC's floor
	// is active, v̂ − Φ < γ'; 0 for the other algorithms.
	FloorFraction float64
	// UpdateRMS is sqrt(mean(u_i²)) of the applied update u = θ_{t−1} − θ_t
	// before rounding θ to float32, i.e. η·Δ_t (Adam, AdamBC), η·g̃ (SGD),
	// η·b (SGDM).
	UpdateRMS float64
}

// Optimizer holds one DP optimizer's state over a flat float32 parameter
// vector: the step count, the first and second moments m and v (Adam,
// AdamBC) or the momentum buffer b (SGDM), and the Config.
//
// State is stored as float32 (like PyTorch's Adam for float32 parameters:
// 4 bytes per coordinate per buffer, which keeps the step memory-bound); all
// arithmetic inside a step is float64 and rounds to float32 only on store.
//
// Determinism: Step is a pure function of (state, θ, g̃). Every product that
// feeds a sum is explicitly rounded (float64(a*b)), which the Go spec
// guarantees prevents fused multiply-add, and the bias-correction powers β^t
// are computed by binary exponentiation with plain multiplies, never
// math.Pow. IEEE-754 add, multiply, divide and square root are correctly
// rounded, so replicas on any architecture or GOAMD64 level produce the
// same bits, and the diagnostic sums run in a fixed order. On amd64 with
// AVX2, DP-AdamBC's loop runs in assembly doing the same IEEE operations
// four coordinates at a time (same bits; build with -tags noasm for the
// pure-Go kernel, which is always built and tested).
//
// An Optimizer is not safe for concurrent use. The zero value is only a
// target for UnmarshalBinary.
type Optimizer struct {
	cfg  Config
	dim  int
	step int64
	m, v []float32 // Adam, AdamBC: first and second moments, len dim
	b    []float32 // SGDM: momentum buffer, len dim
}

// New returns an optimizer for dim parameters with zero moments and step
// count 0 (Algorithm 1: m₀ = 0, v₀ = 0). It validates cfg (errors wrap
// ErrInvalidConfig) and requires dim > 0 (ErrDimension).
func New(cfg Config, dim int) (*Optimizer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if dim <= 0 {
		return nil, fmt.Errorf("%w: dim = %d, want > 0", ErrDimension, dim)
	}
	o := &Optimizer{cfg: cfg, dim: dim}
	switch cfg.Algorithm {
	case AdamBC, Adam:
		o.m = make([]float32, dim)
		o.v = make([]float32, dim)
	case SGDM:
		o.b = make([]float32, dim)
	}
	return o, nil
}

// StepCount returns the number of steps applied so far (t of the last step).
func (o *Optimizer) StepCount() int64 { return o.step }

// Config returns the optimizer's configuration.
func (o *Optimizer) Config() Config { return o.cfg }

// Dim returns the number of parameters.
func (o *Optimizer) Dim() int { return o.dim }

// Step applies one update with the noisy gradient g̃ (noisyGrad) to theta in
// place and advances the step count. Both slices must have Dim() elements
// (else ErrDimension) and must not overlap; the Optimizer keeps no
// reference to either.
//
// If g̃ holds a NaN, ±Inf or a value with |g̃_i| ≥ MaxGradient, Step returns
// ErrNonFinite and changes nothing: it checks all of g̃ before writing
// anything. θ is not checked. Bounding g̃ keeps every state value finite
// (|m| < 2^63, v < 2^126, |b| < 2^63/(1−μ)), so a snapshot of any reachable
// state decodes.
//
// Step allocates nothing (only its error values are allocated) for up to
// adamChunk coordinates; a longer vector is updated on several cores, at
// the cost of their goroutines.
func (o *Optimizer) Step(theta, noisyGrad []float32) (Diagnostics, error) {
	if o.cfg.Algorithm == "" {
		return Diagnostics{}, ErrUninitialized
	}
	if len(theta) != o.dim || len(noisyGrad) != o.dim {
		return Diagnostics{}, fmt.Errorf("%w: len(theta) = %d, len(noisyGrad) = %d, want %d",
			ErrDimension, len(theta), len(noisyGrad), o.dim)
	}
	if err := CheckGradient(noisyGrad); err != nil {
		return Diagnostics{}, err
	}
	if o.step == math.MaxInt64 {
		return Diagnostics{}, ErrStepOverflow
	}
	t := o.step + 1
	c := &o.cfg
	d := Diagnostics{Step: t, Phi: c.Phi()}
	var sumVHat, sumU2 float64
	var floors int
	switch c.Algorithm {
	case AdamBC:
		k := newAdamConsts(c, t)
		sumVHat, sumU2, floors = adamBCKernel(theta, o.m, o.v, noisyGrad, &k)
	case Adam:
		sumVHat, sumU2 = adamKernel(theta, o.m, o.v, noisyGrad, newAdamConsts(c, t), c.AdamEps)
	case SGD:
		sumU2 = sgdKernel(theta, noisyGrad, c.LearningRate)
	case SGDM:
		sumU2 = sgdmKernel(theta, o.b, noisyGrad, c.LearningRate, c.Momentum)
	}
	o.step = t
	n := float64(o.dim)
	d.MeanVHat = sumVHat / n
	d.FloorFraction = float64(floors) / n
	d.UpdateRMS = math.Sqrt(sumU2 / n)
	return d, nil
}

// MaxGradient bounds the noisy gradient's coordinates: Step rejects
// |g̃_i| ≥ 2^63 with ErrNonFinite. Real gradients are many orders of
// magnitude smaller; the bound keeps g̃² and the moments finite in float32.
const MaxGradient float64 = 1 << 63

// CheckGradient is the rule for what a valid noisy gradient g̃ is, the
// optimizer's input contract: every coordinate finite (no NaN, no ±Inf) and
// |g̃_i| < MaxGradient. It returns nil for a valid g̃ and otherwise an error
// wrapping ErrNonFinite that names the first offending index and its value
// (GradientValid applies the rule without them).
//
// Step applies exactly this rule, and everything that must agree with Step
// calls this function rather than restating the rule: the coordinator's
// leader checks g̃ before proposing it, and its state machine checks a
// committed g̃ before charging the privacy ledger, so an entry Step would
// refuse is refused before it is charged, identically on every replica.
//
// Why the bound: Algorithm 1 of the paper (DP-AdamBC; the same moment
// updates in DP-Adam) accumulates v_t = β2·v_{t−1} + (1−β2)·g̃_t², and
// Eq. (4) divides by sqrt(max(v̂_t − Φ, γ')). With |g̃_i| < 2^63, g̃_i² <
// 2^126 stays below float32's largest finite value (≈ 2^128), so m, v and
// SGDM's momentum stay finite and every reachable optimizer state encodes
// and decodes. A g̃ the Gaussian mechanism produces honestly is of order
// (count·C + σC·O(1))/B, far below the bound.
//
// Numeric error: none. The test is exact on the float32 bits (a biased
// exponent ≥ 127+63 is exactly |x| ≥ 2^63 or NaN/Inf), so the largest
// float32 below 2^63 passes and 2^63 fails, on every platform and on the
// AVX2 and pure-Go paths alike. It allocates only its error value.
func CheckGradient(noisyGrad []float32) error {
	if i := firstNonFinite(noisyGrad); i >= 0 {
		return fmt.Errorf("%w: noisyGrad[%d] = %v", ErrNonFinite, i, noisyGrad[i])
	}
	return nil
}

// GradientValid reports whether CheckGradient accepts noisyGrad: the same
// rule, without the detail of CheckGradient's error. That error names the
// first offending element's index and value, which are part of g̃; a
// caller that must not put any of g̃ in a message (the coordinator, about a
// g̃ whose privacy charge is not applied) reports ErrNonFinite alone for a
// false answer.
func GradientValid(noisyGrad []float32) bool { return firstNonFinite(noisyGrad) < 0 }

// firstNonFinite returns the index of the first element of x that is NaN,
// ±Inf or of magnitude ≥ 2^63, or -1. With AVX2 it scans 64K-element
// blocks eight lanes at a time and locates the index in Go only in a block
// that has a hit.
func firstNonFinite(x []float32) int {
	done := 0
	if haveAVX2 {
		for len(x)-done >= 8 {
			c := min(len(x)-done, simdBlock) &^ 7
			if anyNonFiniteAVX2(&x[done], c) {
				return done + firstNonFiniteGo(x[done:done+c])
			}
			done += c
		}
	}
	if i := firstNonFiniteGo(x[done:]); i >= 0 {
		return done + i
	}
	return -1
}

// firstNonFiniteGo is the portable firstNonFinite. For float32 the rejected
// values are exactly those whose biased exponent is ≥ 127+63 (255 encodes
// NaN and Inf).
func firstNonFiniteGo(x []float32) int {
	const expMask, limit = 0x7f800000, (127 + 63) << 23
	for i, f := range x {
		if math.Float32bits(f)&expMask >= limit {
			return i
		}
	}
	return -1
}

// powInt returns x^n by binary exponentiation with plain IEEE multiplies,
// so the result is identical on every platform (math.Pow has
// architecture-specific assembly on some ports).
func powInt(x float64, n int64) float64 {
	r := 1.0
	for n > 0 {
		if n&1 == 1 {
			r *= x
		}
		x *= x
		n >>= 1
	}
	return r
}

// adamConsts are the per-step scalars of Adam and AdamBC, hoisted out of the
// coordinate loop. The field order is part of the assembly kernel's ABI
// (kernel_amd64.s reads them by offset).
type adamConsts struct {
	b1, c1 float64 // β1, 1−β1
	b2, c2 float64 // β2, 1−β2
	lrM    float64 // η/(1−β1^t): η·m̂ = lrM·m
	invV   float64 // 1/(1−β2^t): v̂ = invV·v
	phi    float64 // Φ (AdamBC)
	gp     float64 // γ' (AdamBC)
}

func newAdamConsts(c *Config, t int64) adamConsts {
	return adamConsts{
		b1:   c.Beta1,
		c1:   1 - c.Beta1,
		b2:   c.Beta2,
		c2:   1 - c.Beta2,
		lrM:  c.LearningRate / (1 - powInt(c.Beta1, t)),
		invV: 1 / (1 - powInt(c.Beta2, t)),
		phi:  c.Phi(),
		gp:   c.GammaPrime,
	}
}

// lanes holds the diagnostic sums in four interleaved lanes: coordinate i
// is added, in increasing i, to lane i mod 4, and the total is
// (l0 + l1) + (l2 + l3). The fixed order makes the diagnostics identical
// between the Go and the SIMD kernel (float addition is not associative).
// The layout is part of the assembly kernel's ABI.
type lanes struct {
	vHat [4]float64 // Σ v̂
	u2   [4]float64 // Σ u²
}

func sum4(l *[4]float64) float64 { return (l[0] + l[1]) + (l[2] + l[3]) }

// simdBlock is the number of coordinates per assembly call: the assembly
// loop cannot be preempted, so it returns to Go every 64K coordinates.
const simdBlock = 1 << 16

// adamBCKernel is Algorithm 1 of the paper, lines 5–7, for one step:
//
//	m ← β1·m + (1−β1)·g̃
//	v ← β2·v + (1−β2)·g̃²
//	v̂ = v/(1−β2^t)
//	θ ← θ − (η/(1−β1^t))·m / sqrt(max(v̂ − Φ, γ'))   (= θ − η·m̂/sqrt(max(v̂−Φ, γ')), Eq. 4)
//
// It returns Σv̂, Σu² and the number of coordinates with v̂ − Φ < γ'. On
// amd64 with AVX2 the bulk runs in adamBCAVX2, which performs the same
// IEEE operations per coordinate (4 at a time) and so gives the same bits.
func adamBCKernel(theta, m, v, g []float32, k *adamConsts) (sumVHat, sumU2 float64, floors int) {
	n := len(theta)
	m, v, g = m[:n], v[:n], g[:n]
	if n <= adamChunk {
		var acc lanes
		floors = adamBCRange(theta, m, v, g, k, &acc)
		return sum4(&acc.vHat), sum4(&acc.u2), floors
	}
	return adamBCParallel(theta, m, v, g, *k)
}

// adamBCParallel is adamBCKernel for longer vectors (a model of millions
// of parameters): chunks of adamChunk coordinates on several cores. Each
// coordinate's update is the same operations whichever goroutine runs it,
// so θ, m and v have the serial loop's bits; each chunk keeps its own
// lanes (adamChunk is a multiple of 4, so coordinate i stays in lane
// i mod 4), and the chunks' lanes are added in chunk order: the
// diagnostics are the same bits on every machine, whatever its core
// count. (A function of its own, with k by value, so that what its
// goroutines capture escapes here and not in the short path.)
func adamBCParallel(theta, m, v, g []float32, k adamConsts) (sumVHat, sumU2 float64, floors int) {
	parts := make([]lanes, parallel.Count(len(theta), adamChunk))
	partFloors := make([]int, len(parts))
	parallel.Chunks(len(theta), adamChunk, func(c, lo, hi int) {
		partFloors[c] = adamBCRange(theta[lo:hi], m[lo:hi], v[lo:hi], g[lo:hi], &k, &parts[c])
	})
	var acc lanes
	for c := range parts {
		for l := range 4 {
			acc.vHat[l] += parts[c].vHat[l]
			acc.u2[l] += parts[c].u2[l]
		}
		floors += partFloors[c]
	}
	return sum4(&acc.vHat), sum4(&acc.u2), floors
}

// adamChunk is the number of coordinates one goroutine updates at a time
// in adamBCKernel: a multiple of 4 (the lanes) and of simdBlock.
const adamChunk = 1 << 18

// adamBCRange runs the kernel over the whole of its slices (the same
// length), adding into acc, and returns the floor count: the assembly
// kernel on blocks of simdBlock, the Go kernel on the rest.
func adamBCRange(theta, m, v, g []float32, k *adamConsts, acc *lanes) (floors int) {
	n := len(theta)
	done := 0
	if haveAVX2 {
		for n-done >= 4 {
			c := min(n-done, simdBlock) &^ 3
			floors += adamBCAVX2(&theta[done], &m[done], &v[done], &g[done], c, k, acc)
			done += c
		}
	}
	return floors + adamBCGo(theta, m, v, g, done, k, acc)
}

// adamBCGo is the portable kernel for coordinates [start, len(theta)).
// Every product feeding a sum is rounded explicitly (no FMA, see Optimizer).
func adamBCGo(theta, m, v, g []float32, start int, k *adamConsts, acc *lanes) (floors int) {
	n := len(theta)
	m, v, g = m[:n], v[:n], g[:n]
	// Local copies keep the constants in registers.
	b1, c1, b2, c2, lrM, invV, phi, gp := k.b1, k.c1, k.b2, k.c2, k.lrM, k.invV, k.phi, k.gp
	gpBits := math.Float64bits(gp)
	// Work on local copies of the lanes: stores through acc could alias
	// the slices as far as the compiler knows, forcing reloads.
	sumV, sumU := acc.vHat, acc.u2
	for i := start; i < n; i++ {
		gi := float64(g[i])
		mi := float64(b1*float64(m[i])) + float64(c1*gi)
		vi := float64(b2*float64(v[i])) + float64(c2*float64(gi*gi))
		m[i] = float32(mi)
		v[i] = float32(vi)
		vHat := float64(invV * vi)
		den := vHat - phi
		// den = max(den, γ') without a branch: the floor is active for
		// about half the coordinates when Φ dominates v̂, so a branch would
		// mispredict constantly. den−γ' is negative exactly when den < γ'
		// (the difference of distinct floats is never 0), so its sign bit
		// both counts the floor and selects γ' through an all-ones mask.
		floor := math.Float64bits(den-gp) >> 63
		floors += int(floor)
		mask := -floor
		den = math.Float64frombits(math.Float64bits(den)&^mask | gpBits&mask)
		u := float64(lrM*mi) / math.Sqrt(den)
		theta[i] = float32(float64(theta[i]) - u)
		sumV[i&3] += vHat
		sumU[i&3] += float64(u * u)
	}
	acc.vHat, acc.u2 = sumV, sumU
	return floors
}

// adamKernel is DP-Adam (paper §3, and Kingma & Ba 2015 Algorithm 1 applied
// to g̃): the same moments as adamBCKernel and
//
//	θ ← θ − η·m̂/(sqrt(v̂) + γ).
//
// It returns Σv̂ and Σu².
func adamKernel(theta, m, v, g []float32, k adamConsts, eps float64) (sumVHat, sumU2 float64) {
	n := len(theta)
	m, v, g = m[:n], v[:n], g[:n]
	for i := range theta {
		gi := float64(g[i])
		mi := float64(k.b1*float64(m[i])) + float64(k.c1*gi)
		vi := float64(k.b2*float64(v[i])) + float64(k.c2*float64(gi*gi))
		m[i] = float32(mi)
		v[i] = float32(vi)
		vHat := float64(k.invV * vi)
		u := float64(k.lrM*mi) / (math.Sqrt(vHat) + eps)
		theta[i] = float32(float64(theta[i]) - u)
		sumVHat += vHat
		sumU2 += float64(u * u)
	}
	return sumVHat, sumU2
}

// sgdKernel is DP-SGD (Abadi et al. 2016, Algorithm 1): θ ← θ − η·g̃.
// It returns Σu².
func sgdKernel(theta, g []float32, lr float64) (sumU2 float64) {
	g = g[:len(theta)]
	for i := range theta {
		u := float64(lr * float64(g[i]))
		theta[i] = float32(float64(theta[i]) - u)
		sumU2 += float64(u * u)
	}
	return sumU2
}

// sgdmKernel is DP-SGD with momentum in the paper's §3.2 form
// (b ← μ·b + g̃; θ ← θ − η·b; the paper's "+ η b" is a sign typo for
// descent). It returns Σu².
func sgdmKernel(theta, b, g []float32, lr, mu float64) (sumU2 float64) {
	n := len(theta)
	b, g = b[:n], g[:n]
	for i := range theta {
		bi := float64(mu*float64(b[i])) + float64(g[i])
		b[i] = float32(bi)
		u := float64(lr * bi)
		theta[i] = float32(float64(theta[i]) - u)
		sumU2 += float64(u * u)
	}
	return sumU2
}
