package coordinator

import (
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
	c := testRunConfig()
	grads := noisyGrads(3, 15)
	r, ctx := startConfigured(t, t.TempDir(), freeAddr(t), c)
	defer r.Close()
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
	// The step that ε runs through is exported beside it, read from the
	// ledger the same way: step 4, charged and not applied.
	if got := gaugeValue(t, reg, "dpcluster_coordinator_charged_step"); got != 4 {
		t.Errorf("charged_step = %v, want 4 (epsilon_spent counts step 4's charge)", got)
	}
}

// TestEpsilonGaugeDoesNotWaitForTheStateMachine: a scrape answers while
// the state machine holds its lock (a replica restoring a snapshot, which
// replays its ledger under it), with the ε charged so far. The first
// version of the gauge read State, which waits for the lock: a restarting
// replica's /metrics hung for its whole restore, and the failover soak's
// harness, which scrapes every replica, fell 100 steps behind its
// schedule.
func TestEpsilonGaugeDoesNotWaitForTheStateMachine(t *testing.T) {
	f := newTestFSM(t, t.TempDir())
	c := testRunConfig()
	mustApply(t, f, logEntry(t, 1, entryConfig, c))
	for i, g := range noisyGrads(2, 16) {
		mustApply(t, f, stepLog(t, uint64(i+2), int64(i+1), c, g))
	}
	want := f.State().Epsilon
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg, c.Run, "r1")
	if err != nil {
		t.Fatal(err)
	}
	m.fsm.Store(f)
	f.mu.Lock() // what Restore holds
	defer f.mu.Unlock()
	got := make(chan float64, 1)
	go func() { got <- gaugeValue(t, reg, "dpcluster_coordinator_epsilon_spent") }()
	select {
	case v := <-got:
		if v != want {
			t.Errorf("epsilon_spent = %v, want %v", v, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a scrape waited 5 s for the state machine's lock")
	}
}
