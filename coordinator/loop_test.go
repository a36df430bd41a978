package coordinator

import (
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/transport"
)

// heldConsensus is a real Replica whose membership changes and, when
// holdSteps is set, step charges block until release is closed (or
// their context ends): a Raft operation that never gets its quorum. It
// also lists extra voters that do not exist, so a removal has something to
// remove.
type heldConsensus struct {
	*Replica
	release   chan struct{}
	holdSteps atomic.Bool
	extra     []Voter

	mu    sync.Mutex
	calls []string
	grads map[int64][]float32 // g̃ proposed, by step (if not nil)
}

func (h *heldConsensus) record(call string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, call)
}

func (h *heldConsensus) called(call string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Contains(h.calls, call)
}

func (h *heldConsensus) hold(ctx context.Context) error {
	select {
	case <-h.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *heldConsensus) Voters() ([]Voter, error) {
	vs, err := h.Replica.Voters()
	return append(vs, h.extra...), err
}

func (h *heldConsensus) AddVoter(ctx context.Context, id, addr string) error {
	h.record("add " + id)
	return h.hold(ctx)
}

func (h *heldConsensus) RemoveVoter(ctx context.Context, id string) error {
	h.record("remove " + id)
	return h.hold(ctx)
}

func (h *heldConsensus) ProposeGrad(ctx context.Context, step int64, charge uint64, g []float32) (func() (ApplyResult, error), error) {
	h.mu.Lock()
	if h.grads != nil {
		h.grads[step] = slices.Clone(g)
	}
	h.mu.Unlock()
	return h.Replica.ProposeGrad(ctx, step, charge, g)
}

func (h *heldConsensus) ProposeCharge(ctx context.Context, step int64, e accounting.Event, round string) (ApplyResult, error) {
	if h.holdSteps.Load() {
		h.record("step")
		if err := h.hold(ctx); err != nil {
			return ApplyResult{}, err
		}
	}
	return h.Replica.ProposeCharge(ctx, step, e, round)
}

// TestServerRoundsGoOnDuringMembershipChange: a membership change whose
// Raft call blocks (a joining replica that never answers) holds neither
// the control handler nor the round loop: steps keep being committed while
// it runs, and the next request is acted on once it returns.
func TestServerRoundsGoOnDuringMembershipChange(t *testing.T) {
	c := testRunConfig()
	c.MaxSteps = 60
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coordConn, dial := natsPair(t, c.Run)
	startScriptNode(t, ctx, dial("n"), "n", c.ModelHash, shardOf(0), func(step uint64) (int64, []float32) {
		return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm)
	})
	r := openReplicaForServer(t, t.TempDir())
	waitLeader(t, r)
	held := &heldConsensus{Replica: r, release: make(chan struct{}), extra: []Voter{{ID: "r2", Addr: "10.0.0.2:7000"}}}
	scfg := DefaultServerConfig()
	scfg.Noise, scfg.DrainTimeout = mechanism.NewSeededNoiseSource(3), 50*time.Millisecond
	s, err := NewServer(held, coordConn, c, scfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		sum Summary
		err error
	}
	res := make(chan result, 1)
	go func() { sum, err := s.Run(ctx); res <- result{sum, err} }()

	applied := func() int64 { return r.FSM().State().Applied }
	waitFor(t, ctx, "step 3", func() bool { return applied() >= 3 })
	op := dial("r9")
	join := transport.Control{Run: c.Run, From: "r9", Code: transport.ControlJoin, Addr: "10.0.0.9:7000"}
	if err := op.Publish(ctx, join); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the join's AddVoter", func() bool { return held.called("add r9") })
	at := applied()
	waitFor(t, ctx, "5 steps while AddVoter is held", func() bool { return applied() >= at+5 })
	close(held.release)
	remove := transport.Control{Run: c.Run, From: "r9", Code: transport.ControlRemove, Replica: "r2"}
	waitFor(t, ctx, "the removal's RemoveVoter", func() bool {
		_ = op.Publish(ctx, remove) // dropped while the join's change is still finishing
		return held.called("remove r2") || applied() >= c.MaxSteps
	})
	if !held.called("remove r2") {
		t.Error("the removal request was never acted on")
	}
	got := <-res
	if got.err != nil || got.sum.Steps != c.MaxSteps {
		t.Fatalf("Run: %+v, %v", got.sum, got.err)
	}
}

// TestServerServesWhileProposalHeld: while a step's proposal waits for a
// quorum that does not come, the replica goes on serving: it keeps
// announcing its leadership, registers a node that joins meanwhile (its
// reports count it) and releases nothing past the committed θ. When the
// proposal returns, the run goes on to the end.
func TestServerServesWhileProposalHeld(t *testing.T) {
	c := testRunConfig()
	c.MaxSteps = 12
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coordConn, dial := natsPair(t, c.Run)
	startScriptNode(t, ctx, dial("n0"), "n0", c.ModelHash, shardOf(0), func(step uint64) (int64, []float32) {
		return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm)
	})
	var announced, maxNodes atomic.Int64
	var maxVersion atomic.Uint64
	watch := dial("watch")
	for _, sub := range []struct {
		topic transport.Topic
		h     transport.Handler
	}{
		{transport.TopicLeader, func(transport.Message) { announced.Add(1) }},
		{transport.TopicControl, func(m transport.Message) {
			if v, ok := m.(transport.Control); ok && v.Code == transport.ControlReplica && int64(v.Nodes) > maxNodes.Load() {
				maxNodes.Store(int64(v.Nodes))
			}
		}},
		{transport.TopicParams, func(m transport.Message) {
			if v, ok := m.(transport.Params); ok && v.Version > maxVersion.Load() {
				maxVersion.Store(v.Version)
			}
		}},
	} {
		if _, err := watch.Subscribe(sub.topic, sub.h); err != nil {
			t.Fatal(err)
		}
	}
	r := openReplicaForServer(t, t.TempDir())
	waitLeader(t, r)
	held := &heldConsensus{Replica: r, release: make(chan struct{})}
	scfg := DefaultServerConfig()
	scfg.Noise, scfg.AnnounceEvery = mechanism.NewSeededNoiseSource(4), 50*time.Millisecond
	s, err := NewServer(held, coordConn, c, scfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() { _, err := s.Run(ctx); res <- err }()

	waitFor(t, ctx, "step 2", func() bool { return r.FSM().State().Applied >= 2 })
	held.holdSteps.Store(true)
	waitFor(t, ctx, "a held proposal", func() bool { return held.called("step") })
	at := r.FSM().State().Applied
	before := announced.Load()
	startScriptNode(t, ctx, dial("n1"), "n1", c.ModelHash, shardOf(1), func(step uint64) (int64, []float32) {
		return 10, sentinelSum(1, step, c.Dim, 10, c.Optimizer.ClipNorm)
	})
	waitFor(t, ctx, "3 announcements while the proposal is held", func() bool { return announced.Load() >= before+3 })
	waitFor(t, ctx, "the new node in a replica report", func() bool { return maxNodes.Load() >= 2 })
	if got := r.FSM().State().Applied; got != at {
		t.Fatalf("applied moved from %d to %d while the proposal was held", at, got)
	}
	if v := maxVersion.Load(); v > uint64(at) {
		t.Fatalf("θ version %d published while only step %d is committed", v, at)
	}
	held.holdSteps.Store(false)
	close(held.release)
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if got := r.FSM().State().Applied; got != c.MaxSteps {
		t.Fatalf("applied %d steps, want %d", got, c.MaxSteps)
	}
}

// TestServerRunStopsItsGoroutines: Run returns on cancellation even while
// a Raft operation it started is held: the operation sees its context
// end, and Run returns only after its goroutines have.
func TestServerRunStopsItsGoroutines(t *testing.T) {
	c := testRunConfig()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	coordConn, dial := natsPair(t, c.Run)
	startScriptNode(t, ctx, dial("n"), "n", c.ModelHash, shardOf(0), func(step uint64) (int64, []float32) {
		return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm)
	})
	r := openReplicaForServer(t, t.TempDir())
	waitLeader(t, r)
	held := &heldConsensus{Replica: r, release: make(chan struct{})}
	held.holdSteps.Store(true)
	scfg := DefaultServerConfig()
	scfg.Noise = mechanism.NewSeededNoiseSource(5)
	s, err := NewServer(held, coordConn, c, scfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	res := make(chan error, 1)
	go func() { _, err := s.Run(runCtx); res <- err }()
	waitFor(t, ctx, "a held proposal", func() bool { return held.called("step") })
	stop()
	select {
	case err := <-res:
		if err != context.Canceled {
			t.Fatalf("Run: %v, want context.Canceled", err)
		}
	case <-ctx.Done():
		t.Fatal("Run did not return after cancellation with a proposal held")
	}
}

// TestThetaNeverReleasedBeforeCommit: charge before release, as seen on
// the wire, whatever carries θ (Params, or a RoundStart's optional inline
// params): while step t's charge is held (not committed), nothing that
// depends on step t goes out — no RoundStart for round t+1, no θ of
// version t — and every θ that does go out is bit for bit θ₀ (recorded
// from the state machine once the run is configured) moved by the
// optimizer with the g̃ of each step, as proposed in the grad entries,
// which is also the state machine's final θ. Every θ version, the final
// one included, is released.
func TestThetaNeverReleasedBeforeCommit(t *testing.T) {
	c := testRunConfig()
	c.MaxSteps = 8
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coordConn, dial := natsPair(t, c.Run)
	startScriptNode(t, ctx, dial("n0"), "n0", c.ModelHash, shardOf(0), func(step uint64) (int64, []float32) {
		return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm)
	})
	type release struct {
		kind          string
		step, version uint64 // step: the RoundStart's round (0 for Params)
		theta         []float32
	}
	var (
		mu       sync.Mutex
		releases []release
	)
	watch := dial("watch")
	h := func(m transport.Message) {
		var r release
		switch v := m.(type) {
		case transport.RoundStart:
			r = release{kind: "RoundStart", step: v.Step, version: v.ParamsVersion, theta: slices.Clone([]float32(v.Params))}
		case transport.Params:
			r = release{kind: "Params", version: v.Version, theta: slices.Clone([]float32(v.Values))}
		}
		mu.Lock()
		releases = append(releases, r)
		mu.Unlock()
	}
	for _, topic := range []transport.Topic{transport.TopicRounds, transport.TopicParams} {
		if _, err := watch.Subscribe(topic, h); err != nil {
			t.Fatal(err)
		}
	}
	snapshot := func() []release {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(releases)
	}
	r := openReplicaForServer(t, t.TempDir())
	waitLeader(t, r)
	var theta0 []float32
	held := &heldConsensus{Replica: r, release: make(chan struct{}), grads: map[int64][]float32{}}
	cons := &configHook{heldConsensus: held, after: func() { // θ₀, before any step
		theta0, _ = r.FSM().Params(nil)
	}}
	scfg := DefaultServerConfig()
	scfg.Noise, scfg.AnnounceEvery = mechanism.NewSeededNoiseSource(6), 50*time.Millisecond
	scfg.OnStep = func(p Progress) { // on the loop, right after θ of step p.Step is released
		if p.Step == 3 {
			// Hold from the next proposal on. Set here, on the loop, not
			// by the test after it sees step 3: the run's 8 steps could
			// all be done by then (1 run in 4 before).
			held.holdSteps.Store(true)
		}
	}
	s, err := NewServer(cons, coordConn, c, scfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() { _, err := s.Run(ctx); res <- err }()

	waitFor(t, ctx, "step 3", func() bool { return r.FSM().State().Applied >= 3 })
	waitFor(t, ctx, "a held proposal", func() bool { return held.called("step") })
	at := r.FSM().State().Charges // steps 1..at are charged; at+1's charge is held
	// Let the loop run while the proposal is held: several announcements.
	var announced atomic.Int64
	if _, err := watch.Subscribe(transport.TopicLeader, func(transport.Message) { announced.Add(1) }); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "3 announcements while the proposal is held", func() bool { return announced.Load() >= 3 })
	if got := r.FSM().State().Charges; got != at {
		t.Fatalf("charges moved from %d to %d while the charge was held", at, got)
	}
	for _, rel := range snapshot() {
		if rel.version > at || rel.step > at+1 {
			t.Fatalf("while step %d's proposal was held (step %d committed): %s of round %d with θ version %d went out",
				at+1, at, rel.kind, rel.step, rel.version)
		}
	}
	held.holdSteps.Store(false)
	close(held.release)
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if got := r.FSM().State().Applied; got != c.MaxSteps {
		t.Fatalf("applied %d steps, want %d", got, c.MaxSteps)
	}
	waitFor(t, ctx, "the final θ", func() bool {
		return slices.ContainsFunc(snapshot(), func(r release) bool { return r.kind == "Params" && r.version == uint64(c.MaxSteps) })
	})
	// θ of every version, from θ₀ and the proposed g̃ (dpadam is pure).
	committed := map[uint64][]float32{0: theta0}
	opt, err := dpadam.New(c.Optimizer, c.Dim)
	if err != nil {
		t.Fatal(err)
	}
	theta := slices.Clone(theta0)
	held.mu.Lock()
	for v := int64(1); v <= c.MaxSteps; v++ {
		if _, err := opt.Step(theta, held.grads[v]); err != nil {
			t.Fatalf("step %d: %v", v, err)
		}
		committed[uint64(v)] = slices.Clone(theta)
	}
	held.mu.Unlock()
	if final, _ := r.FSM().Params(nil); !bitsEqual(final, theta) {
		t.Error("the state machine's final θ is not θ₀ moved by the proposed g̃")
	}
	released := map[uint64]bool{} // θ versions released so far
	for _, rel := range snapshot() {
		if rel.kind == "RoundStart" {
			if rel.version != rel.step-1 {
				t.Errorf("round %d's RoundStart names θ version %d, want %d", rel.step, rel.version, rel.step-1)
			}
			if len(rel.theta) == 0 {
				continue // no inline θ; its Params travel on another subscription, in no order with it
			}
		}
		released[rel.version] = true
		want, ok := committed[rel.version]
		if !ok {
			t.Errorf("%s of round %d: θ version %d was never committed", rel.kind, rel.step, rel.version)
			continue
		}
		if !slices.EqualFunc(rel.theta, want, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
			t.Errorf("%s of round %d: θ version %d differs from the committed θ", rel.kind, rel.step, rel.version)
		}
	}
	for v := uint64(0); v <= uint64(c.MaxSteps); v++ {
		if !released[v] {
			t.Errorf("θ version %d never released", v)
		}
	}
}

// configHook calls after once the run configuration's proposal returned.
type configHook struct {
	*heldConsensus
	after func()
}

func (h *configHook) Configure(ctx context.Context, c RunConfig) error {
	err := h.heldConsensus.Configure(ctx, c)
	if err == nil {
		h.after()
	}
	return err
}
