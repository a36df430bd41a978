package coordinator

import (
	"errors"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/mechanism"
)

// zigguratWidths returns the strip widths wn[i] of the ziggurat normal
// sampler in math/rand/v2 (NormFloat64), rebuilt with the table recurrence
// of Marsaglia and Tsang, "The Ziggurat Method for Generating Random
// Variables" (J. Stat. Softw. 5(8), 2000), 128 strips, r = 3.442619855899,
// v = 9.91256303526217e-3. NormFloat64 returns int32(j)·wn[i] for more than
// 99% of its draws.
func zigguratWidths() [128]float64 {
	const m1 = 1 << 31
	dn, vn := 3.442619855899, 9.91256303526217e-3
	var wn [128]float64
	wn[0] = float64(float32(vn / math.Exp(-0.5*dn*dn) / m1))
	wn[127] = float64(float32(dn / m1))
	for i := 126; i >= 1; i-- {
		dn = math.Sqrt(-2 * math.Log(vn/dn+math.Exp(-0.5*dn*dn)))
		wn[i] = float64(float32(dn / m1))
	}
	return wn
}

// onLattice reports whether the released coordinate o could come from the
// sum value s with ziggurat noise: o = float32((s + std·j·wn[i])/B) for some
// strip i and integer j.
func onLattice(wn *[128]float64, o float32, s, std, batch float64) bool {
	for _, w := range wn {
		j := math.Round((float64(o)*batch - s) / (std * w))
		for dj := -1.0; dj <= 1; dj++ {
			if float32((s+std*((j+dj)*w))/batch) == o {
				return true
			}
		}
	}
	return false
}

// TestPrivatizeHidesLowOrderBits is the regression test for issue 8 (the
// leader's noise sat on a coarse lattice). It runs Mironov's (2012) attack
// on the leader's release: two sums S0 and S1 = S0 + δ with ‖δ‖ = 0.02·C,
// i.e. 0.02 noise standard deviations, which the Gaussian mechanism makes
// practically indistinguishable (at ε = 0.1 its δ(ε) is below 1e-6). The
// attacker knows both sums and the sampler and, on the coordinates released
// near zero (|g̃·B| < 1e-4·σC, where float32 is finer than the ziggurat's
// lattice), checks which hypothesis every coordinate is consistent with.
//
// With the floating-point sampler the true sum is consistent on every such
// coordinate and the false one is refuted on about half of them, so one
// release tells S0 from S1 with certainty. With the default mechanism the
// release is a function of the integer k + z only: the check is noise, and
// the attacker's "certain" event — the true hypothesis never refuted and
// the false one refuted — has probability about 0.54^n for n ≈ 75 window
// coordinates, below 1e-19, so this test cannot fail by chance.
func TestPrivatizeHidesLowOrderBits(t *testing.T) {
	const d = 1_000_000
	c := testRunConfig()
	c.Dim, c.NoiseMode = d, DefaultNoiseMode
	c.Optimizer.NoiseMultiplier, c.Optimizer.ClipNorm, c.Optimizer.ExpectedBatchSize = 1, 1, 1
	std, batch := 1.0, 1.0
	rng := rand.New(rand.NewPCG(8, 8))
	s0, s1 := make([]float64, d), make([]float64, d)
	eta := 0.02 / math.Sqrt(d)
	for j := range s0 {
		s0[j] = rng.NormFloat64() * 0.5 / math.Sqrt(d)
		s1[j] = s0[j] + eta
	}
	wn := zigguratWidths()
	// refuted counts, among the window coordinates of a release, those
	// inconsistent with each hypothesis.
	refuted := func(g []float32) (window, against0, against1 int) {
		for j, o := range g {
			if math.Abs(float64(o)*batch) >= 1e-4*std {
				continue
			}
			window++
			if !onLattice(&wn, o, s0[j], std, batch) {
				against0++
			}
			if !onLattice(&wn, o, s1[j], std, batch) {
				against1++
			}
		}
		return
	}
	g := make([]float32, d)
	if err := privatize(c, mechanism.NewSeededNoiseSource(1), nil, g, append([]float64(nil), s0...)); err != nil {
		t.Fatal(err)
	}
	w0, a00, a01 := refuted(g)
	if err := privatize(c, mechanism.NewSeededNoiseSource(2), nil, g, append([]float64(nil), s1...)); err != nil {
		t.Fatal(err)
	}
	w1, a10, a11 := refuted(g)
	t.Logf("release of S0: %d window coordinates, %d refute S0, %d refute S1", w0, a00, a01)
	t.Logf("release of S1: %d window coordinates, %d refute S0, %d refute S1", w1, a10, a11)
	if w0 < 30 || w1 < 30 {
		t.Fatalf("only %d and %d coordinates near zero: the attack has no power", w0, w1)
	}
	if (a00 == 0 && a01 > 0) || (a11 == 0 && a10 > 0) {
		t.Errorf("the release tells the sums apart: the true sum is consistent with every low-order bit, the other is refuted")
	}
}

// TestZigguratWidths guards the attack above against a wrong table: the
// rebuilt widths explain NormFloat64's draws exactly.
func TestZigguratWidths(t *testing.T) {
	wn := zigguratWidths()
	r := rand.New(rand.NewPCG(1, 2))
	hits := 0
	const n = 20000
	for range n {
		x := r.NormFloat64()
		for _, w := range wn {
			if j := math.Round(x / w); j*w == x && math.Abs(j) < 1<<31 {
				hits++
				break
			}
		}
	}
	if hits < n*99/100 {
		t.Errorf("%d of %d NormFloat64 draws are on the rebuilt lattice, want ≥ 99%%", hits, n)
	}
}

// TestRunConfigNoiseModes: Event is the accounting of the run's noise
// mode, and Validate accepts exactly the known modes.
func TestRunConfigNoiseModes(t *testing.T) {
	c := testRunConfig()
	for _, mode := range []string{NoiseFloat, NoiseLegacy} {
		c.NoiseMode = mode
		e := c.Event()
		if e.Kind != accounting.KindPoissonSampled || e.Event.Kind != accounting.KindGaussian || e.Event.NoiseMultiplier != 1 || c.Validate() != nil {
			t.Errorf("mode %q: event %+v, validate %v", mode, e, c.Validate())
		}
		if _, ok := c.Discrete(); ok {
			t.Errorf("mode %q has a discrete mechanism", mode)
		}
	}
	c.NoiseMode = NoiseDiscrete
	m, ok := c.Discrete()
	want, err := mechanism.NewDiscreteGaussian(1, 1, c.Dim)
	if !ok || err != nil || m != want {
		t.Fatalf("discrete mechanism %+v, want %+v (%v)", m, want, err)
	}
	if e := c.Event(); e.Event.Kind != accounting.KindDiscreteGaussian || e.Event.NoiseMultiplier != m.Sigma || e.SampleRate != c.SampleRate {
		t.Errorf("discrete event %+v", e)
	}
	if m.Sigma >= 1 || m.Sigma < 1/(1+mechanism.GridFraction)*(1-1e-12) {
		t.Errorf("σ_eff = %v for σ = 1", m.Sigma)
	}
	c.NoiseMode = "gaussian"
	if err := c.Validate(); !errors.Is(err, ErrInvalidRunConfig) {
		t.Errorf("unknown mode: %v", err)
	}
	c.NoiseMode = NoiseDiscrete
	c.Optimizer.NoiseMultiplier, c.Dim = 1e9, 1<<30 // noise scale beyond the sampler's
	if err := c.Validate(); !errors.Is(err, ErrInvalidRunConfig) || !errors.Is(err, mechanism.ErrInvalid) {
		t.Errorf("unbuildable mechanism: %v", err)
	}
	if e := c.Event(); e.Validate() == nil {
		t.Errorf("unbuildable mechanism charges %+v", e)
	}
}

// legacyRunConfig is RunConfig as it was before noise modes: the shape of
// the configuration entries in Raft logs and snapshots written then.
type legacyRunConfig struct {
	Run           string        `msgpack:"run"`
	ModelSpec     []byte        `msgpack:"model_spec"`
	ModelHash     string        `msgpack:"model_hash"`
	Dim           int           `msgpack:"dim"`
	InitSeed      uint64        `msgpack:"init_seed"`
	TotalExamples int64         `msgpack:"total_examples"`
	SampleRate    float64       `msgpack:"sample_rate"`
	Optimizer     dpadam.Config `msgpack:"optimizer"`
	TargetEpsilon float64       `msgpack:"target_epsilon"`
	Delta         float64       `msgpack:"delta"`
	MaxSteps      int64         `msgpack:"max_steps"`
	SeedPolicy    string        `msgpack:"seed_policy"`
}

// TestLegacyConfigKeepsItsMeaning: a configuration written before noise
// modes existed decodes to NoiseLegacy, is charged as the floating-point
// Gaussian it ran with, and re-encodes to the same bytes, so a resumed run
// matches its log (sameConfig) and its ledger.
func TestLegacyConfigKeepsItsMeaning(t *testing.T) {
	c := testRunConfig()
	c.NoiseMode = NoiseLegacy
	old, err := msgpack.Marshal(legacyRunConfig{
		Run: c.Run, ModelHash: c.ModelHash, Dim: c.Dim, InitSeed: c.InitSeed, TotalExamples: c.TotalExamples,
		SampleRate: c.SampleRate, Optimizer: c.Optimizer, TargetEpsilon: c.TargetEpsilon, Delta: c.Delta, SeedPolicy: string(c.SeedPolicy),
	})
	if err != nil {
		t.Fatal(err)
	}
	var got RunConfig
	if err := msgpack.Unmarshal(old, &got); err != nil {
		t.Fatal(err)
	}
	if got.NoiseMode != NoiseLegacy || got.Accountant != AccountantLegacy || got.Validate() != nil {
		t.Fatalf("decoded %+v (validate %v)", got, got.Validate())
	}
	if e := got.Event(); e.Event == nil || e.Event.Kind != accounting.KindGaussian || e.Event.NoiseMultiplier != c.Optimizer.NoiseMultiplier {
		t.Errorf("legacy config charges %+v", e)
	}
	again, err := msgpack.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(old) || !sameConfig(got, c) {
		t.Errorf("legacy config re-encodes differently:\n%x\n%x", again, old)
	}
}

// TestLegacyConfigKeepsItsAccountant: a configuration written before
// accountants were recorded (here with the discrete noise mode, which
// predates them) decodes to AccountantLegacy, re-encodes to the same bytes,
// and its ledger enforces the budget with RDP, as it did when it ran: the
// ledger's Spent after a charge is the RDP accountant's ε of that event.
func TestLegacyConfigKeepsItsAccountant(t *testing.T) {
	c := testRunConfig()
	c.NoiseMode = NoiseDiscrete
	type preAccountant struct {
		legacyRunConfig
		NoiseMode string `msgpack:"noise_mode,omitempty"`
	}
	old, err := msgpack.Marshal(preAccountant{legacyRunConfig{
		Run: c.Run, ModelHash: c.ModelHash, Dim: c.Dim, InitSeed: c.InitSeed, TotalExamples: c.TotalExamples,
		SampleRate: c.SampleRate, Optimizer: c.Optimizer, TargetEpsilon: c.TargetEpsilon, Delta: c.Delta, SeedPolicy: string(c.SeedPolicy),
	}, c.NoiseMode})
	if err != nil {
		t.Fatal(err)
	}
	var got RunConfig
	if err := msgpack.Unmarshal(old, &got); err != nil {
		t.Fatal(err)
	}
	if got.Accountant != AccountantLegacy || got.NoiseMode != NoiseDiscrete || got.Validate() != nil {
		t.Fatalf("decoded %+v (validate %v)", got, got.Validate())
	}
	again, err := msgpack.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(old) {
		t.Errorf("pre-accountant config re-encodes differently:\n%x\n%x", again, old)
	}
	l, err := ledger.Open(filepath.Join(t.TempDir(), "ledger.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Start(got.Run, got.TargetEpsilon, got.Delta, got.SeedPolicy, got.NoiseMode, got.Accountant, "h"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Charge(1, got.Event(), ledger.Position{History: "h", Term: 1, Index: 2}, false); err != nil {
		t.Fatal(err)
	}
	want, _, err := accounting.RDP{}.EpsilonOrder(got.Event(), 1, got.Delta)
	if err != nil || l.Spent() != want || l.Accountant() != AccountantRDP {
		t.Errorf("legacy run spent ε=%v with %q, want RDP's %v (%v)", l.Spent(), l.Accountant(), want, err)
	}
}

// TestAccountantName: what a run is charged with, as the dashboard and the
// exported model's metadata report it; a legacy configuration means RDP.
func TestAccountantName(t *testing.T) {
	for _, tc := range []struct{ field, want string }{
		{AccountantLegacy, AccountantRDP}, {AccountantRDP, AccountantRDP}, {AccountantPLD, AccountantPLD},
	} {
		if got := (RunConfig{Accountant: tc.field}).AccountantName(); got != tc.want {
			t.Errorf("Accountant %q: AccountantName() = %q, want %q", tc.field, got, tc.want)
		}
	}
}

// TestRunConfigPretrained: a run started from a checkpoint names its
// weights by a full SHA-256 in lowercase hex and keeps its config.json;
// anything else is refused, and the field survives the configuration's encoding.
func TestRunConfigPretrained(t *testing.T) {
	c := testRunConfig()
	c.Pretrained = &Pretrained{WeightsSHA256: strings.Repeat("0f", 32), Config: []byte(`{"model_type": "bert"}`)}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	b, err := msgpack.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var back RunConfig
	if err := msgpack.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Pretrained == nil || string(back.Pretrained.Config) != string(c.Pretrained.Config) || back.Pretrained.WeightsSHA256 != c.Pretrained.WeightsSHA256 {
		t.Errorf("decoded %+v, want %+v", back.Pretrained, c.Pretrained)
	}
	for _, p := range []Pretrained{
		{WeightsSHA256: "abc", Config: []byte("{}")},
		{WeightsSHA256: strings.Repeat("0F", 32), Config: []byte("{}")}, // nodes report lowercase hex
		{Config: []byte("{}")},
		{WeightsSHA256: strings.Repeat("0f", 32)},
	} {
		c.Pretrained = &p
		if err := c.Validate(); !errors.Is(err, ErrInvalidRunConfig) {
			t.Errorf("%+v: Validate = %v, want ErrInvalidRunConfig", p, err)
		}
	}
}
