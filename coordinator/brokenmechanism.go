package coordinator

// BrokenMechanismEnv names the environment variable that breaks the
// leader's mechanism on purpose, in binaries built with -tags
// dpbrokenmechanism only (brokenmechanism_on.go): with the value
// "sigma/4" every g̃ carries a quarter of the noise the ledger charges
// for. It exists for one test, e2e's TestAuditCatchesBrokenMechanism,
// which checks that coordinator audit-privacy notices. Product builds
// (brokenmechanism_off.go) ignore it.
const BrokenMechanismEnv = "DPCLUSTER_BROKEN_MECHANISM"

// BrokenSigmaQuarter is the BrokenMechanismEnv value that divides the
// noise's scale by 4.
const BrokenSigmaQuarter = "sigma/4"
