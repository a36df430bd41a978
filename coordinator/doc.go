// Package coordinator runs the replicated side of a dpcluster training run:
// a Raft state machine (FSM) that charges every release to the privacy
// ledger and applies committed noisy gradients with the DP-AdamBC
// optimizer, a Replica that runs it over hashicorp/raft with durable stores
// (package raftlog: the Raft log in append-only segment files under raft/,
// each entry CRC-checked, and the stable store; file snapshots), and the
// Server, whose leader aggregates node contributions, adds Gaussian noise
// exactly once, gets the release charged on a quorum and only then
// releases θ_t.
//
// The order of operations for a step, on which the privacy guarantees rest
// (the same list, in more detail, documents Server and FSM; PROTOCOL.md,
// step 7):
//
//  1. The leader, after Barrier, opens round t over the live registered
//     nodes — only nodes that run the run's model, name their shard and,
//     in a private run, sample from the CSPRNG are registered, and no round
//     opens while their shards overlap (admission.go) — and collects
//     contributions (package aggregation validates them).
//  2. It draws z from a CSPRNG (the discrete Gaussian by default) and forms
//     g̃ = (S + z)/B. S never leaves its memory. A g̃ that fails
//     dpadam.CheckGradient is not proposed; the run stops.
//  3. It proposes the charge entry (t, ledger event; no tensor) to Raft.
//     Every replica's FSM charges the configuration's event when it
//     applies it, bound to this Raft history (append, fsync; refuse if
//     over budget; fail closed if the write fails), refusing, uncharged,
//     an entry whose event is not the configuration's.
//  4. Only after the charge is committed and applied on the leader does
//     anything derived from g̃ leave it: θ_t (computed on a copy of the
//     optimizer one step ahead) to the nodes, and g̃ in the grad entry.
//  5. Every replica's FSM applies the grad entry that names its pending
//     charge deterministically: θ and the optimizer state move. Any other
//     grad entry is refused and stops the run.
//
// Structure. One concern per file, one owner per piece of state:
//
//   - fsm.go, snapshot.go: the deterministic state machine (no clock, no
//     randomness, no network); entry.go its log entries.
//   - replica.go: Replica, the only code that touches the raft handle. It
//     gives the Server what it needs (Role, Term, Leader, Voters,
//     LeadershipChanges, Barrier, Configure, ProposeCharge, ProposeGrad, ProposeStop,
//     AddVoter, RemoveVoter); raftlog.Store and raftnet (TLS) are its stores
//     and transport.
//   - server.go: the Server and its loop. The loop goroutine owns all of
//     the protocol state; transport handlers only forward messages to its
//     inbox; each Raft operation runs on a goroutine the loop starts,
//     waits for, and hears back from on a channel, so no handler and no
//     step of the loop blocks on a quorum. The Server sees its replica
//     through the Consensus interface (tests wrap a Replica to hold an
//     operation; coordinatortest runs whole clusters in memory).
//   - round.go: the leader's step, steps 1-6 above in order; registry.go:
//     the nodes; membership.go: join and remove requests; reports.go:
//     replica reports, leader announcements and the drain at the end.
//   - config.go: ServerConfig and ReplicaConfig, each with its default and
//     its Validate.
//   - admission.go: which nodes a round may include; plan.go: the run's
//     rules (its configuration, a node's, the event each step charges,
//     θ₀); runconfig.go: the replicated run configuration; metrics.go and
//     eval.go: what is exported about the run, and status.go what the loop
//     publishes for dashboards (Server.Status, a snapshot replaced after
//     each event, and Server.History); export.go and history.go:
//     reading a data dir offline and binding the ledger to its Raft
//     history.
//
// Planning a run. RunPlan.RunConfig turns what an operator asks for (N or
// the data's size, B, σ or a target ε, the noise mode, a seeded source)
// into the replicated RunConfig: q = B/N, σ calibrated with the event the
// ledger will charge (less CalibrationMargin), the seed policy
// (seed.Policy). RunPlan.NodeConfig is a node's configuration (q and C,
// never σ: a node calibrates nothing); RunConfig.Event is the event each
// step charges; RunConfig.Theta0 (InitFromSpec as an InitFunc) is θ₀, from
// the run's model taken as an Initializer, since the coordinator never
// imports the model. The command line parses flags and run files and calls
// these; it derives nothing itself.
//
// Typical use, one replica (see cli for the commands):
//
//	replica, err := coordinator.OpenReplica(replicaCfg, coordinator.InitFromSpec(buildModel)) // θ₀: RunConfig.Theta0
//	server, err := coordinator.NewServer(replica, conn, runCfg, coordinator.DefaultServerConfig(), logger)
//	summary, err := server.Run(ctx) // returns when the run has stopped
package coordinator
