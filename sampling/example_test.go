package sampling_test

import (
	"fmt"

	"github.com/dpcluster/dpcluster/sampling"
)

func ExamplePoisson() {
	// Production code uses sampling.NewPoisson(q), seeded from crypto/rand.
	// A seeded sampler makes this example reproducible.
	p, err := sampling.NewSeededPoisson(0.1, 2024)
	if err != nil {
		panic(err)
	}
	batch := make([]int, 0, 16)
	for step := range 3 {
		batch = p.Sample(batch[:0], 40) // each of 40 examples joins with probability 0.1
		fmt.Println(step, batch)
	}
	_, err = sampling.NewPoisson(0)
	fmt.Println(err)
	// Output:
	// 0 [1 4 6 14 18 19 24 38]
	// 1 [9 15]
	// 2 [14]
	// sampling: sampling rate q must be in (0, 1]: got 0
}
