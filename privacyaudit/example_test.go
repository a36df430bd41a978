package privacyaudit_test

import (
	"fmt"

	"github.com/dpcluster/dpcluster/privacyaudit"
)

// An audit with m = 1000 canaries: the auditor guesses "in" for the 100
// highest scores and "out" for the 100 lowest, 150 of its 200 guesses are
// right, and the run's δ is 1e-5. At 95% confidence the mechanism's ε is
// at least the bound; no outcome of 200 guesses certifies more than the
// ceiling.
func Example() {
	const m, delta, beta = 1000, 1e-5, 0.05
	lower, err := privacyaudit.EpsilonLowerBound(m, 200, 150, delta, beta)
	if err != nil {
		panic(err)
	}
	ceiling, err := privacyaudit.Ceiling(m, 200, delta, beta)
	if err != nil {
		panic(err)
	}
	fmt.Printf("ε ≥ %.3f (ceiling %.3f)\n", lower, ceiling)
	// Output:
	// ε ≥ 0.820 (ceiling 4.166)
}
