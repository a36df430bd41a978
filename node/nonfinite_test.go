package node

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/transport"
)

// TestNonFiniteExampleStillAnswered is issue 11's item 2 at the node: a
// shard holds one record with finite but huge features (3e38) whose
// forward pass overflows. The node must answer the round as usual, with
// the record contributing zero and counted, and nothing observable outside
// the node (the round metrics, the logs, the status topic) may depend on
// the record: the contribution is the clipped sum of the other records,
// bit for bit, with the full count.
func TestNonFiniteExampleStillAnswered(t *testing.T) {
	fx := newFixture(t, model.MLP([]int{8}, []int{64}, 3))
	n := fx.shard.Len()
	withHugeRecord(t, &fx, n-1) // last, so the sum of the others is the same bits

	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	var statuses []transport.Status
	statusCh := make(chan transport.Status, 64)
	if _, err := lc.Subscribe(transport.TopicStatus, func(m transport.Message) {
		if s := m.(transport.Status); s.From == testNode {
			statusCh <- s
		}
	}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := testConfig()
	cfg.SampleRate = 1 // every record, the huge one included
	cfg.Registerer = reg
	cfg.SeededSampling, cfg.SamplingSeed = true, 5
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
	rs := fx.round(1, 1, 1, wait)
	rs.SampleRate = cfg.SampleRate
	l.publish(rs)
	eventually(t, "round answered or skipped", func() bool {
		st := w.Stats()
		return st.Answered+st.Skipped[SkipCompute] > 0
	})
	if st := w.Stats(); st.Skipped[SkipCompute] != 0 {
		t.Fatalf("round skipped (%s) because of one record: stats %+v", SkipCompute, st)
	}
	c := recv(t, l.contribs, "contribution")
	cancel()
	<-done
	for len(statusCh) > 0 {
		statuses = append(statuses, <-statusCh)
	}

	if c.Count != int64(n) {
		t.Errorf("count = %d, want %d: the record is counted whatever its gradient", c.Count, n)
	}
	checkContribution(t, c, n, rs.SampleRate, rs.ClipNorm)
	checkSumOfOthers(t, fx, c, n, rs.ClipNorm)
	checkNothingMentionsRecord(t, reg, statuses, buf.String())
}

// withHugeRecord gives the record bad of fx's shard (a copy) features of
// 3e38, finite values whose forward pass overflows, and checks that it does.
func withHugeRecord(t *testing.T, fx *fixture, bad int) {
	t.Helper()
	d := *fx.shard
	d.X = slices.Clone(fx.shard.X)
	for j := range d.Dim {
		d.X[bad*d.Dim+j] = 3e38
	}
	fx.shard = &d
	ws, err := fx.m.NewWorkspace(1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Evaluate(fx.theta, d.X[bad*d.Dim:(bad+1)*d.Dim], d.Y[bad:bad+1]); !errors.Is(err, model.ErrNonFinite) {
		t.Fatalf("the 3e38 record's forward pass is finite (%v): the test lost its point", err)
	}
}

// checkSumOfOthers checks that c's sum is the clipped sum of the first n-1
// records of fx's shard, bit for bit.
func checkSumOfOthers(t *testing.T, fx fixture, c transport.Contribution, n int, clip float64) {
	t.Helper()
	// The other records are summed exactly as without the huge one.
	others := make([]int, n-1)
	for i := range others {
		others[i] = i
	}
	ref, err := fx.m.NewWorkspace(n)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]float32, fx.m.NumParams())
	if _, err := ref.ClippedSumIndexed(want, fx.theta, fx.shard, others, clip); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal([]float32(c.Sum), want) {
		var d2, w2 float64
		for i := range want {
			e := float64(c.Sum[i]) - float64(want[i])
			d2 += e * e
			w2 += float64(want[i]) * float64(want[i])
		}
		t.Errorf("sum differs from the clipped sum of the other records (relative %.3g)", math.Sqrt(d2/w2))
	}
}

// checkNothingMentionsRecord checks that the metrics count one answered
// round and nothing else, that the node published no status, and that the
// logs do not mention a skipped round or a non-finite value.
func checkNothingMentionsRecord(t *testing.T, reg *prometheus.Registry, statuses []transport.Status, logs string) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() != "result" {
					continue
				}
				v := m.GetCounter().GetValue()
				if want := map[bool]float64{true: 1, false: 0}[lp.GetValue() == "answered"]; v != want {
					t.Errorf("%s{result=%q} = %v, want %v", mf.GetName(), lp.GetValue(), v, want)
				}
			}
		}
	}
	for _, s := range statuses {
		t.Errorf("node published status %+v", s)
	}
	for _, s := range []string{"round skipped", "non-finite", "compute_error", "NaN", "Inf"} {
		if strings.Contains(logs, s) {
			t.Errorf("logs mention %q:\n%s", s, logs)
		}
	}
}
