package seed_test

import (
	"fmt"

	"github.com/dpcluster/dpcluster/seed"
)

func ExampleParsePolicy() {
	for _, s := range []string{"crypto", "seeded", "random"} {
		p, err := seed.ParsePolicy(s)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(p, "private:", p.Private())
	}
	// Output:
	// crypto private: true
	// seeded private: false
	// seed: unknown seed policy: "random" (want "crypto" or "seeded")
}
