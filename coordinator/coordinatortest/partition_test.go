package coordinatortest_test

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/coordinator/coordinatortest"
	"github.com/dpcluster/dpcluster/transport"
	"github.com/dpcluster/dpcluster/transport/fake"
)

// testLogger logs to stderr when DPC_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("DPC_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func newCluster(t *testing.T, opts coordinatortest.Options) (*coordinatortest.Cluster, context.Context) {
	t.Helper()
	opts.Logger = testLogger()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return coordinatortest.NewCluster(t, opts), ctx
}

// finish waits for the run to end and checks the invariants.
func finish(t *testing.T, ctx context.Context, c *coordinatortest.Cluster) {
	t.Helper()
	sums := c.Wait(ctx, t)
	for id, s := range sums {
		if s.Steps != c.Run.MaxSteps {
			t.Errorf("replica %s: %d steps applied, want %d (%q)", id, s.Steps, c.Run.MaxSteps, s.Stopped)
		}
	}
	c.EnsureSame(t)
	c.Check(t)
}

// others returns the replicas other than id.
func others(c *coordinatortest.Cluster, id string) []string {
	return slices.DeleteFunc(c.Replicas(), func(x string) bool { return x == id })
}

// waitNewLeader waits for a leader other than old.
func waitNewLeader(t *testing.T, ctx context.Context, c *coordinatortest.Cluster, old string) string {
	t.Helper()
	for {
		if l := c.Leader(ctx); l != old && l != "" {
			return l
		} else if ctx.Err() != nil {
			t.Fatalf("no leader other than %s: %v", old, ctx.Err())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestClusterRuns: without faults the run reaches MaxSteps and every
// invariant holds (the harness's control case).
func TestClusterRuns(t *testing.T) {
	c, ctx := newCluster(t, coordinatortest.Options{Seed: 1, MaxSteps: 20})
	finish(t, ctx, c)
}

// TestLeaderIsolatedWithNodes: the leader keeps the nodes but loses the
// other replicas, so it can still close rounds and propose steps that can
// never commit. It must release none of them: it steps down, the majority
// elects a new leader (which, cut from the nodes, closes empty rounds and
// releases nothing), and after the heal the run finishes with every step
// charged once and every published θ_t the committed one. A θ_t released
// from the old leader's uncommitted proposal would differ (its own noise).
func TestLeaderIsolatedWithNodes(t *testing.T) {
	c, ctx := newCluster(t, coordinatortest.Options{Seed: 2, MaxSteps: 30})
	c.WaitApplied(ctx, t, 5)
	old := c.Leader(ctx)
	c.Partition(append([]string{old}, c.Nodes()...))
	waitNewLeader(t, ctx, c, old)
	time.Sleep(500 * time.Millisecond) // rounds on both sides of the cut
	c.Heal()
	finish(t, ctx, c)
}

// TestLeaderIsolated: the leader is cut from everyone; the others elect a
// new leader, which trains on with the nodes; the old one rejoins as a
// follower after the heal.
func TestLeaderIsolated(t *testing.T) {
	c, ctx := newCluster(t, coordinatortest.Options{Seed: 3, MaxSteps: 30})
	c.WaitApplied(ctx, t, 5)
	old := c.Leader(ctx)
	c.Isolate(old)
	waitNewLeader(t, ctx, c, old)
	at := c.Applied()
	c.WaitApplied(ctx, t, at+3) // progress without the old leader
	c.Heal()
	finish(t, ctx, c)
}

// TestMinorityPartition: a follower is cut off; the majority trains on,
// and the follower catches up (by log or snapshot) after the heal.
func TestMinorityPartition(t *testing.T) {
	c, ctx := newCluster(t, coordinatortest.Options{Seed: 4, MaxSteps: 40})
	c.WaitApplied(ctx, t, 3)
	leader := c.Leader(ctx)
	follower := others(c, leader)[0]
	c.Isolate(follower)
	at := c.Applied()
	c.WaitApplied(ctx, t, at+20) // beyond the snapshot threshold (16)
	c.Heal()
	finish(t, ctx, c)
}

// TestMajorityPartition: the leader and the nodes on one side, the two
// other replicas on the other, and then every replica cut from every
// other: no side has a majority, so no step is applied while it lasts;
// after the heal the run goes on and finishes.
func TestMajorityPartition(t *testing.T) {
	c, ctx := newCluster(t, coordinatortest.Options{Seed: 5, MaxSteps: 25})
	c.WaitApplied(ctx, t, 3)
	reps := c.Replicas()
	c.Partition(append([]string{reps[0]}, c.Nodes()...), reps[1:2], reps[2:3])
	// A leader may commit what it had in flight within its lease; after
	// that nothing.
	time.Sleep(400 * time.Millisecond)
	at := c.Applied()
	time.Sleep(time.Second)
	if got := c.Applied(); got != at {
		t.Errorf("steps applied without a majority: %d → %d", at, got)
	}
	// θ_t goes out once step t's charge is committed, before its g̃ is:
	// at most the one step charged ahead of the last applied.
	if _, top := c.Published(); top > c.Charged() || top > at+1 {
		t.Errorf("θ_%d published without a majority (applied %d, charged %d)", top, at, c.Charged())
	}
	c.Heal()
	c.WaitApplied(ctx, t, at+1)
	finish(t, ctx, c)
}

// TestFlappingLinks: every 150-400 ms a different random partition (one
// replica or a replica with the nodes cut off) is set or healed, with NATS
// dropping 5% of deliveries and delaying them up to 20 ms throughout.
func TestFlappingLinks(t *testing.T) {
	c, ctx := newCluster(t, coordinatortest.Options{Seed: 6, MaxSteps: 30})
	c.SetFaults(fake.Faults{Drop: 0.05, Delay: 20 * time.Millisecond})
	c.WaitApplied(ctx, t, 2)
	reps := c.Replicas()
	for i := range 12 {
		switch i % 3 {
		case 0:
			c.Isolate(reps[i%len(reps)])
		case 1:
			c.Partition(append([]string{reps[(i+1)%len(reps)]}, c.Nodes()...))
		case 2:
			c.Heal()
		}
		time.Sleep(time.Duration(150+50*(i%6)) * time.Millisecond)
	}
	c.Heal()
	c.SetFaults(fake.Faults{})
	finish(t, ctx, c)
}

// TestAddReplicaDuringPartition: with a follower cut off, a fourth
// replica joins (it asks the leader over NATS); the configuration of four
// commits on the three connected ones, and after the heal all four hold
// the same state.
func TestAddReplicaDuringPartition(t *testing.T) {
	c, ctx := newCluster(t, coordinatortest.Options{Seed: 8, MaxSteps: 30})
	c.WaitApplied(ctx, t, 3)
	leader := c.Leader(ctx)
	cutoff := others(c, leader)[0]
	c.Isolate(cutoff)
	if err := c.AddReplica("r3"); err != nil {
		t.Fatal(err)
	}
	want := []string{"r0", "r1", "r2", "r3"}
	for c.Replica("r3").FSM().State().Applied == 0 || !slices.Equal(c.VoterIDs(leader), want) {
		if ctx.Err() != nil {
			t.Fatalf("r3 not added: leader voters %v", c.VoterIDs(leader))
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.Heal()
	c.WaitVoters(ctx, t, want)
	finish(t, ctx, c)
}

// TestRemoveIsolatedReplica: a follower is cut off and then removed; the
// two others commit the removal and finish the run.
func TestRemoveIsolatedReplica(t *testing.T) {
	c, ctx := newCluster(t, coordinatortest.Options{Seed: 9, MaxSteps: 25})
	c.WaitApplied(ctx, t, 3)
	leader := c.Leader(ctx)
	gone := others(c, leader)[0]
	c.Isolate(gone)
	if err := c.RemoveReplica(ctx, gone); err != nil {
		t.Fatal(err)
	}
	c.Heal()
	c.WaitVoters(ctx, t, others(c, gone))
	finish(t, ctx, c)
}

// TestForeignGroupControlIgnored is issue 27's finding 4 on the replica
// side: removal requests and replica reports that carry another replica
// group's history (a second group started under the same run name on the
// same NATS) are ignored by this group's leader; the same request with
// this group's history is obeyed.
func TestForeignGroupControlIgnored(t *testing.T) {
	c, ctx := newCluster(t, coordinatortest.Options{Seed: 11, MaxSteps: 400})
	c.WaitApplied(ctx, t, 3)
	leader := c.Leader(ctx)
	victim := others(c, leader)[0]
	history := c.Replica(leader).FSM().State().History
	if history == "" {
		t.Fatal("the leader reports no history")
	}
	voters := c.VoterIDs(leader)
	foreign := transport.Control{Run: c.Run.Run, From: "coordinatortest", Code: transport.ControlRemove,
		Replica: victim, History: "ffffffffffffffffffffffffffffffff"}
	for range 10 {
		if err := c.PublishControl(ctx, foreign); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := c.VoterIDs(c.Leader(ctx)); !slices.Equal(got, voters) {
		t.Fatalf("a foreign group's removal of %s was obeyed: voters %v → %v", victim, voters, got)
	}
	if err := c.RemoveReplicaOfGroup(ctx, victim, history); err != nil {
		t.Fatalf("the group's own removal of %s: %v", victim, err)
	}
	c.WaitVoters(ctx, t, others(c, victim))
	finish(t, ctx, c)
}

// TestNodesCutFromLeader: the nodes lose the leader but still reach the
// followers. Today's Server keeps leading (Raft is healthy) and its
// rounds close at the deadline without contributions, so nothing is
// released: the run stalls until the heal, and then finishes.
func TestNodesCutFromLeader(t *testing.T) {
	c, ctx := newCluster(t, coordinatortest.Options{Seed: 10, MaxSteps: 20})
	c.WaitApplied(ctx, t, 3)
	leader := c.Leader(ctx)
	for _, n := range c.Nodes() {
		c.Cut(leader, n)
	}
	time.Sleep(800 * time.Millisecond) // the round in flight closes
	at := c.Applied()
	time.Sleep(time.Second)
	if got := c.Applied(); got != at {
		t.Errorf("steps applied with the nodes cut from the leader: %d → %d", at, got)
	}
	if l := c.Leader(ctx); l != leader {
		t.Logf("leadership moved %s → %s", leader, l)
	}
	c.Heal()
	finish(t, ctx, c)
}
