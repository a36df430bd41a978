package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/mechanism"
)

// TestHistoryDownsample fills a small board far past its limit: each
// series stays within the limit, keeps its first and latest points in
// order, and keeps only multiples of its stride in between.
func TestHistoryDownsample(t *testing.T) {
	const limit = 16
	b := newBoard(limit)
	for step := int64(1); step <= 1000; step++ {
		b.addStep(StepPoint{Step: step, Epsilon: Float(step) / 1000})
		// The leader's round details arrive for the same step after the
		// state machine's ε: one point, with both.
		b.addStep(StepPoint{Step: step, Epsilon: Float(step) / 1000, RoundSeconds: 0.5, Participants: 3})
		if step%3 == 0 {
			b.addEval(EvalPoint{Step: step, Accuracy: 0.5})
		}
		h := b.history()
		for name, steps := range map[string][]int64{"steps": stepsOf(h.Steps), "evals": evalStepsOf(h.Evals)} {
			if len(steps) > limit {
				t.Fatalf("after step %d: %d %s points, limit %d", step, len(steps), name, limit)
			}
			for i := 1; i < len(steps); i++ {
				if steps[i] <= steps[i-1] {
					t.Fatalf("after step %d: %s not increasing: %v", step, name, steps)
				}
			}
		}
		if got := h.Steps[len(h.Steps)-1]; got.Step != step || got.Participants != 3 || got.RoundSeconds != 0.5 {
			t.Fatalf("after step %d: last point %+v", step, got)
		}
	}
	h := b.history()
	if h.Steps[0].Step != 1 || h.Stride < 64 || h.Stride&(h.Stride-1) != 0 {
		t.Errorf("first step %d, stride %d (want 1 and a power of 2 ≥ 64)", h.Steps[0].Step, h.Stride)
	}
	for _, p := range h.Steps[1 : len(h.Steps)-1] {
		if p.Step%h.Stride != 0 {
			t.Errorf("step %d kept, not a multiple of stride %d", p.Step, h.Stride)
		}
	}
	if n := len(h.Steps); n < limit/4 {
		t.Errorf("only %d points kept of %d allowed", n, limit)
	}
	if last := h.Evals[len(h.Evals)-1].Step; last != 999 {
		t.Errorf("last evaluation at step %d, want 999", last)
	}
}

// TestFloatJSON: a non-finite value (a diverged model's loss) encodes as
// null instead of failing the whole document, and decodes as NaN; finite
// values round-trip exactly.
func TestFloatJSON(t *testing.T) {
	for _, v := range []float64{0, -1.5, 0.1, math.MaxFloat64, math.SmallestNonzeroFloat64, math.NaN(), math.Inf(1), math.Inf(-1)} {
		b, err := json.Marshal(EvalPoint{Loss: Float(v)})
		if err != nil {
			t.Fatalf("%v: %v", v, err)
		}
		var back EvalPoint
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%v: %s: %v", v, b, err)
		}
		finite := !math.IsNaN(v) && !math.IsInf(v, 0)
		if got := float64(back.Loss); finite && got != v || !finite && !math.IsNaN(got) {
			t.Errorf("%v → %s → %v", v, b, got)
		}
		if !finite && !strings.Contains(string(b), `"loss":null`) {
			t.Errorf("%v → %s, want loss null", v, b)
		}
	}
}

func stepsOf(ps []StepPoint) []int64 {
	var s []int64
	for _, p := range ps {
		s = append(s, p.Step)
	}
	return s
}

func evalStepsOf(ps []EvalPoint) []int64 {
	var s []int64
	for _, p := range ps {
		s = append(s, p.Step)
	}
	return s
}

// TestServerStatus runs the leader's loop (real NATS, real Raft) with two
// script nodes, one of which sends an over-long sum every even step, and
// reads Status and History from another goroutine all along (run with
// -race). At the end the snapshot matches the Summary, counts each node's
// answered and skipped rounds, shows the node refused at the last step
// out of good standing, lists the replica as leader, and the history has
// one point per step with its participants; neither the
// snapshot nor the history, as JSON, holds any value of a node's sum or
// of their aggregate.
func TestServerStatus(t *testing.T) {
	const steps = 8
	c := testRunConfig()
	c.MaxSteps = steps
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coordConn, dial := natsPair(t, c.Run)
	counts := []int64{40, 35}
	sums := func(i int, step uint64) []float32 {
		s := sentinelSum(i, step, c.Dim, counts[i], c.Optimizer.ClipNorm)
		if i == 1 && step%2 == 0 {
			for j := range s {
				s[j] *= 2 // ||sum|| = 1.8·count·C: rejected
			}
		}
		return s
	}
	for i, id := range []string{"n0", "n1"} {
		startScriptNode(t, ctx, dial(id), id, c.ModelHash, shardOf(i), func(step uint64) (int64, []float32) {
			return counts[i], sums(i, step)
		})
	}
	r := openReplicaForServer(t, t.TempDir())
	waitLeader(t, r)
	scfg := DefaultServerConfig()
	scfg.MinNodes, scfg.RoundTimeout = 2, 500*time.Millisecond
	scfg.Noise = mechanism.NewSeededNoiseSource(3)
	scfg.Evaluator, scfg.EvalData, scfg.EvalEvery = &thetaEvaluator{}, EvalPublic, 4
	s, err := NewServer(r, coordConn, c, scfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st := s.Status(); st.Run != c.Run || st.Step != 0 || st.Nodes != nil {
		t.Errorf("status before Run: %+v", st)
	}

	// A reader polls like the dashboard does, while the loop publishes.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var maxSeen int64
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			st, h := s.Status(), s.History()
			if st.Step < maxSeen || int64(len(h.Steps)) > st.Step+1 {
				t.Errorf("status step %d after %d, %d history points", st.Step, maxSeen, len(h.Steps))
			}
			maxSeen = st.Step
		}
	})
	sum, err := s.Run(ctx)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}

	st, h := s.Status(), s.History()
	if st.Step != steps || float64(st.Epsilon) != sum.Epsilon || float64(st.TargetEpsilon) != c.TargetEpsilon || float64(st.Delta) != c.Delta ||
		st.MaxSteps != steps || st.Stopped != stopMaxSteps || st.Private || st.Accountant != "rdp" || st.NoiseMode != NoiseDiscrete {
		t.Errorf("status %+v, summary %+v", st, sum)
	}
	if st.Eval == nil || st.Eval.Step != steps || st.Eval.Data != "test" || !st.Eval.Private || float64(st.Eval.Accuracy) != sum.Final.Accuracy {
		t.Errorf("status evaluation %+v, final %+v", st.Eval, sum.Final)
	}
	if len(st.Replicas) != 1 || st.Replicas[0].ID != r.ID() || st.Replicas[0].Role != RoleLeader || !st.Replicas[0].Self ||
		st.Replicas[0].Step != steps || st.Replicas[0].Term == 0 {
		t.Errorf("replicas %+v", st.Replicas)
	}
	// n1 is refused at step 2 and loses good standing: a valid answer of
	// its at an odd step is summed if it comes before n0's closes the
	// round, or in a round that waits for it again, so how many of its
	// odd steps count depends on timing; step 1's does, the even steps'
	// never.
	if len(st.Nodes) != 2 {
		t.Fatalf("nodes %+v", st.Nodes)
	}
	n1 := st.Nodes[1]
	for i, n := range st.Nodes {
		if n.ID != []string{"n0", "n1"}[i] || n.Answered+n.Skipped != steps || n.ShardSize != 1250 ||
			n.ShardIndex != i || n.ShardCount != 8 || n.LastSeen.IsZero() {
			t.Errorf("node %+v", n)
		}
	}
	if st.Nodes[0].Answered != steps || st.Nodes[0].Standing != standingGood {
		t.Errorf("node n0 %+v, want every step answered, in good standing", st.Nodes[0])
	}
	if n1.Answered < 1 || n1.Answered > steps/2 || n1.Standing != standingRefused || n1.StandingDetail != "norm_bound" ||
		n1.OutSinceStep < 2 || n1.OutSinceStep%2 != 0 || !slices.Equal(st.OutOfStanding, []string{"n1"}) {
		t.Errorf("node n1 %+v (out of standing %v), want 1 to %d steps answered, refused for norm_bound since an even step",
			n1, st.OutOfStanding, steps/2)
	}
	if len(h.Steps) != steps {
		t.Fatalf("history %+v", h.Steps)
	}
	var n1Counted int64
	for i, p := range h.Steps {
		if p.Step != int64(i+1) || p.Participants < 1 || p.Participants > 2 || (i+1)%2 == 0 && p.Participants != 1 ||
			i == 0 && p.Participants != 2 || !(p.RoundSeconds > 0) || !(p.Epsilon > 0) {
			t.Errorf("history point %d: %+v", i, p)
		}
		n1Counted += int64(p.Participants - 1)
	}
	if n1Counted != n1.Answered {
		t.Errorf("the history counts n1 in %d steps, its status %d", n1Counted, n1.Answered)
	}
	if float64(h.Steps[steps-1].Epsilon) != sum.Epsilon {
		t.Errorf("last history ε %v, spent %v", h.Steps[steps-1].Epsilon, sum.Epsilon)
	}
	if got := evalStepsOf(h.Evals); len(got) != 2 || got[0] != 4 || got[1] != 8 {
		t.Errorf("evaluations at steps %v, want [4 8]", got)
	}

	// No un-noised value: neither the nodes' sums nor their aggregate, in
	// any of the ways encoding/json writes a float.
	js, err := json.Marshal(struct {
		S Status
		H History
	}{st, h})
	if err != nil {
		t.Fatal(err)
	}
	for step := uint64(1); step <= steps; step++ {
		var agg [4]float64
		for i := range counts {
			for j, v := range sums(i, step)[:4] {
				agg[j] += float64(v)
				assertNotIn(t, string(js), float64(v))
			}
		}
		for _, v := range agg {
			assertNotIn(t, string(js), v)
			assertNotIn(t, string(js), float64(float32(v)))
		}
	}
}

// assertNotIn fails if js holds v, written as a float64 or as the
// shortest float32 that rounds to it.
func assertNotIn(t *testing.T, js string, v float64) {
	t.Helper()
	for _, bits := range []int{32, 64} {
		if s := strconv.FormatFloat(v, 'g', -1, bits); len(s) > 4 && strings.Contains(js, s) {
			t.Errorf("status JSON holds the un-noised value %s", s)
		}
	}
}

// BenchmarkPublishStatus measures what the loop spends publishing its
// snapshot after an event, by number of registered nodes.
func BenchmarkPublishStatus(b *testing.B) {
	for _, nodes := range []int{10, 1000} {
		b.Run(strconv.Itoa(nodes)+"nodes", func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close()
			cfg := DefaultReplicaConfig()
			cfg.ID, cfg.RaftAddr, cfg.DataDir, cfg.Bootstrap = "r1", addr, b.TempDir(), true
			r, err := OpenReplica(cfg, testInit)
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			scfg := DefaultServerConfig()
			scfg.Noise = mechanism.NewSeededNoiseSource(1)
			s, err := NewServer(r, nil, testRunConfig(), scfg, nil)
			if err != nil {
				b.Fatal(err)
			}
			l := newLoop(s, newInbox())
			now := time.Now()
			for i := range nodes {
				l.nodes.seen(fmt.Sprintf("node-%04d", i), "", shardClaim{index: i, count: nodes, size: 100}, now)
			}
			b.ReportAllocs()
			for b.Loop() {
				l.publishStatus(true) // a rebuild, as when the step moved
			}
		})
	}
}
