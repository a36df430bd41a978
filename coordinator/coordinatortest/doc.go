// Package coordinatortest runs a whole training run in one process, for
// tests of the coordinator under network faults: like net/http/httptest, a
// non-test package that tests import. It follows hashicorp/raft's
// makeCluster (testing.go), without shipping test code in the product.
//
// A Cluster is N coordinator replicas (real coordinator.Replica, durable
// stores in t.TempDir(), Raft over raft's in-memory transport, fully
// connected), each with a coordinator.Server, and M node.Workers on a small
// logistic regression and a synthetic dataset, all talking over one
// transport/fake network through the real codec. Noise and sampling are
// seeded (the run is SeedSeeded: NOT private); Raft timeouts are about
// 100 ms, so a failover takes a few hundred milliseconds.
//
// Faults are named by replica (r0, r1, …) or node (n0, n1, …) ID:
// Partition cuts Raft and NATS between groups, Isolate cuts one member
// from all, Heal removes every cut; SetFaults drops, delays, duplicates or
// reorders NATS deliveries. AddReplica and RemoveReplica change the Raft
// membership through the leader, over NATS, as the CLI does.
//
// An observer records every Params message and samples every replica's
// committed θ; Check asserts docs/PRIVACY.md's invariants (commit before
// release, one charge per applied step, audited ledgers) and EnsureSame
// that the replicas hold the same state bit for bit:
//
//	func TestLeaderIsolated(t *testing.T) {
//		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
//		defer cancel()
//		c := coordinatortest.NewCluster(t, coordinatortest.Options{Seed: 7, MaxSteps: 30})
//		c.WaitApplied(ctx, t, 5)
//		old := c.Leader(ctx)
//		c.Isolate(old)
//		// … a new leader is elected among the others …
//		c.Heal()
//		c.Wait(ctx, t) // the run reached MaxSteps
//		c.EnsureSame(t)
//		c.Check(t)
//	}
//
// Raft message delays are not injected (the in-memory transport has no
// hook for them); NATS delays are.
package coordinatortest
