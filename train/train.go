// Package train runs differentially private training in one process: the
// reference loop that the distributed node/coordinator pair splits across
// machines. Its Gaussian noise comes from mechanism.NoiseSource, the source
// the coordinator's leader uses too.
//
// One step (Abadi et al. 2016, Algorithm 1, with the DP-AdamBC update of
// Tang, Shpilevskiy and Lécuyer, AAAI 2024; docs/ARCHITECTURE.md "One step"):
//
//  1. Poisson-sample the training set with rate q = B/N (package sampling);
//  2. S = Σ over the sample of per-example gradients clipped to norm C
//     (model.Engine.ClippedSumIndexed, on the CPU or on Config.Device);
//  3. g̃ = (S + z)/B with z ~ N(0, σ²C²I) and B the expected batch size
//     (mechanism.NoiseSource.NoisyGradient);
//  4. θ ← dpadam.Optimizer.Step(θ, g̃).
//
// Typical use:
//
//	cfg := train.DefaultConfig()
//	cfg.Optimizer.ExpectedBatchSize = 256 // also σ, C, η ...
//	res, err := train.Run(ctx, m, theta, trainSet, testSet, cfg, train.Sources{}, logger)
//
// Run does no privacy accounting; the ε of a run follows from q, σ and the
// number of steps (accounting.RDP).
package train

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/sampling"
)

// ErrInvalidConfig is returned (wrapped, naming the field) when a Config
// or its relation to the data is invalid.
var ErrInvalidConfig = errors.New("train: invalid config")

// Config configures Run.
type Config struct {
	// Optimizer is the update rule and the mechanism's public constants:
	// NoiseMultiplier σ, ClipNorm C and ExpectedBatchSize B (the sampling
	// rate is q = B / N for a training set of N examples).
	Optimizer dpadam.Config
	// Steps is the number of noisy steps, ≥ 1. Default 100.
	Steps int
	// MaxBatch is the workspace capacity: a Poisson batch larger than this
	// is processed in chunks (no example is dropped). 0 means
	// ⌈1.25·B⌉ + 16. Default 0.
	MaxBatch int
	// EvalEvery evaluates on the eval set every EvalEvery steps (0: only
	// after the last step). Default 0.
	EvalEvery int
	// Device computes the clipped sums (model.OpenDevice: "cpu", or
	// "cuda:N" in a binary built with -tags cuda). Run allocates one engine
	// of MaxBatch examples on it and releases it before returning; the
	// caller closes the device after Run. Evaluation runs on the CPU. Nil
	// means the CPU. Default nil.
	Device model.Device
}

// DefaultConfig returns 100 steps of dpadam.DefaultConfig().
func DefaultConfig() Config {
	return Config{Optimizer: dpadam.DefaultConfig(), Steps: 100}
}

// Validate checks the fields that do not depend on the data.
func (c Config) Validate() error {
	if err := c.Optimizer.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.Steps < 1 {
		return fmt.Errorf("%w: Steps = %d, need ≥ 1", ErrInvalidConfig, c.Steps)
	}
	if c.MaxBatch < 0 || c.EvalEvery < 0 {
		return fmt.Errorf("%w: MaxBatch %d and EvalEvery %d must be ≥ 0", ErrInvalidConfig, c.MaxBatch, c.EvalEvery)
	}
	return nil
}

// Sources are the run's randomness. Nil fields get cryptographically
// secure defaults (NewNoiseSource, sampling.NewPoisson); tests inject
// seeded ones. Sampler.Q() must equal B/N.
type Sources struct {
	Noise   *mechanism.NoiseSource
	Sampler *sampling.Poisson
}

// Point is an evaluation after a step.
type Point struct {
	Step int
	Eval model.Evaluation
}

// Result summarizes a run.
type Result struct {
	// Steps is the number of optimizer steps taken.
	Steps int
	// SampleRate is q = B/N.
	SampleRate float64
	// Final is the evaluation after the last step (zero without an eval set).
	Final model.Evaluation
	// History holds every evaluation, Final included.
	History []Point
	// LastDiagnostics are the optimizer's diagnostics of the last step.
	LastDiagnostics dpadam.Diagnostics
}

// Run trains theta (updated in place; initialize it with m.Init) on data
// for cfg.Steps noisy steps and evaluates on eval (which may be nil). It
// returns early with ctx.Err() if ctx is cancelled between steps; theta
// then holds the parameters after the last completed step. Errors:
// ErrInvalidConfig, model.ErrShape for data that do not fit the model,
// model.ErrNonFinite / dpadam.ErrNonFinite when training diverges, and the
// device's errors from allocating or releasing its engine (such as
// model.ErrUnsupportedLayer), which come before any step.
func Run(ctx context.Context, m *model.Model, theta []float32, data, eval *dataset.Dataset, cfg Config, src Sources, log *slog.Logger) (_ Result, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	if err := m.CheckDataset(data); err != nil {
		return Result{}, err
	}
	if eval != nil {
		if err := m.CheckDataset(eval); err != nil {
			return Result{}, err
		}
	}
	if len(theta) != m.NumParams() {
		return Result{}, fmt.Errorf("%w: theta has %d values, model has %d", model.ErrShape, len(theta), m.NumParams())
	}
	oc := cfg.Optimizer
	N := data.Len()
	B := oc.ExpectedBatchSize
	q := B / float64(N)
	if !(q > 0 && q <= 1) {
		return Result{}, fmt.Errorf("%w: expected batch size %v with %d examples gives q = %v outside (0, 1]", ErrInvalidConfig, B, N, q)
	}
	if src.Noise == nil {
		if src.Noise, err = mechanism.NewNoiseSource(); err != nil {
			return Result{}, err
		}
	}
	if src.Sampler == nil {
		if src.Sampler, err = sampling.NewPoisson(q); err != nil {
			return Result{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	} else if math.Abs(src.Sampler.Q()-q) > 1e-12*q {
		return Result{}, fmt.Errorf("%w: sampler rate %v, want B/N = %v", ErrInvalidConfig, src.Sampler.Q(), q)
	}
	if src.Noise.Seeded() {
		log.Warn("train: using a SEEDED noise source: this run is NOT differentially private")
	}
	maxB := cfg.MaxBatch
	if maxB == 0 {
		maxB = int(math.Ceil(1.25*B)) + 16
	}
	dev := cfg.Device
	if dev == nil {
		if dev, err = model.OpenDevice("cpu"); err != nil {
			return Result{}, err
		}
	}
	info := dev.Info()
	eng, err := dev.NewEngine(m, maxB)
	if err != nil {
		return Result{}, fmt.Errorf("train: engine for %d examples on device %s (%s): %w", maxB, info.ID, info.Name, err)
	}
	defer func() {
		if cerr := eng.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("train: closing the engine on device %s: %w", info.ID, cerr)
		}
	}()
	var ews *model.Workspace
	if eval != nil {
		if ews, err = m.NewWorkspace(min(maxB, 1024)); err != nil {
			return Result{}, err
		}
	}
	opt, err := dpadam.New(oc, m.NumParams())
	if err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	var (
		batch = make([]int, 0, maxB)
		sum   = make([]float32, m.NumParams())
		g     = make([]float32, m.NumParams())
		res   = Result{SampleRate: q}
	)
	log.Info("train: start", "model", m.Spec().Name, "params", m.NumParams(), "examples", N,
		"q", q, "sigma", oc.NoiseMultiplier, "clip", oc.ClipNorm, "B", B, "algorithm", oc.Algorithm, "steps", cfg.Steps,
		"device", info.ID, "device_name", info.Name, "device_memory_bytes", info.MemoryBytes,
		"compute_capability", info.ComputeCapability)
	for step := 1; step <= cfg.Steps; step++ {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		batch = src.Sampler.Sample(batch[:0], N)
		if _, err := eng.ClippedSumIndexed(sum, theta, data, batch, oc.ClipNorm); err != nil {
			return res, fmt.Errorf("train: step %d: %w", step, err)
		}
		if err := src.Noise.NoisyGradient(g, sum, oc.NoiseMultiplier, oc.ClipNorm, B); err != nil {
			return res, err
		}
		diag, err := opt.Step(theta, g)
		if err != nil {
			return res, fmt.Errorf("train: step %d: %w", step, err)
		}
		res.Steps, res.LastDiagnostics = step, diag
		if ews != nil && ((cfg.EvalEvery > 0 && step%cfg.EvalEvery == 0) || step == cfg.Steps) {
			met, err := ews.EvaluateDataset(theta, eval)
			if err != nil {
				return res, fmt.Errorf("train: step %d: evaluation: %w", step, err)
			}
			res.History = append(res.History, Point{Step: step, Eval: met})
			res.Final = met
			log.Info("train: eval", "step", step, "loss", met.Loss, "accuracy", met.Accuracy,
				"update_rms", diag.UpdateRMS, "floor_fraction", diag.FloorFraction)
		}
	}
	return res, nil
}
