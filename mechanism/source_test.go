package mechanism

import (
	"errors"
	"math"
	"testing"
)

// TestNoisyGradientMoments checks mean and variance of (S+z)/B against
// N(S/B, (σC/B)²) over many coordinates: with n = 200000 the sample mean's
// standard error is σC/B/√n and the variance's relative standard error is
// √(2/n) ≈ 0.3%, so 5-sigma bounds below cannot fail by chance.
func TestNoisyGradientMoments(t *testing.T) {
	const n = 200000
	const sigma, clip, B = 1.3, 2.0, 50.0
	sum := make([]float32, n)
	for i := range sum {
		sum[i] = 10
	}
	dst := make([]float32, n)
	if err := NewSeededNoiseSource(1).NoisyGradient(dst, sum, sigma, clip, B); err != nil {
		t.Fatal(err)
	}
	var m1, m2 float64
	for _, v := range dst {
		d := float64(v) - 10/B
		m1 += d
		m2 += d * d
	}
	m1 /= n
	m2 /= n
	std := sigma * clip / B
	if math.Abs(m1) > 5*std/math.Sqrt(n) {
		t.Errorf("mean offset %v, std error %v", m1, std/math.Sqrt(n))
	}
	if rel := m2/(std*std) - 1; math.Abs(rel) > 5*math.Sqrt(2.0/n) {
		t.Errorf("variance ratio − 1 = %v", rel)
	}
}

func TestNoiseSources(t *testing.T) {
	a, b := NewSeededNoiseSource(7), NewSeededNoiseSource(7)
	if a.Normal() != b.Normal() || !a.Seeded() {
		t.Fatal("seeded sources differ")
	}
	s1, err := NewNoiseSource()
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := NewNoiseSource()
	if s1.Seeded() || s1.Normal() == s2.Normal() {
		t.Fatal("crypto-seeded sources look identical")
	}
	dst := make([]float32, 3)
	sum := []float32{1, 2, 3}
	if err := s1.NoisyGradient(dst, sum, 0, 1, 2); err != nil || dst[2] != 1.5 {
		t.Fatalf("σ = 0: %v %v", dst, err)
	}
	for _, tc := range []struct {
		dst                []float32
		sigma, clip, batch float64
	}{
		{dst[:2], 1, 1, 1}, {dst, -1, 1, 1}, {dst, math.NaN(), 1, 1}, {dst, 1, 0, 1},
		{dst, 1, 1, 0}, {dst, 1, 1, math.Inf(1)}, {dst, math.Inf(1), 1, 1},
	} {
		if err := s1.NoisyGradient(tc.dst, sum, tc.sigma, tc.clip, tc.batch); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: err = %v", tc, err)
		}
	}
}

// TestNoisyGradient64MatchesFloat32: for a sum representable in both
// widths, the float64 path draws the same noise and rounds the same way.
func TestNoisyGradient64MatchesFloat32(t *testing.T) {
	sum32 := []float32{0.5, -1.25, 3, 0, 7.75}
	sum64 := make([]float64, len(sum32))
	for i, v := range sum32 {
		sum64[i] = float64(v)
	}
	got, want := make([]float32, len(sum32)), make([]float32, len(sum32))
	if err := NewSeededNoiseSource(9).NoisyGradient64(got, sum64, 1.3, 0.7, 10); err != nil {
		t.Fatal(err)
	}
	if err := NewSeededNoiseSource(9).NoisyGradient(want, sum32, 1.3, 0.7, 10); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Errorf("[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	if err := NewSeededNoiseSource(9).NoisyGradient64(got[:2], sum64, 1, 1, 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("length mismatch: err = %v", err)
	}
}
