package cli

import (
	crand "crypto/rand"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/node"
	"github.com/dpcluster/dpcluster/privacyaudit"
)

// The canaries of coordinator audit-privacy (auditprivacy.go): their
// secret coins, where they go, and their scores. docs/PRIVACY.md
// ("Auditing the mechanism") argues the design.

// auditRand returns a generator keyed from crypto/rand: the canaries'
// coins and the gradient canaries' direction seed must be unknown to the
// run (nothing in it may depend on them but through the canaries).
func auditRand() (*rand.Rand, error) {
	var seed [32]byte
	if _, err := crand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("audit-privacy: reading crypto/rand: %w", err)
	}
	return rand.New(rand.NewChaCha8(seed)), nil
}

// coins returns m independent fair coins: included[i] says whether canary
// i is in the run.
func coins(r *rand.Rand, m int) []bool {
	in := make([]bool, m)
	for i := range in {
		in[i] = r.Uint64()&1 == 1
	}
	return in
}

// gradientCanaries are the white-box canaries: m directions from a seed,
// and m canary positions dealt to the nodes before the coins are drawn;
// a position holds its canary when the coins include it, and is empty
// otherwise (node.Canaries).
type gradientCanaries struct {
	seed      uint64
	included  []bool
	scale     float64
	support   int
	span      int     // the directions lie in the first span parameters
	perNode   [][]int // included canary IDs per node
	positions []int   // canary positions per node
}

// newGradientCanaries draws the canaries' direction seed and coins and
// deals them to nodes nodes holding IID shards of n training examples:
// node i holds the positions of canaries [start_i, start_i + P_i), P_i =
// ShardSizeIID(n + m, i) − ShardSizeIID(n, i), so that its claim, shard
// size plus positions, is shard i of n + m examples cut into nodes IID
// shards: what the leader admits in the run of auditRunConfig. The
// positions depend on m, n and nodes only, not on the coins.
func newGradientCanaries(r *rand.Rand, m int, n int64, nodes, support, span int, scale float64) *gradientCanaries {
	g := &gradientCanaries{seed: r.Uint64(), included: coins(r, m), scale: scale, support: min(support, span), span: span,
		perNode: make([][]int, nodes), positions: make([]int, nodes)}
	start := 0
	for i := range nodes {
		p := int(dataset.ShardSizeIID(n+int64(m), nodes, i) - dataset.ShardSizeIID(n, nodes, i))
		for id := start; id < start+p; id++ {
			if g.included[id] {
				g.perNode[i] = append(g.perNode[i], id)
			}
		}
		g.positions[i], start = p, start+p
	}
	return g
}

// nodeConfig gives node i its canaries (localFlags.nodeConfig).
func (g *gradientCanaries) nodeConfig(i int, c *node.Config) {
	c.Canaries = &node.Canaries{Seed: g.seed, IDs: g.perNode[i], Scale: g.scale, Support: g.support,
		Span: g.span, Positions: g.positions[i]}
}

// canarySpan is the number of leading parameters the gradient canaries'
// directions lie in: all but the output layer's (the model's last weight
// tensor and what follows it) when m canaries fit there (with support 1,
// one coordinate each), else all dim. The output layer's gradient is the
// loss's derivative times the last hidden activations, so every example
// moves it: on the main job its coordinates drifted with training (their
// canaries' Dᵢ had a standard deviation of 2.6, against 1.04–1.08 on the
// other layers, which carried only the mechanism's noise; detrendScorer,
// docs/PRIVACY.md "Quiet canaries scored raw"). The span is fixed by the
// model's layout before the coins are drawn.
func canarySpan(params []model.ParamInfo, m, support, dim int) int {
	last := -1
	for i, p := range params {
		if strings.HasSuffix(p.Name, "weight") {
			last = i
		}
	}
	if last < 0 {
		return dim
	}
	span := params[last].Offset
	if span < 1 || support > span || support == 1 && m > span {
		return dim
	}
	return span
}

// auditRunConfig is the configuration of the run the audit trains: the
// main job's, rc (N examples, B = q·N), with the m gradient canary
// positions added to its population, N' = N + m, and B' = q·N' for q bit
// for bit rc's; σ is rc's (no second calibration), and so are T, δ, the
// noise mode and the accountant: the ledger charges exactly the main
// job's mechanism. Each node then claims its shard and its canary
// positions (newGradientCanaries), which add up to N', so the leader's
// admission and count bound see what the nodes sample. The release g̃ =
// (S + z)/B' is the main job's scaled by B/B' (a smaller step for the
// optimizer); the audit scores B'·g̃, so that scale does not reach it.
func auditRunConfig(spec runSpec, pr preparedRun, rc coordinator.RunConfig, m int, dataDir string, log *slog.Logger) (coordinator.RunConfig, error) {
	n := rc.TotalExamples + int64(m)
	b, err := batchForRate(rc.SampleRate, n)
	if err != nil {
		return coordinator.RunConfig{}, err
	}
	s := spec
	s.TotalExamples, s.BatchSize, s.Sigma = n, b, rc.Optimizer.NoiseMultiplier
	// δ is the main job's, kept as a resumed run keeps its ledger's: the
	// audit accounts that mechanism at that δ, even where the canaries
	// take N' past 1/δ.
	s.Delta, s.ledgerDelta = 0, rc.Delta
	out, err := s.runConfig(pr.model, n, "", false, dataDir, log)
	if err != nil {
		return coordinator.RunConfig{}, fmt.Errorf("audit-privacy: the run with %d canary positions: %w", m, err)
	}
	if out.SampleRate != rc.SampleRate || out.Optimizer.NoiseMultiplier != rc.Optimizer.NoiseMultiplier || out.Delta != rc.Delta ||
		out.MaxSteps != rc.MaxSteps || out.NoiseMode != rc.NoiseMode || out.Accountant != rc.Accountant || out.TargetEpsilon != rc.TargetEpsilon {
		return coordinator.RunConfig{}, fmt.Errorf("audit-privacy: the run with %d canary positions would not account the main job's mechanism (q %v, σ %v; want %v, %v)",
			m, out.SampleRate, out.Optimizer.NoiseMultiplier, rc.SampleRate, rc.Optimizer.NoiseMultiplier)
	}
	return out, nil
}

// batchForRate returns a B with B/n == q exactly in float64 (q·n, or a
// neighbour a few ulps away, where q·n rounds to a B whose quotient is
// off by one ulp), or an error if there is none within 64 ulps.
func batchForRate(q float64, n int64) (float64, error) {
	nf := float64(n)
	lo, hi := q*nf, q*nf
	for range 64 {
		for _, b := range []float64{lo, hi} {
			if b/nf == q {
				return b, nil
			}
		}
		lo, hi = math.Nextafter(lo, 0), math.Nextafter(hi, math.Inf(1))
	}
	return 0, fmt.Errorf("audit-privacy: no batch size B has B/%d = q = %v exactly", n, q)
}

// scores reads every release g̃ₜ from the Raft log under dataDir, twice
// (detrendScorer's two passes), and returns each canary's score and the
// number of releases read. xᵢₜ = ⟨B·g̃ₜ, uᵢ⟩ (g̃ = (S + z)/B:
// coordinator.EachLoggedGradient) is the canary's gradient when sampled
// (norm C along uᵢ), plus N(0, σ²C²) noise, plus the real examples'
// clipped sum along uᵢ, which drifts with θ and varies from batch to
// batch. The inner products are accumulated in float64 over uᵢ's support,
// and scored while the log is read: memory m·(2·detrendWindow+1)
// float32s and 2m float64s, whatever the number of steps.
func (g *gradientCanaries) scores(dataDir string, rc coordinator.RunConfig) ([]float64, int64, error) {
	dim := rc.Dim
	oc := rc.Optimizer
	q, sigma, clip, b := rc.SampleRate, oc.NoiseMultiplier, oc.ClipNorm, oc.ExpectedBatchSize
	if !(sigma > 0) {
		return nil, 0, fmt.Errorf("audit-privacy: σ = %v: the audit needs a noisy run", sigma)
	}
	m := len(g.included)
	idx, vals := make([][]int, m), make([][]float32, m)
	for i := range m {
		idx[i], vals[i] = node.CanaryDirection(g.seed, i, g.span, g.support)
	}
	sc := newDetrendScorer(m, q, sigma, clip)
	x := make([]float32, m)
	var releases int64
	for pass := range 2 {
		releases = 0
		err := coordinator.EachLoggedGradient(dataDir, dim, func(_ int64, gt []float32) error {
			releases++
			for i := range m {
				var dot float64
				for j, k := range idx[i] {
					dot += float64(gt[k]) * float64(vals[i][j])
				}
				x[i] = float32(dot * b)
			}
			sc.push(x)
			return nil
		})
		if err != nil {
			return nil, 0, err
		}
		if pass == 0 {
			sc.endNoisePass()
		}
	}
	return sc.finish(), releases, nil
}

// detrendWindow is how many steps on each side of t the baseline x̄ᵢₜ
// averages (detrendScorer).
const detrendWindow = 10

// ringLen is the steps a detrendScorer keeps per canary: step s's window.
const ringLen = 2*detrendWindow + 1

// detrendScorer scores m canaries from their projections xᵢₜ, pushed one
// step at a time, in two passes over the same series. The first pass
// measures each canary's series: the mean of xᵢₜ² (raw), Σₜ xᵢₜ, and vᵢ,
// the mean of rᵢₜ², the detrended residuals
// rᵢₜ = (xᵢₜ − x̄ᵢₜ)/√(1 + 1/n), x̄ᵢₜ the mean of xᵢ over the n ≤
// 2·detrendWindow other steps within detrendWindow of t (rᵢₜ = xᵢₜ for a
// one-step series; the scale keeps the noise's variance). The second pass
// scores it,
//
//	Σₜ SubsampledGaussianLLR(yᵢₜ/sᵢ, q, sᵢ/C),
//
// the subsampled Gaussian's likelihood ratio for a shift C in noise of
// standard deviation sᵢ, where
//
//   - a quiet canary (vᵢ within excessNoise of σ²C², its raw mean square
//     at most vᵢ by excessNoise, and |Σₜ xᵢₜ|/√(T·vᵢ) ≤ driftLimit: a series
//     of independent noise at the mechanism's level, without a slow part) is
//     scored on its raw series, yᵢₜ = xᵢₜ, sᵢ = σC. Most are: on the main job the
//     coordinates of every layer but the output layer carry only the
//     mechanism's noise. The detrending costs such a canary much of its
//     power: x̄ᵢₜ removes the series' slow part, and with it the part of
//     the likelihood ratio that is linear in Σₜ xᵢₜ (on a simulated perfect
//     mechanism with the main job's q, T, σ and 1.2·10⁵ canaries, about 37
//     fewer included canaries among the top 840, paired over 8 runs);
//   - an active one (a coordinate the real examples' gradients move: their
//     drift along uᵢ shows in Dᵢ, their batch-to-batch variation in the
//     mean squares) is scored on its residuals, yᵢₜ = rᵢₜ, in its own
//     noise, sᵢ = √vᵢ where vᵢ exceeds σ²C² by more than excessNoise and
//     σC otherwise. Without the detrending, or with σC there, such a
//     canary's drift or excursions look like inclusions and crowd the
//     included canaries out of the top scores.
//
// Any function of the releases is a valid score (the guesses' validity
// needs only the coins' independence); the choice only makes the attack
// stronger or weaker.
//
// Step s's window needs x up to s + detrendWindow, so push(x_t) handles
// step t − detrendWindow, and the end of a pass the last detrendWindow
// steps (all of a shorter series) with their truncated windows. It keeps
// the last ringLen projections of each canary (m·ringLen float32s) and
// four float64s. The terms are those of the whole-series computation
// (canaryScoreWhole in the tests), added in the same order; only a
// window's sum is added in another order: equal to within float64
// rounding.
type detrendScorer struct {
	q, sigma, clip float64
	ring           []float32 // ring[i·ringLen + t mod ringLen] = xᵢₜ
	sumSq          []float64 // first pass: Σₜ rᵢₜ²
	rawSum, rawSq  []float64 // first pass: Σₜ xᵢₜ, Σₜ xᵢₜ²
	noise          []float64 // second pass: sᵢ, negative for a quiet canary (−σC: its raw series)
	score          []float64
	steps          int // steps pushed in this pass
}

func newDetrendScorer(m int, q, sigma, clip float64) *detrendScorer {
	return &detrendScorer{q: q, sigma: sigma, clip: clip, ring: make([]float32, m*ringLen), sumSq: make([]float64, m),
		rawSum: make([]float64, m), rawSq: make([]float64, m), score: make([]float64, m)}
}

// push adds step t's projections, x[i] for canary i.
func (d *detrendScorer) push(x []float32) {
	slot := d.steps % ringLen
	for i, v := range x {
		d.ring[i*ringLen+slot] = v
	}
	if d.noise == nil {
		for i, v := range x {
			d.rawSum[i] += float64(v)
			d.rawSq[i] += float64(v) * float64(v)
		}
	}
	d.steps++
	if s := d.steps - 1 - detrendWindow; s >= 0 {
		d.step(s)
	}
}

// endNoisePass ends the first pass: each canary's way of scoring and sᵢ,
// and a fresh series for the second.
func (d *detrendScorer) endNoisePass() {
	d.endPass()
	d.noise = d.sumSq
	sc := d.sigma * d.clip
	t := float64(d.steps)
	for i, ss := range d.sumSq {
		v, raw := ss/t, d.rawSq[i]/t
		drift := math.Abs(d.rawSum[i]) / math.Sqrt(t*v) // in the canary's own noise
		switch {
		case math.Abs(v-sc*sc) <= excessNoise*sc*sc && raw <= (1+excessNoise)*v && drift <= driftLimit:
			d.noise[i] = -sc // quiet: its raw series, in the mechanism's noise
		case v > (1+excessNoise)*sc*sc:
			d.noise[i] = math.Sqrt(v)
		default:
			d.noise[i] = sc
		}
	}
	d.rawSum, d.rawSq = nil, nil
	d.steps = 0
}

// driftLimit is the largest |Σₜ xᵢₜ|/√(T·vᵢ) of a quiet canary
// (detrendScorer): for a series of independent noise it is |N(0, 1)| plus
// the canary's own inclusions (about qT·C/(σC√T) ≈ 0.19 on the main job),
// so 4 moves a pure-noise canary to the detrended score with probability
// 6·10⁻⁵. On the main job's layers other than the output layer Σₜ xᵢₜ/(σC√T)
// had a standard deviation of 1.04–1.08 over 1.2·10⁵ canaries, on the
// output layer's 2.6 (docs/PRIVACY.md, "Quiet canaries scored raw"). The
// drift is measured in the canary's own noise, not σC, and a canary whose
// noise is not the mechanism's (vᵢ off σ²C² by more than excessNoise, either
// way) is not quiet: where the release carries less noise than the ledger
// charges (the broken mechanism of e2e's TestAuditCatchesBrokenMechanism),
// the real gradients' variation is large against it though small against
// σC, and scored raw it drowned the canaries (bounds 0.5–1.0 at ledger ε =
// 1 instead of above it).
const driftLimit = 4

// excessNoise is the relative excess of a canary's residual variance over
// σ²C² above which detrendScorer scores it in its own noise: 15%, 3.3
// standard deviations of the variance's estimate from T = 1000 steps, so
// that a direction with only the mechanism's noise keeps σC. Chosen on one
// dumped ε = 8 run of the main job with 120,000 coordinate canaries: of
// the top 840 scores 785 were included canaries with 15%, 776 with 10%,
// 775 with 20%, 761 with 30%, 750 with every canary in its own noise, and
// 700 with σC for all (on a simulated perfect mechanism 799, 786, 803,
// 804, 768 and 804); docs/PRIVACY.md, "Coordinate canaries".
const excessNoise = 0.15

// finish ends the second pass and returns the scores.
func (d *detrendScorer) finish() []float64 {
	d.endPass()
	return d.score
}

func (d *detrendScorer) endPass() {
	for s := max(0, d.steps-detrendWindow); s < d.steps; s++ {
		d.step(s)
	}
}

// step handles step s: its window is [s − detrendWindow, s +
// detrendWindow] within the steps pushed.
func (d *detrendScorer) step(s int) {
	lo, hi := max(0, s-detrendWindow), min(d.steps, s+detrendWindow+1)
	n := float64(hi - lo - 1)
	root := math.Sqrt(1 + 1/n)
	for i := range d.score {
		row := d.ring[i*ringLen : (i+1)*ringLen]
		v := float64(row[s%ringLen])
		r := v
		if n > 0 {
			var sum float64
			if hi-lo == ringLen {
				for _, w := range row {
					sum += float64(w)
				}
			} else {
				for t := lo; t < hi; t++ {
					sum += float64(row[t%ringLen])
				}
			}
			r = (r - (sum-v)/n) / root
		}
		switch s := d.noise; {
		case s == nil:
			d.sumSq[i] += r * r
		case s[i] < 0: // quiet: the raw series
			d.score[i] += privacyaudit.SubsampledGaussianLLR(v/-s[i], d.q, -s[i]/d.clip)
		default:
			d.score[i] += privacyaudit.SubsampledGaussianLLR(r/s[i], d.q, s[i]/d.clip)
		}
	}
}

// inputCanaries are the black-box canaries: m training rows, each given
// a wrong label drawn uniformly from the other classes; every source row
// leaves the training set, and the included canaries come back with
// their wrong labels.
type inputCanaries struct {
	included []bool
	x        []float32 // m rows of Dim features
	y        []int32   // the wrong labels
	dim      int
}

// newInputCanaries draws m distinct rows of train and returns the
// canaries and the training set the run uses: train without the m rows,
// followed by the included canaries.
func newInputCanaries(r *rand.Rand, train *dataset.Dataset, m int) (*inputCanaries, *dataset.Dataset, error) {
	n := train.Len()
	if m >= n {
		return nil, nil, fmt.Errorf("audit-privacy: %d input canaries need more than %d training examples", m, n)
	}
	if train.Classes < 2 {
		return nil, nil, fmt.Errorf("audit-privacy: input canaries need two classes or more, the data has %d", train.Classes)
	}
	src := r.Perm(n)[:m]
	c := &inputCanaries{included: coins(r, m), x: make([]float32, m*train.Dim), y: make([]int32, m), dim: train.Dim}
	train.Gather(c.x, c.y, src)
	for i := range c.y {
		c.y[i] = (c.y[i] + 1 + int32(r.IntN(train.Classes-1))) % int32(train.Classes)
	}
	drop := slices.Clone(src)
	slices.Sort(drop)
	keep := make([]int, 0, n)
	for i := range n {
		if _, found := slices.BinarySearch(drop, i); !found {
			keep = append(keep, i)
		}
	}
	base := len(keep)
	for i, in := range c.included {
		if in {
			keep = append(keep, src[i])
		}
	}
	out := train.Subset(keep)
	k := base
	for i, in := range c.included {
		if in {
			out.Y[k] = c.y[i]
			k++
		}
	}
	return c, out, nil
}

// scores returns −loss of θ on each canary (its wrong label): lower loss,
// higher score, "more likely trained on".
func (c *inputCanaries) scores(m *model.Model, theta []float32) ([]float64, error) {
	ws, err := m.NewWorkspace(1)
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(c.y))
	for i := range c.y {
		ev, err := ws.Evaluate(theta, c.x[i*c.dim:(i+1)*c.dim], c.y[i:i+1])
		if err != nil {
			return nil, fmt.Errorf("audit-privacy: input canary %d: %w", i, err)
		}
		out[i] = -ev.Loss
	}
	return out, nil
}

// auditSplits are the guesses tried, fixed before any score is seen, a
// function of m only, each at β/len(splits) (privacyaudit.Audit's union
// bound). For m < largeAudit: the top 1% and 5% guessed in, and the top
// and bottom 10% and 25% (chosen for m = 10⁴). For m ≥ largeAudit: one
// split, the top 0.7% guessed in, no union bound to pay: in the ideal
// audit of the main job (privacyaudit.Ideal's model, q = 0.0043, T =
// 1000, σ for ε = 2 and 8, δ = 1e-5, β = 0.05; docs/PRIVACY.md, "Coordinate
// canaries") it had the best or a tied-best median run-curve bound at both
// ε for m = 1.2·10⁵ (9 repetitions), and at ε = 2 for 2.5·10⁵ (5; the top
// 0.5% was better at ε = 8 there), among ten candidate sets: single top
// splits of 0.5% to 2%, unions of two or three of them, the old splits,
// and the top 0.2%, 0.5%, 1%, 2%, 5%.
func auditSplits(m int) []privacyaudit.Split {
	if m >= largeAudit {
		return []privacyaudit.Split{{KPlus: m * 7 / 1000}}
	}
	k := func(frac int) int { return max(1, m/frac) }
	return []privacyaudit.Split{{KPlus: k(100)}, {KPlus: k(20)}, {KPlus: k(10), KMinus: k(10)}, {KPlus: k(4), KMinus: k(4)}}
}

// largeAudit is the least m that auditSplits gives the large-audit split.
const largeAudit = 50000
