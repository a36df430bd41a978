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
// clipped to C·canaryShade (10·C before the clip), and the count grows by
// the number of canaries.
func TestCanariesAddClippedGradients(t *testing.T) {
	c := &Canaries{Seed: 5, IDs: []int{0, 9, 4}, Scale: 10, Support: 5}
	w, fx := canaryWorker(t, 1, c)
	plain, _ := canaryWorker(t, 1, nil)
	rs := transport.RoundStart{Step: 1}
	n, err := w.compute(rs, fx.theta)
	if err != nil {
		t.Fatal(err)
	}
	n0, err := plain.compute(rs, fx.theta)
	if err != nil {
		t.Fatal(err)
	}
	if n != n0+len(c.IDs) || n0 != fx.shard.Len() {
		t.Fatalf("count %d, without canaries %d; want %d + %d", n, n0, fx.shard.Len(), len(c.IDs))
	}
	want := make([]float64, len(w.sum))
	for _, id := range c.IDs {
		idx, vals := CanaryDirection(c.Seed, id, len(w.sum), c.Support)
		for j, k := range idx {
			want[k] += testClip * canaryShade * float64(vals[j])
		}
	}
	for k := range want {
		got := float64(w.sum[k]) - float64(plain.sum[k])
		if math.Abs(got-want[k]) > 1e-5*testClip {
			t.Fatalf("sum[%d]: canaries added %v, want %v", k, got, want[k])
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
	w, fx := canaryWorker(t, q, &Canaries{Seed: 1, IDs: ids, Scale: 10, Support: 3})
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
		{IDs: []int{1}, Scale: 1, Support: 2},
		{IDs: []int{1}, Scale: math.Inf(1), Support: 2},
		{IDs: []int{1}, Scale: 10, Support: 0},
		{IDs: []int{1}, Scale: 10, Support: fx.m.NumParams() + 1},
		{IDs: []int{1, 1}, Scale: 10, Support: 2},
		{IDs: []int{-1}, Scale: 10, Support: 2},
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
