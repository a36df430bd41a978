package coordinator

import (
	"errors"
	"fmt"
	"math"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/seed"
)

// ErrInvalidPlan is returned (wrapped, naming the quantity by its run-file
// key) by RunPlan.RunConfig for a plan that cannot become a run: N unknown
// or contradicted by the data, a batch size outside (0, N], a negative σ,
// an unknown noise mode, or σ to calibrate without a step count.
// Calibration failures wrap the accounting errors (accounting.ErrUnreachable,
// accounting.ErrInvalidParameter) instead, and a plan that yields an invalid
// configuration wraps ErrInvalidRunConfig.
var ErrInvalidPlan = errors.New("coordinator: invalid run plan")

// CalibrationMargin is the relative safety margin of σ calibration: σ is
// calibrated to reach ε = TargetEpsilon·(1 − CalibrationMargin) after
// MaxSteps, a hair below the budget, because the ledger composes step by
// step and float rounding must not push the last step a few ulps past the
// target. RunPlan.RunConfig applies it, once; nothing else does.
const CalibrationMargin = 1e-9

// RunPlan is a training run as an operator asks for it: the quantities a
// run file and flags give, before the derived ones (q = B/N, a calibrated
// σ, the seed policy) are worked out. RunConfig turns it into the
// replicated RunConfig; it is the one place those derivations live.
//
// This file holds every rule that derives something from a run, so that
// the commands only wire: the run's configuration (RunPlan.RunConfig), a
// node's (RunPlan.NodeConfig), the privacy event each step charges
// (RunConfig.Event) and θ₀ (RunConfig.Theta0, InitFromSpec).
type RunPlan struct {
	// Run names the run.
	Run string
	// ModelSpec, ModelHash and Dim describe the model (RunConfig's fields
	// of the same names); InitSeed seeds θ₀.
	ModelSpec []byte
	ModelHash string
	Dim       int
	InitSeed  uint64
	// DataExamples is the number of training examples in the loaded data
	// (0: no data loaded), TotalExamples the N the operator declared (0:
	// take it from the data). If both are set they must agree.
	DataExamples  int64
	TotalExamples int64
	// BatchSize is the expected batch size B; q = B/N.
	BatchSize float64
	// Sigma is the noise multiplier σ; 0 calibrates it so that MaxSteps
	// steps spend TargetEpsilon at Delta (less CalibrationMargin).
	Sigma         float64
	TargetEpsilon float64
	// Delta is δ, which must be below 1/N; 0 derives it: LedgerDelta if
	// set, else DefaultDelta(N).
	Delta float64
	// LedgerDelta is the δ the ledger of the run being resumed records (0:
	// a new run). With Delta 0 the run keeps it, even at or above 1/N (a
	// run started before δ depended on N), since a run cannot change δ
	// midway (ledger.ErrRunMismatch). It is not part of the calibration
	// key: the δ it gives is.
	LedgerDelta float64 `json:"-"`
	MaxSteps    int64
	// Optimizer is the update rule and its hyperparameters; its
	// NoiseMultiplier and ExpectedBatchSize are ignored (the plan sets
	// them), its ClipNorm is C.
	Optimizer dpadam.Config
	// NoiseMode is NoiseDiscrete or NoiseFloat. KeepLegacyNoise overrides
	// it with NoiseLegacy, for a run resumed from a ledger that predates
	// noise modes (a run cannot change mechanism midway).
	NoiseMode       string
	KeepLegacyNoise bool
	// Accountant is AccountantPLD or AccountantRDP, or "" for the default
	// of the noise mode (DefaultAccountantFor). KeepLegacyAccountant
	// overrides it with AccountantLegacy (RDP), for a run resumed from a
	// ledger that predates accountants (a run cannot change accountant
	// midway).
	Accountant           string
	KeepLegacyAccountant bool
	// Seeded says the leader's noise comes from a seeded, predictable
	// source: the run's SeedPolicy is then seed.Seeded, and it is NOT
	// private. Otherwise seed.Crypto.
	Seeded bool
	// DataSchema, for a run whose nodes bring their own data, is what
	// that data must look like (RunConfig.DataSchema); N is then
	// TotalExamples, declared in advance (no data is loaded here).
	DataSchema string
	// Nodes binds node IDs to shards (RunConfig.Nodes).
	Nodes []string
	// Pretrained names the checkpoint θ₀ is read from (RunConfig.Pretrained);
	// nil: θ₀ is drawn from InitSeed.
	Pretrained *Pretrained
	// Names names the classes and columns (RunConfig.Names); not part of
	// the calibration key, since σ does not depend on it.
	Names *DataNames `json:"-"`
}

// RunConfig derives the replicated run configuration from the plan:
//
//  1. N is TotalExamples or DataExamples (which must agree when both are
//     set), and must be positive;
//  2. B must be in (0, N], and q = B/N; δ is Delta, which must be in
//     (0, 1/N), or with Delta 0 LedgerDelta or DefaultDelta(N) (RunPlan.delta);
//  3. the noise mode is NoiseLegacy if KeepLegacyNoise, else NoiseMode,
//     which must be NoiseDiscrete or NoiseFloat;
//  4. the accountant is AccountantLegacy if KeepLegacyAccountant, else
//     Accountant, or DefaultAccountantFor(mode) if that is empty; it must
//     be able to charge the mode's mechanism (RunConfig.Validate);
//  5. the seed policy is seed.Seeded if Seeded, else seed.Crypto;
//  6. if Sigma is 0, σ is calibrated with the run's accountant and the
//     event the ledger will charge (RunConfig.Event) to
//     TargetEpsilon·(1 − CalibrationMargin) at MaxSteps (which must then
//     be positive): the accountant's Calibrate (RunConfig.Accounting);
//  7. B is stored as q·N, which must reproduce B (to 1e-9), and the result
//     passes RunConfig.Validate.
//
// On error it returns the zero RunConfig. It reads no clock and draws no
// randomness: the same plan gives the same configuration.
func (p RunPlan) RunConfig() (RunConfig, error) {
	n, q, err := p.sampling()
	if err != nil {
		return RunConfig{}, err
	}
	if p.Delta, err = p.delta(n); err != nil {
		return RunConfig{}, err
	}
	if !(p.Sigma >= 0) {
		return RunConfig{}, invalidPlan("sigma %v must not be negative", p.Sigma)
	}
	mode, accountant, err := p.mechanism()
	if err != nil {
		return RunConfig{}, err
	}
	policy := seed.Crypto
	if p.Seeded {
		policy = seed.Seeded
	}
	opt := p.Optimizer
	opt.NoiseMultiplier, opt.ExpectedBatchSize = p.Sigma, p.BatchSize
	c := RunConfig{
		Run: p.Run, ModelSpec: p.ModelSpec, ModelHash: p.ModelHash, Dim: p.Dim, InitSeed: p.InitSeed,
		TotalExamples: n, SampleRate: q, Optimizer: opt, TargetEpsilon: p.TargetEpsilon, Delta: p.Delta,
		MaxSteps: p.MaxSteps, SeedPolicy: policy, NoiseMode: mode, Accountant: accountant, DataSchema: p.DataSchema,
		Nodes: p.Nodes, Pretrained: p.Pretrained, Names: p.Names,
	}
	if p.Sigma == 0 {
		if c.Optimizer.NoiseMultiplier, err = p.calibrate(c); err != nil {
			return RunConfig{}, err
		}
	}
	// B = q·N must hold exactly enough for Validate.
	c.Optimizer.ExpectedBatchSize = q * float64(n)
	if math.Abs(c.Optimizer.ExpectedBatchSize-p.BatchSize) > 1e-9*p.BatchSize {
		return RunConfig{}, invalidPlan("batch_size %v does not survive q·N", p.BatchSize)
	}
	if err := c.Validate(); err != nil {
		return RunConfig{}, err
	}
	return c, nil
}

// invalidPlan is ErrInvalidPlan, saying why.
func invalidPlan(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidPlan, fmt.Sprintf(format, args...))
}

// sampling derives N and q = B/N (RunConfig's steps 1 and 2).
func (p RunPlan) sampling() (int64, float64, error) {
	n := p.DataExamples
	if p.TotalExamples > 0 {
		if n > 0 && n != p.TotalExamples {
			return 0, 0, invalidPlan("total_examples %d but the dataset has %d", p.TotalExamples, n)
		}
		n = p.TotalExamples
	}
	if n <= 0 {
		return 0, 0, invalidPlan("the number of training examples N is unknown: give total_examples or a dataset")
	}
	if !(p.BatchSize > 0 && p.BatchSize <= float64(n)) {
		return 0, 0, invalidPlan("batch_size %v must be in (0, N = %d]", p.BatchSize, n)
	}
	return n, p.BatchSize / float64(n), nil
}

// DefaultDelta is δ for a run of N examples that gives none: 1e-5 for
// N < 1e5 (the δ runs had before it depended on N, so their ledgers and
// calibrated σ stay as they were), else the largest power of ten at most
// 1/(10·N) (1e-6 at N = 1e5, where 1e-5 would be 1/N; 1e-7 up to 1e6).
// δ must stay well below 1/N: a mechanism that publishes one record,
// chosen at random, whole satisfies every ε at δ = 1/N. A power of ten
// reads plainly in reports and stays the same as N drifts a little (a few
// examples more do not change the run's δ, its σ, or its ledger).
func DefaultDelta(n int64) float64 {
	if n < 1e5 {
		return 1e-5
	}
	p := 1e6
	for p < 10*float64(n) {
		p *= 10
	}
	return 1 / p
}

// delta derives δ for a run of n examples (RunConfig's step 2): Delta,
// which must be in (0, 1/n), or with Delta 0 LedgerDelta, or else
// DefaultDelta(n).
func (p RunPlan) delta(n int64) (float64, error) {
	switch {
	case p.Delta == 0 && p.LedgerDelta != 0:
		return p.LedgerDelta, nil
	case p.Delta == 0:
		return DefaultDelta(n), nil
	case !(p.Delta > 0):
		return 0, invalidPlan("delta %v must be positive", p.Delta)
	case p.Delta >= 1/float64(n):
		return 0, invalidPlan("delta %g must be below 1/N = %.3g (N = %d training examples): at δ ≥ 1/N publishing one example whole is allowed; "+
			"leave delta unset for %g", p.Delta, 1/float64(n), n, DefaultDelta(n))
	}
	return p.Delta, nil
}

// mechanism derives the noise mode and the accountant (RunConfig's steps
// 3 and 4).
func (p RunPlan) mechanism() (mode, accountant string, err error) {
	mode = p.NoiseMode
	switch {
	case p.KeepLegacyNoise:
		mode = NoiseLegacy
	case mode != NoiseDiscrete && mode != NoiseFloat:
		return "", "", invalidPlan("noise %q must be %s or %s", mode, NoiseDiscrete, NoiseFloat)
	}
	accountant = p.Accountant
	switch {
	case p.KeepLegacyAccountant:
		accountant = AccountantLegacy
	case accountant == "":
		accountant = DefaultAccountantFor(mode)
	case accountant != AccountantPLD && accountant != AccountantRDP:
		return "", "", invalidPlan("accountant %q must be %s or %s", accountant, AccountantPLD, AccountantRDP)
	}
	if !ledger.AccountantSupports(accountant, mode) {
		return "", "", invalidPlan("accountant %s cannot charge noise %s (use accountant %s)", accountant, noiseModeLabel(mode), AccountantRDP)
	}
	return mode, accountant, nil
}

// calibrate returns the σ that run c, derived from the plan, is calibrated
// to (RunConfig's step 6).
func (p RunPlan) calibrate(c RunConfig) (float64, error) {
	if p.MaxSteps <= 0 {
		return 0, invalidPlan("calibrating sigma needs max_steps (or give sigma)")
	}
	target := p.TargetEpsilon * (1 - CalibrationMargin)
	// σ is calibrated for the very event the ledger will charge.
	event := func(sigma float64) accounting.Event {
		c := c
		c.Optimizer.NoiseMultiplier = sigma
		return c.Event()
	}
	acc, err := c.Accounting()
	if err != nil {
		return 0, fmt.Errorf("coordinator: calibrating sigma: %w", err)
	}
	sigma, err := acc.Calibrate(target, p.MaxSteps, p.Delta, event)
	if err != nil {
		return 0, fmt.Errorf("coordinator: calibrating sigma: %w", err)
	}
	return sigma, nil
}

// NodeConfig derives the run configuration a node works with: what
// RunConfig derives (N, q, C, the model, the noise mode and accountant),
// but without calibrating σ. A node takes q and C from the run, never σ
// (the noise is the leader's), so with Sigma 0 it does not search for one
// (with the PLD accountant, seconds on every start and restart): the
// configuration is derived with a stand-in σ of 1, which no other
// derivation depends on, and its NoiseMultiplier is then 0, not the
// node's to know. A σ given in the plan is kept. Its errors are
// RunConfig's.
func (p RunPlan) NodeConfig() (RunConfig, error) {
	if p.Sigma != 0 {
		return p.RunConfig()
	}
	p.Sigma = 1 // the stand-in
	c, err := p.RunConfig()
	if err != nil {
		return c, err
	}
	c.Optimizer.NoiseMultiplier = 0
	return c, nil
}

// Event returns the ledger event charged for each step of the run. It is
// the single place the run's privacy accounting is defined:
//
//   - NoiseDiscrete: the discrete Gaussian mechanism on a Poisson sample of
//     rate q, at the effective noise multiplier of the snapped sum,
//     σ_eff = ⌈σC/Λ⌉/(C/Λ + √d) ≥ σ/(1 + 2⁻¹⁶) (mechanism.DiscreteGaussian;
//     accounted by accounting.SubsampledDiscreteGaussianRDP). A PLD run's
//     event also names the lattice (d and ⌈σC/Λ⌉), which the PLD
//     accountant needs (accounting/pld_discrete.go); runs with the RDP
//     accountant keep the event without it, as written before PLD
//     accounted for discrete noise, so their logs replay unchanged;
//   - NoiseFloat and NoiseLegacy: the Gaussian mechanism with noise
//     multiplier σ on a Poisson sample of rate q.
//
// For an invalid discrete configuration it returns the zero Event, which
// the ledger refuses to charge.
func (c RunConfig) Event() accounting.Event {
	if c.NoiseMode == NoiseDiscrete {
		m, ok := c.Discrete()
		if !ok {
			return accounting.Event{}
		}
		if c.Accountant == AccountantPLD {
			return m.LatticeEvent(c.SampleRate)
		}
		return m.Event(c.SampleRate)
	}
	return accounting.SubsampledGaussian(c.SampleRate, c.Optimizer.NoiseMultiplier)
}

// Initializer is what θ₀ needs of a run's model: its hash, its number of
// parameters and its deterministic initialization (Init must give the
// same bits for the same seed on every machine). package model's *Model
// is one; the coordinator takes it as this interface because it never
// imports the model.
type Initializer interface {
	Hash() string
	NumParams() int
	Init(theta []float32, seed uint64) error
}

// Theta0 returns the run's initial parameters θ₀: m.NumParams() values
// initialized by m.Init from InitSeed. m must be the run's model: one
// that hashes to another ModelHash is an error. Deterministic, as
// InitFunc requires.
func (c RunConfig) Theta0(m Initializer) ([]float32, error) {
	if m.Hash() != c.ModelHash {
		return nil, fmt.Errorf("model spec hashes to %s, run says %s", m.Hash(), c.ModelHash)
	}
	theta := make([]float32, m.NumParams())
	return theta, m.Init(theta, c.InitSeed)
}

// InitFromSpec returns the InitFunc of replicas that build the run's
// model from its spec (RunConfig.ModelSpec) with build: θ₀ is
// RunConfig.Theta0 of that model. build's errors are returned as they are.
func InitFromSpec(build func(spec []byte) (Initializer, error)) InitFunc {
	return func(c RunConfig) ([]float32, error) {
		m, err := build(c.ModelSpec)
		if err != nil {
			return nil, err
		}
		return c.Theta0(m)
	}
}
