package train

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/sampling"
)

// mixture returns dataset.GaussianMixture(n, dim, k, 4, seed), whose
// class means are 4·(random unit vectors), so any two are typically ≈ 5.7
// apart and the Bayes accuracy is high.
func mixture(t testing.TB, n, dim, k int, seed uint64) *dataset.Dataset {
	t.Helper()
	d, err := dataset.GaussianMixture(n, dim, k, 4, seed)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// split returns the first n rows and the rest.
func split(d *dataset.Dataset, n int) (*dataset.Dataset, *dataset.Dataset) {
	a, b := make([]int, n), make([]int, d.Len()-n)
	for i := range a {
		a[i] = i
	}
	for i := range b {
		b[i] = n + i
	}
	return d.Subset(a), d.Subset(b)
}

// TestRunLogRegMixture trains logistic regression with DP-AdamBC (σ = 1,
// C = 1, B = 100) on a 4-class Gaussian mixture and checks accuracy on
// 2000 held-out points: it must reach 90%.
func TestRunLogRegMixture(t *testing.T) {
	const dim, k = 8, 4
	trainSet, testSet := split(mixture(t, 6000, dim, k, 1), 4000)
	m, err := model.New(model.LogReg([]int{dim}, k))
	if err != nil {
		t.Fatal(err)
	}
	theta := make([]float32, m.NumParams())
	if err := m.Init(theta, 3); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Steps = 200
	cfg.EvalEvery = 50
	cfg.Optimizer.Algorithm = dpadam.AdamBC
	cfg.Optimizer.LearningRate = 0.02
	cfg.Optimizer.NoiseMultiplier = 1
	cfg.Optimizer.ClipNorm = 1
	cfg.Optimizer.ExpectedBatchSize = 100
	cfg.Optimizer.GammaPrime = 1e-6
	sampler, err := sampling.NewSeededPoisson(100.0/4000, 4)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := evalOnce(t, m, theta, testSet)
	res, err := Run(context.Background(), m, theta, trainSet, testSet, cfg,
		Sources{Noise: mechanism.NewSeededNoiseSource(5), Sampler: sampler}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Steps != 200 || len(res.History) != 4 {
		t.Fatalf("steps %d, %d evaluations; want 200, 4", res.Steps, len(res.History))
	}
	t.Logf("accuracy %.3f → %.3f, loss %.3f", before, res.Final.Accuracy, res.Final.Loss)
	if res.Final.Accuracy < 0.90 {
		t.Fatalf("held-out accuracy %.3f < 0.90", res.Final.Accuracy)
	}
}

func evalOnce(t *testing.T, m *model.Model, theta []float32, d *dataset.Dataset) (float64, float64) {
	t.Helper()
	ws, err := m.NewWorkspace(256)
	if err != nil {
		t.Fatal(err)
	}
	met, err := ws.EvaluateDataset(theta, d)
	if err != nil {
		t.Fatal(err)
	}
	return met.Accuracy, met.Loss
}

// TestRunDeterministicWithSeeds: seeded sources give bit-identical runs,
// and chunking a batch over a small workspace gives the same result as
// one chunk up to float32 summation order.
func TestRunDeterministicWithSeeds(t *testing.T) {
	data := mixture(t, 600, 5, 3, 9)
	m, _ := model.New(model.MLP([]int{5}, []int{8}, 3))
	run := func(maxBatch int) []float32 {
		theta := make([]float32, m.NumParams())
		_ = m.Init(theta, 1)
		cfg := DefaultConfig()
		cfg.Steps = 5
		cfg.MaxBatch = maxBatch
		cfg.Optimizer.ExpectedBatchSize = 60
		s, _ := sampling.NewSeededPoisson(0.1, 3)
		if _, err := Run(context.Background(), m, theta, data, nil, cfg, Sources{Noise: mechanism.NewSeededNoiseSource(1), Sampler: s}, nil); err != nil {
			t.Fatal(err)
		}
		return theta
	}
	a, b, c := run(0), run(0), run(7)
	for i := range a {
		if a[i] != b[i] {
			t.Fatal("seeded runs differ")
		}
		if math.Abs(float64(a[i]-c[i])) > 1e-4 {
			t.Fatalf("chunked run differs at %d: %v vs %v", i, a[i], c[i])
		}
	}
}

func TestRunErrors(t *testing.T) {
	data := mixture(t, 100, 3, 2, 1)
	m, _ := model.New(model.LogReg([]int{3}, 2))
	theta := make([]float32, m.NumParams())
	good := DefaultConfig()
	good.Optimizer.ExpectedBatchSize = 10
	bigB := good
	bigB.Optimizer.ExpectedBatchSize = 1000
	noSteps := good
	noSteps.Steps = 0
	wrongQ, _ := sampling.NewSeededPoisson(0.5, 1)
	tests := []struct {
		name  string
		m     *model.Model
		theta []float32
		cfg   Config
		src   Sources
		want  error
	}{
		{"steps", m, theta, noSteps, Sources{}, ErrInvalidConfig},
		{"q > 1", m, theta, bigB, Sources{}, ErrInvalidConfig},
		{"sampler q", m, theta, good, Sources{Sampler: wrongQ}, ErrInvalidConfig},
		{"theta", m, theta[1:], good, Sources{}, model.ErrShape},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Run(context.Background(), tc.m, tc.theta, data, nil, tc.cfg, tc.src, nil)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
	other, _ := model.New(model.LogReg([]int{4}, 2))
	if _, err := Run(context.Background(), other, make([]float32, other.NumParams()), data, nil, good, Sources{}, nil); !errors.Is(err, model.ErrShape) {
		t.Fatalf("mismatched data: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, m, theta, data, nil, good, Sources{}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}
