package model_test

import (
	"fmt"
	"math"

	"github.com/dpcluster/dpcluster/model"
)

// A node's work for one round: the clipped gradient sum of its batch.
func Example() {
	spec, err := model.Preset("mlp")
	if err != nil {
		panic(err)
	}
	m, err := model.New(spec)
	if err != nil {
		panic(err)
	}
	theta := make([]float32, m.NumParams())
	if err := m.Init(theta, 42); err != nil {
		panic(err)
	}
	ws, err := m.NewWorkspace(4)
	if err != nil {
		panic(err)
	}
	x := make([]float32, 4*m.InputSize()) // four all-black images
	y := []int32{0, 1, 2, 3}
	sum := make([]float32, m.NumParams())
	n, err := ws.ClippedSum(sum, theta, x, y, 0.1)
	if err != nil {
		panic(err)
	}
	var sq float64
	for _, v := range sum {
		sq += float64(v) * float64(v)
	}
	fmt.Println("params:", m.NumParams(), "count:", n, "norm ≤ n·C:", math.Sqrt(sq) <= 4*0.1*(1+1e-6))
	// Output: params: 269322 count: 4 norm ≤ n·C: true
}
