package coordinator

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestEpsilonGaugeNeverBehindTheLedger: the epsilon_spent gauge reads the
// ledger when scraped, so it is never below what was charged. Before, the
// leader set it from the step it had just released (stepApplied) while the
// next step's charge, proposed ahead, could already be in the ledger: a
// scrape then read one charge less than the ledger held until the loop
// next observed the state.
func TestEpsilonGaugeNeverBehindTheLedger(t *testing.T) {
	dir, addr := t.TempDir(), freeAddr(t)
	c := testRunConfig()
	grads := noisyGrads(3, 15)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := openTestReplica(t, dir, addr)
	defer r.Close()
	waitLeader(t, r)
	if err := r.Configure(ctx, c); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg, c.Run, "r1")
	if err != nil {
		t.Fatal(err)
	}
	var last ApplyResult
	for i, g := range grads {
		if last, err = r.ProposeStep(ctx, int64(i+1), c.Event(), g, "test"); err != nil || !last.Applied {
			t.Fatalf("step %d: %+v, %v", i+1, last, err)
		}
		m.observe(r.FSM().State(), r)
	}
	// Step 4's charge lands in the ledger; the leader then reports step 3.
	if res, err := r.ProposeCharge(ctx, 4, c.Event(), "test"); err != nil || !res.Pending {
		t.Fatalf("step 4's charge: %+v, %v", res, err)
	}
	m.stepApplied(Progress{Step: 3, Epsilon: last.Epsilon})
	spent := r.FSM().State().Epsilon
	if !(spent > last.Epsilon) {
		t.Fatalf("ledger ε %v after step 4's charge, %v after step 3's", spent, last.Epsilon)
	}
	if got := gaugeValue(t, reg, "dpcluster_coordinator_epsilon_spent"); got != spent {
		t.Errorf("epsilon_spent = %v, the ledger holds %v (step 3's ε: %v)", got, spent, last.Epsilon)
	}
}
