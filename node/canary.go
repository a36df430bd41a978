package node

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Canaries are the gradient canaries of a privacy audit (coordinator
// audit-privacy, docs/PRIVACY.md "Auditing the mechanism"): extra examples
// of this node's shard whose per-example gradient the auditor crafted.
// They are the only way anything but the shard's own examples enters a
// node's sum, and only the audit command sets them: the node command and
// every other caller leave Config.Canaries nil.
//
// Each round the node's real Poisson sampler draws from the shard's n
// examples and the len(IDs) canaries together, n+len(IDs) positions at
// the run's q (Worker.compute): a canary is sampled exactly as often as an
// example, never injected every step. A sampled canary adds its clipped
// gradient to the round's sum and 1 to its count, so it travels with the
// real examples: over the wire, through the leader's one noise addition,
// the ledger's charge and the release.
//
// Canary id's gradient is Scale·C·u_id, u_id = CanaryDirection(Seed, id,
// dim, Support), clipped to norm C·(1 − 2⁻²⁰) by clipCanary: Scale > 1, so
// the clip is what bounds its contribution (a canary that reached the sum
// unclipped would move g̃ Scale times as far along u_id).
type Canaries struct {
	// Seed is the auditor's direction seed (secret until the run ends).
	Seed uint64
	// IDs are the canaries this node holds: indices into the auditor's
	// list, distinct and ≥ 0. Only the canaries the auditor's coins
	// included are given to a node.
	IDs []int
	// Scale is a canary gradient's norm before clipping, in units of C:
	// greater than 1 and finite (the audit uses 10).
	Scale float64
	// Support is the number of coordinates of each direction, in
	// [1, the model's number of parameters].
	Support int
}

// CanaryDirection returns the unit direction of canary id for a model of
// dim parameters: support distinct coordinates idx, drawn uniformly
// without replacement, each of value vals[j] = ±1/√support with a fair
// sign, from a PCG stream keyed by (seed, id). It is a pure function of
// its arguments: the node that injects canary id and the auditor who
// scores it compute the same vector. Its squared norm is 1 up to float32
// rounding of 1/√support (relative 2⁻²⁴). It panics if support is not in
// [1, dim] (Canaries.validate refuses such a configuration first).
func CanaryDirection(seed uint64, id, dim, support int) (idx []int, vals []float32) {
	if support < 1 || support > dim {
		panic(fmt.Sprintf("node: CanaryDirection: support %d outside [1, %d]", support, dim))
	}
	r := rand.New(rand.NewPCG(seed, uint64(id)))
	v := float32(1 / math.Sqrt(float64(support)))
	seen := make(map[int]struct{}, support)
	idx, vals = make([]int, 0, support), make([]float32, 0, support)
	for len(idx) < support {
		j := r.IntN(dim)
		if _, dup := seen[j]; dup {
			continue
		}
		seen[j] = struct{}{}
		s := v
		if r.Uint64()&1 == 1 {
			s = -v
		}
		idx, vals = append(idx, j), append(vals, s)
	}
	return idx, vals
}

// canaryShade keeps a clipped canary's norm below C by more than the
// float32 rounding of adding it into the sum (relative 2⁻²⁴ per element),
// so a round's sum stays within the leader's check ‖sum‖ ≤ count·C.
const canaryShade = 1 - 0x1p-20

// validate checks c against a model of dim parameters.
func (c *Canaries) validate(dim int) error {
	if !(c.Scale > 1) || math.IsInf(c.Scale, 0) {
		return fmt.Errorf("%w: Canaries.Scale %v must be > 1 and finite", ErrInvalidConfig, c.Scale)
	}
	if c.Support < 1 || c.Support > dim {
		return fmt.Errorf("%w: Canaries.Support %d must be in [1, %d]", ErrInvalidConfig, c.Support, dim)
	}
	seen := make(map[int]struct{}, len(c.IDs))
	for _, id := range c.IDs {
		if _, dup := seen[id]; dup || id < 0 {
			return fmt.Errorf("%w: Canaries.IDs: %d is negative or repeated", ErrInvalidConfig, id)
		}
		seen[id] = struct{}{}
	}
	return nil
}

// canaryVectors are a node's canaries' directions, computed once by
// NewWorker.
type canaryVectors struct {
	scale float64
	idx   [][]int
	vals  [][]float32
}

func newCanaryVectors(c *Canaries, dim int) *canaryVectors {
	cv := &canaryVectors{scale: c.Scale, idx: make([][]int, len(c.IDs)), vals: make([][]float32, len(c.IDs))}
	for i, id := range c.IDs {
		cv.idx[i], cv.vals[i] = CanaryDirection(c.Seed, id, dim, c.Support)
	}
	return cv
}

// add adds the clipped gradient of the node's i-th canary into sum: the
// raw gradient g = scale·C·u, clipped by the per-example rule
// g·min(1, C'/‖g‖) with C' = C·canaryShade, evaluated in float64 (‖g‖ is
// computed from g's own float32 coordinates, so the clip factor holds for
// the vector actually added, up to one float32 rounding per coordinate).
func (cv *canaryVectors) add(sum []float32, i int, clip float64) {
	g := cv.scale * clip
	var sq float64
	for _, v := range cv.vals[i] {
		x := g * float64(v)
		sq += x * x
	}
	c := 1.0
	if n := math.Sqrt(sq); n > clip*canaryShade {
		c = clip * canaryShade / n
	}
	for j, k := range cv.idx[i] {
		sum[k] += float32(c * g * float64(cv.vals[i][j]))
	}
}
