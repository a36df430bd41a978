package dpadam

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// refOptimizer is a deliberately naive float64 transcription of the four
// update rules (paper Algorithm 1 and §3), with math.Pow and an ordinary
// branch, to check the fast kernels against.
type refOptimizer struct {
	cfg     Config
	t       int
	m, v, b []float64
}

func newRef(cfg Config, dim int) *refOptimizer {
	return &refOptimizer{cfg: cfg, m: make([]float64, dim), v: make([]float64, dim), b: make([]float64, dim)}
}

func (r *refOptimizer) step(theta []float64, g []float64) Diagnostics {
	r.t++
	c := r.cfg
	phi := math.Pow(c.NoiseMultiplier*c.ClipNorm/c.ExpectedBatchSize, 2)
	if c.PhiScale != 0 {
		phi *= c.PhiScale
	}
	d := Diagnostics{Step: int64(r.t), Phi: phi}
	var sumV, sumU2 float64
	floors := 0
	for i := range theta {
		var u float64
		switch c.Algorithm {
		case AdamBC, Adam:
			r.m[i] = c.Beta1*r.m[i] + (1-c.Beta1)*g[i]
			r.v[i] = c.Beta2*r.v[i] + (1-c.Beta2)*g[i]*g[i]
			mHat := r.m[i] / (1 - math.Pow(c.Beta1, float64(r.t)))
			vHat := r.v[i] / (1 - math.Pow(c.Beta2, float64(r.t)))
			sumV += vHat
			if c.Algorithm == AdamBC {
				den := vHat - phi
				if den < c.GammaPrime {
					den = c.GammaPrime
					floors++
				}
				u = c.LearningRate * mHat / math.Sqrt(den)
			} else {
				u = c.LearningRate * mHat / (math.Sqrt(vHat) + c.AdamEps)
			}
		case SGD:
			u = c.LearningRate * g[i]
		case SGDM:
			r.b[i] = c.Momentum*r.b[i] + g[i]
			u = c.LearningRate * r.b[i]
		}
		theta[i] -= u
		sumU2 += u * u
	}
	n := float64(len(theta))
	d.MeanVHat = sumV / n
	d.FloorFraction = float64(floors) / n
	d.UpdateRMS = math.Sqrt(sumU2 / n)
	return d
}

// testConfig returns a config of the given algorithm in the paper's SNLI
// regime (B=256, C=0.1, σ=0.4, Φ ≈ 2.44e-8).
func testConfig(a Algorithm) Config {
	cfg := DefaultConfig()
	cfg.Algorithm = a
	cfg.NoiseMultiplier, cfg.ClipNorm, cfg.ExpectedBatchSize = 0.4, 0.1, 256
	cfg.GammaPrime = 1e-9
	switch a {
	case SGD, SGDM:
		cfg.LearningRate = 0.5
	}
	return cfg
}

var algorithms = []Algorithm{AdamBC, Adam, SGD, SGDM}

// noisyGrads returns steps×dim gradients: a fixed per-coordinate signal
// plus Gaussian noise of the mechanism's scale σC/B.
func noisyGrads(seed uint64, cfg Config, steps, dim int) [][]float32 {
	rng := rand.New(rand.NewPCG(seed, 7))
	sigma := cfg.NoiseMultiplier * cfg.ClipNorm / cfg.ExpectedBatchSize
	signal := make([]float64, dim)
	for i := range signal {
		signal[i] = 2 * sigma * rng.NormFloat64()
	}
	out := make([][]float32, steps)
	for s := range out {
		out[s] = make([]float32, dim)
		for i := range out[s] {
			out[s][i] = float32(signal[i] + sigma*rng.NormFloat64())
		}
	}
	return out
}

func TestStepMatchesReference(t *testing.T) {
	const dim, steps = 257, 60
	for _, alg := range algorithms {
		t.Run(string(alg), func(t *testing.T) {
			cfg := testConfig(alg)
			opt, err := New(cfg, dim)
			if err != nil {
				t.Fatal(err)
			}
			ref := newRef(cfg, dim)
			rng := rand.New(rand.NewPCG(3, 4))
			theta := make([]float32, dim)
			refTheta := make([]float64, dim)
			for i := range theta {
				theta[i] = float32(rng.NormFloat64())
				refTheta[i] = float64(theta[i])
			}
			sawFloor := false
			for s, g := range noisyGrads(11, cfg, steps, dim) {
				got, err := opt.Step(theta, g)
				if err != nil {
					t.Fatalf("step %d: %v", s+1, err)
				}
				g64 := make([]float64, dim)
				for i, x := range g {
					g64[i] = float64(x)
				}
				want := ref.step(refTheta, g64)
				// Tolerances: θ and the state are float32 (relative
				// rounding 6e-8 per operation) and the reference is
				// float64, so 60 steps agree to ~1e-6 relative.
				for i := range theta {
					if diff := math.Abs(float64(theta[i]) - refTheta[i]); diff > 1e-6+1e-5*math.Abs(refTheta[i]) {
						t.Fatalf("step %d: theta[%d] = %.9g, want %.9g", s+1, i, theta[i], refTheta[i])
					}
				}
				if got.Step != want.Step || got.FloorFraction != want.FloorFraction {
					t.Fatalf("step %d: diagnostics %+v, want %+v", s+1, got, want)
				}
				for _, f := range []struct {
					name      string
					got, want float64
				}{
					{"Phi", got.Phi, want.Phi},
					{"MeanVHat", got.MeanVHat, want.MeanVHat},
					{"UpdateRMS", got.UpdateRMS, want.UpdateRMS},
				} {
					if math.Abs(f.got-f.want) > 1e-5*math.Abs(f.want) {
						t.Fatalf("step %d: %s = %g, want %g", s+1, f.name, f.got, f.want)
					}
				}
				sawFloor = sawFloor || got.FloorFraction > 0
			}
			if alg == AdamBC && !sawFloor {
				t.Errorf("test inputs never activated the γ' floor; the floor path went untested")
			}
			if alg != AdamBC && sawFloor {
				t.Errorf("FloorFraction > 0 for %s", alg)
			}
		})
	}
}

func TestDiagnosticsSimple(t *testing.T) {
	// One step of DP-AdamBC from zero state with g̃ = (1, 0): m̂ = g̃,
	// v̂ = g̃², so Δ = (1/sqrt(1−Φ), 0/sqrt(γ')) = (1/sqrt(1−Φ), 0), and the
	// floor is active on the second coordinate only.
	cfg := DefaultConfig()
	cfg.NoiseMultiplier, cfg.ClipNorm, cfg.ExpectedBatchSize = 1, 1, 2 // Φ = 0.25
	cfg.LearningRate = 0.5
	opt, err := New(cfg, 2)
	if err != nil {
		t.Fatal(err)
	}
	theta := []float32{1, 1}
	d, err := opt.Step(theta, []float32{1, 0})
	if err != nil {
		t.Fatal(err)
	}
	u := 0.5 / math.Sqrt(0.75)
	want := Diagnostics{Step: 1, Phi: 0.25, MeanVHat: 0.5, FloorFraction: 0.5, UpdateRMS: math.Sqrt(u * u / 2)}
	if math.Abs(d.UpdateRMS-want.UpdateRMS) > 1e-15 || d.Step != want.Step || d.Phi != want.Phi ||
		math.Abs(d.MeanVHat-want.MeanVHat) > 1e-15 || d.FloorFraction != want.FloorFraction {
		t.Errorf("Diagnostics = %+v, want %+v", d, want)
	}
	if got, want := theta, []float32{float32(1 - u), 1}; got[0] != want[0] || got[1] != want[1] {
		t.Errorf("theta = %v, want %v", got, want)
	}
}

func TestPhiScale(t *testing.T) {
	cfg := testConfig(AdamBC)
	base := cfg.Phi()
	if want := math.Pow(0.4*0.1/256, 2); math.Abs(base-want) > 1e-15*want {
		t.Fatalf("Phi() = %g, want %g", base, want)
	}
	for _, tc := range []struct {
		scale, want float64
	}{
		{0, base}, {1, base}, {2, 2 * base}, {0.5, 0.5 * base},
	} {
		cfg.PhiScale = tc.scale
		if got := cfg.Phi(); got != tc.want {
			t.Errorf("PhiScale %v: Phi() = %g, want %g", tc.scale, got, tc.want)
		}
	}
}

// stateBytes returns the optimizer's encoding, failing the test on error.
func stateBytes(t *testing.T, o *Optimizer) []byte {
	t.Helper()
	b, err := o.MarshalBinary()
	if err != nil {
		t.Fatalf("MarshalBinary: %v", err)
	}
	return b
}

// TestCheckGradientIsStepsRule: CheckGradient and GradientValid accept
// exactly the g̃ Step accepts, for every algorithm, on both sides of the
// MaxGradient boundary, and CheckGradient names the first offending index.
func TestCheckGradientIsStepsRule(t *testing.T) {
	const dim = 11
	below := math.Nextafter32(float32(MaxGradient), 0)
	vals := []float32{0, float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, 1, -1e18,
		below, -below, float32(MaxGradient), -float32(MaxGradient), math.MaxFloat32,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.Float32frombits(0x7fc00001)}
	for _, alg := range algorithms {
		for _, v := range vals {
			for _, pos := range []int{0, dim - 1} {
				cfg := testConfig(alg)
				opt, err := New(cfg, dim)
				if err != nil {
					t.Fatal(err)
				}
				g := noisyGrads(1, cfg, 5, dim)[0]
				g[pos] = v
				checkErr := CheckGradient(g)
				_, stepErr := opt.Step(make([]float32, dim), g)
				if (checkErr == nil) != (stepErr == nil) || GradientValid(g) != (stepErr == nil) {
					t.Fatalf("%s g[%d] = %v: CheckGradient = %v, GradientValid = %v, Step = %v", alg, pos, v, checkErr, GradientValid(g), stepErr)
				}
				valid := !math.IsNaN(float64(v)) && math.Abs(float64(v)) < MaxGradient
				if (checkErr == nil) != valid {
					t.Fatalf("g[%d] = %v: CheckGradient = %v, want valid = %v", pos, v, checkErr, valid)
				}
				if checkErr != nil && (!errors.Is(checkErr, ErrNonFinite) || !strings.Contains(checkErr.Error(), fmt.Sprintf("[%d]", pos))) {
					t.Fatalf("g[%d] = %v: error %v does not wrap ErrNonFinite and name the index", pos, v, checkErr)
				}
			}
		}
	}
}

func TestStepRejectsNonFinite(t *testing.T) {
	const dim = 9
	bad := []struct {
		name string
		val  float32
	}{
		{"NaN", float32(math.NaN())},
		{"+Inf", float32(math.Inf(1))},
		{"-Inf", float32(math.Inf(-1))},
		{"2^63", float32(MaxGradient)},
		{"-2^63", -float32(MaxGradient)},
		{"MaxFloat32", math.MaxFloat32},
	}
	for _, alg := range algorithms {
		for _, b := range bad {
			for _, pos := range []int{0, dim / 2, dim - 1} {
				cfg := testConfig(alg)
				opt, err := New(cfg, dim)
				if err != nil {
					t.Fatal(err)
				}
				theta := make([]float32, dim)
				grads := noisyGrads(5, cfg, 4, dim)
				for _, g := range grads[:3] {
					if _, err := opt.Step(theta, g); err != nil {
						t.Fatal(err)
					}
				}
				before := stateBytes(t, opt)
				thetaBefore := append([]float32(nil), theta...)
				g := grads[3]
				g[pos] = b.val
				d, err := opt.Step(theta, g)
				if !errors.Is(err, ErrNonFinite) {
					t.Fatalf("%s %s at %d: Step error = %v, want ErrNonFinite", alg, b.name, pos, err)
				}
				if d != (Diagnostics{}) {
					t.Errorf("%s %s at %d: Diagnostics = %+v on error, want zero", alg, b.name, pos, d)
				}
				if !bitsEqual(theta, thetaBefore) {
					t.Errorf("%s %s at %d: theta changed", alg, b.name, pos)
				}
				if after := stateBytes(t, opt); !bytes.Equal(after, before) {
					t.Errorf("%s %s at %d: optimizer state changed", alg, b.name, pos)
				}
				if got := opt.StepCount(); got != 3 {
					t.Errorf("%s %s at %d: StepCount = %d, want 3", alg, b.name, pos, got)
				}
			}
		}
	}
}

func TestStepAcceptsLargeFinite(t *testing.T) {
	// Just below MaxGradient is accepted and keeps the whole state finite
	// and decodable, even with β2 = 0 and momentum near 1.
	for _, alg := range algorithms {
		cfg := testConfig(alg)
		cfg.Beta2 = 0
		cfg.Momentum = 0.999
		opt, err := New(cfg, 2)
		if err != nil {
			t.Fatal(err)
		}
		big := math.Nextafter32(float32(MaxGradient), 0)
		theta := []float32{0, 0}
		for range 5 {
			if _, err := opt.Step(theta, []float32{big, -big}); err != nil {
				t.Fatalf("%s: Step(%g): %v", alg, big, err)
			}
		}
		var restored Optimizer
		if err := restored.UnmarshalBinary(stateBytes(t, opt)); err != nil {
			t.Errorf("%s: state after large gradients does not decode: %v", alg, err)
		}
	}
}

func TestStepDimension(t *testing.T) {
	opt, err := New(testConfig(AdamBC), 4)
	if err != nil {
		t.Fatal(err)
	}
	before := stateBytes(t, opt)
	for _, tc := range []struct {
		name        string
		theta, grad []float32
	}{
		{"short theta", make([]float32, 3), make([]float32, 4)},
		{"long theta", make([]float32, 5), make([]float32, 4)},
		{"short grad", make([]float32, 4), make([]float32, 3)},
		{"nil both", nil, nil},
	} {
		if _, err := opt.Step(tc.theta, tc.grad); !errors.Is(err, ErrDimension) {
			t.Errorf("%s: error = %v, want ErrDimension", tc.name, err)
		}
	}
	if !bytes.Equal(stateBytes(t, opt), before) {
		t.Errorf("state changed after dimension errors")
	}
	for _, dim := range []int{0, -1} {
		if _, err := New(DefaultConfig(), dim); !errors.Is(err, ErrDimension) {
			t.Errorf("New(dim=%d) error = %v, want ErrDimension", dim, err)
		}
	}
}

func TestZeroOptimizer(t *testing.T) {
	var o Optimizer
	if _, err := o.Step(nil, nil); !errors.Is(err, ErrUninitialized) {
		t.Errorf("Step on zero Optimizer: %v, want ErrUninitialized", err)
	}
	if _, err := o.MarshalBinary(); !errors.Is(err, ErrUninitialized) {
		t.Errorf("MarshalBinary on zero Optimizer: %v, want ErrUninitialized", err)
	}
}

func TestStepOverflow(t *testing.T) {
	opt, err := New(testConfig(SGD), 1)
	if err != nil {
		t.Fatal(err)
	}
	opt.step = math.MaxInt64
	theta := []float32{1}
	if _, err := opt.Step(theta, []float32{1}); !errors.Is(err, ErrStepOverflow) {
		t.Errorf("Step at MaxInt64: %v, want ErrStepOverflow", err)
	}
	if theta[0] != 1 || opt.StepCount() != math.MaxInt64 {
		t.Errorf("state changed on overflow")
	}
}

func TestStepAllocs(t *testing.T) {
	for _, alg := range algorithms {
		cfg := testConfig(alg)
		opt, err := New(cfg, 1000)
		if err != nil {
			t.Fatal(err)
		}
		theta := make([]float32, 1000)
		g := noisyGrads(1, cfg, 1, 1000)[0]
		allocs := testing.AllocsPerRun(100, func() {
			if _, err := opt.Step(theta, g); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: Step allocates %v times per call, want 0", alg, allocs)
		}
	}
}

func TestConfigAccessors(t *testing.T) {
	cfg := testConfig(SGDM)
	opt, err := New(cfg, 3)
	if err != nil {
		t.Fatal(err)
	}
	if opt.Config() != cfg || opt.Dim() != 3 || opt.StepCount() != 0 {
		t.Errorf("Config/Dim/StepCount = %+v/%d/%d, want %+v/3/0", opt.Config(), opt.Dim(), opt.StepCount(), cfg)
	}
}

func bitsEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// uniformGrads is noisyGrads built from rng.Float64 only (integer
// arithmetic and one exact conversion), so the inputs of the golden test
// are identical on every platform, unlike NormFloat64 which calls math.Exp
// and math.Log (assembly on some ports).
func uniformGrads(seed uint64, cfg Config, steps, dim int) [][]float32 {
	rng := rand.New(rand.NewPCG(seed, 9))
	sigma := cfg.NoiseMultiplier * cfg.ClipNorm / cfg.ExpectedBatchSize
	signal := make([]float64, dim)
	for i := range signal {
		signal[i] = 4 * sigma * (rng.Float64() - 0.5)
	}
	out := make([][]float32, steps)
	for s := range out {
		out[s] = make([]float32, dim)
		for i := range out[s] {
			// Sum of three uniforms: mean 0, standard deviation σ.
			z := rng.Float64() + rng.Float64() + rng.Float64() - 1.5
			out[s][i] = float32(signal[i] + 2*sigma*z)
		}
	}
	return out
}

// trajectoryDigest runs an algorithm for 200 steps from seeded inputs and
// hashes θ and the diagnostics after every step, then the encoded state.
func trajectoryDigest(t *testing.T, alg Algorithm) string {
	t.Helper()
	const dim, steps = 1031, 200
	cfg := testConfig(alg)
	opt, err := New(cfg, dim)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(21, 22))
	theta := make([]float32, dim)
	for i := range theta {
		theta[i] = float32(rng.Float64() - 0.5)
	}
	h := sha256.New()
	for _, g := range uniformGrads(23, cfg, steps, dim) {
		d, err := opt.Step(theta, g)
		if err != nil {
			t.Fatal(err)
		}
		binary.Write(h, binary.LittleEndian, theta)
		binary.Write(h, binary.LittleEndian, d)
	}
	h.Write(stateBytes(t, opt))
	return hex.EncodeToString(h.Sum(nil))
}

// TestDeterminismGolden pins the exact bits of a 200-step trajectory per
// algorithm. Replicas must agree bit for bit across machines, so this
// digest must not change with the architecture, GOAMD64 level (FMA) or Go
// version; CI on other platforms runs the same test. (Checked: amd64 with
// GOAMD64=v1 and v3, with and without the noasm tag (AVX2 kernel or not),
// and GOARCH=386 give these digests; dropping one
// explicit float64(a*b) rounding changes the v3 digest through FMA.) A
// deliberate change to the arithmetic must update these values and say so.
func TestDeterminismGolden(t *testing.T) {
	golden := map[Algorithm]string{
		AdamBC: "bdbecae6eb384e26788518bb0145a86ff77912329e933e8be32c9e9133ec477f",
		Adam:   "63bb68612efd29142fb373a1b4cf18144d36d2368c0f693134a7ec025801b5b1",
		SGD:    "074a04b28ba20e00b2aa55ac77426914d21b935d558d6b9136724e032270aef9",
		SGDM:   "f9f02d38826b41ea726af14eddbc2b52123cdb712308593ce751fa0876a6711a",
	}
	for _, alg := range algorithms {
		got := trajectoryDigest(t, alg)
		if again := trajectoryDigest(t, alg); again != got {
			t.Fatalf("%s: two identical runs differ: %s vs %s", alg, got, again)
		}
		if want := golden[alg]; got != want {
			t.Errorf("%s: trajectory digest %s, want %s", alg, got, want)
		}
	}
}

func TestErrorMessagesArePrefixed(t *testing.T) {
	for _, err := range []error{ErrInvalidConfig, ErrNonFinite, ErrDimension, ErrUninitialized,
		ErrStepOverflow, ErrCorrupt, ErrVersion} {
		if !strings.HasPrefix(err.Error(), "dpadam: ") {
			t.Errorf("error %q lacks the package prefix", err)
		}
	}
}
