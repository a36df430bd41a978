package node

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/sampling"
	"github.com/dpcluster/dpcluster/seed"
	"github.com/dpcluster/dpcluster/transport"
	"github.com/dpcluster/dpcluster/transport/fake"
)

func TestJoinAndHeartbeat(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	r := start(t, testConfig(), fx, nc)

	j := recv(t, l.joins, "join")
	want := transport.Join{Run: testRun, NodeID: testNode, ShardSize: int64(fx.shard.Len()), ModelHash: fx.m.Hash(),
		ShardIndex: 0, ShardCount: 1, ShardSeed: 1, SeedPolicy: seed.Crypto, Incarnation: r.w.incarnation}
	if j != want {
		t.Errorf("join = %+v, want %+v", j, want)
	}
	for range 3 {
		h := recv(t, l.heartbeats, "heartbeat")
		wantH := transport.Heartbeat{Run: testRun, NodeID: testNode, ShardSize: int64(fx.shard.Len()), ModelHash: fx.m.Hash(),
			ShardIndex: 0, ShardCount: 1, ShardSeed: 1, SeedPolicy: seed.Crypto, Incarnation: r.w.incarnation}
		if h != wantH {
			t.Errorf("heartbeat = %+v, want %+v", h, wantH)
		}
	}
}

// TestJoinReportsShardAndSeedPolicy: a node reports which shard it holds
// and, when it samples from a seed, says so in Join and Heartbeat, so that
// the leader can refuse overlapping shards and, in a private run, seeded
// nodes (issue 11, items 6 and 7).
func TestJoinReportsShardAndSeedPolicy(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	cfg := testConfig()
	cfg.ShardIndex, cfg.ShardCount, cfg.ShardSeed = 2, 3, 42
	cfg.SeededSampling, cfg.SamplingSeed = true, 5
	start(t, cfg, fx, nc)
	j := recv(t, l.joins, "join")
	if j.ShardIndex != 2 || j.ShardCount != 3 || j.ShardSeed != 42 || j.ShardSize != int64(fx.shard.Len()) ||
		j.SeedPolicy != seed.Seeded {
		t.Errorf("join = %+v, want shard 2 of 3, seed 42, %d examples, seed policy seeded", j, fx.shard.Len())
	}
	h := recv(t, l.heartbeats, "heartbeat")
	if h.ShardIndex != 2 || h.ShardCount != 3 || h.ShardSeed != 42 || h.SeedPolicy != seed.Seeded {
		t.Errorf("heartbeat = %+v, want shard 2 of 3, seed 42, seed policy seeded", h)
	}
}

// TestJoinReportsWeights: a node started from a checkpoint reports its
// weights hash in Join and Heartbeat, through the real codec.
func TestJoinReportsWeights(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	cfg := testConfig()
	cfg.Weights = strings.Repeat("0f", 32)
	start(t, cfg, fx, nc)
	if j := recv(t, l.joins, "join"); j.Weights != cfg.Weights {
		t.Errorf("join weights %q, want %q", j.Weights, cfg.Weights)
	}
	if h := recv(t, l.heartbeats, "heartbeat"); h.Weights != cfg.Weights {
		t.Errorf("heartbeat weights %q, want %q", h.Weights, cfg.Weights)
	}
}

// TestRefusesRoundsOfAnotherRun: the node takes q, C and the model from its
// own configuration. A round naming others — q = 1 with C = 1e6 asks for
// the unclipped sum of the whole shard — is refused, counted and logged,
// and, sent with a higher term by another "leader", does not make the node
// follow it: the real leader's next round is answered (issue 11, item 5).
func TestRefusesRoundsOfAnotherRun(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	reg := prometheus.NewRegistry()
	cfg := testConfig()
	cfg.Registerer = reg
	var logs syncBuffer
	w, err := NewWorker(cfg, fx.m, fx.shard, nc, slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	recv(t, l.joins, "join")
	l.announce("r1", 1)
	recv(t, l.joins, "join for r1")
	l.params(0, 1, fx.theta)
	eventually(t, "params stored", func() bool { return w.Stats().ParamsReceived == 1 })

	forged := []struct {
		name string
		mod  func(*transport.RoundStart)
	}{
		{"q=1, C=1e6, higher term", func(r *transport.RoundStart) {
			r.SampleRate, r.ClipNorm, r.Term, r.Leader, r.Step = 1, 1e6, 9, "mallory", 1<<40
		}},
		{"q one ulp above the run's", func(r *transport.RoundStart) { r.SampleRate = math.Nextafter(testQ, 1) }},
		{"q below the run's", func(r *transport.RoundStart) { r.SampleRate = testQ / 2 }},
		{"C above the run's", func(r *transport.RoundStart) { r.ClipNorm = 2 * testClip }},
		{"another model", func(r *transport.RoundStart) { r.ModelHash = "another-model" }},
		{"no model hash", func(r *transport.RoundStart) { r.ModelHash = "" }},
	}
	for i, tc := range forged {
		rs := fx.round(1, uint64(100+i), 1, wait)
		rs.Params = fx.theta // inline: nothing else is needed to answer
		tc.mod(&rs)
		l.publish(rs)
		eventually(t, tc.name+" refused", func() bool { return w.Stats().Skipped[SkipParamsMismatch] == uint64(i+1) })
		if st := w.Stats(); st.Term != 1 || st.Leader != "r1" {
			t.Fatalf("after a refused round (%s) the node follows %s, term %d; want r1, term 1", tc.name, st.Leader, st.Term)
		}
	}
	none(t, l.contribs, "contribution to a round of another run")
	none(t, l.joins, "join for the forged round's leader")
	if st := w.Stats(); st.Term != 1 || st.Leader != "r1" || st.Answered != 0 {
		t.Errorf("after forged rounds: leader %s term %d, answered %d; want r1, 1, 0", st.Leader, st.Term, st.Answered)
	}
	// The real leader's round (step 1, far below the forged 2⁴⁰) is
	// answered.
	l.publish(fx.round(1, 1, 1, wait))
	c := recv(t, l.contribs, "contribution to the real round")
	checkContribution(t, c, fx.shard.Len(), testQ, testClip)

	if got := counterValue(t, reg, "dpcluster_node_rounds_total", "skipped_params_mismatch"); got != float64(len(forged)) {
		t.Errorf("skipped_params_mismatch = %v, want %d", got, len(forged))
	}
	n := 0
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"reason":"params_mismatch"`) {
			n++
			if !strings.Contains(line, `"level":"WARN"`) {
				t.Errorf("refusal not logged at warn: %s", line)
			}
		}
	}
	if n != len(forged) || !strings.Contains(logs.String(), "sample rate q = 1, the run's is 0.25") {
		t.Errorf("%d params_mismatch log records, want %d naming the values:\n%s", n, len(forged), logs.String())
	}
}

// counterValue returns the value of counter name with label result=result.
func counterValue(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "result" && lp.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{result=%q}", name, result)
	return 0
}

// reference recomputes a seeded node's contribution: the same batch
// (sampling.NewSeededPoisson(q, seed+step)) through a workspace of the
// same capacity.
func reference(t *testing.T, fx fixture, rs transport.RoundStart, seed uint64, maxBatch int) ([]float32, int) {
	t.Helper()
	p, err := sampling.NewSeededPoisson(rs.SampleRate, seed+rs.Step)
	if err != nil {
		t.Fatal(err)
	}
	idx := p.Sample(nil, fx.shard.Len())
	ws, err := fx.m.NewWorkspace(maxBatch)
	if err != nil {
		t.Fatal(err)
	}
	sum := make([]float32, fx.m.NumParams())
	n, err := ws.ClippedSumIndexed(sum, fx.theta, fx.shard, idx, rs.ClipNorm)
	if err != nil {
		t.Fatal(err)
	}
	return sum, n
}

func norm2(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

// checkContribution checks the sensitivity bound and a sane batch size:
// Count ~ Binomial(n, q), within 6 standard deviations of qn.
func checkContribution(t *testing.T, c transport.Contribution, n int, q, clip float64) {
	t.Helper()
	if got, bound := norm2(c.Sum), float64(c.Count)*clip*(1+1e-6); got > bound {
		t.Errorf("‖sum‖ = %v > count·C = %v", got, bound)
	}
	mean, sd := q*float64(n), math.Sqrt(float64(n)*q*(1-q))
	if math.Abs(float64(c.Count)-mean) > 6*sd {
		t.Errorf("count %d outside %v ± 6·%v", c.Count, mean, sd)
	}
}

func TestAnswersOnceWithReferenceSum(t *testing.T) {
	const seed = 99
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	cfg := testConfig()
	cfg.MaxBatch = 16 // a q=0.25 batch of ~100 is computed in chunks
	cfg.SeededSampling, cfg.SamplingSeed = true, seed
	r := start(t, cfg, fx, nc)
	recv(t, l.joins, "join")

	l.announce("r1", 1)
	l.params(0, 1, fx.theta)
	rs := fx.round(1, 77, 1, wait)
	l.publish(rs)

	c := recv(t, l.contribs, "contribution")
	if c.Run != testRun || c.Step != 1 || c.RoundID != 77 || c.NodeID != testNode {
		t.Errorf("contribution header = %s %d %d %s, want %s 1 77 %s", c.Run, c.Step, c.RoundID, c.NodeID, testRun, testNode)
	}
	checkContribution(t, c, fx.shard.Len(), rs.SampleRate, rs.ClipNorm)
	want, wantN := reference(t, fx, rs, seed, cfg.MaxBatch)
	if int(c.Count) != wantN {
		t.Errorf("count = %d, reference %d", c.Count, wantN)
	}
	for i := range want {
		if c.Sum[i] != want[i] { // same batch, same chunking: bit for bit
			t.Fatalf("sum[%d] = %v, reference %v", i, c.Sum[i], want[i])
		}
	}
	// Chunking changes only float32 rounding: one workspace for the whole
	// batch agrees to ~1e-6 relative (float32 sums of ~7 chunks).
	whole, _ := reference(t, fx, rs, seed, fx.shard.Len())
	for i := range whole {
		if d := math.Abs(float64(c.Sum[i] - whole[i])); d > 1e-5*(1+math.Abs(float64(whole[i]))) {
			t.Fatalf("sum[%d] = %v, unchunked %v", i, c.Sum[i], whole[i])
		}
	}

	// The same round again, duplicated by the network or re-sent: no
	// second answer.
	l.publish(rs)
	eventually(t, "duplicate skipped", func() bool { return r.skipped(SkipDuplicate) == 1 })
	none(t, l.contribs, "second contribution to one round")

	// A new round ID for the same step (a new leader reopening it) is a
	// new round.
	rs2 := rs
	rs2.RoundID = 78
	l.publish(rs2)
	c2 := recv(t, l.contribs, "contribution to the reopened round")
	if c2.Step != 1 || c2.RoundID != 78 {
		t.Errorf("reopened round answer is for %d/%d, want 1/78", c2.Step, c2.RoundID)
	}

	eventually(t, "heartbeat with step 1", func() bool {
		h := recv(t, l.heartbeats, "heartbeat")
		return h.Step == 1
	})
	// The count moves just after the publish returns, so the answer can
	// reach the leader first.
	eventually(t, "two answers counted", func() bool { return r.w.Stats().Answered == 2 })
	st := r.w.Stats()
	if st.Answered != 2 || st.LastStep != 1 || st.ParamsReceived != 1 || st.Term != 1 || st.Leader != "r1" {
		t.Errorf("stats = %+v", st)
	}
}

// announcedNode starts a node over NATS with the logreg fixture and
// testConfig, waits for its join and announces leader r1 in term 1.
func announcedNode(t *testing.T) (fixture, *leaderSide, *running) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	r := start(t, testConfig(), fx, nc)
	recv(t, l.joins, "join")
	l.announce("r1", 1)
	return fx, l, r
}

func TestNeedParamsThenAnswer(t *testing.T) {
	fx, l, r := announcedNode(t)
	l.params(0, 1, fx.theta)
	rs := fx.round(2, 5, 1, wait) // needs version 1, which the node lacks
	l.publish(rs)
	for range 2 { // asked, then asked again after ParamsRetry
		s := recv(t, l.needs, "params request")
		if s.NodeID != testNode || s.Version != 1 {
			t.Errorf("params request = %+v, want node %s version 1", s, testNode)
		}
	}
	none(t, l.contribs, "contribution without params")
	theta1 := append([]float32(nil), fx.theta...)
	theta1[0] += 0.5
	l.params(1, 1, theta1)
	c := recv(t, l.contribs, "contribution after params arrived")
	if c.Step != 2 || c.RoundID != 5 {
		t.Errorf("answered %d/%d, want 2/5", c.Step, c.RoundID)
	}
	checkContribution(t, c, fx.shard.Len(), rs.SampleRate, rs.ClipNorm)
	eventually(t, "the answer counted", func() bool { return r.w.Stats().Answered >= 1 }) // counted after Publish returns
	if st := r.w.Stats(); st.Answered != 1 || st.NeedParamsSent < 2 || st.ParamsVersion != 1 {
		t.Errorf("stats = %+v", st)
	}
}

// TestParamsKeptBounded: the node holds the newest maxParamsKept parameter
// versions (each model-sized); a round that names an older one, evicted,
// makes it ask for that version again and answer with what comes back.
// Before, the version that came back was below every held one and so
// dropped on arrival, and the round was answered with no parameters.
func TestParamsKeptBounded(t *testing.T) {
	fx, l, r := announcedNode(t)
	for v := range uint64(maxParamsKept + 1) {
		theta := append([]float32(nil), fx.theta...)
		theta[0] += float32(v)
		l.params(v, 1, theta)
	}
	eventually(t, "every version received", func() bool { return r.w.Stats().ParamsReceived == maxParamsKept+1 })
	rs := fx.round(1, 1, 1, wait) // version 0: evicted by the newer ones
	l.publish(rs)
	if s := recv(t, l.needs, "params request"); s.Version != 0 {
		t.Errorf("asked for version %d, want the evicted 0", s.Version)
	}
	none(t, l.contribs, "contribution without version 0")
	l.params(0, 1, fx.theta)
	c := recv(t, l.contribs, "contribution after version 0 came again")
	if c.Step != 1 || c.RoundID != 1 {
		t.Errorf("answered %d/%d, want 1/1", c.Step, c.RoundID)
	}
	checkContribution(t, c, fx.shard.Len(), rs.SampleRate, rs.ClipNorm)
}

// TestParamsGrace: a RoundStart processed just before the Params published
// ahead of it is answered without asking, thanks to the grace period.
func TestParamsGrace(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	cfg := testConfig()
	cfg.ParamsGrace = time.Minute
	r := start(t, cfg, fx, nc)
	recv(t, l.joins, "join")
	l.publish(fx.round(1, 1, 1, wait))
	eventually(t, "round pending", func() bool { return r.w.Stats().Term == 1 })
	l.params(0, 1, fx.theta)
	recv(t, l.contribs, "contribution")
	if n := r.w.Stats().NeedParamsSent; n != 0 {
		t.Errorf("sent %d params requests during the grace period", n)
	}
}

func TestDeadline(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	r := start(t, testConfig(), fx, nc)
	recv(t, l.joins, "join")
	l.announce("r1", 1)
	l.params(0, 1, fx.theta)

	// Closed before it arrives.
	l.publish(fx.round(1, 1, 1, -time.Second))
	eventually(t, "late round skipped", func() bool { return r.skipped(SkipDeadline) == 1 })

	// Waiting for params that come only after the deadline.
	l.publish(fx.round(3, 2, 1, 300*time.Millisecond))
	eventually(t, "round closed while waiting", func() bool { return r.skipped(SkipDeadline) == 2 })
	l.params(2, 1, fx.theta)
	eventually(t, "params stored", func() bool { return r.w.Stats().ParamsVersion == 2 })
	none(t, l.contribs, "contribution after the deadline")
}

func TestTerms(t *testing.T) {
	fx, l, r := announcedNode(t)
	if j := recv(t, l.joins, "join for the first leader"); j.NodeID != testNode {
		t.Errorf("join = %+v", j)
	}
	l.announce("r1", 1) // same term: no new join
	l.announce("r2", 5)
	recv(t, l.joins, "join for the term 5 leader")
	none(t, l.joins, "extra join")
	if st := r.w.Stats(); st.Term != 5 || st.Leader != "r2" {
		t.Errorf("leader = %s term %d, want r2 term 5", st.Leader, st.Term)
	}

	// The deposed leader's params and rounds are ignored.
	l.params(0, 3, fx.theta)
	rs := fx.round(1, 9, 3, wait)
	rs.Leader = "r1"
	rs.Params = fx.theta
	l.publish(rs)
	eventually(t, "stale round skipped", func() bool { return r.skipped(SkipStaleTerm) == 1 })
	eventually(t, "stale params rejected", func() bool { return r.w.Stats().ParamsRejected == 1 })
	if st := r.w.Stats(); st.ParamsReceived != 0 {
		t.Errorf("stale params stored: stats = %+v", st)
	}
	// A Done from the deposed leader does not end the run.
	l.publish(transport.Status{Run: testRun, From: "r1", Code: transport.StatusDone})
	none(t, r.done, "Run result after a stale Done")

	// A round from a newer term than any announcement adopts that term
	// (and joins again) before answering.
	rs = fx.round(1, 10, 6, wait)
	rs.Leader = "r3"
	rs.Params = fx.theta
	l.publish(rs)
	recv(t, l.joins, "join for the term 6 leader")
	recv(t, l.contribs, "contribution to the term 6 round")
	if st := r.w.Stats(); st.Term != 6 || st.Leader != "r3" {
		t.Errorf("leader = %s term %d, want r3 term 6", st.Leader, st.Term)
	}
}

// TestDeferredDone: a re-elected replica's Done processed before its new
// Leader announcement still ends the run once the announcement is seen.
func TestDeferredDone(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	r := start(t, testConfig(), fx, nc)
	recv(t, l.joins, "join")
	l.announce("r1", 1)
	recv(t, l.joins, "join")
	l.announce("r2", 2)
	recv(t, l.joins, "join")
	l.publish(transport.Status{Run: testRun, From: "r1", Code: transport.StatusDone})
	none(t, r.done, "Run result after a stale Done")
	l.announce("r1", 3)
	if err := r.result(t); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

func TestEndOfRun(t *testing.T) {
	for _, tc := range []struct {
		code   transport.StatusCode
		reason string
	}{
		{transport.StatusDone, "done"},
		{transport.StatusStopped, "stopped"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			fx := logregFixture(t)
			nc, lc := natsPair(t)
			l := newLeaderSide(t, lc)
			runtime.GC()
			before := runtime.NumGoroutine()
			r := start(t, testConfig(), fx, nc)
			recv(t, l.joins, "join")
			l.announce("r1", 1)
			recv(t, l.heartbeats, "heartbeat")
			l.publish(transport.Status{Run: testRun, From: "r1", Code: tc.code, Detail: "steps_reached"})
			if err := r.result(t); err != nil {
				t.Fatalf("Run = %v, want nil", err)
			}
			if lv := recv(t, l.leaves, "leave"); lv.NodeID != testNode || lv.Reason != tc.reason {
				t.Errorf("leave = %+v, want reason %q", lv, tc.reason)
			}
			// Every goroutine Run started, and the transport's for Run's
			// subscriptions, are gone.
			eventually(t, "goroutines to exit", func() bool { return runtime.NumGoroutine() <= before })
			// Nothing is sent after Leave.
			for len(l.heartbeats) > 0 {
				<-l.heartbeats
			}
			time.Sleep(3 * testConfig().HeartbeatEvery)
			if n := len(l.heartbeats); n != 0 {
				t.Errorf("%d heartbeats after Run returned", n)
			}
		})
	}
}

func TestRejections(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	r := start(t, testConfig(), fx, nc)
	recv(t, l.joins, "join")
	l.announce("r1", 1)
	// Another node's model mismatch, and an ordinary rejection of ours:
	// the run goes on.
	l.publish(transport.Status{Run: testRun, From: "r1", Node: "node-b", Code: transport.StatusRejected, Detail: RejectModelHash})
	l.publish(transport.Status{Run: testRun, From: "r1", Node: testNode, Step: 3, Code: transport.StatusRejected, Detail: "norm"})
	none(t, r.done, "Run result")
	l.publish(transport.Status{Run: testRun, From: "r1", Node: testNode, Code: transport.StatusRejected, Detail: RejectModelHash})
	if err := r.result(t); !errors.Is(err, ErrModelMismatch) {
		t.Fatalf("Run = %v, want ErrModelMismatch", err)
	}
	if lv := recv(t, l.leaves, "leave"); lv.Reason != "model_mismatch" {
		t.Errorf("leave reason = %q", lv.Reason)
	}
}

// TestRefusedByLeader: a leader that refuses the node for good (a seeded
// node in a private run, a missing shard identity) ends its Run with
// ErrRefused naming the reason.
func TestRefusedByLeader(t *testing.T) {
	for _, detail := range []string{RejectSeedPolicy, RejectShardIdentity} {
		t.Run(detail, func(t *testing.T) {
			fx := logregFixture(t)
			nc, lc := natsPair(t)
			l := newLeaderSide(t, lc)
			cfg := testConfig()
			cfg.SeededSampling, cfg.SamplingSeed = true, 1
			r := start(t, cfg, fx, nc)
			recv(t, l.joins, "join")
			l.announce("r1", 1)
			l.publish(transport.Status{Run: testRun, From: "r1", Node: testNode, Code: transport.StatusRejected, Detail: detail})
			err := r.result(t)
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), detail) {
				t.Fatalf("Run = %v, want ErrRefused naming %q", err, detail)
			}
			if lv := recv(t, l.leaves, "leave"); lv.Reason != "refused" {
				t.Errorf("leave reason = %q", lv.Reason)
			}
		})
	}
}

// TestRefusedForWeights: a leader that refuses the node's pretrained
// weights ends its Run with ErrRefused naming both hashes ("none" for a
// model initialized from a seed, or a run with no checkpoint) and what to
// do, logged at error level; the node leaves with reason "refused". The same refusal
// from another run's coordinator (another model hash) is ignored.
func TestRefusedForWeights(t *testing.T) {
	a, b := strings.Repeat("0f", 32), strings.Repeat("a1", 32)
	const initFrom = "give the node the run's checkpoint folder (--init-from)"
	for _, tc := range []struct {
		name, node, run string
		want            string
	}{
		{"other weights", a, b, "this node's pretrained weights sha256 " + a + ", the run's " + b + ": " + initFrom},
		{"node has none", "", b, "this node's pretrained weights sha256 none, the run's " + b + ": " + initFrom},
		{"run has none", a, "", "this node's pretrained weights sha256 " + a + ", the run's none: the run starts from no checkpoint: start the node without --init-from"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := logregFixture(t)
			nc, lc := natsPair(t)
			l := newLeaderSide(t, lc)
			cfg := testConfig()
			cfg.Weights = tc.node
			var logs syncBuffer
			r := startLogged(t, cfg, fx, nc, slog.New(slog.NewJSONHandler(&logs, nil)))
			recv(t, l.joins, "join")
			l.announce("r1", 1)
			refusal := transport.Status{Run: testRun, From: "r1", Node: testNode, Code: transport.StatusRejected,
				Detail: RejectWeights + ": " + tc.run}
			foreign := refusal
			foreign.ModelHash = "another-model"
			l.publish(foreign)
			none(t, r.done, "Run result after another run's refusal")
			l.publish(refusal)
			err := r.result(t)
			if !errors.Is(err, ErrRefused) || !strings.HasSuffix(err.Error(), tc.want) {
				t.Fatalf("Run = %v, want ErrRefused ending %q", err, tc.want)
			}
			if lv := recv(t, l.leaves, "leave"); lv.Reason != "refused" {
				t.Errorf("leave reason = %q, want refused", lv.Reason)
			}
			var logged bool
			for line := range strings.Lines(logs.String()) {
				if strings.Contains(line, `"level":"ERROR"`) && strings.Contains(line, `"weights":"`+tc.node+`"`) &&
					strings.Contains(line, `"run_weights":"`+tc.run+`"`) {
					logged = true
				}
			}
			if !logged {
				t.Errorf("no error record naming weights %q and run_weights %q in:\n%s", tc.node, tc.run, logs.String())
			}
		})
	}
}

// TestRefusedSeatTaken: the node sends the incarnation it drew at start in
// its Join (another Worker draws another), and a leader that refuses it
// because another live process holds its ID does not end its Run: the
// node keeps heartbeating until the seat lapses (the common case: this
// process restarted after one with its ID died without leaving), and
// says so once, at error, with what to do if a second process does hold
// the ID.
func TestRefusedSeatTaken(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	cfg := testConfig()
	var logs syncBuffer
	r := startLogged(t, cfg, fx, nc, slog.New(slog.NewJSONHandler(&logs, nil)))
	j := recv(t, l.joins, "join")
	if j.Incarnation == "" {
		t.Fatal("Join has no incarnation")
	}
	other, err := NewWorker(cfg, fx.m, fx.shard, nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if other.incarnation == j.Incarnation {
		t.Errorf("two Workers drew the same incarnation %q", j.Incarnation)
	}
	l.announce("r1", 1)
	for range 3 {
		l.publish(transport.Status{Run: testRun, From: "r1", Node: testNode, Code: transport.StatusRejected,
			Detail: RejectSeatTaken + ": another live process holds node ID " + testNode})
	}
	// The node waits for the seat: it keeps heartbeating, says so once,
	// and does not end.
	recv(t, l.heartbeats, "heartbeat after the refusal")
	none(t, r.done, "Run result after seat_taken")
	var errors int
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, `"level":"ERROR"`) && strings.Contains(line, `"incarnation":"`+j.Incarnation+`"`) &&
			strings.Contains(line, "another process holds its node ID") {
			errors++
		}
	}
	if errors != 1 {
		t.Errorf("%d error records naming the incarnation %s, want 1, in:\n%s", errors, j.Incarnation, logs.String())
	}
}

// TestNotMemberWarnedOnce: a node the leader keeps out of the rounds
// (its shard claim conflicts with an older one, or the nodes hold more
// than N examples) is told unknown_node for every contribution; it warns
// once, saying what that means, not once per round.
func TestNotMemberWarnedOnce(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	var logs syncBuffer
	r := startLogged(t, testConfig(), fx, nc, slog.New(slog.NewJSONHandler(&logs, nil)))
	recv(t, l.joins, "join")
	l.announce("r1", 1)
	for step := range uint64(20) {
		l.publish(transport.Status{Run: testRun, From: "r1", Node: testNode, Step: step + 1, Code: transport.StatusRejected,
			Detail: "unknown_node"})
	}
	// A rejection of another kind after them: once it is logged, so are they.
	l.publish(transport.Status{Run: testRun, From: "r1", Node: testNode, Step: 21, Code: transport.StatusRejected, Detail: "norm_bound"})
	deadline := time.Now().Add(wait)
	for !strings.Contains(logs.String(), "norm_bound") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	none(t, r.done, "Run result")
	var warned int
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, `"level":"WARN"`) && strings.Contains(line, "unknown_node") {
			warned++
			if !strings.Contains(line, "not a member of the rounds") {
				t.Errorf("the warning does not say the node is not a round member: %s", line)
			}
		}
	}
	if warned != 1 {
		t.Errorf("%d warnings about unknown_node for 20 rejections, want 1:\n%s", warned, logs.String())
	}
}

func TestCancel(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	r := start(t, testConfig(), fx, nc)
	recv(t, l.joins, "join")
	r.cancel()
	if err := r.result(t); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if lv := recv(t, l.leaves, "leave"); lv.Reason != "shutdown" {
		t.Errorf("leave reason = %q", lv.Reason)
	}
	if err := r.w.Run(context.Background()); !errors.Is(err, ErrAlreadyStarted) {
		t.Errorf("second Run = %v, want ErrAlreadyStarted", err)
	}
}

func TestInvalidInputs(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	r := start(t, testConfig(), fx, nc)
	recv(t, l.joins, "join")
	l.announce("r1", 1)
	l.params(0, 1, fx.theta)

	mod := func(f func(*transport.RoundStart)) transport.RoundStart {
		rs := fx.round(1, 0, 1, wait)
		f(&rs)
		return rs
	}
	rounds := []struct {
		name string
		rs   transport.RoundStart
	}{
		{"q=0", mod(func(r *transport.RoundStart) { r.SampleRate = 0 })},
		{"q>1", mod(func(r *transport.RoundStart) { r.SampleRate = 1.5 })},
		{"q=NaN", mod(func(r *transport.RoundStart) { r.SampleRate = math.NaN() })},
		{"clip=0", mod(func(r *transport.RoundStart) { r.ClipNorm = 0 })},
		{"clip<0", mod(func(r *transport.RoundStart) { r.ClipNorm = -1 })},
		{"clip=Inf", mod(func(r *transport.RoundStart) { r.ClipNorm = math.Inf(1) })},
		{"clip=NaN", mod(func(r *transport.RoundStart) { r.ClipNorm = math.NaN() })},
		{"clip>max", mod(func(r *transport.RoundStart) { r.ClipNorm = 2 * model.MaxClipNorm })},
		{"no deadline", mod(func(r *transport.RoundStart) { r.Deadline = 0 })},
		{"step 0", mod(func(r *transport.RoundStart) { r.Step = 0 })},
		{"inline params too short", mod(func(r *transport.RoundStart) { r.Params = fx.theta[1:] })},
	}
	for i, tc := range rounds {
		tc.rs.RoundID = uint64(100 + i)
		l.publish(tc.rs)
		eventually(t, tc.name+" skipped", func() bool { return r.skipped(SkipInvalid) == uint64(i+1) })
	}
	none(t, l.contribs, "contribution to an invalid round")

	bad := []struct {
		name  string
		theta []float32
	}{
		{"too long", append(append([]float32(nil), fx.theta...), 0)},
		{"too short", fx.theta[:3]},
		{"NaN", func() []float32 { v := append([]float32(nil), fx.theta...); v[7] = float32(math.NaN()); return v }()},
		{"Inf", func() []float32 { v := append([]float32(nil), fx.theta...); v[0] = float32(math.Inf(-1)); return v }()},
	}
	for i, tc := range bad {
		l.params(uint64(1+i), 1, tc.theta)
		eventually(t, "params "+tc.name+" rejected", func() bool { return r.w.Stats().ParamsRejected == uint64(i+1) })
	}
	if st := r.w.Stats(); st.ParamsReceived != 1 || st.ParamsVersion != 0 {
		t.Errorf("stats = %+v, want only version 0 stored", st)
	}
	// The node still works.
	l.publish(fx.round(1, 1, 1, wait))
	recv(t, l.contribs, "contribution to a valid round")
}

// TestDuplicatedNetwork runs over the fake transport with every delivery
// duplicated: each round is still answered exactly once.
func TestDuplicatedNetwork(t *testing.T) {
	fx := logregFixture(t)
	net, nc, lc := fakePair(t)
	l := newLeaderSide(t, lc)
	r := start(t, testConfig(), fx, nc)
	recv(t, l.joins, "join")
	net.SetFaults(fake.Faults{Duplicate: 1})
	l.announce("r1", 1)
	l.params(0, 1, fx.theta)
	for step := uint64(1); step <= 3; step++ {
		l.params(step-1, 1, fx.theta)
		l.publish(fx.round(step, 1000+step, 1, wait))
		// The network duplicates the contribution too; skip the copies of
		// earlier steps' answers.
		for {
			c := recv(t, l.contribs, "contribution")
			if c.Step == step {
				break
			}
			if c.Step > step {
				t.Fatalf("answered step %d, want %d", c.Step, step)
			}
		}
	}
	eventually(t, "duplicates skipped", func() bool { return r.skipped(SkipDuplicate) == 3 })
	// The node counts an answer after its Publish returns, which can be
	// after the leader side has the contribution: wait for the count, then
	// check it did not go past 3.
	eventually(t, "three rounds answered", func() bool { return r.w.Stats().Answered >= 3 })
	if st := r.w.Stats(); st.Answered != 3 {
		t.Errorf("answered %d rounds, want 3", st.Answered)
	}
}

// TestLostParams drops the first Params delivery to the node: it asks for
// them and answers once they are re-sent.
func TestLostParams(t *testing.T) {
	fx := logregFixture(t)
	net, nc, lc := fakePair(t)
	l := newLeaderSide(t, lc)
	cfg := testConfig()
	cfg.ParamsGrace = 20 * time.Millisecond
	r := start(t, cfg, fx, nc)
	recv(t, l.joins, "join")
	subjects, err := transport.NewSubjects(testRun)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	dropped := false
	net.SetFaults(fake.Faults{Filter: func(from, subject string, _ []byte) bool {
		mu.Lock()
		defer mu.Unlock()
		if subject == subjects.Topic(transport.TopicParams) && !dropped {
			dropped = true
			return false
		}
		return true
	}})
	l.announce("r1", 1)
	l.params(0, 1, fx.theta)
	l.publish(fx.round(1, 1, 1, wait))
	s := recv(t, l.needs, "params request")
	if s.Version != 0 {
		t.Errorf("asked for version %d, want 0", s.Version)
	}
	l.params(0, 1, fx.theta)
	recv(t, l.contribs, "contribution")
	// The node counts an answer after its Publish returns, which can be
	// after the leader side has the contribution.
	eventually(t, "the answer counted", func() bool { return r.w.Stats().Answered >= 1 })
	if st := r.w.Stats(); st.Answered != 1 || st.ParamsReceived != 1 {
		t.Errorf("stats = %+v", st)
	}
}

// TestChunkedParams uses a model whose parameters exceed NATS's 1 MiB
// payload, so Params and the contribution travel in chunks.
func TestChunkedParams(t *testing.T) {
	if testing.Short() {
		t.Skip("large model")
	}
	fx := newFixture(t, model.MLP([]int{8}, []int{1024, 256}, 3))
	if 4*fx.m.NumParams() <= 1<<20 {
		t.Fatalf("model of %d params is not chunked", fx.m.NumParams())
	}
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	cfg := testConfig()
	cfg.SampleRate = 0.05
	start(t, cfg, fx, nc)
	recv(t, l.joins, "join")
	l.announce("r1", 1)
	l.params(0, 1, fx.theta)
	rs := fx.round(1, 1, 1, wait)
	rs.SampleRate = cfg.SampleRate
	l.publish(rs)
	c := recv(t, l.contribs, "contribution")
	if len(c.Sum) != fx.m.NumParams() {
		t.Fatalf("sum has %d values, want %d", len(c.Sum), fx.m.NumParams())
	}
	checkContribution(t, c, fx.shard.Len(), rs.SampleRate, rs.ClipNorm)
}

// TestMetricsAndLogsHoldNoPrivateValues answers a round with metrics and
// debug logging on, then checks what the metrics hold and that no log
// record carries a sum or count.
func TestMetricsAndLogsHoldNoPrivateValues(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	reg := prometheus.NewRegistry()
	cfg := testConfig()
	cfg.Registerer = reg
	var buf syncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w, err := NewWorker(cfg, fx.m, fx.shard, nc, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	recv(t, l.joins, "join")
	l.announce("r1", 1)
	l.params(0, 1, fx.theta)
	l.publish(fx.round(1, 1, 1, wait))
	l.publish(fx.round(1, 1, 1, wait))
	c := recv(t, l.contribs, "contribution")
	eventually(t, "duplicate skipped", func() bool { return w.Stats().Skipped[SkipDuplicate] == 1 })
	cancel()
	<-done

	got := gatherNodeMetrics(t, reg)
	for name, want := range map[string]float64{
		"dpcluster_node_rounds_total{answered}":          1,
		"dpcluster_node_rounds_total{skipped_duplicate}": 1,
		"dpcluster_node_rounds_total{skipped_deadline}":  0,
		"dpcluster_node_last_step":                       1,
		"dpcluster_node_params_version":                  0,
		"dpcluster_node_compute_seconds":                 1,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
		}
	}
	// A second worker with the same ID on the same registry reuses the
	// collectors.
	if _, err := NewWorker(cfg, fx.m, fx.shard, nc, nil); err != nil {
		t.Errorf("second worker on the registry: %v", err)
	}

	logs := buf.String()
	if !strings.Contains(logs, "node: start") {
		t.Fatalf("no logs captured:\n%s", logs)
	}
	for _, key := range []string{`"count"`, `"sum"`, `"batch"`} {
		if strings.Contains(logs, key) {
			t.Errorf("logs hold key %s:\n%s", key, logs)
		}
	}
	_ = c
}

// gatherNodeMetrics returns the value of each metric in reg, by name with
// the "result" label's value in braces (a histogram's value is its sample
// count), and fails t for a metric labelled with another node than testNode.
func gatherNodeMetrics(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "node" && lp.GetValue() != testNode {
					t.Errorf("%s has node label %q", name, lp.GetValue())
				}
				if lp.GetName() == "result" {
					name += "{" + lp.GetValue() + "}"
				}
			}
			switch {
			case m.GetCounter() != nil:
				got[name] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				got[name] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				got[name] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return got
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestConfigValidate(t *testing.T) {
	ok := testConfig()
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		bad  bool
	}{
		{"valid", func(*Config) {}, false},
		{"host-pid ID", func(c *Config) { c.ID = "worker-7-1234" }, false},
		{"ID with a dot", func(c *Config) { c.ID = "worker-7.example.org-1234" }, true},
		{"empty ID", func(c *Config) { c.ID = "" }, true},
		{"ID with space", func(c *Config) { c.ID = "a b" }, true},
		{"ID too long", func(c *Config) { c.ID = strings.Repeat("a", 65) }, true},
		{"bad run", func(c *Config) { c.Run = "a.b" }, true},
		{"heartbeat 0", func(c *Config) { c.HeartbeatEvery = 0 }, true},
		{"negative MaxBatch", func(c *Config) { c.MaxBatch = -1 }, true},
		{"negative grace", func(c *Config) { c.ParamsGrace = -1 }, true},
		{"retry 0", func(c *Config) { c.ParamsRetry = 0 }, true},
		{"leave timeout 0", func(c *Config) { c.LeaveTimeout = 0 }, true},
		{"no sample rate", func(c *Config) { c.SampleRate = 0 }, true},
		{"sample rate above 1", func(c *Config) { c.SampleRate = 1.5 }, true},
		{"sample rate NaN", func(c *Config) { c.SampleRate = math.NaN() }, true},
		{"sample rate 1", func(c *Config) { c.SampleRate = 1 }, false},
		{"no clip norm", func(c *Config) { c.ClipNorm = 0 }, true},
		{"clip norm Inf", func(c *Config) { c.ClipNorm = math.Inf(1) }, true},
		{"clip norm NaN", func(c *Config) { c.ClipNorm = math.NaN() }, true},
		{"no shard count", func(c *Config) { c.ShardCount = 0 }, true},
		{"shard index = count", func(c *Config) { c.ShardIndex, c.ShardCount = 3, 3 }, true},
		{"negative shard index", func(c *Config) { c.ShardIndex = -1 }, true},
		{"last shard", func(c *Config) { c.ShardIndex, c.ShardCount = 2, 3 }, false},
		{"seeded sampling", func(c *Config) { c.SeededSampling, c.SamplingSeed = true, 7 }, false},
		{"seeded sampling, seed 0", func(c *Config) { c.SeededSampling = true }, false},
		{"seed without seeded sampling", func(c *Config) { c.SamplingSeed = 7 }, true},
		{"pretrained weights", func(c *Config) { c.Weights = strings.Repeat("0f", 32) }, false},
		{"weights in upper case", func(c *Config) { c.Weights = strings.Repeat("0F", 32) }, true},
		{"weights too short", func(c *Config) { c.Weights = strings.Repeat("0f", 31) }, true},
		{"weights with a prefix", func(c *Config) { c.Weights = "sha256:" + strings.Repeat("0f", 32) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.mod(&c)
			err := c.Validate()
			if got := err != nil; got != tc.bad {
				t.Fatalf("Validate() = %v, want error %v", err, tc.bad)
			}
			if err != nil && !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("error %v does not wrap ErrInvalidConfig", err)
			}
		})
	}
	if err := DefaultConfig().Validate(); err == nil {
		t.Error("DefaultConfig without ID validated")
	}
}

func TestNewWorkerErrors(t *testing.T) {
	fx := logregFixture(t)
	_, nc, _ := fakePair(t)
	wrongDim, err := dataset.GaussianMixture(10, 5, 3, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	empty := fx.shard.Subset(nil)
	for _, tc := range []struct {
		name  string
		shard *dataset.Dataset
		conn  transport.Conn
	}{
		{"shard does not fit the model", wrongDim, nc},
		{"empty shard", empty, nc},
		{"nil shard", nil, nc},
		{"nil conn", fx.shard, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewWorker(testConfig(), fx.m, tc.shard, tc.conn, nil); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("NewWorker = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

// TestParamsOfADeposedTermNotUsed: a leader releases θ_t once step t is
// charged, before its g̃ is committed, so a new leader may charge step t
// again and release a different θ_t. A round of the new term must not be
// computed on the θ_t cached from the old one: the node asks for the
// version, and answers once the new term's θ_t arrives.
func TestParamsOfADeposedTermNotUsed(t *testing.T) {
	fx, l, r := announcedNode(t)
	recv(t, l.joins, "join for the term 1 leader")
	l.params(1, 1, fx.theta) // the deposed leader's θ_1
	eventually(t, "params stored", func() bool { return r.w.Stats().ParamsVersion == 1 })
	l.announce("r2", 2)
	recv(t, l.joins, "join for the term 2 leader")
	rs := fx.round(2, 5, 2, wait) // needs version 1, held only from term 1
	rs.Leader = "r2"
	l.publish(rs)
	if s := recv(t, l.needs, "params request"); s.Version != 1 {
		t.Errorf("params request for version %d, want 1", s.Version)
	}
	none(t, l.contribs, "contribution computed on the deposed term's θ")
	theta1 := append([]float32(nil), fx.theta...)
	theta1[0] += 0.5
	l.params(1, 2, theta1)
	c := recv(t, l.contribs, "contribution after the term 2 params arrived")
	if c.Step != 2 || c.RoundID != 5 {
		t.Errorf("answered %d/%d, want 2/5", c.Step, c.RoundID)
	}
}

// TestCoordinatorSilenceEndsTheNode is issue 27's finding 5: a node that
// missed the end-of-run message while the servers shut down reconnected
// for 25 minutes until killed. A node that has heard a coordinator and
// then hears nothing from any (no announcement, round, params or status)
// for CoordinatorTimeout stops with ErrCoordinatorGone; before it has
// heard one, it waits (nodes may start before their replicas).
func TestCoordinatorSilenceEndsTheNode(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	cfg := testConfig()
	cfg.CoordinatorTimeout = 300 * time.Millisecond
	r := start(t, cfg, fx, nc)
	recv(t, l.joins, "join")
	time.Sleep(3 * cfg.CoordinatorTimeout)
	none(t, r.done, "Run result before any coordinator was heard")
	for range 6 { // announcements keep it in the run
		l.announce("r1", 1)
		time.Sleep(cfg.CoordinatorTimeout / 2)
		select {
		case err := <-r.done:
			t.Fatalf("Run = %v while the leader announces", err)
		default:
		}
	}
	err := r.result(t) // then silence
	if !errors.Is(err, ErrCoordinatorGone) || !strings.Contains(err.Error(), "300ms") {
		t.Fatalf("Run = %v, want ErrCoordinatorGone after 300ms of silence", err)
	}
}

// TestForeignGroupIgnored is issue 27's finding 4: a second replica group
// with the same run name on the same NATS (another model) rejected the
// real nodes, and they exited. A leader whose announcement names another
// model, q or C is another run's: its announcements are not followed
// (even of a higher term), and its statuses — a model_hash refusal, a
// Done — are ignored. The node keeps answering its own leader's rounds
// and ends with that leader's Done.
func TestForeignGroupIgnored(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	r := start(t, testConfig(), fx, nc)
	recv(t, l.joins, "join")
	own := transport.Leader{Run: testRun, ReplicaID: "r1", Term: 1, ModelHash: fx.m.Hash(), SampleRate: testQ, ClipNorm: testClip}
	l.publish(own)
	recv(t, l.joins, "join for r1")
	foreign := transport.Leader{Run: testRun, ReplicaID: "x1", Term: 9, ModelHash: "another-model", SampleRate: testQ, ClipNorm: testClip}
	l.publish(foreign)
	none(t, l.joins, "a join for the foreign leader")
	// Its statuses name its model; same replica ID as ours, even.
	l.publish(transport.Status{Run: testRun, From: "x1", Node: testNode, Code: transport.StatusRejected, Detail: RejectModelHash, ModelHash: "another-model"})
	l.publish(transport.Status{Run: testRun, From: "r1", Code: transport.StatusDone, ModelHash: "another-model"})
	none(t, r.done, "Run result after the foreign group's refusal and Done")
	// Its own leader's round (term 1, below the foreign 9) is answered.
	l.params(0, 1, fx.theta)
	l.publish(fx.round(1, 1, 1, wait))
	recv(t, l.contribs, "contribution to r1's round")
	if st := r.w.Stats(); st.Leader != "r1" || st.Term != 1 {
		t.Errorf("following %s term %d, want r1 term 1", st.Leader, st.Term)
	}
	l.publish(transport.Status{Run: testRun, From: "r1", Code: transport.StatusDone, ModelHash: fx.m.Hash()})
	if err := r.result(t); err != nil {
		t.Fatalf("Run = %v, want nil after r1's Done", err)
	}
}
