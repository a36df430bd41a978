package mechanism_test

import (
	"fmt"
	"math/rand/v2"

	"github.com/dpcluster/dpcluster/mechanism"
)

// The leader's release of one step: the grid and the effective noise
// multiplier come from σ, C and d; the noise is drawn before the sum is
// known and added to the snapped sum.
func Example() {
	const sigma, clip, dim, batch = 1.1, 1.0, 269_322, 256.0
	m, err := mechanism.NewDiscreteGaussian(sigma, clip, dim)
	if err != nil {
		panic(err)
	}
	fmt.Printf("grid 2^%d, noise scale %d grid steps, σ_eff/σ = %.6f\n", m.GridExp, m.Scale, m.Sigma/sigma)
	fmt.Println("charged as:", m.Event(256.0/60000).Event.Kind)

	// A seeded stream for the example only; the leader keys from crypto/rand.
	src := rand.New(rand.NewChaCha8([32]byte{1}))
	var noise mechanism.Noise
	if err := m.Draw(&noise, src); err != nil {
		panic(err)
	}
	sum := make([]float64, dim) // the clipped gradients' sum, from the round
	gTilde := make([]float32, dim)
	if err := m.Apply(gTilde, sum, batch, &noise); err != nil {
		panic(err)
	}
	fmt.Println("noise used up:", !noise.Ready())
	// Output:
	// grid 2^-26, noise scale 73819751 grid steps, σ_eff/σ = 0.999992
	// charged as: discrete_gaussian
	// noise used up: true
}
