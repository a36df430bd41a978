package dpadam_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/dpcluster/dpcluster/dpadam"
)

// Example minimizes ½‖θ − target‖² from noisy gradients shaped like the
// Gaussian mechanism's output, g̃ = ∇ + N(0, (σC/B)²), with DP-AdamBC, then
// snapshots and restores the optimizer as a Raft replica would.
func Example() {
	cfg := dpadam.DefaultConfig() // DP-AdamBC, η = 1e-3, β = (0.9, 0.999)
	cfg.LearningRate = 0.01
	cfg.NoiseMultiplier, cfg.ClipNorm, cfg.ExpectedBatchSize = 1.0, 0.1, 256
	cfg.GammaPrime = 1e-6 // the floor under v̂ − Φ; tune it with η (paper §4)
	opt, err := dpadam.New(cfg, 3)
	if err != nil {
		panic(err)
	}

	target := []float32{0.5, -0.25, 0}
	theta := make([]float32, 3)
	grad := make([]float32, 3)
	noise := math.Sqrt(cfg.Phi()) // σC/B: the noise on each coordinate of g̃
	rng := rand.New(rand.NewPCG(1, 2))
	var d dpadam.Diagnostics
	for range 500 {
		for i := range grad {
			grad[i] = theta[i] - target[i] + float32(noise*rng.NormFloat64())
		}
		if d, err = opt.Step(theta, grad); err != nil {
			panic(err)
		}
	}
	worst := 0.0
	for i := range theta {
		worst = max(worst, math.Abs(float64(theta[i]-target[i])))
	}
	fmt.Printf("step %d: Φ = %.2g, max|θ − target| < 0.05: %v\n", d.Step, d.Phi, worst < 0.05)

	// A NaN gradient is refused and changes nothing.
	grad[1] = float32(math.NaN())
	_, err = opt.Step(theta, grad)
	fmt.Println(errors.Is(err, dpadam.ErrNonFinite), opt.StepCount())

	// Snapshot and restore.
	snap, err := opt.MarshalBinary()
	if err != nil {
		panic(err)
	}
	var replica dpadam.Optimizer
	if err := replica.UnmarshalBinary(snap); err != nil {
		panic(err)
	}
	fmt.Println(replica.StepCount(), replica.Dim(), replica.Config().Algorithm)
	// Output:
	// step 500: Φ = 1.5e-07, max|θ − target| < 0.05: true
	// true 500
	// 500 3 dp-adambc
}
