package coordinatortest

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/pki"
	"github.com/dpcluster/dpcluster/transport"
)

// observer records what left the replicas (every Params message, on a
// link no partition cuts) and what the replicas committed (θ and its step,
// sampled from every live replica's state machine every 2 ms).
type observer struct {
	c    *Cluster
	conn *transport.Client

	mu        sync.Mutex
	published map[uint64][][]float32 // the distinct θ published for each version
	committed map[int64][]float32    // θ_t seen on some replica's FSM at step t
	problems  []string               // invariant violations, as they are seen
	messages  int
}

func newObserver(c *Cluster) (*observer, error) {
	conn, err := transport.NewClient(c.net.Link("observer"), c.clientConfig(pki.RoleObserver, "observer"), c.log)
	if err != nil {
		return nil, err
	}
	o := &observer{c: c, conn: conn, published: make(map[uint64][][]float32), committed: make(map[int64][]float32)}
	if _, err := conn.Subscribe(transport.TopicParams, o.onParams); err != nil {
		conn.Close()
		return nil, err
	}
	return o, nil
}

func (o *observer) onParams(m transport.Message) {
	p, ok := m.(transport.Params)
	if !ok {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.messages++
	vs := o.published[p.Version]
	if !slices.ContainsFunc(vs, func(v []float32) bool { return bitsEqual(v, p.Values) }) {
		o.published[p.Version] = append(vs, slices.Clone([]float32(p.Values)))
	}
}

// sample records every live replica's committed θ until ctx ends.
func (o *observer) sample(ctx context.Context) {
	for sleep(ctx, 2*time.Millisecond) == nil {
		for _, m := range o.c.live() {
			o.record(m.id, m.replica)
		}
	}
}

func (o *observer) record(id string, r *coordinator.Replica) {
	theta, step := r.FSM().Params(nil)
	if theta == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if prev, ok := o.committed[step]; !ok {
		o.committed[step] = theta
	} else if !bitsEqual(prev, theta) {
		o.problems = append(o.problems, fmt.Sprintf("replica %s holds a θ_%d that another replica does not", id, step))
	}
}

// Published returns how many Params messages the observer received and
// the highest version among them (-1: none).
func (c *Cluster) Published() (messages int, top int64) {
	o := c.obs
	o.mu.Lock()
	defer o.mu.Unlock()
	top = -1
	for v := range o.published {
		top = max(top, int64(v))
	}
	return o.messages, top
}

// EnsureSame waits (at most 10 s) until every live replica has applied
// the same step and holds bit for bit the same state (FSM.Digest: θ, the
// optimizer state, the ledger head), and fails t if they never do. Call it
// when the replicas can converge: the run finished (Wait) or no step can
// be taken.
func (c *Cluster) EnsureSame(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		digests := make(map[string]string)
		var steps []int64
		for _, m := range c.live() {
			d, err := m.replica.FSM().Digest()
			if err != nil {
				t.Fatalf("replica %s: digest: %v", m.id, err)
			}
			digests[m.id] = d
			steps = append(steps, m.replica.FSM().State().Applied)
		}
		same := true
		for _, d := range digests {
			for _, e := range digests {
				same = same && d == e
			}
		}
		if same && slices.Min(steps) == slices.Max(steps) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas differ after 10 s: steps %v, digests %v", steps, digests)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Check asserts docs/PRIVACY.md's invariants on the run so far; call it after
// Wait (the ledgers are audited, so no step may be in flight):
//
//   - charge before release: every θ_t the observer saw published is
//     covered by a charge of step t in every live replica's ledger, one
//     charge per distinct θ_t published (a leader that died after step t's
//     charge committed and before its g̃ did may have released a θ_t the
//     next leader replaces after charging step t again); the committed θ_t,
//     wherever a replica's was sampled, is among those published (the
//     final one always is);
//   - replicas agree: no two replicas were seen holding different θ at
//     the same step;
//   - every applied step charged: each live replica's ledger audits clean,
//     with an applied (non-replay) charge for each step 1…Applied, in
//     order, and as many charges as the state machine counts; once the
//     run stopped, an end record stating exactly Applied (a step charged
//     ahead, its g̃ never committed, counted as unapplied), and while it
//     runs perhaps one more applied charge (Applied+1, charged ahead).
func (c *Cluster) Check(t testing.TB) {
	t.Helper()
	final := c.Applied()
	for _, m := range c.live() {
		c.obs.record(m.id, m.replica)
	}
	charges := make(map[string]map[int64]int) // replica → step → charges
	for _, m := range c.live() {
		charges[m.id] = make(map[int64]int)
		for _, r := range chargeRecords(t, m) {
			charges[m.id][r.Step]++
		}
	}
	o := c.obs
	o.mu.Lock()
	for _, p := range o.problems {
		t.Error(p)
	}
	checked := 0
	for v, thetas := range o.published {
		for id, byStep := range charges {
			if v > 0 && byStep[int64(v)] < len(thetas) {
				t.Errorf("%d distinct θ_%d published, replica %s's ledger charges step %d %d times", len(thetas), v, id, v, byStep[int64(v)])
			}
		}
		if int64(v) > final {
			continue // released once charged; its g̃ never committed
		}
		if want, ok := o.committed[int64(v)]; ok {
			checked++
			if !slices.ContainsFunc(thetas, func(th []float32) bool { return bitsEqual(th, want) }) {
				t.Errorf("θ_%d committed was never published (%d other values were)", v, len(thetas))
			}
		}
	}
	if _, ok := o.published[uint64(final)]; !ok {
		t.Logf("final θ_%d not seen by the observer (dropped?)", final)
	}
	o.mu.Unlock()
	if checked == 0 {
		t.Error("no published θ could be compared with a committed one")
	}
	for _, m := range c.live() {
		st := m.replica.FSM().State()
		if st.Fatal != nil {
			t.Errorf("replica %s failed: %v", m.id, st.Fatal)
		}
		// The replica is live: its ledger is audited up to its last
		// complete record, and without an end record its last step
		// charged is unconfirmed (counted apart from Applied).
		contents, err := ledger.ReadContents(filepath.Join(m.dir, coordinator.LedgerFile))
		rep := contents.Audit(ledger.AuditOptions{Live: true})
		charged := int64(rep.Applied + rep.Unconfirmed)
		switch {
		case err != nil:
			t.Errorf("replica %s: audit: %v", m.id, err)
		case !rep.OK:
			t.Errorf("replica %s: ledger audit: %v", m.id, rep.Problems)
		case st.Stopped != "" && (!rep.Ended || rep.EndStep != st.Applied || int64(rep.Applied) != st.Applied):
			t.Errorf("replica %s: the run stopped after %d steps (%s), the ledger states %v, step %d (%q), %d applied",
				m.id, st.Applied, st.Stopped, rep.Ended, rep.EndStep, rep.EndReason, rep.Applied)
		case st.Stopped == "" && charged != st.Applied && !(charged == st.Applied+1 && rep.LastStep == st.Applied+1):
			// (While the run runs, one more: the step charged ahead,
			// its g̃ not committed yet.)
			t.Errorf("replica %s: ledger has %d applied charges up to step %d, the state machine applied %d steps",
				m.id, charged, rep.LastStep, st.Applied)
		case uint64(rep.Charges) != st.Charges || rep.Charges < rep.Applied:
			t.Errorf("replica %s: ledger has %d charges, state machine %d, applied %d", m.id, rep.Charges, st.Charges, rep.Applied)
		}
	}
}

// chargeRecords returns the charge records of m's ledger (none, after
// failing t, if it cannot be read).
func chargeRecords(t testing.TB, m *member) []ledger.Record {
	t.Helper()
	recs, _, err := ledger.ReadFile(filepath.Join(m.dir, coordinator.LedgerFile))
	if err != nil {
		t.Errorf("replica %s: reading the ledger: %v", m.id, err)
		return nil
	}
	return slices.DeleteFunc(recs, func(r ledger.Record) bool { return r.Kind != ledger.RecordCharge })
}

func bitsEqual(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}
