package node

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/dpcluster/dpcluster/model"
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
// dim, Support), clipped by the examples' own clip rule (model.ClipFactor,
// canaryVectors.add) to norm below C·(1 − 2⁻¹⁶): Scale > 1, so the clip is
// what bounds its contribution (a canary that reached the sum unclipped
// would move g̃ Scale times as far along u_id, and so would one whose clip
// rule were broken: the audit checks the rule the examples go through).
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
	// [1, the span]. With Support 1 every ID must be below the span
	// (CanaryDirection).
	Support int
	// Span is the number of leading parameters the directions lie in,
	// [0, Span) (CanaryDirection's dim); 0 means all of them. The audit
	// leaves the output layer out (cli/auditcanaries.go, canarySpan).
	Span int
	// Positions is the number of canary positions after the shard's n
	// examples, at least len(IDs): the node's Poisson sampler draws from
	// n + Positions positions, and the node claims n + Positions as its
	// shard size (Join and Heartbeat), so that the leader's admission
	// and count bound (coordinator/admission.go) see the population the
	// sampler really draws from. The first len(IDs) positions hold the
	// canaries; the others are empty (an excluded canary's position: when
	// sampled it adds nothing and counts nothing). The auditor fixes
	// Positions before its coins are drawn, so that nothing the leader
	// sees of a node but its sum depends on which canaries are included.
	Positions int
}

// CanaryDirection returns the unit direction of canary id for a model of
// dim parameters. It is a pure function of its arguments: the node that
// injects canary id and the auditor who scores it compute the same vector.
//
// With support 1 (coordinate canaries) it is ±e_j for j = π(id), π the
// permutation of [0, dim) keyed by seed (canaryCoordinate), and a fair
// sign from a hash of (seed, id): distinct ids below dim get distinct
// coordinates, so no canary moves another's projection. It panics for
// support 1 and id outside [0, dim) (Canaries.validate refuses such a
// configuration first).
//
// With support > 1 (the random-support mode) it is support distinct
// coordinates idx, drawn uniformly without replacement, each of value
// vals[j] = ±1/√support with a fair sign, from a PCG stream keyed by
// (seed, id); two canaries may share coordinates. Its squared norm is 1
// up to float32 rounding of 1/√support (relative 2⁻²⁴).
//
// It panics if support is not in [1, dim].
func CanaryDirection(seed uint64, id, dim, support int) (idx []int, vals []float32) {
	if support < 1 || support > dim {
		panic(fmt.Sprintf("node: CanaryDirection: support %d outside [1, %d]", support, dim))
	}
	if support == 1 {
		s := float32(1)
		if mix64(seed^signKey, uint64(id))&1 == 1 {
			s = -1
		}
		return []int{canaryCoordinate(seed, id, dim)}, []float32{s}
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

// feistelRounds is the number of rounds of canaryCoordinate's network.
// Any number gives a permutation; four rounds of a pseudorandom round
// function give a pseudorandom permutation (Luby and Rackoff, "How to
// construct pseudorandom permutations from pseudorandom functions", SIAM
// J. Comput. 1988), and eight leave a margin for a round function that is
// a fast mixer, not a PRF. The audit needs only that the coordinates look
// unrelated to the model's structure, not secrecy from the permutation.
const feistelRounds = 8

// signKey separates the sign's hash from the permutation's round keys.
const signKey = 0x5167_6e5f_6b65_7921

// canaryCoordinate returns π(id) for the permutation π of [0, dim) keyed
// by seed: a balanced Feistel network on 2h bits, 2^(2h) the least power
// of 4 ≥ dim (at most 4·dim), with cycle walking (Black and Rogaway,
// "Ciphers with Arbitrary Finite Domains", CT-RSA 2002): the network is
// applied again until the result is below dim. Cycle walking restricts a
// permutation of [0, 4^h) to one of [0, dim), so distinct ids give
// distinct coordinates; the expected number of applications is at most
// 4. It panics for id outside [0, dim).
func canaryCoordinate(seed uint64, id, dim int) int {
	if id < 0 || id >= dim {
		panic(fmt.Sprintf("node: canaryCoordinate: id %d outside [0, %d)", id, dim))
	}
	h := 1
	for 1<<(2*h) < dim {
		h++
	}
	mask := uint64(1)<<h - 1
	x := uint64(id)
	for {
		l, r := x>>h, x&mask
		for round := range uint64(feistelRounds) {
			l, r = r, l^(mix64(seed+round, r)&mask)
		}
		if x = l<<h | r; x < uint64(dim) {
			return int(x)
		}
	}
}

// mix64 is a keyed 64-bit mixer: SplitMix64's finalizer (Steele, Lea and
// Flood, "Fast Splittable Pseudorandom Number Generators", OOPSLA 2014)
// applied to key and x.
func mix64(key, x uint64) uint64 {
	z := key*0x9e3779b97f4a7c15 ^ x
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	z += key
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// canaryFloor bounds, in units of C and with a factor 16 to spare, the
// norm of the rounding error of a clipped canary's own coordinates (each
// rounded once to float32 when scaled: relative 2⁻²⁴, of a vector of norm
// below C); model.ClipFactor keeps the clipped norm plus this below
// C·(1 − 2⁻¹⁶). Adding it into the node's float32 sum rounds as the
// sum's own additions do (relative 2⁻²⁴ of each coordinate of the sum),
// which the leader's check ‖sum‖ ≤ count·C(1 + 10⁻⁶) allows for.
const canaryFloor = 0x1p-20

// validate checks c against a model of dim parameters.
func (c *Canaries) validate(dim int) error {
	if !(c.Scale > 1) || math.IsInf(c.Scale, 0) {
		return fmt.Errorf("%w: Canaries.Scale %v must be > 1 and finite", ErrInvalidConfig, c.Scale)
	}
	if c.Span < 0 || c.Span > dim {
		return fmt.Errorf("%w: Canaries.Span %d must be in [0, %d]", ErrInvalidConfig, c.Span, dim)
	}
	dim = c.span(dim)
	if c.Support < 1 || c.Support > dim {
		return fmt.Errorf("%w: Canaries.Support %d must be in [1, %d]", ErrInvalidConfig, c.Support, dim)
	}
	if c.Positions < len(c.IDs) {
		return fmt.Errorf("%w: Canaries.Positions %d must be at least the %d canaries", ErrInvalidConfig, c.Positions, len(c.IDs))
	}
	seen := make(map[int]struct{}, len(c.IDs))
	for _, id := range c.IDs {
		if _, dup := seen[id]; dup || id < 0 {
			return fmt.Errorf("%w: Canaries.IDs: %d is negative or repeated", ErrInvalidConfig, id)
		}
		if c.Support == 1 && id >= dim {
			return fmt.Errorf("%w: Canaries.IDs: %d with Support 1 must be below the span's %d parameters", ErrInvalidConfig, id, dim)
		}
		seen[id] = struct{}{}
	}
	return nil
}

// span is the number of leading parameters of a dim-parameter model the
// directions lie in.
func (c *Canaries) span(dim int) int {
	if c.Span > 0 {
		return c.Span
	}
	return dim
}

// canaryVectors are a node's canaries' directions, computed once by
// NewWorker.
type canaryVectors struct {
	scale     float64
	positions int // Canaries.Positions
	idx       [][]int
	vals      [][]float32
}

func newCanaryVectors(c *Canaries, dim int) *canaryVectors {
	cv := &canaryVectors{scale: c.Scale, positions: c.Positions, idx: make([][]int, len(c.IDs)), vals: make([][]float32, len(c.IDs))}
	for i, id := range c.IDs {
		cv.idx[i], cv.vals[i] = CanaryDirection(c.Seed, id, c.span(dim), c.Support)
	}
	return cv
}

// add adds the clipped gradient of the node's i-th canary into sum: the
// raw gradient g = scale·C·u, scaled by the examples' clip factor
// (model.ClipFactor, from ‖g‖² in float64 over g's coordinates and the
// rounding floor canaryFloor·C).
func (cv *canaryVectors) add(sum []float32, i int, clip float64) {
	g := cv.scale * clip
	var sq float64
	for _, v := range cv.vals[i] {
		x := g * float64(v)
		sq += x * x
	}
	c := float64(model.ClipFactor(sq, canaryFloor*clip, clip))
	for j, k := range cv.idx[i] {
		sum[k] += float32(c * g * float64(cv.vals[i][j]))
	}
}
