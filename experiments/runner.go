package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/sampling"
	"github.com/dpcluster/dpcluster/train"
)

// Delta is the δ of every experiment.
const Delta = 1e-5

// sigmaFor calibrates σ so that t.Steps steps at q = B/N spend exactly eps
// at δ = Delta (the product's RDP accountant, accounting.RDP).
func sigmaFor(t *Task, eps float64) (float64, error) {
	q := t.B / float64(t.Train.Len())
	return accounting.RDP{}.Calibrate(eps, int64(t.Steps), Delta, func(sigma float64) accounting.Event {
		return accounting.SubsampledGaussian(q, sigma)
	})
}

// seededSources returns the deterministic noise and sampling sources of an
// experiment run. Seeded sources make runs reproducible and are NOT
// private; the experiments measure optimizers, they release nothing.
func seededSources(q float64, seed uint64) (train.Sources, error) {
	s, err := sampling.NewSeededPoisson(q, 1000+seed)
	if err != nil {
		return train.Sources{}, err
	}
	return train.Sources{Noise: mechanism.NewSeededNoiseSource(2000 + seed), Sampler: s}, nil
}

// runResult is one training run through train.Run.
type runResult struct {
	Val, Test model.Evaluation
	History   []train.Point
	Diag      dpadam.Diagnostics
	Wall      time.Duration
	Err       error // divergence (non-finite values) counts as a failed run
}

// trainRun trains t's model from the seeded initialization with cfg for
// t.Steps steps through train.Run (the product's single-process loop) and
// evaluates on the validation and test sets. evalEvery > 0 records the
// test metrics every evalEvery steps.
func trainRun(ctx context.Context, t *Task, cfg dpadam.Config, seed uint64, evalEvery int) runResult {
	start := time.Now()
	res := runResult{}
	m, err := model.New(t.Spec)
	if err != nil {
		return runResult{Err: err}
	}
	theta := make([]float32, m.NumParams())
	if err := m.Init(theta, seed); err != nil {
		return runResult{Err: err}
	}
	src, err := seededSources(t.B/float64(t.Train.Len()), seed)
	if err != nil {
		return runResult{Err: err}
	}
	tc := train.Config{Optimizer: cfg, Steps: t.Steps, EvalEvery: evalEvery}
	out, err := train.Run(ctx, m, theta, t.Train, t.Test, tc, src, nil)
	res.Test, res.History, res.Diag = out.Final, out.History, out.LastDiagnostics
	if err != nil {
		res.Err = err
		res.Test = model.Evaluation{}
	} else {
		ws, err := m.NewWorkspace(1024)
		if err == nil {
			res.Val, err = ws.EvaluateDataset(theta, t.Val)
		}
		if err != nil {
			res.Err = err
		}
	}
	res.Wall = time.Since(start)
	return res
}

// parallel runs fn(i) for i in [0, n) on `workers` goroutines and waits.
func parallel(n, workers int, fn func(i int)) {
	if workers < 1 {
		workers = 1
	}
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// stepper reproduces train.Run's step (Poisson sample, ClippedSumIndexed,
// NoisyGradient) one step at a time for the experiments that need the
// per-step quantities train.Run keeps to itself. After Next, Sum holds the
// un-noised clipped sum S (NON-PRIVATE: it is the raw data-dependent
// quantity, used here only for diagnostics) and G the noisy gradient
// g̃ = (S + z)/B, which is what the optimizer consumes.
type stepper struct {
	t       *Task
	cfg     dpadam.Config
	ws      *model.Workspace
	src     train.Sources
	batch   []int
	Sum, G  []float32
	Batches int
}

func newStepper(t *Task, m *model.Model, cfg dpadam.Config, seed uint64) (*stepper, error) {
	src, err := seededSources(t.B/float64(t.Train.Len()), seed)
	if err != nil {
		return nil, err
	}
	maxB := int(math.Ceil(1.25*t.B)) + 16
	ws, err := m.NewWorkspace(maxB)
	if err != nil {
		return nil, err
	}
	n := m.NumParams()
	return &stepper{t: t, cfg: cfg, ws: ws, src: src, batch: make([]int, 0, maxB),
		Sum: make([]float32, n), G: make([]float32, n)}, nil
}

// Next computes S and g̃ at theta for the next Poisson batch.
func (s *stepper) Next(theta []float32) error {
	s.batch = s.src.Sampler.Sample(s.batch[:0], s.t.Train.Len())
	if _, err := s.ws.ClippedSumIndexed(s.Sum, theta, s.t.Train, s.batch, s.cfg.ClipNorm); err != nil {
		return err
	}
	s.Batches++
	return s.src.Noise.NoisyGradient(s.G, s.Sum, s.cfg.NoiseMultiplier, s.cfg.ClipNorm, s.cfg.ExpectedBatchSize)
}

// evalSubset returns the first n rows of d (all of d if it is smaller).
func evalSubset(d *dataset.Dataset, n int) *dataset.Dataset {
	if d.Len() <= n {
		return d
	}
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return d.Subset(idx)
}

func logRun(log *slog.Logger, msg string, t *Task, cfg dpadam.Config, seed uint64, r runResult) {
	if r.Err != nil {
		log.Warn(msg, "task", t.Name, "algo", cfg.Algorithm, "lr", cfg.LearningRate, "seed", seed, "err", r.Err)
		return
	}
	log.Info(msg, "task", t.Name, "algo", cfg.Algorithm, "lr", cfg.LearningRate, "gamma'", cfg.GammaPrime,
		"sigma", fmt.Sprintf("%.3f", cfg.NoiseMultiplier), "seed", seed,
		"val", fmt.Sprintf("%.4f", r.Val.Accuracy), "test", fmt.Sprintf("%.4f", r.Test.Accuracy),
		"test_loss", fmt.Sprintf("%.4f", r.Test.Loss), "wall", r.Wall.Round(time.Millisecond))
}

// probe times one DP-AdamBC run of t (σ for ε = 3) and logs the cost per
// step.
func probe(ctx context.Context, t *Task, log *slog.Logger) error {
	sigma, err := sigmaFor(t, 3)
	if err != nil {
		return err
	}
	cfg := optimizerConfig(t, dpadam.AdamBC, Hyper{LR: 1e-3, GammaPrimeRel: 0.01}, sigma)
	r := trainRun(ctx, t, cfg, 1, 0)
	if r.Err != nil {
		return r.Err
	}
	log.Info("probe", "task", t.Name, "params", t.Spec.Name, "train", t.Train.Len(), "steps", t.Steps,
		"wall", r.Wall.Round(time.Millisecond), "per_step_ms", fmt.Sprintf("%.1f", float64(r.Wall.Milliseconds())/float64(t.Steps)),
		"sigma", fmt.Sprintf("%.3f", sigma), "test", fmt.Sprintf("%.4f", r.Test.Accuracy))
	return nil
}
