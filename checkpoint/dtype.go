package checkpoint

import (
	"encoding/binary"
	"math"
)

// DType is a safetensors element type, spelled as the header spells it.
type DType string

// The element types whose values ReadFloat32 converts. The format defines
// more (the integer types, BOOL, the 8-bit floats); Open accepts a tensor
// of any whole-byte type, so that a checkpoint's integer buffers (BERT's
// position_ids) do not make the whole file unreadable, and ReadFloat32
// refuses them with ErrDType.
const (
	F32  DType = "F32"
	F16  DType = "F16"
	BF16 DType = "BF16"
	F64  DType = "F64"
)

// dtypeSizes is the size in bytes of one element of each whole-byte type
// of the format (Dtype::bitsize in huggingface/safetensors
// safetensors/src/tensor.rs). The sub-byte types (F4, F6_E2M3, F6_E3M2)
// pack several elements into a byte; no checkpoint this package reads
// uses them, and Open refuses them by name.
var dtypeSizes = map[DType]int{
	"BOOL": 1, "U8": 1, "I8": 1,
	"F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1,
	"I16": 2, "U16": 2, F16: 2, BF16: 2,
	"I32": 4, "U32": 4, F32: 4,
	"C64": 8, F64: 8, "I64": 8, "U64": 8,
}

// Size returns the size in bytes of one element of d, or 0 for a type
// Open does not accept.
func (d DType) Size() int { return dtypeSizes[d] }

// Float reports whether ReadFloat32 converts values of type d.
func (d DType) Float() bool { return d == F32 || d == F16 || d == BF16 || d == F64 }

// decode converts the little-endian elements of type d in src into dst:
// len(src) must be len(dst)·d.Size(). Every conversion is exact except
// F64's, which rounds to the nearest float32 (f64ToF32).
func decode(dst []float32, src []byte, d DType) {
	switch d {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = f16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = bf16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case F64:
		for i := range dst {
			dst[i] = f64ToF32(math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:])))
		}
	default:
		panic("checkpoint: decode of " + string(d))
	}
}

// f16ToF32 converts an IEEE 754 binary16 value to float32 exactly: every
// binary16 value, subnormals included, is a float32 value. Binary16 has
// 1 sign bit, 5 exponent bits (bias 15) and 10 fraction bits.
//
//   - exponent 0, fraction 0: ±0.
//   - exponent 0, fraction f: the subnormal ±f·2⁻²⁴, a normal float32
//     (the product of an integer below 2¹⁰ and a power of two within
//     float32's range is exact).
//   - exponent 31, fraction 0: ±Inf.
//   - exponent 31, fraction f: NaN, its fraction kept in the top bits of
//     float32's (so a quiet NaN stays quiet, a payload survives).
//   - otherwise: exponent e−15+127 and the fraction shifted left by 13.
func f16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch exp {
	case 0:
		v := float32(frac) * (1.0 / (1 << 24))
		if sign != 0 {
			v = -v
		}
		return v
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | frac<<13)
	}
	return math.Float32frombits(sign | (exp-15+127)<<23 | frac<<13)
}

// bf16ToF32 converts a bfloat16 value to float32 exactly: bfloat16 is the
// top half of a float32 (same sign, same 8-bit exponent, 7 of the 23
// fraction bits), so the conversion is a shift, for subnormals, infinities
// and NaNs too.
func bf16ToF32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// f32Overflow is the smallest magnitude that rounds to infinity in
// float32 under round-to-nearest-even: MaxFloat32 + half its ulp,
// 2¹²⁸ − 2¹⁰³ (a tie, which goes to the even neighbour, infinity).
const f32Overflow = 0x1.ffffffp127

// f64ToF32 rounds a float64 to the nearest float32, ties to even (IEEE 754
// roundTiesToEven, the default rounding attribute): magnitudes from
// f32Overflow up become ±Inf, results below float32's normal range become
// subnormals or ±0. Go's float32(x) rounds to nearest even for values
// float32 can represent; the Go spec leaves the result implementation-
// dependent when it cannot, so overflow and NaN are handled here: a NaN
// stays a NaN of the same sign, quiet, with the top 22 bits of its payload.
func f64ToF32(x float64) float32 {
	switch {
	case x != x:
		b := math.Float64bits(x)
		return math.Float32frombits(uint32(b>>63)<<31 | 0x7fc00000 | uint32(b>>29)&0x3fffff)
	case x >= f32Overflow:
		return float32(math.Inf(1))
	case x <= -f32Overflow:
		return float32(math.Inf(-1))
	}
	return float32(x)
}
