package coordinator

import "github.com/dpcluster/dpcluster/internal/brokenmech"

// BrokenMechanismEnv names the environment variable that breaks the
// mechanism on purpose, in binaries built with -tags dpbrokenmechanism
// only (internal/brokenmech): with the value BrokenSigmaQuarter every g̃
// carries a quarter of the noise the ledger charges for; with
// BrokenClipTriple examples are clipped to 3·C (model's clip rule). It exists for
// one test, e2e's TestAuditCatchesBrokenMechanism, which checks that
// coordinator audit-privacy notices. Product builds ignore it.
const BrokenMechanismEnv = brokenmech.Env

// BrokenSigmaQuarter is the BrokenMechanismEnv value that divides the
// noise's scale by 4.
const BrokenSigmaQuarter = brokenmech.SigmaQuarter

// BrokenClipTriple is the BrokenMechanismEnv value that triples the clip
// norm the clip rule applies.
const BrokenClipTriple = brokenmech.ClipTriple

// breakMechanism, in a -tags dpbrokenmechanism binary whose
// BrokenMechanismEnv is BrokenSigmaQuarter, rewrites g̃ = (S + z)/B as
// (S + z/4)/B: the noise z is recovered as B·g̃ − S and a quarter of it
// kept, so the release has noise of scale σC/4 while the ledger charges
// σ. In product builds brokenmech.Is is the constant false and this does
// nothing. The float64 arithmetic errs by far less than the noise it
// removes (relative 2⁻⁵³ of |S| + |z| per coordinate, before the float32
// rounding every g̃ has).
func breakMechanism(g []float32, sum []float64, expectedBatch float64) {
	if !brokenmech.Is(brokenmech.SigmaQuarter) {
		return
	}
	for j, v := range g {
		s := sum[j] / expectedBatch
		g[j] = float32(s + (float64(v)-s)/4)
	}
}
