package checkpoint

import (
	"encoding/binary"
	"math"
	"testing"
)

// TestF16Table checks binary16 → float32 on the values that exercise each
// branch: zeros, the smallest and largest subnormals, the smallest normal,
// the largest finite value, infinities and NaNs (quiet, signalling with a
// payload, negative). Expected bits worked by hand from IEEE 754-2019
// §3.6 (binary16: 5 exponent bits, bias 15; binary32: 8, bias 127).
func TestF16Table(t *testing.T) {
	for _, c := range []struct {
		h    uint16
		want uint32
		what string
	}{
		{0x0000, 0x00000000, "+0"},
		{0x8000, 0x80000000, "-0"},
		{0x0001, 0x33800000, "smallest subnormal 2^-24"},
		{0x8001, 0xb3800000, "-2^-24"},
		{0x0200, 0x38000000, "subnormal 2^-15"},
		{0x03ff, 0x387fc000, "largest subnormal 1023·2^-24"},
		{0x0400, 0x38800000, "smallest normal 2^-14"},
		{0x3c00, 0x3f800000, "1"},
		{0xc000, 0xc0000000, "-2"},
		{0x3555, 0x3eaaa000, "0.333251953125"},
		{0x7bff, 0x477fe000, "65504, the largest finite"},
		{0x7c00, 0x7f800000, "+Inf"},
		{0xfc00, 0xff800000, "-Inf"},
		{0x7e00, 0x7fc00000, "quiet NaN"},
		{0xfe00, 0xffc00000, "negative quiet NaN"},
		{0x7c01, 0x7f802000, "signalling NaN, payload 1"},
		{0x7fff, 0x7fffe000, "NaN, all payload bits"},
	} {
		if got := math.Float32bits(f16ToF32(c.h)); got != c.want {
			t.Errorf("f16 %#04x (%s) = %#08x, want %#08x", c.h, c.what, got, c.want)
		}
	}
}

// TestF16Exhaustive checks every binary16 bit pattern against the value
// its fields denote, (−1)^s · 2^(e−15) · (1 + f/1024) or, for e = 0,
// (−1)^s · 2^−14 · f/1024, computed in float64 with math.Ldexp, a second
// derivation independent of f16ToF32's bit shuffling.
func TestF16Exhaustive(t *testing.T) {
	for h := range 1 << 16 {
		s, e, f := h>>15, (h>>10)&0x1f, h&0x3ff
		got := f16ToF32(uint16(h))
		var want float64
		switch {
		case e == 0x1f && f != 0:
			if !math.IsNaN(float64(got)) || math.Signbit(float64(got)) != (s == 1) {
				t.Fatalf("f16 %#04x = %v, want a NaN of sign %d", h, got, s)
			}
			continue
		case e == 0x1f:
			want = math.Inf(1)
		case e == 0:
			want = math.Ldexp(float64(f)/1024, -14)
		default:
			want = math.Ldexp(1+float64(f)/1024, e-15)
		}
		if s == 1 {
			want = -want
		}
		if float64(got) != want || math.Signbit(float64(got)) != (s == 1) {
			t.Fatalf("f16 %#04x = %v, want %v", h, got, want)
		}
	}
}

// TestBF16Table checks bfloat16 → float32: the bits shifted into the top
// half, so subnormals, infinities and NaN payloads carry over.
func TestBF16Table(t *testing.T) {
	for _, c := range []struct {
		b    uint16
		want uint32
		what string
	}{
		{0x0000, 0x00000000, "+0"},
		{0x8000, 0x80000000, "-0"},
		{0x3f80, 0x3f800000, "1"},
		{0xc2f7, 0xc2f70000, "-123.5"},
		{0x0001, 0x00010000, "smallest subnormal, 2^-133"},
		{0x007f, 0x007f0000, "largest subnormal"},
		{0x0080, 0x00800000, "smallest normal, 2^-126"},
		{0x7f7f, 0x7f7f0000, "largest finite"},
		{0x7f80, 0x7f800000, "+Inf"},
		{0xff80, 0xff800000, "-Inf"},
		{0x7fc0, 0x7fc00000, "quiet NaN"},
		{0x7f81, 0x7f810000, "signalling NaN keeps its payload"},
	} {
		if got := math.Float32bits(bf16ToF32(c.b)); got != c.want {
			t.Errorf("bf16 %#04x (%s) = %#08x, want %#08x", c.b, c.what, got, c.want)
		}
	}
	if bf16ToF32(0x0001) != float32(math.Ldexp(1, -133)) || bf16ToF32(0xc2f7) != -123.5 {
		t.Error("bf16 0x0001 is not 2^-133, or 0xc2f7 not -123.5")
	}
}

// TestF64Table checks float64 → float32 rounding to nearest, ties to even:
// exact values, halfway cases both ways, the overflow threshold (values
// just under it round down to MaxFloat32, from it up to infinity),
// float32 subnormals and underflow to zero, infinities and NaNs.
func TestF64Table(t *testing.T) {
	const ulp1 = 0x1p-23 // float32's ulp at 1
	for _, c := range []struct {
		x    float64
		want uint32
		what string
	}{
		{0, 0x00000000, "+0"},
		{math.Copysign(0, -1), 0x80000000, "-0"},
		{1, 0x3f800000, "1"},
		{0.1, 0x3dcccccd, "0.1 rounds up"},
		{1 + ulp1/2, 0x3f800000, "halfway from 1 (even) stays at 1"},
		{1 + 3*ulp1/2, 0x3f800002, "halfway from 1+ulp (odd) goes up to even"},
		{1 + ulp1/2 + 0x1p-40, 0x3f800001, "just over halfway goes up"},
		{math.MaxFloat32, 0x7f7fffff, "MaxFloat32"},
		{f32Overflow - 0x1p75, 0x7f7fffff, "just under the threshold rounds down"},
		{f32Overflow, 0x7f800000, "the threshold, a tie, goes to Inf"},
		{-f32Overflow, 0xff800000, "the negative threshold"},
		{1e300, 0x7f800000, "far overflow"},
		{0x1p-149, 0x00000001, "smallest float32 subnormal"},
		{0x1p-150, 0x00000000, "half the smallest subnormal: tie to even 0"},
		{0x1.8p-150, 0x00000001, "three quarters of it rounds up"},
		{0x1p-127, 0x00400000, "a float32 subnormal"},
		{-0x1p-149, 0x80000001, "negative subnormal"},
		{1e-300, 0x00000000, "underflow"},
		{-1e-300, 0x80000000, "negative underflow keeps the sign"},
		{math.Inf(1), 0x7f800000, "+Inf"},
		{math.Inf(-1), 0xff800000, "-Inf"},
		{math.Float64frombits(0x7ff8000000000000), 0x7fc00000, "quiet NaN"},
		{math.Float64frombits(0xfff8000000000000), 0xffc00000, "negative quiet NaN"},
		{math.Float64frombits(0x7ff0000020000000), 0x7fc00001, "signalling NaN: quieted, payload's top bits kept"},
	} {
		if got := math.Float32bits(f64ToF32(c.x)); got != c.want {
			t.Errorf("f64 %v (%s) = %#08x, want %#08x", c.x, c.what, got, c.want)
		}
	}
}

// TestDecodeLittleEndian checks decode reads each type little-endian.
func TestDecodeLittleEndian(t *testing.T) {
	dst := make([]float32, 1)
	for _, c := range []struct {
		d   DType
		src []byte
	}{
		{F32, binary.LittleEndian.AppendUint32(nil, math.Float32bits(1.5))},
		{F16, []byte{0x00, 0x3e}},
		{BF16, []byte{0xc0, 0x3f}},
		{F64, binary.LittleEndian.AppendUint64(nil, math.Float64bits(1.5))},
	} {
		decode(dst, c.src, c.d)
		if dst[0] != 1.5 {
			t.Errorf("%s % x = %v, want 1.5", c.d, c.src, dst[0])
		}
	}
}
