package sampling

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"gonum.org/v1/gonum/stat/distuv"
)

// alpha is the significance level of every statistical test in this file.
// The seeds are fixed, so the tests are deterministic; alpha bounds the
// chance that a correct sampler fails for a freshly chosen seed.
const alpha = 1e-4

func seeded(t testing.TB, q float64, seed uint64) *Poisson {
	t.Helper()
	p, err := NewSeededPoisson(q, seed)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestInvalidQ(t *testing.T) {
	for _, q := range []float64{0, -0.1, 1.0000001, 2, math.NaN(), math.Inf(1), math.Inf(-1)} {
		if _, err := NewSeededPoisson(q, 1); !errors.Is(err, ErrInvalidQ) {
			t.Errorf("q=%v: err = %v, want ErrInvalidQ", q, err)
		}
		if _, err := NewPoisson(q); !errors.Is(err, ErrInvalidQ) {
			t.Errorf("NewPoisson(%v): err = %v, want ErrInvalidQ", q, err)
		}
	}
	if _, err := NewPoissonFromSource(0.5, nil); err == nil {
		t.Error("nil source accepted")
	}
	for _, q := range []float64{math.SmallestNonzeroFloat64, 1e-300, 0.5, 1} {
		if _, err := NewSeededPoisson(q, 1); err != nil {
			t.Errorf("q=%v rejected: %v", q, err)
		}
	}
}

func TestEdgeCases(t *testing.T) {
	p := seeded(t, 1, 1)
	if got, want := p.Sample(nil, 5), []int{0, 1, 2, 3, 4}; !slices.Equal(got, want) {
		t.Fatalf("q=1: Sample = %v, want %v", got, want)
	}
	for _, n := range []int{0, -3} {
		if got := seeded(t, 0.5, 1).Sample(nil, n); len(got) != 0 {
			t.Fatalf("n=%d: Sample = %v, want empty", n, got)
		}
		if got := p.Sample(nil, n); len(got) != 0 {
			t.Fatalf("q=1, n=%d: Sample = %v, want empty", n, got)
		}
	}
	// Appends to existing contents.
	got := seeded(t, 1, 1).Sample([]int{-7}, 2)
	if want := []int{-7, 0, 1}; !slices.Equal(got, want) {
		t.Fatalf("append: got %v, want %v", got, want)
	}
	// Tiny q with a huge n: gaps beyond the int range must not wrap.
	tiny := seeded(t, math.SmallestNonzeroFloat64, 1)
	for range 100 {
		if got := tiny.Sample(nil, math.MaxInt); len(got) != 0 {
			t.Fatalf("q=5e-324: Sample = %v, want empty", got)
		}
	}
	// Huge n with gaps near the int range: indices stay in [0, n), increasing.
	huge := seeded(t, 1e-18, 3)
	sawAny := false
	for range 20 {
		got := huge.Sample(nil, math.MaxInt)
		sawAny = sawAny || len(got) > 0
		if !slices.IsSorted(got) || (len(got) > 0 && got[0] < 0) {
			t.Fatalf("n=MaxInt: bad sample %v", got)
		}
	}
	if !sawAny {
		t.Fatal("n=MaxInt, q=1e-18: expected ~9 indices per batch, got none in 20 batches")
	}
	// An empty batch is a legal outcome: q small, n small.
	empty := 0
	small := seeded(t, 0.01, 2)
	for range 1000 {
		if len(small.Sample(nil, 10)) == 0 {
			empty++
		}
	}
	if empty == 0 {
		t.Fatal("never drew an empty batch with q=0.01, n=10")
	}
	if got, want := seeded(t, 0.25, 1).Q(), 0.25; got != want {
		t.Fatalf("Q() = %v, want %v", got, want)
	}
}

func TestSortedInRangeNoAlloc(t *testing.T) {
	p := seeded(t, 0.1, 3)
	dst := make([]int, 0, 1000)
	for range 200 {
		dst = p.Sample(dst[:0], 1000)
		if !slices.IsSorted(dst) {
			t.Fatalf("not increasing: %v", dst)
		}
		for i := 1; i < len(dst); i++ {
			if dst[i] == dst[i-1] {
				t.Fatalf("duplicate index %d", dst[i])
			}
		}
		if len(dst) > 0 && (dst[0] < 0 || dst[len(dst)-1] >= 1000) {
			t.Fatalf("index out of range: %v", dst)
		}
	}
	allocs := testing.AllocsPerRun(100, func() { dst = p.Sample(dst[:0], 1000) })
	if allocs != 0 {
		t.Fatalf("Sample allocates %v times with enough capacity", allocs)
	}
}

func TestDeterministicAndSeedSensitive(t *testing.T) {
	a := seeded(t, 0.3, 42).Sample(nil, 500)
	b := seeded(t, 0.3, 42).Sample(nil, 500)
	c := seeded(t, 0.3, 43).Sample(nil, 500)
	if !slices.Equal(a, b) {
		t.Fatal("same seed, different samples")
	}
	if slices.Equal(a, c) {
		t.Fatal("different seeds, same sample")
	}
	p1, err := NewPoisson(0.5)
	if err != nil {
		t.Fatal(err)
	}
	p2, _ := NewPoisson(0.5)
	if slices.Equal(p1.Sample(nil, 1000), p2.Sample(nil, 1000)) {
		t.Fatal("two crypto-seeded samplers agree on 1000 coin flips")
	}
}

// TestBatchSizeBinomial checks the batch-size distribution against
// Binomial(n, q) with a chi-square goodness-of-fit test (bins with expected
// count < 5 are pooled into the tails), for a dense and a sparse rate.
func TestBatchSizeBinomial(t *testing.T) {
	for _, tc := range []struct {
		n     int
		q     float64
		draws int
		seed  uint64
	}{
		{200, 0.05, 20000, 1},
		{60000, 256.0 / 60000, 5000, 2},
		{30, 0.5, 20000, 3},
	} {
		p := seeded(t, tc.q, tc.seed)
		counts := make([]float64, tc.n+1)
		dst := make([]int, 0, tc.n)
		for range tc.draws {
			dst = p.Sample(dst[:0], tc.n)
			counts[len(dst)]++
		}
		bin := distuv.Binomial{N: float64(tc.n), P: tc.q}
		// Pool into bins [lo, hi) with expected count ≥ 5.
		var stat float64
		bins := 0
		obs, exp := 0.0, 0.0
		for k := 0; k <= tc.n; k++ {
			obs += counts[k]
			exp += bin.Prob(float64(k)) * float64(tc.draws)
			rest := (1 - bin.CDF(float64(k))) * float64(tc.draws)
			if exp >= 5 && rest >= 5 || k == tc.n { // the last bin takes the remaining tail
				stat += (obs - exp) * (obs - exp) / exp
				bins++
				obs, exp = 0, 0
			}
		}
		crit := distuv.ChiSquared{K: float64(bins - 1)}.Quantile(1 - alpha)
		if stat > crit {
			t.Errorf("n=%d q=%v: chi-square %.1f > critical %.1f (%d bins, alpha %v)", tc.n, tc.q, stat, crit, bins, alpha)
		}
		t.Logf("n=%d q=%v: chi-square %.1f, critical %.1f, %d bins", tc.n, tc.q, stat, crit, bins)
	}
}

// reject reports whether count successes in trials is implausible for
// probability q at level alpha/m (Bonferroni over m simultaneous checks),
// using the normal approximation (trials·q ≥ 500 in every use here).
func reject(count, trials int, q float64, m int) (z, bound float64, bad bool) {
	mean := float64(trials) * q
	sd := math.Sqrt(float64(trials) * q * (1 - q))
	z = (float64(count) - mean) / sd
	bound = distuv.UnitNormal.Quantile(1 - alpha/(2*float64(m)))
	return z, bound, math.Abs(z) > bound
}

// TestPerIndexInclusion checks that every index, the first and last
// included, is sampled with frequency ≈ q, and that adjacent indices are
// included together with frequency ≈ q² (an off-by-one in the gap
// arithmetic shows up as a correlation between neighbours).
func TestPerIndexInclusion(t *testing.T) {
	for _, tc := range []struct {
		n     int
		q     float64
		draws int
	}{{40, 0.3, 20000}, {100, 0.02, 50000}} {
		p := seeded(t, tc.q, 7)
		single := make([]int, tc.n)
		pair := make([]int, tc.n-1)
		in := make([]bool, tc.n)
		dst := make([]int, 0, tc.n)
		for range tc.draws {
			dst = p.Sample(dst[:0], tc.n)
			clear(in)
			for _, i := range dst {
				single[i]++
				in[i] = true
			}
			for i := range pair {
				if in[i] && in[i+1] {
					pair[i]++
				}
			}
		}
		for i, c := range single {
			if z, b, bad := reject(c, tc.draws, tc.q, tc.n); bad {
				t.Errorf("n=%d q=%v: index %d included %d/%d times (z=%.2f, bound %.2f)", tc.n, tc.q, i, c, tc.draws, z, b)
			}
		}
		// Pairs: pool over all adjacent pairs for power.
		total := 0
		for _, c := range pair {
			total += c
		}
		if z, b, bad := reject(total, tc.draws*(tc.n-1), tc.q*tc.q, 1); bad {
			t.Errorf("n=%d q=%v: adjacent pairs co-included %d times (z=%.2f, bound %.2f)", tc.n, tc.q, total, z, b)
		}
	}
}

// TestContentIndependent: the sampler only sees n, so two datasets with
// very different contents get identical index sets from the same seed; and
// the inclusion frequency of examples labelled A matches that of label B.
func TestContentIndependent(t *testing.T) {
	const n, q, draws = 1000, 0.05, 4000
	// Two "datasets": labels sorted (all A then all B) and random labels.
	labelsSorted := make([]int, n)
	labelsRandom := make([]int, n)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		if i >= n/2 {
			labelsSorted[i] = 1
		}
		labelsRandom[i] = r.IntN(2)
	}
	pa, pb := seeded(t, q, 99), seeded(t, q, 99)
	hits := [2][2]int{} // [dataset][label]
	size := [2][2]int{}
	for i := range n {
		size[0][labelsSorted[i]]++
		size[1][labelsRandom[i]]++
	}
	for range draws {
		a := pa.Sample(nil, len(labelsSorted))
		b := pb.Sample(nil, len(labelsRandom))
		if !slices.Equal(a, b) {
			t.Fatal("same seed and size, different samples for different contents")
		}
		for _, i := range a {
			hits[0][labelsSorted[i]]++
			hits[1][labelsRandom[i]]++
		}
	}
	for d := range 2 {
		// Two-proportion z-test between labels.
		p0 := float64(hits[d][0]) / float64(size[d][0]*draws)
		p1 := float64(hits[d][1]) / float64(size[d][1]*draws)
		pool := float64(hits[d][0]+hits[d][1]) / float64(n*draws)
		se := math.Sqrt(pool * (1 - pool) * (1/float64(size[d][0]*draws) + 1/float64(size[d][1]*draws)))
		z := (p0 - p1) / se
		if bound := distuv.UnitNormal.Quantile(1 - alpha/2); math.Abs(z) > bound {
			t.Errorf("dataset %d: inclusion rate label A %.5f vs label B %.5f (z=%.2f)", d, p0, p1, z)
		}
		for l := range 2 {
			if z, b, bad := reject(hits[d][l], size[d][l]*draws, q, 4); bad {
				t.Errorf("dataset %d label %d: rate %d/%d (z=%.2f, bound %.2f)", d, l, hits[d][l], size[d][l]*draws, z, b)
			}
		}
	}
}

// TestUniformResolution checks the full-resolution uniform: binade
// frequencies halve, and draws near 0 are not stuck on a 2⁻⁵³ grid.
func TestUniformResolution(t *testing.T) {
	p := seeded(t, 0.5, 5)
	const draws = 200000
	binade := make([]int, 20)
	fine := 0
	for range draws {
		w := p.uniform()
		if w < 0 || w >= 1 {
			t.Fatalf("uniform() = %v outside [0,1)", w)
		}
		k := int(-math.Floor(math.Log2(w))) - 1 // w in [2^-k-1, 2^-k)
		if k < len(binade) {
			binade[k]++
		}
		if w < 1.0/(1<<10) && w != math.Round(w*(1<<53))/(1<<53) {
			fine++
		}
	}
	for k := range 8 {
		if z, b, bad := reject(binade[k], draws, math.Ldexp(1, -k-1), 8); bad {
			t.Errorf("binade %d: %d draws (z=%.2f, bound %.2f)", k, binade[k], z, b)
		}
	}
	if fine == 0 {
		t.Error("no draw below 2^-10 has resolution finer than 2^-53")
	}
	// A source that returns zeros first exercises the exponent loop.
	zs := &zeroThen{zeros: 2, src: rand.NewPCG(1, 1)}
	q, _ := NewPoissonFromSource(0.5, zs)
	if w := q.uniform(); w <= 0 || w >= math.Ldexp(1, -128) {
		t.Fatalf("after two zero words uniform() = %v, want in (0, 2^-128)", w)
	}
}

type zeroThen struct {
	zeros int
	src   Source
}

func (z *zeroThen) Uint64() uint64 {
	if z.zeros > 0 {
		z.zeros--
		return 0
	}
	return z.src.Uint64()
}

func BenchmarkPoisson(b *testing.B) {
	const n = 60000
	q := 256.0 / n
	for _, bc := range []struct {
		name string
		mk   func() (*Poisson, error)
	}{
		{"crypto", func() (*Poisson, error) { return NewPoisson(q) }},
		{"seeded", func() (*Poisson, error) { return NewSeededPoisson(q, 1) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p, err := bc.mk()
			if err != nil {
				b.Fatal(err)
			}
			dst := make([]int, 0, 512)
			b.ReportAllocs()
			total := 0
			for b.Loop() {
				dst = p.Sample(dst[:0], n)
				total += len(dst)
			}
			b.ReportMetric(float64(total)/float64(b.N), "batch")
		})
	}
	// Reference: one Bernoulli trial per index, the naive alternative.
	b.Run("naive-bernoulli", func(b *testing.B) {
		r := rand.New(rand.NewChaCha8([32]byte{}))
		dst := make([]int, 0, 512)
		for b.Loop() {
			dst = dst[:0]
			for i := range n {
				if r.Float64() < q {
					dst = append(dst, i)
				}
			}
		}
	})
}
