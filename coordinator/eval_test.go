package coordinator

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/transport"
)

func TestEvalDataLabels(t *testing.T) {
	for _, tc := range []struct {
		d          EvalData
		private    bool
		label, key string
	}{
		{EvalPublic, true, "test", "test"},
		{EvalTrainHoldout, false, "NON-PRIVATE holdout", "nonprivate_holdout"},
		// Unset data is labelled as private data: when in doubt, NON-PRIVATE.
		{EvalDataUnset, false, "NON-PRIVATE holdout", "nonprivate_holdout"},
	} {
		if got := tc.d.Private(); got != tc.private {
			t.Errorf("%d.Private() = %v, want %v", tc.d, got, tc.private)
		}
		if got := tc.d.Label(); got != tc.label {
			t.Errorf("%d.Label() = %q, want %q", tc.d, got, tc.label)
		}
		if got := tc.d.Key(); got != tc.key {
			t.Errorf("%d.Key() = %q, want %q", tc.d, got, tc.key)
		}
		if got := tc.d.Examples(); strings.Contains(got, "NOT differentially private") == tc.private {
			t.Errorf("%d.Examples() = %q", tc.d, got)
		}
	}
}

// thetaEvaluator scores θ by a deterministic function of it (the
// fraction of positive coordinates), counting its calls.
type thetaEvaluator struct {
	mu    sync.Mutex
	calls int
}

func (e *thetaEvaluator) Evaluate(theta []float32) (Evaluation, error) {
	e.mu.Lock()
	e.calls++
	e.mu.Unlock()
	pos := 0
	for _, v := range theta {
		if v > 0 {
			pos++
		}
	}
	return Evaluation{Accuracy: float64(pos) / float64(len(theta)), Loss: 1, N: len(theta)}, nil
}

// TestServerConfigNeedsEvalData: an Evaluator without declared data is
// refused, so no evaluation is ever released with a guessed label.
func TestServerConfigNeedsEvalData(t *testing.T) {
	cfg := DefaultServerConfig()
	cfg.Evaluator = &thetaEvaluator{}
	if err := cfg.Validate(); !errors.Is(err, ErrEvalDataUnset) {
		t.Errorf("Evaluator without EvalData: Validate = %v, want ErrEvalDataUnset", err)
	}
	cfg.EvalData = EvalData(9)
	if err := cfg.Validate(); !errors.Is(err, ErrEvalDataUnset) {
		t.Errorf("EvalData 9: Validate = %v, want ErrEvalDataUnset", err)
	}
	for _, d := range []EvalData{EvalPublic, EvalTrainHoldout} {
		cfg.EvalData = d
		if err := cfg.Validate(); err != nil {
			t.Errorf("EvalData %d: %v", d, err)
		}
	}
	if _, err := NewServer(nil, nil, testRunConfig(), ServerConfig{Evaluator: &thetaEvaluator{}, RoundTimeout: 1,
		MinNodes: 1, NodeTimeout: 2, AnnounceEvery: 1, Noise: mechanism.NewSeededNoiseSource(1)}, nil); !errors.Is(err, ErrEvalDataUnset) {
		t.Errorf("NewServer with an undeclared Evaluator: %v", err)
	}
}

// TestServerLabelsEvaluations runs the leader's round loop (real NATS,
// real Raft) with an Evaluator on each kind of data and checks every
// output the coordinator produces for it: Progress, Summary, the
// evaluation log lines, and the Prometheus metric names. A holdout of the
// training data is labelled NON-PRIVATE and never exported as
// test_accuracy; public data keeps the test names.
func TestServerLabelsEvaluations(t *testing.T) {
	for _, d := range []EvalData{EvalPublic, EvalTrainHoldout} {
		t.Run(d.Key(), func(t *testing.T) {
			const steps = 6
			c, ctx, coordConn, r, scfg := oneNodeRun(t, steps)
			ev := &thetaEvaluator{}
			scfg.Evaluator, scfg.EvalData, scfg.EvalEvery = ev, d, 3
			var progress []Progress
			scfg.OnStep = func(p Progress) { progress = append(progress, p) }
			reg := prometheus.NewRegistry()
			var err error
			if scfg.Metrics, err = NewMetrics(reg, c.Run, "r1"); err != nil {
				t.Fatal(err)
			}
			// Before any evaluation no accuracy is exported, under either name.
			assertEvalMetrics(t, reg, nil)
			var logs bytes.Buffer // written by the Server's goroutines through slog's locked handler; read after Run
			s, err := NewServer(r, coordConn, c, scfg, slog.New(slog.NewJSONHandler(&logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			sum, err := s.Run(ctx)
			if err != nil {
				t.Fatal(err)
			}

			if !sum.FinalEvaluated || sum.EvalData != d {
				t.Errorf("summary: evaluated %v on %d, want %d", sum.FinalEvaluated, sum.EvalData, d)
			}
			evals := 0
			for _, p := range progress {
				if p.Step == 0 {
					t.Errorf("OnStep reported step 0 (θ₀'s evaluation is logged, not a step's progress): %+v", p)
				}
				if p.EvalStep > 0 {
					evals++
					if p.EvalData != d {
						t.Errorf("progress at step %d: EvalData %d, want %d", p.Step, p.EvalData, d)
					}
				}
			}
			if evals == 0 || ev.calls == 0 {
				t.Fatalf("no evaluation reported (%d calls)", ev.calls)
			}
			// Every call is logged: θ₀'s first (step 0, ε 0, the base of
			// the divergence check), then the steps'.
			logged := 0
			for _, line := range strings.Split(logs.String(), "\n") {
				if !strings.Contains(line, `"accuracy"`) {
					continue
				}
				if logged == 0 && (!strings.Contains(line, `"step":0,`) || !strings.Contains(line, `"epsilon":0}`)) {
					t.Errorf("first evaluation log line is not θ₀'s (step 0, ε 0): %s", line)
				}
				logged++
				label := `"msg":"` + d.Label() + ` evaluation"`
				if !strings.Contains(line, label) || !strings.Contains(line, `"eval_data":"`+d.Key()+`"`) ||
					strings.Contains(line, `"private":true`) != d.Private() {
					t.Errorf("evaluation log line not labelled %q: %s", d.Label(), line)
				}
			}
			if logged != ev.calls {
				t.Errorf("%d evaluation log lines for %d evaluations", logged, ev.calls)
			}
			assertEvalMetrics(t, reg, map[string]float64{
				"dpcluster_coordinator_" + d.Key() + "_accuracy": sum.Final.Accuracy,
				"dpcluster_coordinator_" + d.Key() + "_loss":     sum.Final.Loss,
			})
		})
	}
}

// assertEvalMetrics checks that the accuracy and loss metrics in reg are
// exactly want (name → value).
func assertEvalMetrics(t *testing.T, reg *prometheus.Registry, want map[string]float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		name := mf.GetName()
		if strings.HasSuffix(name, "_accuracy") || strings.HasSuffix(name, "_loss") {
			got[name] = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if len(got) != len(want) {
		t.Errorf("evaluation metrics %v, want %v", got, want)
	}
	for name, v := range want {
		if g, ok := got[name]; !ok || g != v {
			t.Errorf("%s = %v (exported: %v), want %v", name, g, ok, v)
		}
	}
}

// blockingEvaluator blocks its first evaluation until release is closed.
type blockingEvaluator struct {
	thetaEvaluator
	started, release chan struct{}
	once             sync.Once
}

func (e *blockingEvaluator) Evaluate(theta []float32) (Evaluation, error) {
	first := false
	e.once.Do(func() { first = true })
	if first {
		close(e.started)
		<-e.release
	}
	return e.thetaEvaluator.Evaluate(theta)
}

// TestServerEvaluatesBesideTheRounds: an evaluation runs beside the rounds:
// while the first one, θ₀'s, is held, the run goes on stepping (evaluating
// on the loop would hold every round behind it, the first one included);
// of the steps that come due meanwhile the first (2) is evaluated after
// θ₀'s, the others not; once released θ₀'s evaluation is logged at step 0
// and the run ends with its final evaluation.
func TestServerEvaluatesBesideTheRounds(t *testing.T) {
	const steps = 12
	c, ctx, coordConn, r, scfg := oneNodeRun(t, steps)
	ev := &blockingEvaluator{started: make(chan struct{}), release: make(chan struct{})}
	scfg.Evaluator, scfg.EvalData, scfg.EvalEvery = ev, EvalPublic, 2
	var mu sync.Mutex
	var evalSteps []int64
	scfg.OnStep = func(p Progress) {
		if p.EvalStep > 0 {
			mu.Lock()
			evalSteps = append(evalSteps, p.EvalStep)
			mu.Unlock()
		}
	}
	var logs bytes.Buffer // written by the Server's goroutines through slog's locked handler; read after Run
	s, err := NewServer(r, coordConn, c, scfg, slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := s.Run(ctx); done <- err }()
	<-ev.started // θ₀'s evaluation is held
	for r.FSM().State().Applied < 8 {
		if ctx.Err() != nil {
			at := r.FSM().State().Applied
			close(ev.release) // let a loop blocked in Evaluate return, so Run does
			<-done
			t.Fatalf("the run stopped at step %d while an evaluation was held", at)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(ev.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(evalSteps) == 0 || evalSteps[len(evalSteps)-1] != steps {
		t.Errorf("evaluations reported for steps %v, want %d last", evalSteps, steps)
	}
	if len(evalSteps) == 0 || evalSteps[0] != 2 {
		t.Errorf("evaluations reported for steps %v, want the first due, 2, first (kept for after θ₀'s)", evalSteps)
	}
	for _, st := range evalSteps[min(1, len(evalSteps)):] {
		if st < 8 {
			t.Errorf("step %d was evaluated while θ₀'s evaluation was held (reported %v)", st, evalSteps)
		}
	}
	var first string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"msg":"test evaluation"`) {
			first = line
			break
		}
	}
	if !strings.Contains(first, `"step":0,`) {
		t.Errorf("first evaluation logged %q; want θ₀'s, at step 0", first)
	}
}

// oneNodeRun sets up a run of steps steps with one scripted node and one
// replica that leads, and the server configuration for it (seeded noise).
func oneNodeRun(t *testing.T, steps int64) (RunConfig, context.Context, *transport.Client, *Replica, ServerConfig) {
	t.Helper()
	c := testRunConfig()
	c.MaxSteps = steps
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	coordConn, dial := natsPair(t, c.Run)
	startScriptNode(t, ctx, dial("n0"), "n0", c.ModelHash, shardOf(0), func(step uint64) (int64, []float32) {
		return 40, sentinelSum(0, step, c.Dim, 40, c.Optimizer.ClipNorm)
	})
	r := openReplicaForServer(t, t.TempDir())
	waitLeader(t, r)
	scfg := DefaultServerConfig()
	scfg.Noise = mechanism.NewSeededNoiseSource(5)
	return c, ctx, coordConn, r, scfg
}

// TestCheckDivergence: the rule advance stops a run by. A loss that is NaN
// or infinite diverges at once, even as the base; otherwise the first loss
// seen is the base, and a later one diverges only past divergenceFactor
// times it. The first reason stays.
func TestCheckDivergence(t *testing.T) {
	inf := math.Inf(1)
	for _, tc := range []struct {
		name   string
		losses []float64 // of steps 0, 5, 10, …
		want   string    // the reason after StopDiverged; "" for none
	}{
		{"steady", []float64{2.3, 1.1, 0.7}, ""},
		{"grows, within the factor", []float64{2.3, 2000}, ""},
		{"grows past the factor", []float64{2.3, 2301, 1e9}, "evaluation loss grew from 2.3 at step 0 to 2.3e+03 at step 5 (more than 1000×)"},
		{"NaN", []float64{2.3, math.NaN(), inf}, "evaluation loss NaN at step 5"},
		{"infinite base", []float64{inf}, "evaluation loss +Inf at step 0"},
		{"zero base: only non-finite", []float64{0, 1e6, -inf}, "evaluation loss -Inf at step 10"},
	} {
		var l loop
		for i, loss := range tc.losses {
			l.checkDivergence(loss, int64(5*i))
		}
		want := ""
		if tc.want != "" {
			want = StopDiverged + ": " + tc.want
		}
		if l.diverged != want {
			t.Errorf("%s: diverged %q, want %q", tc.name, l.diverged, want)
		}
	}
}
