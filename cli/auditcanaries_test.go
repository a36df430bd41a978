package cli

import (
	"encoding/json"
	"log/slog"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/privacyaudit"
)

// detrendedScore is one canary's score from its whole series x (prefix
// sums over the series, its residuals kept): the naive version
// detrendScorer is checked against.
func detrendedScore(x []float32, q, sigma, clip float64) float64 {
	prefix := make([]float64, len(x)+1)
	for t, v := range x {
		prefix[t+1] = prefix[t] + float64(v)
	}
	r := make([]float64, len(x))
	var sumSq float64
	for t, v := range x {
		lo, hi := max(0, t-detrendWindow), min(len(x), t+detrendWindow+1)
		n := float64(hi - lo - 1)
		r[t] = float64(v)
		if n > 0 {
			base := (prefix[hi] - prefix[lo] - float64(v)) / n
			r[t] = (r[t] - base) / math.Sqrt(1+1/n)
		}
		sumSq += r[t] * r[t]
	}
	s := sigma * clip
	if v := sumSq / float64(len(x)); v > (1+excessNoise)*s*s {
		s = math.Sqrt(v)
	}
	var score float64
	for _, rt := range r {
		score += privacyaudit.SubsampledGaussianLLR(rt/s, q, s/clip)
	}
	return score
}

// TestDetrendScorerMatchesWholeSeries: streaming, in two passes with
// m·(2W+1) floats, gives the whole-series scores to within 1e-9 relative,
// on random series with a drift, a noise level of their own and sampled
// canaries, of lengths around the window's (shorter than it, one step,
// exactly 2W+1, one more) and longer.
func TestDetrendScorerMatchesWholeSeries(t *testing.T) {
	const m, q, sigma, clip = 7, 0.05, 0.8, 1.5
	r := rand.New(rand.NewPCG(3, 4))
	for _, steps := range []int{1, 2, 5, detrendWindow, detrendWindow + 1, 2 * detrendWindow, ringLen, ringLen + 1, 50, 1000} {
		series := make([][]float32, m)
		for i := range series {
			drift, noise := r.NormFloat64()*5, sigma*clip*(1+3*r.Float64())
			for t := range steps {
				x := drift*math.Sin(float64(t)/30) + r.NormFloat64()*noise
				if r.Float64() < q {
					x += clip
				}
				series[i] = append(series[i], float32(x))
			}
		}
		sc := newDetrendScorer(m, q, sigma, clip)
		x := make([]float32, m)
		for pass := range 2 {
			for t := range steps {
				for i := range m {
					x[i] = series[i][t]
				}
				sc.push(x)
			}
			if pass == 0 {
				sc.endNoisePass()
			}
		}
		got := sc.finish()
		for i := range m {
			want := detrendedScore(series[i], q, sigma, clip)
			if math.Abs(got[i]-want) > 1e-9*math.Max(math.Abs(want), 1e-300) {
				t.Errorf("%d steps, canary %d: streamed %v, whole series %v", steps, i, got[i], want)
			}
		}
	}
}

// TestAuditRunConfig: the audited run's population is N + m with B' =
// q·N', q and σ bit for bit the main job's (so the ledger charges the same
// mechanism), and its nodes' claims, shard plus canary positions, are the
// IID shards of N' the leader admits, whatever the coins.
func TestAuditRunConfig(t *testing.T) {
	spec := defaultRunSpec()
	spec.Dataset, spec.Model, spec.BatchSize, spec.MaxSteps, spec.TargetEpsilon = "gaussian", "logreg", 256, 100, 2
	pr, err := spec.prepare(t.Context(), false, "", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	n := int64(pr.train.Len())
	main, err := spec.runConfig(pr.model, n, "", false, t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []int{10, 9999, 123457} {
		rc, err := auditRunConfig(spec, pr, main, m, t.TempDir(), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("m = %d: %v", m, err)
		}
		if rc.TotalExamples != n+int64(m) || rc.SampleRate != main.SampleRate || rc.Optimizer.NoiseMultiplier != main.Optimizer.NoiseMultiplier ||
			rc.Delta != main.Delta || rc.MaxSteps != main.MaxSteps || rc.NoiseMode != main.NoiseMode || rc.Accountant != main.Accountant {
			t.Errorf("m = %d: N %d, q %v, σ %v; want %d, %v, %v and the same mechanism", m, rc.TotalExamples, rc.SampleRate,
				rc.Optimizer.NoiseMultiplier, n+int64(m), main.SampleRate, main.Optimizer.NoiseMultiplier)
		}
		const nodes = 3
		g := newGradientCanaries(rand.New(rand.NewPCG(uint64(m), 1)), m, n, nodes, 4, rc.Dim, 10)
		total := 0
		for i := range nodes {
			claim := dataset.ShardSizeIID(n, nodes, i) + int64(g.positions[i])
			if want := dataset.ShardSizeIID(rc.TotalExamples, nodes, i); claim != want {
				t.Errorf("m = %d, node %d claims %d, want shard %d of N' = %d", m, i, claim, want, rc.TotalExamples)
			}
			for _, id := range g.perNode[i] {
				if id < total || id >= total+g.positions[i] || !g.included[id] {
					t.Errorf("m = %d, node %d: canary %d outside its positions [%d, %d) or excluded", m, i, id, total, total+g.positions[i])
				}
			}
			total += g.positions[i]
		}
		if total != m {
			t.Errorf("m = %d: %d positions dealt", m, total)
		}
	}
}

// TestAuditWithAsManyCanariesAsExamples: one node whose shard holds n
// examples and about n included canaries (q·n = 400): its sampler draws
// about 2·q·n, and it claims n + its positions, so the leader rejects no
// contribution. Before the node counted its canary positions in its claim
// (issue 31), it claimed n and the leader's count bound for n, about
// q·n + 232, refused nearly every honest contribution.
func TestAuditWithAsManyCanariesAsExamples(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "audit")
	args := auditArgs(dir, "--nodes", "1", "--batch-size", "400", "--max-steps", "20", "--canaries", "20000", "--canary-support", "4",
		"--input-canaries", "0", "--reach-reps", "0")
	stdout, stderr, err := runCmd(t, args...)
	if err != nil {
		t.Fatalf("audit-privacy: %v\n%s", err, stderr)
	}
	var res auditResult
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if res.Rejected != 0 || res.Steps != 20 || res.Releases != 20 {
		t.Errorf("%d contributions rejected, %d steps, %d releases; want none, 20, 20", res.Rejected, res.Steps, res.Releases)
	}
	if res.SampleRate != 400.0/10000 {
		t.Errorf("q = %v, want the main job's 400/10000", res.SampleRate)
	}
}
