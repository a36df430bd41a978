package mechanism

import (
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/accounting"
)

// TestNewDiscreteGaussian checks the grid and the accounted noise
// multiplier: Λ is the largest power of two with √d·Λ ≤ C/2¹⁶, Scale =
// ⌈σC/Λ⌉, and Sigma lies just below Scale/(C/Λ + √d) computed in 256-bit
// arithmetic, so the ledger never charges less than the truth.
func TestNewDiscreteGaussian(t *testing.T) {
	for _, tc := range []struct {
		sigma, clip float64
		dim         int
	}{
		{0.7420020719159987, 1, 269322}, {1.1, 0.1, 3_700_000}, {1, 1, 1}, {3, 2.5, 1000},
		{1e4, 1, 3_700_000}, {0.01, 1e-3, 10}, {5, 1e6, 50_000_000},
	} {
		m, err := NewDiscreteGaussian(tc.sigma, tc.clip, tc.dim)
		if err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		grid, rootD := m.Grid(), math.Sqrt(float64(tc.dim))
		if rootD*grid > tc.clip*GridFraction || 2*rootD*grid <= tc.clip*GridFraction {
			t.Errorf("%+v: Λ = %v is not the largest power of two with √d·Λ ≤ C/2¹⁶", tc, grid)
		}
		if want := math.Ceil(tc.sigma * tc.clip / grid); float64(m.Scale) != want {
			t.Errorf("%+v: scale %d, want %v", tc, m.Scale, want)
		}
		const prec = 256
		exact := new(big.Float).SetPrec(prec).SetUint64(m.Scale)
		sens := new(big.Float).SetPrec(prec).SetFloat64(tc.clip / grid)
		sens.Add(sens, new(big.Float).SetPrec(prec).Sqrt(new(big.Float).SetPrec(prec).SetInt64(int64(tc.dim))))
		exact.Quo(exact, sens)
		got := new(big.Float).SetPrec(prec).SetFloat64(m.Sigma)
		if got.Cmp(exact) >= 0 {
			t.Errorf("%+v: Sigma %v is not below the exact %v", tc, m.Sigma, exact)
		}
		lower := new(big.Float).SetPrec(prec).Mul(exact, big.NewFloat(1-0x1p-48))
		if got.Cmp(lower) < 0 {
			t.Errorf("%+v: Sigma %v is more than 2⁻⁴⁸ below the exact %v", tc, m.Sigma, exact)
		}
		if m.Sigma < tc.sigma/(1+GridFraction)*(1-0x1p-48) {
			t.Errorf("%+v: Sigma %v < σ/(1 + 2⁻¹⁶)(1 − 2⁻⁴⁸)", tc, m.Sigma)
		}
		if e := m.Event(0.01); e.Kind != accounting.KindPoissonSampled || e.SampleRate != 0.01 || e.Event.Kind != accounting.KindDiscreteGaussian ||
			e.Event.NoiseMultiplier != m.Sigma || e.Validate() != nil {
			t.Errorf("%+v: event %+v", tc, e)
		}
	}
	for _, tc := range []struct {
		sigma, clip float64
		dim         int
	}{
		{0, 1, 10}, {-1, 1, 10}, {math.NaN(), 1, 10}, {math.Inf(1), 1, 10}, {1, 0, 10}, {1, math.Inf(1), 10},
		{1, 1, 0}, {1e9, 1, 1 << 30}, {1, 1e-320, 10},
	} {
		if _, err := NewDiscreteGaussian(tc.sigma, tc.clip, tc.dim); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: err = %v, want ErrInvalid", tc, err)
		}
	}
}

func seededSource(seed uint64) *rand.Rand { return rand.New(seeded(seed)) }

// countingSource counts the words drawn.
type countingSource struct {
	src Source
	n   int
}

func (c *countingSource) Uint64() uint64 { c.n++; return c.src.Uint64() }

func mustMechanism(t *testing.T, sigma, clip float64, dim int) DiscreteGaussian {
	t.Helper()
	m, err := NewDiscreteGaussian(sigma, clip, dim)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestReleaseMoments: (g̃·B − S)/(σC) over 200000 coordinates has mean 0
// and variance (ScaleΛ/σC)² ≈ 1 (6-sigma bounds, false failure < 4e-9),
// for an arbitrary sum.
func TestReleaseMoments(t *testing.T) {
	const d = 200000
	const sigma, clip, batch = 1.3, 2.0, 50.0
	m := mustMechanism(t, sigma, clip, d)
	rng := rand.New(rand.NewPCG(1, 1))
	sum := make([]float64, d)
	for i := range sum {
		sum[i] = rng.NormFloat64() * 3
	}
	dst := make([]float32, d)
	if err := m.Release(dst, sum, batch, seededSource(1), nil); err != nil {
		t.Fatal(err)
	}
	var m1, m2 float64
	for i, v := range dst {
		x := (float64(v)*batch - sum[i]) / (sigma * clip)
		m1 += x
		m2 += x * x
	}
	m1 /= d
	m2 /= d
	if math.Abs(m1) > 6/math.Sqrt(d) {
		t.Errorf("mean %v", m1)
	}
	want := math.Pow(float64(m.Scale)*m.Grid()/(sigma*clip), 2)
	if math.Abs(m2/want-1) > 6*math.Sqrt(2.0/d)+2e-7 { // + float32 rounding of g̃
		t.Errorf("variance %v, want %v", m2, want)
	}
}

// TestReleaseDependsOnlyOnTheSnappedSum: with the same randomness, sums
// that snap to the same grid points give bit-identical releases, and a sum
// moved by m grid steps moves the release by exactly mΛ/B: g̃ is a function
// of k + z.
func TestReleaseDependsOnlyOnTheSnappedSum(t *testing.T) {
	const d = 40000 // three chunks
	m := mustMechanism(t, 0.01, 1, d)
	grid := m.Grid()
	rng := rand.New(rand.NewPCG(2, 2))
	a, b, c := make([]float64, d), make([]float64, d), make([]float64, d)
	for i := range a {
		k := float64(rng.IntN(2001) - 1000)
		a[i] = (k + 0.45*(2*rng.Float64()-1)) * grid
		b[i] = (k + 0.45*(2*rng.Float64()-1)) * grid
		c[i] = (k + 7) * grid
	}
	ga, gb, gc := make([]float32, d), make([]float32, d), make([]float32, d)
	for _, r := range []struct {
		dst []float32
		sum []float64
	}{{ga, a}, {gb, b}, {gc, c}} {
		if err := m.Release(r.dst, r.sum, grid, seededSource(9), nil); err != nil { // B = Λ: g̃ = k + z
			t.Fatal(err)
		}
	}
	for i := range ga {
		if math.Float32bits(ga[i]) != math.Float32bits(gb[i]) {
			t.Fatalf("[%d]: %v vs %v for sums on the same grid point", i, ga[i], gb[i])
		}
		if gc[i]-ga[i] != 7 { // k + z below 2²⁴: exact in float32
			t.Fatalf("[%d]: moved by %v, want 7", i, gc[i]-ga[i])
		}
	}
}

// TestReleaseDeterministicAcrossGOMAXPROCS: a seeded release is the same
// bit for bit on 1 and on 8 workers.
func TestReleaseDeterministicAcrossGOMAXPROCS(t *testing.T) {
	const d = 100003
	m := mustMechanism(t, 1, 1, d)
	sum := make([]float64, d)
	for i := range sum {
		sum[i] = float64(i%17) - 8
	}
	run := func(procs int) []float32 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
		dst := make([]float32, d)
		if err := m.Release(dst, sum, 7, seededSource(4), nil); err != nil {
			t.Fatal(err)
		}
		return dst
	}
	one, eight := run(1), run(8)
	for i := range one {
		if math.Float32bits(one[i]) != math.Float32bits(eight[i]) {
			t.Fatalf("[%d]: %v on one worker, %v on eight", i, one[i], eight[i])
		}
	}
}

// TestReleaseRejects: bad lengths, batch sizes and sums are errors that
// draw nothing and leave dst as it was.
func TestReleaseRejects(t *testing.T) {
	const d = 10
	m := mustMechanism(t, 1, 1, d)
	ok := make([]float64, d)
	huge := make([]float64, d)
	huge[3] = math.Ldexp(1, 62+m.GridExp)
	for _, tc := range []struct {
		name  string
		dst   []float32
		sum   []float64
		batch float64
		want  error
	}{
		{"short dst", make([]float32, d-1), ok, 1, ErrInvalid},
		{"long sum", make([]float32, d), make([]float64, d+1), 1, ErrInvalid},
		{"zero batch", make([]float32, d), ok, 0, ErrInvalid},
		{"NaN batch", make([]float32, d), ok, math.NaN(), ErrInvalid},
		{"infinite batch", make([]float32, d), ok, math.Inf(1), ErrInvalid},
		{"NaN sum", make([]float32, d), []float64{0, 0, math.NaN(), 0, 0, 0, 0, 0, 0, 0}, 1, ErrSumRange},
		{"infinite sum", make([]float32, d), []float64{0, 0, 0, 0, 0, 0, 0, 0, 0, math.Inf(-1)}, 1, ErrSumRange},
		{"sum beyond 2⁶² steps", make([]float32, d), huge, 1, ErrSumRange},
	} {
		for i := range tc.dst {
			tc.dst[i] = 42
		}
		src := &countingSource{src: seededSource(1)}
		err := m.Release(tc.dst, tc.sum, tc.batch, src, nil)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
		if src.n != 0 {
			t.Errorf("%s: drew %d words", tc.name, src.n)
		}
		for _, v := range tc.dst {
			if v != 42 {
				t.Errorf("%s: dst changed", tc.name)
				break
			}
		}
	}
	if err := (DiscreteGaussian{}).Release(nil, nil, 1, seededSource(1), nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("zero mechanism: err = %v", err)
	}
}

// TestReleaseGoroutinesExit: the workers have exited when Release returns.
func TestReleaseGoroutinesExit(t *testing.T) {
	m := mustMechanism(t, 1, 1, 5*chunkSize)
	before := runtime.NumGoroutine()
	if err := m.Release(make([]float32, m.Dim), make([]float64, m.Dim), 1, seededSource(1), nil); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > before; {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines before Release, %d after", before, runtime.NumGoroutine())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestDrawApply: Release is Draw then Apply on the same stream; Apply
// consumes the noise (zeroed, not ready) and refuses noise that was not
// drawn, or drawn for another mechanism, leaving it as it was.
func TestDrawApply(t *testing.T) {
	const d = 3*chunkSize + 5
	m := mustMechanism(t, 1, 1, d)
	sum := make([]float64, d)
	for i := range sum {
		sum[i] = float64(i%13) - 6
	}
	want := make([]float32, d)
	if err := m.Release(want, sum, 3, seededSource(7), nil); err != nil {
		t.Fatal(err)
	}
	var n Noise
	got := make([]float32, d)
	if err := m.Apply(got, sum, 3, &n); !errors.Is(err, ErrInvalid) {
		t.Errorf("Apply without Draw: %v", err)
	}
	if err := m.Draw(&n, seededSource(7)); err != nil || !n.Ready() {
		t.Fatalf("Draw: %v, ready %v", err, n.Ready())
	}
	other := mustMechanism(t, 2, 1, d)
	if err := other.Apply(got, sum, 3, &n); !errors.Is(err, ErrInvalid) || !n.Ready() {
		t.Errorf("Apply with another mechanism's noise: %v, ready %v", err, n.Ready())
	}
	if err := m.Apply(got, sum[:d-1], 3, &n); !errors.Is(err, ErrInvalid) || !n.Ready() {
		t.Errorf("Apply with a short sum: %v, ready %v", err, n.Ready())
	}
	if err := m.Apply(got, sum, 3, &n); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("[%d]: Draw+Apply %v, Release %v", i, got[i], want[i])
		}
	}
	if n.Ready() {
		t.Error("noise still ready after Apply")
	}
	for _, z := range n.z {
		if z != 0 {
			t.Fatal("noise not zeroed after Apply")
		}
	}
	if err := m.Apply(got, sum, 3, &n); !errors.Is(err, ErrInvalid) {
		t.Errorf("second Apply of the same noise: %v", err)
	}
	if err := (DiscreteGaussian{}).Draw(&n, seededSource(1)); !errors.Is(err, ErrInvalid) {
		t.Errorf("Draw for the zero mechanism: %v", err)
	}
}

// TestOutputBig: the math/big output path computes the same function of
// k + z as the int64 path.
func TestOutputBig(t *testing.T) {
	m := mustMechanism(t, 1, 1, 1000)
	rng := rand.New(rand.NewPCG(3, 3))
	for range 10000 {
		k, z := rng.Int64N(1<<62)-1<<61, rng.Int64N(1<<62)-1<<61
		for _, b := range []float64{1, 3, 256, 1e-3} {
			fast := float32(float64(k+z) * m.Grid() / b)
			if slow := m.output(new(big.Int).Add(big.NewInt(z), big.NewInt(k)), m.Grid(), b); math.Float32bits(slow) != math.Float32bits(fast) {
				t.Fatalf("k %d z %d B %v: %v vs %v", k, z, b, slow, fast)
			}
		}
	}
}

// TestStartDrawSameNoiseAnyWorkers: a draw started on one or several
// goroutines and finished with or without help gives the same noise as
// Draw, reads all its randomness before StartDraw returns, and leaves no
// goroutine behind after Wait.
func TestStartDrawSameNoiseAnyWorkers(t *testing.T) {
	const d = 7*chunkSize + 11
	m := mustMechanism(t, 1, 1, d)
	var want Noise
	if err := m.Draw(&want, seededSource(9)); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	for _, tc := range []struct{ workers, help int }{{1, 0}, {1, 8}, {0, 3}, {3, 0}, {16, 16}} {
		var n Noise
		src := &countingSource{src: seededSource(9)}
		dr, err := m.StartDraw(&n, src, tc.workers)
		if err != nil {
			t.Fatal(err)
		}
		if read := src.n; read != 4*8 {
			t.Errorf("workers %d: StartDraw read %d words before returning, want %d (one key per chunk)", tc.workers, read, 4*8)
		}
		dr.Wait(tc.help)
		if !slices.Equal(n.z, want.z) {
			t.Errorf("workers %d, help %d: noise differs from Draw's", tc.workers, tc.help)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > before; {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines before the draws, %d after", before, runtime.NumGoroutine())
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := (DiscreteGaussian{}).StartDraw(new(Noise), seededSource(1), 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("StartDraw for the zero mechanism: %v", err)
	}
}
