// Package coordinator runs the replicated side of a dpcluster training run:
// a Raft state machine that applies committed noisy gradients with the
// DP-AdamBC optimizer and charges every release to the privacy ledger, and
// the leader's round loop that aggregates node contributions, adds Gaussian
// noise exactly once, proposes the step and only then releases θ_t.
package coordinator
