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
			// proposed, the next leader charged it again. Each leader
			// charges a step at most once, so a later election while
			// step 6 was in flight (a loaded machine) adds one charge
			// in a later term: more is allowed, in distinct terms.
			want := map[string]int{coordinatortest.CrashChargeCommitted: 2, coordinatortest.CrashBeforeGrad: 2,
				coordinatortest.CrashBeforeCharge: 1, coordinatortest.CrashGradApplied: 1}
			for id, terms := range c.Charges(t, 6) {
				if w, ok := want[point]; ok && len(terms) < w {
					t.Errorf("replica %s charged step 6 %d times (terms %v), want %d", id, len(terms), terms, w)
				} else if ok && len(terms) > w {
					t.Logf("replica %s charged step 6 in terms %v: %d more leader change(s) while it was in flight", id, terms, len(terms)-w)
				}
				for i := 1; i < len(terms); i++ {
					if terms[i] <= terms[i-1] {
						t.Errorf("replica %s charged step 6 twice in term %d (terms %v)", id, terms[i], terms)
					}
				}
			}
		})
	}
}
