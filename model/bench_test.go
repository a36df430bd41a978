package model

import (
	"math/rand/v2"
	"testing"
	"time"
)

// benchStep benchmarks one gradient step at B = 256 on
// Fashion-MNIST-shaped random data: the non-private mean gradient, the
// ghost-norm clipped sum ("dp") and the naive per-example reference. The
// "paired" sub-benchmark runs one nonprivate and one dp step per iteration,
// alternating which goes first, and reports both throughputs and their
// ratio dp/nonprivate (step time of dp ÷ step time of nonprivate) measured
// under the same load: the number docs/BENCHMARKS.md records, since the
// machine is shared and sub-benchmarks run one after another.
func benchStep(b *testing.B, preset string) {
	const B = 256
	spec, err := Preset(preset)
	if err != nil {
		b.Fatal(err)
	}
	m, theta, x, y := benchInputs(b, spec, B)
	ws, err := m.NewWorkspace(B)
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]float32, m.NumParams())
	run := func(name string, step func() error) { benchRun(b, name, B, step) }
	nonprivate := func() error { _, err := ws.MeanGrad(dst, theta, x, y); return err }
	dp := func() error { _, err := ws.ClippedSum(dst, theta, x, y, 1); return err }
	run("nonprivate", nonprivate)
	run("dp", dp)
	run("naive", func() error { _, err := ws.ClippedSumNaive(dst, theta, x, y, 1); return err })
	b.Run("paired", func(b *testing.B) {
		tNP, tDP, iters := pairedSteps(b, nonprivate, dp)
		b.ReportMetric(float64(B*iters)/tNP.Seconds(), "nonprivate-examples/s")
		b.ReportMetric(float64(B*iters)/tDP.Seconds(), "dp-examples/s")
		b.ReportMetric(tDP.Seconds()/tNP.Seconds(), "dp/nonprivate")
	})
}

// benchInputs builds spec's model with its initial parameters (seed 1)
// and a batch of B Fashion-MNIST-shaped random examples: features uniform
// in [0, 1), random labels.
func benchInputs(b testing.TB, spec Spec, B int) (m *Model, theta, x []float32, y []int32) {
	m, err := New(spec)
	if err != nil {
		b.Fatal(err)
	}
	theta = make([]float32, m.NumParams())
	if err := m.Init(theta, 1); err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	x = make([]float32, B*m.InputSize())
	for i := range x {
		x[i] = rng.Float32()
		if m.vocab > 0 {
			x[i] = float32(rng.IntN(m.vocab)) // token ids
		}
	}
	y = make([]int32, B)
	for i := range y {
		y[i] = int32(rng.IntN(m.Classes()))
	}
	return m, theta, x, y
}

// benchRun runs step once (a warm-up: first touch of every buffer), then
// as sub-benchmark name, reporting allocations and examples per second for
// a batch of B.
func benchRun(b *testing.B, name string, B int, step func() error) {
	if err := step(); err != nil {
		b.Fatal(err)
	}
	b.Run(name, func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := step(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(B*b.N)/b.Elapsed().Seconds(), "examples/s")
	})
}

// pairedSteps runs one nonprivate and one dp step per iteration of b,
// alternating which goes first, and returns their total times and the
// number of iterations: the two are measured under the same load.
func pairedSteps(b *testing.B, nonprivate, dp func() error) (tNP, tDP time.Duration, iters int) {
	timed := func(step func() error) time.Duration {
		t0 := time.Now()
		if err := step(); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	for b.Loop() {
		if iters%2 == 0 {
			tNP += timed(nonprivate)
			tDP += timed(dp)
		} else {
			tDP += timed(dp)
			tNP += timed(nonprivate)
		}
		iters++
	}
	return tNP, tDP, iters
}

// BenchmarkMLPStep: the "mlp" preset (784-256-256-10), B = 256.
func BenchmarkMLPStep(b *testing.B) { benchStep(b, "mlp") }

// BenchmarkCNNStep: the "cnn" preset (Papernot et al. 2021), B = 256.
func BenchmarkCNNStep(b *testing.B) { benchStep(b, "cnn") }
