package dpadam

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"unsafe"
)

// TestKernelABI pins the struct offsets kernel_amd64.s reads.
func TestKernelABI(t *testing.T) {
	var k adamConsts
	var l lanes
	for _, tc := range []struct {
		name      string
		got, want uintptr
	}{
		{"b1", unsafe.Offsetof(k.b1), 0}, {"c1", unsafe.Offsetof(k.c1), 8},
		{"b2", unsafe.Offsetof(k.b2), 16}, {"c2", unsafe.Offsetof(k.c2), 24},
		{"lrM", unsafe.Offsetof(k.lrM), 32}, {"invV", unsafe.Offsetof(k.invV), 40},
		{"phi", unsafe.Offsetof(k.phi), 48}, {"gp", unsafe.Offsetof(k.gp), 56},
		{"vHat", unsafe.Offsetof(l.vHat), 0}, {"u2", unsafe.Offsetof(l.u2), 32},
	} {
		if tc.got != tc.want {
			t.Errorf("offset of %s = %d, want %d (kernel_amd64.s)", tc.name, tc.got, tc.want)
		}
	}
}

// TestAdamBCKernelPaths checks that the SIMD kernel (when this build and
// CPU have it) and the portable Go kernel produce identical bits for θ, m,
// v, the floor count and the lane sums, over lengths that exercise the
// 4-wide body, the scalar tail and the 64K block split, with the γ' floor
// active nowhere, everywhere, and on a mix of coordinates.
func TestAdamBCKernelPaths(t *testing.T) {
	if !haveAVX2 {
		t.Logf("no SIMD kernel in this build or on this CPU: checking the Go kernel against itself only")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{1, 3, 4, 5, 7, 64, 1001, simdBlock + 5, 2*simdBlock + 12} {
		for _, phi := range []float64{0, 5e-6, 1} { // floor: (almost) nowhere, on a mix, everywhere
			k := testAdamConsts(phi)
			theta, m, v, g := randomAdamState(rng, n)
			theta2, m2, v2 := append([]float32(nil), theta...), append([]float32(nil), m...), append([]float32(nil), v...)

			sumV, sumU, floors := adamBCKernel(theta, m, v, g, &k)
			var acc lanes
			floors2 := adamBCGo(theta2, m2, v2, g, 0, &k, &acc)
			sumV2, sumU2 := sum4(&acc.vHat), sum4(&acc.u2)

			if !bitsEqual(theta, theta2) || !bitsEqual(m, m2) || !bitsEqual(v, v2) {
				t.Fatalf("n=%d Φ=%g: vectors differ between kernels", n, phi)
			}
			if floors != floors2 || math.Float64bits(sumV) != math.Float64bits(sumV2) ||
				math.Float64bits(sumU) != math.Float64bits(sumU2) {
				t.Fatalf("n=%d Φ=%g: (Σv̂, Σu², floors) = (%v, %v, %d) vs Go (%v, %v, %d)",
					n, phi, sumV, sumU, floors, sumV2, sumU2, floors2)
			}
			if phi == 1 && floors != n {
				t.Errorf("n=%d: Φ=1 floors %d coordinates, want all", n, floors)
			}
			if phi == 5e-6 && (floors == 0 || floors == n) && n > 100 {
				t.Errorf("n=%d: Φ=5e-6 floors %d of %d coordinates, want a mix", n, floors, n)
			}
		}
	}
}

// TestFirstNonFinite checks every float32 exponent at several positions and
// vector lengths (SIMD body, tail, block split) against the definition:
// rejected iff NaN, ±Inf or |x| ≥ 2^63.
func TestFirstNonFinite(t *testing.T) {
	for _, n := range []int{1, 7, 8, 9, 64, 1000, simdBlock + 9} {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(i%13) - 6
		}
		if got := firstNonFinite(x); got != -1 {
			t.Fatalf("n=%d: clean vector: firstNonFinite = %d, want -1", n, got)
		}
		for _, pos := range []int{0, n / 2, n - 1} {
			for e := range 256 {
				for _, sign := range []uint32{0, 1 << 31} {
					saved := x[pos]
					x[pos] = math.Float32frombits(sign | uint32(e)<<23 | 0x12345)
					want := -1
					if f := float64(x[pos]); math.IsNaN(f) || math.Abs(f) >= MaxGradient {
						want = pos
					}
					if got := firstNonFinite(x); got != want {
						t.Fatalf("n=%d pos=%d value %v (exponent %d): firstNonFinite = %d, want %d", n, pos, x[pos], e, got, want)
					}
					x[pos] = saved
				}
			}
		}
		// The first of several bad values is reported.
		x[n-1], x[n/2] = float32(math.NaN()), float32(math.Inf(1))
		if got, want := firstNonFinite(x), n/2; got != want {
			t.Fatalf("n=%d: firstNonFinite = %d, want %d", n, got, want)
		}
	}
}

// TestAdamBCParallel: a vector of several adamChunk chunks (a partial last
// one included) is updated on several cores with θ, m and v bit-identical
// to the serial Go kernel's, the floor count equal, and the diagnostics
// within rounding of the serial sums and the same bits whatever
// GOMAXPROCS is.
func TestAdamBCParallel(t *testing.T) {
	const n = 3*adamChunk + 13
	rng := rand.New(rand.NewPCG(7, 8))
	k := testAdamConsts(5e-6)
	theta, m, v, g := randomAdamState(rng, n)
	clone := func(x []float32) []float32 { return append([]float32(nil), x...) }
	theta0, m0, v0 := clone(theta), clone(m), clone(v)
	var acc lanes
	floorsSerial := adamBCGo(theta0, m0, v0, g, 0, &k, &acc)
	sumVSerial, sumUSerial := sum4(&acc.vHat), sum4(&acc.u2)
	var first [2]float64
	for run, procs := range []int{1, 2, 8} {
		prev := runtime.GOMAXPROCS(procs)
		th, mm, vv := clone(theta), clone(m), clone(v)
		sumV, sumU, floors := adamBCKernel(th, mm, vv, g, &k)
		runtime.GOMAXPROCS(prev)
		if !bitsEqual(th, theta0) || !bitsEqual(mm, m0) || !bitsEqual(vv, v0) {
			t.Fatalf("GOMAXPROCS %d: θ, m or v differ from the serial kernel's", procs)
		}
		if floors != floorsSerial {
			t.Fatalf("GOMAXPROCS %d: %d floors, serial %d", procs, floors, floorsSerial)
		}
		if math.Abs(sumV-sumVSerial) > 1e-12*sumVSerial || math.Abs(sumU-sumUSerial) > 1e-12*sumUSerial {
			t.Fatalf("GOMAXPROCS %d: Σv̂ %v Σu² %v, serial %v %v", procs, sumV, sumU, sumVSerial, sumUSerial)
		}
		if run == 0 {
			first = [2]float64{sumV, sumU}
		} else if math.Float64bits(sumV) != math.Float64bits(first[0]) || math.Float64bits(sumU) != math.Float64bits(first[1]) {
			t.Fatalf("GOMAXPROCS %d: diagnostics %v %v, other bits than with GOMAXPROCS 1 (%v %v)", procs, sumV, sumU, first[0], first[1])
		}
	}
}

// testAdamConsts are the kernel constants of step 2 with η = 1e-3, the
// paper's β's, γ' = 1e-10 and the given Φ.
func testAdamConsts(phi float64) adamConsts {
	return adamConsts{b1: 0.9, c1: 0.1, b2: 0.999, c2: 1 - 0.999, lrM: 1e-3 / (1 - 0.9*0.9),
		invV: 1 / (1 - 0.999*0.999), phi: phi, gp: 1e-10}
}

// randomAdamState returns θ, m, v and g̃ of n coordinates at the scales of
// a DP run (g̃ about the noise σC/B, v about its square).
func randomAdamState(rng *rand.Rand, n int) (theta, m, v, g []float32) {
	theta, m, v, g = make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range n {
		theta[i] = float32(rng.NormFloat64())
		m[i] = float32(1e-4 * rng.NormFloat64())
		v[i] = float32(1e-8 * rng.ExpFloat64())
		g[i] = float32(2e-4 * rng.NormFloat64())
	}
	return theta, m, v, g
}
