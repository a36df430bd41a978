// Package brokenmech breaks the privacy mechanism on purpose, for one
// test: e2e's TestAuditCatchesBrokenMechanism, which checks that
// coordinator audit-privacy notices a release with less noise than the
// ledger charges, or examples that escape the clip. Only binaries built
// with -tags dpbrokenmechanism can be broken (on.go); in every other
// build Is is the constant false (off.go), so the hooks compile away and
// the environment variable is ignored.
package brokenmech

// Env names the environment variable that picks the breakage.
const Env = "DPCLUSTER_BROKEN_MECHANISM"

// The breakages Env can name.
const (
	// SigmaQuarter: every g̃ carries a quarter of the noise the ledger
	// charges for (coordinator's breakMechanism).
	SigmaQuarter = "sigma/4"
	// ClipTriple: the clip rule clips to 3·C instead of C (model's
	// clipFactor), so every example and gradient canary may enter its
	// node's sum with three times the norm the ledger's sensitivity
	// assumes. (In e2e's setting a clip at 4·C, or none, is caught before
	// the audit sees it: the leader refuses the nodes' sums, ‖sum‖ >
	// count·C, and releases nothing; a clip at 2·C passes and is caught
	// by the audit with less margin.)
	ClipTriple = "clip*3"
)
