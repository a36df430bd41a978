//go:build dpbrokenmechanism

package coordinator

import "os"

// breakMechanism, when BrokenMechanismEnv is BrokenSigmaQuarter, rewrites
// g̃ = (S + z)/B as (S + z/4)/B: the noise z is recovered as B·g̃ − S and
// a quarter of it kept, so the release has noise of scale σC/4 while the
// ledger charges σ. Only binaries built with -tags dpbrokenmechanism
// have it (e2e's audit test builds one); product builds have the no-op
// of brokenmechanism_off.go. The float64 arithmetic errs by far less than
// the noise it removes (relative 2⁻⁵³ of |S| + |z| per coordinate,
// before the float32 rounding every g̃ has).
func breakMechanism(g []float32, sum []float64, expectedBatch float64) {
	if os.Getenv(BrokenMechanismEnv) != BrokenSigmaQuarter {
		return
	}
	for j, v := range g {
		s := sum[j] / expectedBatch
		g[j] = float32(s + (float64(v)-s)/4)
	}
}
