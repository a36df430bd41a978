package accounting_test

import (
	"fmt"

	"github.com/dpcluster/dpcluster/accounting"
)

// The accountant a run names, by its name: the ε of 1000 steps of DP-SGD
// (q = 256/60000, σ = 1.1) at δ = 1e-5 by each.
func Example() {
	step := accounting.SubsampledGaussian(256.0/60000, 1.1)
	for _, name := range []accounting.Name{accounting.NameRDP, accounting.NamePLD} {
		acc, err := accounting.New(name)
		if err != nil {
			panic(err)
		}
		eps, err := acc.Epsilon(step, 1000, 1e-5)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: ε = %.4f\n", acc.Name(), eps)
	}
	// Output:
	// rdp: ε = 0.8895
	// pld: ε = 0.5997
}

// A DP-SGD run: 14062 steps of the Gaussian mechanism with noise multiplier
// 1.1 on Poisson samples of rate 256/60000, composed on Opacus's orders.
func ExampleRDP_NewComposition() {
	rdp, err := accounting.NewRDP(accounting.OpacusOrders())
	if err != nil {
		panic(err)
	}
	acc := rdp.NewComposition()
	step := accounting.SubsampledGaussian(0.004266666666666667, 1.1)
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

// The smallest σ that keeps 2343 steps at rate 256/60000 within ε = 3.
func ExampleRDP_Calibrate() {
	const q, steps, delta = 0.004266666666666667, 2343, 1e-5
	step := func(sigma float64) accounting.Event { return accounting.SubsampledGaussian(q, sigma) }
	var rdp accounting.RDP // the zero value: the default orders
	sigma, err := rdp.Calibrate(3, steps, delta, step)
	if err != nil {
		panic(err)
	}
	eps, err := rdp.Epsilon(step(sigma), steps, delta)
	if err != nil {
		panic(err)
	}
	fmt.Printf("σ = %.4f gives ε = %.4f ≤ 3\n", sigma, eps)
	// Output: σ = 0.7420 gives ε = 3.0000 ≤ 3
}
