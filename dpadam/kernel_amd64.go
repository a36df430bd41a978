//go:build amd64 && !noasm

package dpadam

// haveAVX2 reports whether adamBCAVX2 may run: the CPU has AVX2 and POPCNT
// and the OS saves the YMM registers.
var haveAVX2 = detectAVX2()

func detectAVX2() bool {
	maxLeaf, _, _, _ := cpuid(0, 0)
	if maxLeaf < 7 {
		return false
	}
	_, _, ecx1, _ := cpuid(1, 0)
	const popcnt, osxsave, avx = 1 << 23, 1 << 27, 1 << 28
	if ecx1&(popcnt|osxsave|avx) != popcnt|osxsave|avx {
		return false
	}
	if xcr0, _ := xgetbv(); xcr0&6 != 6 { // XMM and YMM state enabled
		return false
	}
	_, ebx7, _, _ := cpuid(7, 0)
	return ebx7&(1<<5) != 0
}

func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)

func xgetbv() (eax, edx uint32)

// adamBCAVX2 runs adamBCGo's per-coordinate operations on n coordinates
// (n a multiple of 4) starting at the given pointers, four at a time in
// float64 lanes, adding v̂ and u² into acc lane i mod 4. It returns the
// number of floored coordinates. The caller guarantees n ≤ the length of
// every vector.
//
//go:noescape
func adamBCAVX2(theta, m, v, grad *float32, n int, k *adamConsts, acc *lanes) (floors int)

// anyNonFiniteAVX2 reports whether any of the n float32s at x (n a multiple
// of 8) is NaN, ±Inf or of magnitude ≥ 2^63 (see firstNonFinite).
//
//go:noescape
func anyNonFiniteAVX2(x *float32, n int) bool
