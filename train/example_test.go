package train_test

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/sampling"
	"github.com/dpcluster/dpcluster/train"
)

// Train logistic regression with DP-AdamBC on two well-separated blobs.
// Seeded sources make the example reproducible; production code leaves
// Sources empty to get crypto/rand-keyed ones.
func ExampleRun() {
	rng := rand.New(rand.NewPCG(1, 2))
	data := &dataset.Dataset{Name: "blobs", Dim: 2, Classes: 2}
	for range 1000 {
		c := rng.IntN(2)
		data.Y = append(data.Y, int32(c))
		data.X = append(data.X, float32(rng.NormFloat64()+4*float64(c)-2), float32(rng.NormFloat64()))
	}
	m, _ := model.New(model.LogReg([]int{2}, 2))
	theta := make([]float32, m.NumParams())
	_ = m.Init(theta, 1)

	cfg := train.DefaultConfig()
	cfg.Steps = 100
	cfg.Optimizer.LearningRate = 0.05
	cfg.Optimizer.NoiseMultiplier = 1
	cfg.Optimizer.ClipNorm = 1
	cfg.Optimizer.ExpectedBatchSize = 50
	// γ' well below Φ = (σC/B)² = 4e-4 but far above the 1e-10 default,
	// which lets early steps (v̂ − Φ < γ') be huge on this tiny problem.
	cfg.Optimizer.GammaPrime = 1e-6
	sampler, _ := sampling.NewSeededPoisson(50.0/1000, 3)
	res, err := train.Run(context.Background(), m, theta, data, data, cfg,
		train.Sources{Noise: mechanism.NewSeededNoiseSource(4), Sampler: sampler}, nil)
	if err != nil {
		panic(err)
	}
	fmt.Printf("q = %.2f, accuracy above 95%%: %v\n", res.SampleRate, res.Final.Accuracy > 0.95)
	// Output: q = 0.05, accuracy above 95%: true
}
