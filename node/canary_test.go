package node

import (
	"errors"
	"math"
	"testing"

	"github.com/dpcluster/dpcluster/transport"
)

// TestCanaryDirection: a pure function of its arguments, unit norm,
// distinct coordinates, and different canaries point differently.
func TestCanaryDirection(t *testing.T) {
	const dim, support = 1000, 64
	idx, vals := CanaryDirection(7, 3, dim, support)
	idx2, vals2 := CanaryDirection(7, 3, dim, support)
	seen := map[int]bool{}
	var sq float64
	for j, k := range idx {
		if idx2[j] != k || vals2[j] != vals[j] {
			t.Fatalf("coordinate %d: (%d, %v) then (%d, %v): not deterministic", j, k, vals[j], idx2[j], vals2[j])
		}
		if seen[k] || k < 0 || k >= dim {
			t.Fatalf("coordinate %d repeated or outside [0, %d)", k, dim)
		}
		seen[k] = true
		sq += float64(vals[j]) * float64(vals[j])
	}
	if len(idx) != support || math.Abs(sq-1) > 1e-6 {
		t.Fatalf("%d coordinates of squared norm %v, want %d and 1", len(idx), sq, support)
	}
	other, _ := CanaryDirection(7, 4, dim, support)
	same := 0
	for j := range other {
		if seen[other[j]] {
			same++
		}
	}
	if same == support {
		t.Fatal("canaries 3 and 4 have the same support")
	}
}

// TestCanaryCoordinates: with support 1 a canary is ±e_j, j = π(id) for a
// permutation π of [0, dim) keyed by the seed: every id below dim gets its
// own coordinate (domains just above and below a power of 4 included,
// where cycle walking does the most and the least), the same again for
// the same arguments, a different permutation for another seed, and signs
// that are fair (the mlp's 269,322 coordinates: 134,661 ± 6·259).
func TestCanaryCoordinates(t *testing.T) {
	for _, dim := range []int{1, 2, 3, 4, 5, 17, 1000, 1024, 1025, 269322} {
		seen := make([]bool, dim)
		plus, moved := 0, 0
		for id := range dim {
			idx, vals := CanaryDirection(99, id, dim, 1)
			if len(idx) != 1 || (vals[0] != 1 && vals[0] != -1) {
				t.Fatalf("dim %d, id %d: %v, %v; want one coordinate of ±1", dim, id, idx, vals)
			}
			j := idx[0]
			if j < 0 || j >= dim || seen[j] {
				t.Fatalf("dim %d, id %d: coordinate %d outside [0, %d) or taken", dim, id, j, dim)
			}
			seen[j] = true
			if again, v := CanaryDirection(99, id, dim, 1); again[0] != j || v[0] != vals[0] {
				t.Fatalf("dim %d, id %d: %d then %d: not deterministic", dim, id, j, again[0])
			}
			if vals[0] > 0 {
				plus++
			}
			if other, _ := CanaryDirection(100, id, dim, 1); other[0] != j {
				moved++
			}
		}
		if dim >= 1000 && moved < dim*9/10 {
			t.Errorf("dim %d: another seed moves only %d of %d canaries", dim, moved, dim)
		}
		if sd := math.Sqrt(float64(dim)) / 2; dim >= 1000 && math.Abs(float64(plus)-float64(dim)/2) > 6*sd {
			t.Errorf("dim %d: %d positive signs, want %d ± %.0f", dim, plus, dim/2, 6*sd)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("support 1 with id = dim did not panic")
		}
	}()
	CanaryDirection(1, 10, 10, 1)
}

// TestCanaryEmptyPositions: positions past the canaries are sampled like
// the others but add nothing and count nothing: at q = 1, three canaries
// in ten positions give the sum and count of three canaries in three.
func TestCanaryEmptyPositions(t *testing.T) {
	c := Canaries{Seed: 5, IDs: []int{0, 9, 4}, Scale: 10, Support: 1, Positions: 3}
	tight, fx := canaryWorker(t, 1, &c)
	c.Positions = 10
	loose, _ := canaryWorker(t, 1, &c)
	n1, n2 := computeStep1(t, fx, tight, loose)
	if n1 != n2 || n1 != fx.shard.Len()+3 {
		t.Fatalf("counts %d (3 positions) and %d (10), want both %d", n1, n2, fx.shard.Len()+3)
	}
	for k := range tight.sum {
		if tight.sum[k] != loose.sum[k] {
			t.Fatalf("sum[%d]: %v with 3 positions, %v with 10", k, tight.sum[k], loose.sum[k])
		}
	}
}

// TestJoinClaimsCanaryPositions: a node with canaries claims its Poisson
// sampler's population, its n examples and its canary positions, in Join
// and Heartbeat, so that the leader's count bound is for what it samples
// (issue 31: with as many canaries as examples, a claim of n alone made
// the leader refuse honest contributions).
func TestJoinClaimsCanaryPositions(t *testing.T) {
	fx := logregFixture(t)
	nc, lc := natsPair(t)
	l := newLeaderSide(t, lc)
	cfg := testConfig()
	cfg.Canaries = &Canaries{Seed: 5, IDs: []int{0, 4}, Scale: 10, Support: 1, Positions: 7}
	start(t, cfg, fx, nc)
	want := int64(fx.shard.Len() + 7)
	if j := recv(t, l.joins, "join"); j.ShardSize != want {
		t.Errorf("join claims %d examples, want %d + 7", j.ShardSize, fx.shard.Len())
	}
	if h := recv(t, l.heartbeats, "heartbeat"); h.ShardSize != want {
		t.Errorf("heartbeat claims %d examples, want %d + 7", h.ShardSize, fx.shard.Len())
	}
}

// computeStep1 has a and b compute step 1's sum at fx.theta and returns
// their counts.
func computeStep1(t *testing.T, fx fixture, a, b *Worker) (na, nb int) {
	t.Helper()
	rs := transport.RoundStart{Step: 1}
	na, err := a.compute(rs, fx.theta)
	if err != nil {
		t.Fatal(err)
	}
	if nb, err = b.compute(rs, fx.theta); err != nil {
		t.Fatal(err)
	}
	return na, nb
}

// canaryWorker is a Worker on the logreg fixture with canaries c, its
// engine released with the test.
func canaryWorker(t *testing.T, q float64, c *Canaries) (*Worker, fixture) {
	t.Helper()
	fx := logregFixture(t)
	_, nodeConn, _ := fakePair(t)
	cfg := testConfig()
	cfg.SampleRate, cfg.SeededSampling, cfg.SamplingSeed = q, true, 11
	cfg.Canaries = c
	w, err := NewWorker(cfg, fx.m, fx.shard, nodeConn, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return w, fx
}

// TestCanariesAddClippedGradients: at q = 1 every canary is in every
// batch: the sum is the real examples' sum plus each canary's gradient
// clipped by the examples' rule to just below C·(1 − 2⁻¹⁶) (10·C before
// the clip), and the count grows by the number of canaries.
func TestCanariesAddClippedGradients(t *testing.T) {
	c := &Canaries{Seed: 5, IDs: []int{0, 9, 4}, Scale: 10, Support: 5, Positions: 3}
	w, fx := canaryWorker(t, 1, c)
	plain, _ := canaryWorker(t, 1, nil)
	n, n0 := computeStep1(t, fx, w, plain)
	if n != n0+len(c.IDs) || n0 != fx.shard.Len() {
		t.Fatalf("count %d, without canaries %d; want %d + %d", n, n0, fx.shard.Len(), len(c.IDs))
	}
	want := make([]float64, len(w.sum))
	for _, id := range c.IDs {
		idx, vals := CanaryDirection(c.Seed, id, len(w.sum), c.Support)
		for j, k := range idx {
			want[k] += testClip * (1 - 0x1p-16 - canaryFloor) * float64(vals[j])
		}
	}
	for k := range want {
		got := float64(w.sum[k]) - float64(plain.sum[k])
		// The float32 sums' own rounding, and the factor's (2⁻²⁴).
		tol := 0x1p-23*(math.Abs(float64(w.sum[k]))+math.Abs(float64(plain.sum[k]))) + 0x1p-23*testClip
		if math.Abs(got-want[k]) > tol {
			t.Fatalf("sum[%d]: canaries added %v, want %v (± %.2g)", k, got, want[k], tol)
		}
	}
}

// TestCanaryClippedByTheExamplesRule: a canary's clipped gradient, as
// added, has norm at most C·(1 − 2⁻¹⁶) less the rounding floor, the
// bound of an example's (model.ClipFactor), for coordinate and
// random-support canaries and scales from just above 1 to 10¹².
func TestCanaryClippedByTheExamplesRule(t *testing.T) {
	const dim = 1000
	for _, support := range []int{1, 7, 1000} {
		for _, scale := range []float64{1 + 0x1p-30, 10, 1e12} {
			c := &Canaries{Seed: 3, IDs: []int{0, 1, 2}, Scale: scale, Support: support, Positions: 3}
			cv := newCanaryVectors(c, dim)
			for i := range c.IDs {
				sum := make([]float32, dim)
				cv.add(sum, i, testClip)
				var sq float64
				for _, v := range sum {
					sq += float64(v) * float64(v)
				}
				if n, max := math.Sqrt(sq), testClip*(1-0x1p-16); !(n <= max) || n < 0.999*max {
					t.Fatalf("support %d, scale %v, canary %d: clipped norm %v, want just below %v", support, scale, i, n, max)
				}
			}
		}
	}
}

// TestCanariesArePoissonSampled: a canary joins a batch with probability
// q, like an example, not every step. 400 rounds × 50 canaries at q = 0.1:
// 2000 expected, standard deviation 42; the test allows 6.
func TestCanariesArePoissonSampled(t *testing.T) {
	const q, rounds, m = 0.1, 400, 50
	ids := make([]int, m)
	for i := range ids {
		ids[i] = i
	}
	w, fx := canaryWorker(t, q, &Canaries{Seed: 1, IDs: ids, Scale: 10, Support: 3, Positions: m})
	total := 0
	for s := range uint64(rounds) {
		rs := transport.RoundStart{Step: s}
		n, err := w.compute(rs, fx.theta)
		if err != nil {
			t.Fatal(err)
		}
		total += n - len(w.batch)
	}
	mean, sd := q*rounds*m, math.Sqrt(q*(1-q)*rounds*m)
	if math.Abs(float64(total)-mean) > 6*sd {
		t.Fatalf("%d canaries sampled in %d rounds, want %v ± %.0f", total, rounds, mean, 6*sd)
	}
}

// TestCanariesInvalid: a bad canary configuration is refused by NewWorker.
func TestCanariesInvalid(t *testing.T) {
	fx := logregFixture(t)
	_, nodeConn, _ := fakePair(t)
	for _, c := range []*Canaries{
		{IDs: []int{1}, Scale: 1, Support: 2, Positions: 1},
		{IDs: []int{1}, Scale: math.Inf(1), Support: 2, Positions: 1},
		{IDs: []int{1}, Scale: 10, Support: 0, Positions: 1},
		{IDs: []int{1}, Scale: 10, Support: fx.m.NumParams() + 1, Positions: 1},
		{IDs: []int{1, 1}, Scale: 10, Support: 2, Positions: 2},
		{IDs: []int{-1}, Scale: 10, Support: 2, Positions: 1},
		{IDs: []int{1, 2}, Scale: 10, Support: 2, Positions: 1},
		{IDs: []int{fx.m.NumParams()}, Scale: 10, Support: 1, Positions: 1},
	} {
		cfg := testConfig()
		cfg.Canaries = c
		w, err := NewWorker(cfg, fx.m, fx.shard, nodeConn, nil)
		if !errors.Is(err, ErrInvalidConfig) {
			if w != nil {
				_ = w.Close()
			}
			t.Errorf("%+v: err %v, want ErrInvalidConfig", *c, err)
		}
	}
}

// TestCanarySpan: with Span set, every canary's direction lies in the
// model's first Span parameters (the audit leaves the output layer out),
// support-1 IDs must be below it, and a span outside [0, dim] is refused.
func TestCanarySpan(t *testing.T) {
	const dim, span = 1000, 700
	for _, support := range []int{1, 5} {
		c := &Canaries{Seed: 42, IDs: []int{0, 3, 699}, Scale: 10, Support: support, Span: span, Positions: 3}
		if err := c.validate(dim); err != nil {
			t.Fatalf("support %d: %v", support, err)
		}
		cv := newCanaryVectors(c, dim)
		for i, idx := range cv.idx {
			for _, j := range idx {
				if j < 0 || j >= span {
					t.Errorf("support %d, canary %d: coordinate %d outside [0, %d)", support, c.IDs[i], j, span)
				}
			}
		}
	}
	for _, c := range []*Canaries{
		{Seed: 1, IDs: []int{700}, Scale: 10, Support: 1, Span: span, Positions: 1}, // ID at the span
		{Seed: 1, IDs: []int{0}, Scale: 10, Support: 1, Span: dim + 1, Positions: 1},
		{Seed: 1, IDs: []int{0}, Scale: 10, Support: 1, Span: -1, Positions: 1},
		{Seed: 1, IDs: []int{0}, Scale: 10, Support: span + 1, Span: span, Positions: 1},
	} {
		if err := c.validate(dim); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: validate = %v, want ErrInvalidConfig", *c, err)
		}
	}
}
