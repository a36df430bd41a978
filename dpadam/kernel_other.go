//go:build !amd64 || noasm

package dpadam

// haveAVX2 is false off amd64 and with the noasm tag: the portable Go
// kernel runs everywhere.
const haveAVX2 = false

func adamBCAVX2(theta, m, v, grad *float32, n int, k *adamConsts, acc *lanes) int {
	panic("dpadam: adamBCAVX2 called without AVX2 support")
}

func anyNonFiniteAVX2(x *float32, n int) bool {
	panic("dpadam: anyNonFiniteAVX2 called without AVX2 support")
}
