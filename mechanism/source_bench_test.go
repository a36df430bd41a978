package mechanism

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkLeaderNoise is the leader's noise per step (coordinator
// Server.step, privatize): the legacy float sampler (NoisyGradient64) and
// the discrete mechanism (DiscreteNoisyGradient64, on GOMAXPROCS workers)
// for the mlp preset's 269,322 parameters and a 3.7M-parameter model, σ = 1,
// C = 1, B = 256. One op is one step's release.
func BenchmarkLeaderNoise(b *testing.B) {
	for _, d := range []int{269_322, 3_700_000} {
		rng := rand.New(rand.NewPCG(1, 2))
		sum := make([]float64, d)
		for i := range sum {
			sum[i] = rng.NormFloat64() * 10
		}
		dst := make([]float32, d)
		b.Run(fmt.Sprintf("d=%d/float", d), func(b *testing.B) {
			n := NewSeededNoiseSource(1)
			for b.Loop() {
				if err := n.NoisyGradient64(dst, sum, 1, 1, 256); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("d=%d/discrete", d), func(b *testing.B) {
			m, err := NewDiscreteGaussian(1, 1, d)
			if err != nil {
				b.Fatal(err)
			}
			n := NewSeededNoiseSource(1)
			// The first call builds the sampler table (once per run, about
			// 25 ms); the leader keeps it from step to step.
			if err := n.DiscreteNoisyGradient64(dst, sum, m, 256); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if err := n.DiscreteNoisyGradient64(dst, sum, m, 256); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
