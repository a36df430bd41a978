package coordinator

// The points of the leader's commit path, in the order a step passes
// them (round.go; PROTOCOL.md, step 7), at which the crash tests kill it:
// in one process (coordinatortest.CrashAt) and, in binaries built with
// -tags dpcrashpoints, as a whole process (crashPoint).
const (
	// CrashBeforeCharge: g̃ is formed, in the leader's memory only; its
	// charge is not proposed.
	CrashBeforeCharge = "before-charge"
	// CrashChargeCommitted: the charge is committed and applied on the
	// leader; θ_t is not released, g̃ not proposed.
	CrashChargeCommitted = "charge-committed"
	// CrashBeforeGrad: the charge is applied; θ_t is being released, g̃
	// not proposed.
	CrashBeforeGrad = "before-grad"
	// CrashGradQueued: g̃'s entry is in the leader's log queue and may
	// have reached followers; it is not known to be committed.
	CrashGradQueued = "grad-queued"
	// CrashGradApplied: g̃'s entry is committed and applied on the leader.
	CrashGradApplied = "grad-applied"
)

// CrashPoints lists the crash points in commit-path order.
var CrashPoints = []string{CrashBeforeCharge, CrashChargeCommitted, CrashBeforeGrad, CrashGradQueued, CrashGradApplied}

// CrashAtEnv is the environment variable a binary built with -tags
// dpcrashpoints reads: "POINT:STEP:MARKER" kills the process (SIGKILL to
// itself) when its leader reaches POINT for step STEP, if it can create
// the file MARKER (so that one process of a cluster dies, once).
const CrashAtEnv = "DPCLUSTER_CRASH_AT"
