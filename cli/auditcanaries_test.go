package cli

import (
	"encoding/json"
	"log/slog"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/privacyaudit"
)

// canaryScoreWhole is one canary's score from its whole series x (prefix
// sums over the series, its residuals kept): the naive version
// detrendScorer is checked against.
func canaryScoreWhole(x []float32, q, sigma, clip float64) float64 {
	prefix := make([]float64, len(x)+1)
	var rawSq float64
	for t, v := range x {
		prefix[t+1] = prefix[t] + float64(v)
		rawSq += float64(v) * float64(v)
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
	s, T := sigma*clip, float64(len(x))
	limit, v := (1+excessNoise)*s*s, sumSq/T
	if math.Abs(v-s*s) <= excessNoise*s*s && rawSq/T <= (1+excessNoise)*v && math.Abs(prefix[len(x)])/math.Sqrt(T*v) <= driftLimit {
		for t, v := range x {
			r[t] = float64(v) // quiet: the raw series
		}
	} else if v > limit {
		s = math.Sqrt(v)
	}
	var score float64
	for _, rt := range r {
		score += privacyaudit.SubsampledGaussianLLR(rt/s, q, s/clip)
	}
	return score
}

// streamScores scores the canaries' series (series[i][t], all of one
// length) with a detrendScorer, in its two passes.
func streamScores(series [][]float32, q, sigma, clip float64) []float64 {
	m := len(series)
	sc := newDetrendScorer(m, q, sigma, clip)
	x := make([]float32, m)
	for pass := range 2 {
		for t := range series[0] {
			for i := range m {
				x[i] = series[i][t]
			}
			sc.push(x)
		}
		if pass == 0 {
			sc.endNoisePass()
		}
	}
	return sc.finish()
}

// TestDetrendScorerMatchesWholeSeries: streaming, in two passes with
// m·(2W+1) floats, gives the whole-series scores to within 1e-9 relative,
// on random series, quiet ones (the mechanism's noise) and ones with a
// drift and a noise level of their own, with sampled canaries, of lengths
// around the window's (shorter than it, one step, exactly 2W+1, one more)
// and longer.
func TestDetrendScorerMatchesWholeSeries(t *testing.T) {
	const m, q, sigma, clip = 7, 0.05, 0.8, 1.5
	r := rand.New(rand.NewPCG(3, 4))
	for _, steps := range []int{1, 2, 5, detrendWindow, detrendWindow + 1, 2 * detrendWindow, ringLen, ringLen + 1, 50, 1000} {
		series := make([][]float32, m)
		for i := range series {
			drift, noise := r.NormFloat64()*5, sigma*clip*(1+3*r.Float64())
			if i%2 == 0 { // quiet: the mechanism's noise alone
				drift, noise = 0, sigma*clip
			}
			for t := range steps {
				x := drift*math.Sin(float64(t)/30) + r.NormFloat64()*noise
				if r.Float64() < q {
					x += clip
				}
				series[i] = append(series[i], float32(x))
			}
		}
		got := streamScores(series, q, sigma, clip)
		for i := range m {
			want := canaryScoreWhole(series[i], q, sigma, clip)
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
	skipUnderRace(t)
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

// TestQuietCanariesScoredAsTheIdealAudit: a canary whose series is the
// mechanism's noise (and its own inclusions) is scored on its raw series,
// Σₜ SubsampledGaussianLLR(xₜ/σC, q, σ), the statistic the ideal audit
// (privacyaudit.IdealReach) scores a perfect mechanism's canaries with;
// before, every canary was scored on detrended residuals, which cost the
// main job's audit about 37 of its top 840 guesses (detrendScorer). A
// canary with a drift of a few noise levels over the run, or a noise
// level 30% above the mechanism's or a quarter of it (a broken mechanism),
// is still scored on its residuals.
func TestQuietCanariesScoredAsTheIdealAudit(t *testing.T) {
	const m, steps, q, sigma, clip = 40, 1000, 0.02, 0.7, 2.0
	r := rand.New(rand.NewPCG(8, 9))
	series := make([][]float32, m)
	for i := range series {
		for range steps {
			x := r.NormFloat64() * sigma * clip
			switch i % 5 {
			case 2: // drifting: 8 noise levels over the run
				x += 8 * sigma * clip / math.Sqrt(steps)
			case 3: // busy: its noise 1.3 times the mechanism's
				x *= 1.3
			case 4: // a quarter of the noise (a broken mechanism)
				x /= 4
			}
			if i%2 == 1 && r.Float64() < q {
				x += clip
			}
			series[i] = append(series[i], float32(x))
		}
	}
	got := streamScores(series, q, sigma, clip)
	for i, xs := range series {
		var ideal float64
		for _, v := range xs {
			ideal += privacyaudit.SubsampledGaussianLLR(float64(v)/(sigma*clip), q, sigma)
		}
		quiet := i%5 < 2
		if same := math.Abs(got[i]-ideal) <= 1e-9*math.Abs(ideal); same != quiet {
			t.Errorf("canary %d (quiet %v): score %v, the ideal audit's statistic %v", i, quiet, got[i], ideal)
		}
	}
}

// TestCanarySpan: the gradient canaries leave the output layer out (the
// mlp's last weight tensor starts at 266,752 of its 269,322 parameters)
// when they fit without it, and use every parameter otherwise: more
// coordinate canaries than the span, or a model whose only weight tensor
// is its output layer (logreg).
func TestCanarySpan(t *testing.T) {
	params := func(name string) ([]model.ParamInfo, int) {
		spec, err := model.Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := model.New(spec)
		if err != nil {
			t.Fatal(err)
		}
		return m.Params(), m.NumParams()
	}
	mlp, dim := params("mlp")
	for _, c := range []struct{ m, support, want int }{
		{120000, 1, 266752}, {266752, 1, 266752}, {266753, 1, dim}, {120000, 32, 266752},
	} {
		if got := canarySpan(mlp, c.m, c.support, dim); got != c.want {
			t.Errorf("mlp, m = %d, support %d: span %d, want %d", c.m, c.support, got, c.want)
		}
	}
	logreg, ldim := params("logreg")
	if got := canarySpan(logreg, 100, 1, ldim); got != ldim {
		t.Errorf("logreg: span %d, want all %d parameters", got, ldim)
	}
}
