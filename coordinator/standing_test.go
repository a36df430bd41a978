package coordinator

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpcluster/dpcluster/aggregation"
	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/transport"
)

// standingRun is a one-replica run over real NATS and Raft with two
// scripted members: "good", which answers every round at once, and
// "other", which answers as otherFor says (a nil sum: not at all).
type standingRun struct {
	sum      Summary
	err      error
	took     time.Duration
	progress []Progress
	status   Status
	reg      *prometheus.Registry
	server   *Server
	logs     *syncBuffer
	// reported are the non-empty Standing fields of the replica's
	// reports on the control subject (what coordinator status prints).
	mu       sync.Mutex
	reported []string
}

// syncBuffer is a bytes.Buffer safe for the loop's logger and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func runWithMember(t *testing.T, c RunConfig, roundTimeout time.Duration, otherFor func(uint64) (int64, []float32), watch func(*Server)) *standingRun {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	coordConn, dial := natsPair(t, c.Run)
	startScriptNode(t, ctx, dial("good"), "good", c.ModelHash, shardOf(0), func(step uint64) (int64, []float32) {
		return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm)
	})
	startScriptNode(t, ctx, dial("other"), "other", c.ModelHash, shardOf(1), otherFor)
	out := &standingRun{logs: &syncBuffer{}}
	if _, err := dial("watch").Subscribe(transport.TopicControl, func(m transport.Message) {
		if v, ok := m.(transport.Control); ok && v.Code == transport.ControlReplica && v.Standing != "" {
			out.mu.Lock()
			out.reported = append(out.reported, v.Standing)
			out.mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	r := openReplicaForServer(t, dir)
	waitLeader(t, r)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg, c.Run, r.ID())
	if err != nil {
		t.Fatal(err)
	}
	scfg := DefaultServerConfig()
	scfg.MinNodes = 2
	scfg.RoundTimeout = roundTimeout
	scfg.Noise = mechanism.NewSeededNoiseSource(1)
	scfg.Metrics = m
	out.reg = reg
	scfg.AnnounceEvery = 100 * time.Millisecond // the replica reports, which coordinator status reads
	scfg.OnStep = func(p Progress) {
		out.mu.Lock()
		out.progress = append(out.progress, p)
		out.mu.Unlock()
	}
	s, err := NewServer(r, coordConn, c, scfg, slog.New(slog.NewTextHandler(out.logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	out.server = s
	var wg sync.WaitGroup
	wctx, stopWatch := context.WithCancel(ctx)
	if watch != nil {
		wg.Go(func() {
			for wctx.Err() == nil {
				watch(s)
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	start := time.Now()
	out.sum, out.err = s.Run(ctx)
	out.took = time.Since(start)
	stopWatch()
	wg.Wait()
	out.status = s.Status()
	t.Logf("%d steps in %v (%.1f steps/s) with a %v round deadline", out.sum.Steps, out.took, float64(out.sum.Steps)/out.took.Seconds(), roundTimeout)
	return out
}

// TestSilentMemberDoesNotHoldUpRounds: a member that heartbeats but never
// answers makes the first round wait out its deadline and then stops
// holding rounds up: the run's 20 steps take far less than 20 deadlines,
// every step includes the good node, and the leader reports the member
// as out of good standing (missed) in its status and metrics.
func TestSilentMemberDoesNotHoldUpRounds(t *testing.T) {
	c := testRunConfig()
	c.MaxSteps = 20
	const deadline = 2 * time.Second
	res := runWithMember(t, c, deadline, func(uint64) (int64, []float32) { return 0, nil }, nil)
	if res.err != nil || res.sum.Steps != c.MaxSteps {
		t.Fatalf("Run: %+v, %v", res.sum, res.err)
	}
	// Before, every round waited for the silent member: 20 deadlines,
	// 40 s. Now the first round waits (the member misses it) and a few
	// more wait as it is given its chances back; the rest close as soon
	// as the good node has answered.
	if limit := 8 * deadline; res.took > limit {
		t.Errorf("20 steps took %v with a silent member and a %v round deadline, want well under %v", res.took, deadline, limit)
	}
	for _, p := range res.progress {
		if p.Participants < 1 {
			t.Errorf("step %d released with %d participants", p.Step, p.Participants)
		}
	}
	checkStandingShown(t, res, "other", standingMissed)
	res.mu.Lock()
	if !slices.ContainsFunc(res.reported, func(r string) bool { return strings.Contains(r, "other (missed at step 1)") }) {
		t.Errorf("no replica report named the silent member out of good standing: %q", res.reported)
	}
	res.mu.Unlock()
	if n := labelled(t, res.reg, "dpcluster_coordinator_rounds_closed_total", "cause", closedDeadline); n > 4 {
		t.Errorf("%v rounds closed at their deadline, want at most 4 (the first miss and the member's chances back)", n)
	}
	if n := labelled(t, res.reg, "dpcluster_coordinator_rounds_closed_total", "cause", closedStandingAnswered); n < 10 {
		t.Errorf("%v rounds closed once the members in good standing answered, want most of the 20", n)
	}
}

// TestRefusedMemberDoesNotHoldUpRounds: a member whose every contribution
// is refused (NaN; a count over the bound) stops holding up rounds the
// moment it is refused, even in the first round: no round waits out its
// deadline.
func TestRefusedMemberDoesNotHoldUpRounds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		detail string
		bad    func(c RunConfig) func(uint64) (int64, []float32)
	}{
		{"nan", "nan", func(c RunConfig) func(uint64) (int64, []float32) {
			return func(step uint64) (int64, []float32) {
				s := sentinelSum(1, step, c.Dim, 10, c.Optimizer.ClipNorm)
				s[3] = float32(math.NaN())
				return 10, s
			}
		}},
		{"count", "count_too_large", func(c RunConfig) func(uint64) (int64, []float32) {
			return func(step uint64) (int64, []float32) {
				return 1250, sentinelSum(1, step, c.Dim, 1250, c.Optimizer.ClipNorm) // the whole shard: over CountBound at q = 0.01
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testRunConfig()
			c.MaxSteps = 20
			const deadline = 2 * time.Second
			res := runWithMember(t, c, deadline, tc.bad(c), nil)
			if res.err != nil || res.sum.Steps != c.MaxSteps {
				t.Fatalf("Run: %+v, %v", res.sum, res.err)
			}
			if limit := 5 * deadline; res.took > limit {
				t.Errorf("20 steps took %v with a refused member and a %v round deadline, want well under %v", res.took, deadline, limit)
			}
			for _, p := range res.progress {
				if p.Participants != 1 {
					t.Errorf("step %d accepted %d contributions, want 1 (the good node)", p.Step, p.Participants)
				}
			}
			if n := labelled(t, res.reg, "dpcluster_coordinator_rounds_closed_total", "cause", closedDeadline); n > 1 {
				t.Errorf("%v rounds closed at their deadline, want at most 1 (a refusal stops the wait at once)", n)
			}
			checkStandingShown(t, res, "other", standingRefused)
			for _, n := range res.status.Nodes {
				if n.ID == "other" && n.StandingDetail != tc.detail {
					t.Errorf("node other's standing detail %q, want %q", n.StandingDetail, tc.detail)
				}
			}
		})
	}
}

// TestMemberRegainsGoodStanding: a member silent for its first rounds
// loses good standing, is still sent every RoundStart, and once it answers
// in time (at the latest in a round that waits for it again) regains good
// standing: its contributions are included in every later step, and the
// status and metrics say so. While it was out, the status and the gauge
// showed it.
func TestMemberRegainsGoodStanding(t *testing.T) {
	c := testRunConfig()
	c.MaxSteps = 400
	const deadline = time.Second
	var answer atomic.Bool
	var sawOut atomic.Bool
	res := runWithMember(t, c, deadline, func(step uint64) (int64, []float32) {
		if !answer.Load() {
			return 0, nil
		}
		return 10, sentinelSum(1, step, c.Dim, 10, c.Optimizer.ClipNorm)
	}, func(s *Server) {
		if answer.Load() {
			return
		}
		for _, n := range s.Status().Nodes {
			if n.ID == "other" && n.Standing == standingMissed {
				sawOut.Store(true)
				answer.Store(true) // it recovers once the leader has shown it out
			}
		}
	})
	if res.err != nil || res.sum.Steps != c.MaxSteps {
		t.Fatalf("Run: %+v, %v", res.sum, res.err)
	}
	if !sawOut.Load() {
		t.Fatal("the silent member was never shown out of good standing")
	}
	last := res.progress[len(res.progress)-1]
	if last.Participants != 2 {
		t.Errorf("the last step accepted %d contributions, want 2: the recovered member's included again", last.Participants)
	}
	checkStandingShown(t, res, "other", standingGood)
	if v := labelled(t, res.reg, "dpcluster_coordinator_nodes_out_of_standing", "reason", standingMissed); v != 0 {
		t.Errorf("nodes_out_of_standing{reason=missed} = %v at the end, want 0", v)
	}
	if n := labelled(t, res.reg, "dpcluster_coordinator_node_standing_changes_total", "change", "regained"); n < 1 {
		t.Errorf("node_standing_changes_total{change=regained} = %v, want at least 1", n)
	}
	logs := res.logs.String()
	for _, want := range []string{
		`msg="node lost good standing: rounds no longer wait for it" node=other reason=missed detail=deadline`,
		`msg="node regained good standing: rounds wait for it again" node=other was=missed`,
	} {
		if strings.Count(logs, want) != 1 {
			t.Errorf("the log has %d lines %q, want 1", strings.Count(logs, want), want)
		}
	}
}

// checkStandingShown checks that the last status lists node id with
// standing want, and that the gauge of members out of standing counts it
// under its reason (or under none, for good standing).
func checkStandingShown(t *testing.T, res *standingRun, id, want string) {
	t.Helper()
	found := false
	for _, n := range res.status.Nodes {
		if n.ID == id {
			found = true
			if n.Standing != want {
				t.Errorf("status: node %s standing %q, want %q", id, n.Standing, want)
			}
		}
	}
	if !found {
		t.Errorf("status lists no node %s: %+v", id, res.status.Nodes)
	}
	if want == standingGood {
		return
	}
	if v := labelled(t, res.reg, "dpcluster_coordinator_nodes_out_of_standing", "reason", want); v != 1 {
		t.Errorf("nodes_out_of_standing{reason=%s} = %v, want 1", want, v)
	}
	if len(res.status.OutOfStanding) == 0 {
		t.Errorf("status out_of_standing is empty, want node %s", id)
	}
}

// TestStandingRules: the rules of standing.go on the registry alone. A
// member that misses a round it was waited for is out and waited for
// again after RoundTimeout, then twice as long after each chance it
// misses, at most standingRetryMax; a round whose members are all out and
// none due waits for all of them (it does not close empty at once); an
// accepted answer restores good standing; a restarted node starts in it.
func TestStandingRules(t *testing.T) {
	const rt = time.Second
	t0 := time.Unix(1000, 0)
	r := registry{nodes: map[string]nodeInfo{}}
	r.seen("a", "s1", shardClaim{count: 2, size: 1}, t0)
	r.seen("b", "s1", shardClaim{index: 1, count: 2, size: 1}, t0)
	members := []string{"a", "b"}
	round := func(step int64, at time.Time, accepted, missing []string, refused map[string]aggregation.Reason) *openRound {
		w := r.awaited(members, at)
		or := &openRound{step: step, awaited: w, awaiting: map[string]bool{}, refused: refused}
		for id := range w {
			if !slices.Contains(accepted, id) && refused[id] == 0 {
				or.awaiting[id] = true
			}
		}
		r.settleStanding(or, aggregation.Result{Accepted: accepted, Missing: missing}, at, rt)
		return or
	}
	// Step 1: b misses a round that waited for it.
	round(1, t0, []string{"a"}, []string{"b"}, map[string]aggregation.Reason{})
	if s := r.nodes["b"].standing; s.out != standingMissed || !s.retryAt.Equal(t0.Add(rt)) {
		t.Fatalf("after a miss: %+v", s)
	}
	// Before its chance, rounds wait for a only.
	if w := r.awaited(members, t0.Add(rt/2)); !maps.Equal(w, map[string]bool{"a": true}) {
		t.Errorf("awaited before b's chance: %v", w)
	}
	// Its chance comes, and it misses it: the next is twice as far.
	t1 := t0.Add(rt)
	or := round(2, t1, []string{"a"}, []string{"b"}, map[string]aggregation.Reason{})
	if !or.awaited["b"] {
		t.Fatal("the round at b's chance did not wait for it")
	}
	if s := r.nodes["b"].standing; s.misses != 2 || !s.retryAt.Equal(t1.Add(2*rt)) {
		t.Errorf("after a missed chance: misses %d, retry at %v, want 2 and %v", s.misses, s.retryAt, t1.Add(2*rt))
	}
	if d := retryAfter(rt, 30); d != standingRetryMax {
		t.Errorf("retryAfter(%v, 30) = %v, want the cap %v", rt, d, standingRetryMax)
	}
	if d := retryAfter(2*standingRetryMax, 3); d != 2*standingRetryMax {
		t.Errorf("retryAfter never waits less than the round timeout: %v", d)
	}
	// a is refused: both are out, none due: the next round waits for both.
	round(3, t1.Add(rt/4), nil, []string{"a", "b"}, map[string]aggregation.Reason{"a": aggregation.ReasonNaN})
	if s := r.nodes["a"].standing; s.out != standingRefused || s.detail != "nan" {
		t.Errorf("a after a NaN: %+v", s)
	}
	if w := r.awaited(members, t1.Add(rt/2)); len(w) != 2 {
		t.Errorf("all out, none due: awaited %v, want both", w)
	}
	// b answers (beating the others, unawaited): good standing again.
	round(4, t1.Add(rt/2), []string{"b"}, []string{"a"}, map[string]aggregation.Reason{})
	if s := r.nodes["b"].standing; s.out != "" {
		t.Errorf("b after an accepted answer: %+v", s)
	}
	// a restarts (a new incarnation): good standing.
	r.seen("a", "s2", shardClaim{count: 2, size: 1}, t1.Add(rt))
	if s := r.nodes["a"].standing; s.out != "" {
		t.Errorf("a after a restart: %+v", s)
	}
}
