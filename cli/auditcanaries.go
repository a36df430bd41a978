package cli

import (
	crand "crypto/rand"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

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
// the included ones dealt round-robin to the nodes (node.Canaries).
type gradientCanaries struct {
	seed     uint64
	included []bool
	scale    float64
	support  int
	perNode  [][]int // canary IDs per node
}

func newGradientCanaries(r *rand.Rand, m, nodes, support, dim int, scale float64) *gradientCanaries {
	g := &gradientCanaries{seed: r.Uint64(), included: coins(r, m), scale: scale, support: min(support, dim),
		perNode: make([][]int, nodes)}
	k := 0
	for i, in := range g.included {
		if in {
			g.perNode[k%nodes] = append(g.perNode[k%nodes], i)
			k++
		}
	}
	return g
}

// nodeConfig gives node i its canaries (localFlags.nodeConfig).
func (g *gradientCanaries) nodeConfig(i int, c *node.Config) {
	c.Canaries = &node.Canaries{Seed: g.seed, IDs: g.perNode[i], Scale: g.scale, Support: g.support}
}

// scores reads every release g̃ₜ from the Raft log under dataDir and
// returns each canary's score Σₜ SubsampledGaussianLLR(zᵢₜ, q, σ), and
// the number of releases read. xᵢₜ = ⟨B·g̃ₜ, uᵢ⟩ (g̃ = (S + z)/B:
// coordinator.EachLoggedGradient) is the canary's gradient when sampled
// (norm C along uᵢ), plus N(0, σ²C²) noise, plus the real examples'
// clipped sum along uᵢ, which drifts slowly with θ and would otherwise
// drown the canary in a small model. The score removes it: zᵢₜ =
// (xᵢₜ − x̄ᵢₜ)/(σC·√(1 + 1/n)), x̄ᵢₜ the mean of xᵢ over the n ≤ 2·detrendWindow
// other steps within detrendWindow of t (its noise has variance σ²C²/n,
// hence the scale). Any function of the releases is a valid score; this
// one only makes the attack stronger. The inner products are accumulated
// in float64 over uᵢ's support; x is kept as m·T float32s.
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
		idx[i], vals[i] = node.CanaryDirection(g.seed, i, dim, g.support)
	}
	x := make([][]float32, m)
	var releases int64
	err := coordinator.EachLoggedGradient(dataDir, dim, func(_ int64, gt []float32) error {
		releases++
		for i := range m {
			var dot float64
			for j, k := range idx[i] {
				dot += float64(gt[k]) * float64(vals[i][j])
			}
			x[i] = append(x[i], float32(dot*b))
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	score := make([]float64, m)
	for i := range m {
		score[i] = detrendedScore(x[i], q, sigma, clip)
	}
	return score, releases, nil
}

// detrendWindow is how many steps on each side of t the baseline x̄ᵢₜ
// averages (scores).
const detrendWindow = 10

// detrendedScore is one canary's score from its projections x (scores).
func detrendedScore(x []float32, q, sigma, clip float64) float64 {
	prefix := make([]float64, len(x)+1)
	for t, v := range x {
		prefix[t+1] = prefix[t] + float64(v)
	}
	var score float64
	for t, v := range x {
		lo, hi := max(0, t-detrendWindow), min(len(x), t+detrendWindow+1)
		n := float64(hi - lo - 1)
		z := float64(v)
		if n > 0 {
			base := (prefix[hi] - prefix[lo] - float64(v)) / n
			z = (z - base) / math.Sqrt(1+1/n)
		}
		score += privacyaudit.SubsampledGaussianLLR(z/(sigma*clip), q, sigma)
	}
	return score
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

// auditSplits are the guesses tried, fixed before any score is seen: the
// top 1% and 5% guessed in, and the top and bottom 10% and 25%, each at
// β/4 (privacyaudit.Audit's union bound).
func auditSplits(m int) []privacyaudit.Split {
	k := func(frac int) int { return max(1, m/frac) }
	return []privacyaudit.Split{{KPlus: k(100)}, {KPlus: k(20)}, {KPlus: k(10), KMinus: k(10)}, {KPlus: k(4), KMinus: k(4)}}
}
