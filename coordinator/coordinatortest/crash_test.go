package coordinatortest_test

import (
	"testing"

	"github.com/dpcluster/dpcluster/coordinator/coordinatortest"
)

// TestLeaderCrashAtEveryPointOfTheCommitPath kills the leader at each link
// of a step's commit path (before its charge is proposed, once it is
// committed, before and after g̃'s entry is queued, once it is applied):
// the two survivors elect a leader and finish the run, bit-identical,
// their ledgers auditing clean; every θ_t published is covered by a charge
// of step t (a θ_t the dead leader released and the next one replaced is
// charged twice); and every g̃ on any disk, the dead leader's included,
// has its charge in the survivors' ledgers.
func TestLeaderCrashAtEveryPointOfTheCommitPath(t *testing.T) {
	for i, point := range coordinatortest.CrashPoints {
		t.Run(point, func(t *testing.T) {
			c, ctx := newCluster(t, coordinatortest.Options{Seed: 20 + uint64(i), MaxSteps: 16,
				CrashAt: &coordinatortest.CrashAt{Point: point, Step: 6}})
			dead, err := c.WaitCrash(ctx)
			if err != nil {
				t.Fatal(err)
			}
			waitNewLeader(t, ctx, c, dead)
			finish(t, ctx, c)
			c.CheckDisks(t)
			// Where step 6's charge was committed and its g̃ never
			// proposed, the next leader charged it again.
			want := map[string]int{coordinatortest.CrashChargeCommitted: 2, coordinatortest.CrashBeforeGrad: 2,
				coordinatortest.CrashBeforeCharge: 1, coordinatortest.CrashGradApplied: 1}
			for id, n := range c.Charges(t, 6) {
				if w, ok := want[point]; ok && n != w {
					t.Errorf("replica %s charged step 6 %d times, want %d", id, n, w)
				}
			}
		})
	}
}
