package ledger_test

import (
	"fmt"

	"github.com/dpcluster/dpcluster/ledger"
)

// A DP-SGD run: 14062 steps of the Gaussian mechanism with noise multiplier
// 1.1 on Poisson samples of rate 256/60000.
func ExampleAccountant() {
	acc, err := ledger.NewAccountant(ledger.OpacusOrders())
	if err != nil {
		panic(err)
	}
	step := ledger.SubsampledGaussian(0.004266666666666667, 1.1)
	if err := acc.Compose(step, 14062); err != nil {
		panic(err)
	}
	eps, order, err := acc.Epsilon(1e-5)
	if err != nil {
		panic(err)
	}
	fmt.Printf("ε = %.4f at order %v\n", eps, order)
	// Output: ε = 2.5966 at order 8.1
}

func ExampleCalibrateSigma() {
	sigma, err := ledger.CalibrateSigma(nil, 3, 0.004266666666666667, 2343, 1e-5)
	if err != nil {
		panic(err)
	}
	eps, _, _ := ledger.Epsilon(0.004266666666666667, sigma, 2343, 1e-5)
	fmt.Printf("σ = %.4f gives ε = %.4f ≤ 3\n", sigma, eps)
	// Output: σ = 0.7420 gives ε = 3.0000 ≤ 3
}
