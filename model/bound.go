package model

import (
	"fmt"
	"math"

	"github.com/dpcluster/dpcluster/internal/brokenmech"
)

// Floating-point error bounds for ClippedSum. The analysis is written out
// in ClippedSum's doc comment; this file holds its constants and the one
// function that turns an example's bounds into its clip factor.
//
// Model of arithmetic (IEEE 754, round to nearest, gradual underflow; Higham
// 2002, "Accuracy and Stability of Numerical Algorithms", 2nd ed., §2.2):
// a float32 operation returns x(1+δ)+η with |δ| ≤ u32 and |η| ≤ eta32
// (η ≠ 0 only for a subnormal result; sums that underflow are exact). A
// product of two float32 values is exact in float64, and a float64 sum of n
// terms has relative error at most γₙ(u64) of the sum of their magnitudes,
// in any order of summation, with or without fused multiply-adds (Higham
// §3.1, eq. 3.5, and §3.5 for inner and matrix products). Back ends must
// satisfy the same bound for their products (see Backend).

const (
	// u32 is the unit roundoff of float32.
	u32 = 0x1p-24
	// u64 is the unit roundoff of float64.
	u64 = 0x1p-53
	// eta32 bounds the absolute error of a float32 product, conversion or
	// fused multiply-add whose result is subnormal: half the smallest
	// subnormal, 2⁻¹⁴⁹.
	eta32 = 0x1p-150
)

// gamma returns γₙ = n·u/(1 − n·u) (Higham §3.1, Lemma 3.1), rounded up
// by a relative 2⁻⁴⁰ to cover its own float64 evaluation, or +Inf when
// n·u ≥ ½ (no useful bound: every example is then dropped, which is safe).
func gamma(n int, u float64) float64 {
	nu := float64(n) * u
	if !(nu < 0.5) {
		return math.Inf(1)
	}
	return nu / (1 - nu) * (1 + 0x1p-40)
}

// accGamma bounds the relative error, over the sum of the magnitudes of
// its terms, of the float64 accumulator ClippedSum and ClippedSumIndexed
// add every block's float32 product into: fewer than 2³¹ additions reach
// any element (one per block of examples, per chunk), so γ_{2³¹}(u64)
// ≈ 2.4e-7 holds whatever the batch size.
var accGamma = gamma(1<<31, u64)

// Clip norms ClippedSum accepts. Outside this range the float32 sum can
// overflow (C·count·2²⁴ must stay below the float32 maximum) or absolute
// underflow errors (≈ 2⁻¹⁵⁰ per element) are no longer covered by the clip
// margin; no sensible run comes near either end.
const (
	MinClipNorm = 0x1p-64
	MaxClipNorm = 0x1p64
)

// CheckClipNorm returns nil if clip is a clip norm ClippedSum accepts, a
// number in [MinClipNorm, MaxClipNorm], and otherwise an error wrapping
// ErrBadClip. It is the one place the range is defined: callers that
// validate a clip norm ahead of computing (a node checking a round) call it.
func CheckClipNorm(clip float64) error {
	if !(clip >= MinClipNorm && clip <= MaxClipNorm) {
		return fmt.Errorf("%w: got %v", ErrBadClip, clip)
	}
	return nil
}

// clipBounds holds, per example i of a batch, the quantities each
// parameter layer l adds and clipFactor combines (see ClippedSum):
//
//	sq[i]    ≥ Σₗ ‖Gᵢₗ‖²  an upper bound on the squared norm of the exact
//	                      per-example gradient implied by the stored
//	                      activations and output gradients
//	share[i] ≥ Σₗ Eᵢₗ     with cᵢ·Eᵢₗ + Hᵢₗ bounding the error that rounding
//	floor[i] ≥ Σₗ Hᵢₗ     example i's scaled terms adds to the float sum
//	                      (Eᵢₗ in proportion to the clip factor cᵢ, Hᵢₗ
//	                      from underflow, independent of it)
//
// A NaN or infinity anywhere marks the example as unbounded.
type clipBounds struct {
	sq, share, floor []float64
}

func newClipBounds(n int) clipBounds {
	return clipBounds{sq: make([]float64, n), share: make([]float64, n), floor: make([]float64, n)}
}

func (b clipBounds) reset(n int) {
	clear(b.sq[:n])
	clear(b.share[:n])
	clear(b.floor[:n])
}

// boundSlack is the relative amount each layer rounds its float64 bounds
// up by, for the float64 evaluation of the bounds themselves: every bound
// is a sum of fewer than n nonnegative terms followed by a few products and
// square roots, whose relative error is below 2·γₙ(u64) (Higham §3.1).
func boundSlack(n int) float64 { return 1 + 4*gamma(n+16, u64) }

// clipFactor returns the factor cᵢ by which ClippedSum scales example i's
// output gradients, from its bounds (see clipBounds) and the clip norm C:
// with C' = C·clipShade and Nᵢ = √sq·(1+2⁻⁴⁰) + share,
//
//	cᵢ = 1                  if Nᵢ + floor ≤ C',
//	cᵢ = (C' − floor) / Nᵢ  rounded down to a float32, if floor < C',
//	cᵢ = 0                  otherwise, and whenever a bound is NaN or ±Inf
//	                        (a gradient that is not finite, or a norm
//	                        estimate negative beyond its error bound).
//
// So cᵢ·Nᵢ + floor ≤ C' (up to one float64 rounding): example i's scaled
// contribution, together with the rounding error its terms add to the sum,
// has norm at most C'. This is the only place the clip rule is applied.
func clipFactor(sq, share, floor, clip float64) float32 {
	if brokenmech.Is(brokenmech.ClipTriple) {
		clip *= 3 // -tags dpbrokenmechanism only, for e2e's audit test; constant false otherwise
	}
	n := math.Sqrt(sq)*(1+0x1p-40) + share
	if math.IsNaN(n) || math.IsInf(n, 0) || math.IsNaN(floor) || math.IsInf(floor, 0) {
		return 0
	}
	target := clip*clipShade - floor
	switch {
	case !(target > 0):
		return 0
	case n <= target:
		return 1
	}
	c := target / n
	c32 := float32(c)
	if float64(c32) > c {
		c32 = math.Nextafter32(c32, 0)
	}
	return c32
}

// ClipFactor is the clip rule (clipFactor, the one place it is applied)
// for one gradient g held outside an engine: an audit's gradient canary
// (node/canary.go), which must be clipped as an example is, so that the
// audit exercises the rule it checks. sq is ‖g‖², computed in float64
// from the values to be scaled, and floor bounds the norm of the rounding
// error that scaling g by the factor and adding it into a float32 sum
// introduce. The factor c then satisfies c·‖g‖ + floor ≤ C·(1 − 2⁻¹⁶) (up
// to one float64 rounding), as for an example, and is 0 for a non-finite
// sq or floor.
func ClipFactor(sq, floor, clip float64) float32 { return clipFactor(sq, 0, floor, clip) }

// sumSq returns Σ v², accumulated in float64 (each square is exact) in four
// interleaved partial sums, added in a fixed order.
func sumSq(v []float32) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(v); i += 4 {
		a, b, c, d := float64(v[i]), float64(v[i+1]), float64(v[i+2]), float64(v[i+3])
		s0 += a * a
		s1 += b * b
		s2 += c * c
		s3 += d * d
	}
	for ; i < len(v); i++ {
		a := float64(v[i])
		s0 += a * a
	}
	return (s0 + s1) + (s2 + s3)
}
