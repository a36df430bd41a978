package dpadam

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

var benchSizes = []int{1 << 20, 10 << 20}

func benchName(n int) string { return fmt.Sprintf("d=%dM", n>>20) }

func randomVec(rng *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(scale * rng.NormFloat64())
	}
	return x
}

// reportBandwidth sets the byte count and reports ns/param and GB/s
// (10⁹ bytes per second) from bytesPerParam.
func reportBandwidth(b *testing.B, n, bytesPerParam int) {
	b.Helper()
	nsPerOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(nsPerOp/float64(n), "ns/param")
	b.ReportMetric(float64(bytesPerParam*n)/nsPerOp, "GB/s")
}

// BenchmarkStep measures one DP-AdamBC step. Bytes counted per parameter:
// θ read+write (8), m read+write (8), v read+write (8), g̃ read (4) = 28.
// The non-finite pre-scan re-reads g̃ (4 more bytes/param, not counted).
func BenchmarkStep(b *testing.B) {
	const bytesPerParam = 28
	for _, n := range benchSizes {
		b.Run(benchName(n), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			cfg := DefaultConfig()
			cfg.NoiseMultiplier, cfg.ClipNorm, cfg.ExpectedBatchSize = 0.4, 0.1, 256
			opt, err := New(cfg, n)
			if err != nil {
				b.Fatal(err)
			}
			theta := randomVec(rng, n, 0.1)
			grad := randomVec(rng, n, 2e-4) // ~ the noise scale σC/B of cfg
			if _, err := opt.Step(theta, grad); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(bytesPerParam * int64(n))
			b.ResetTimer()
			for range b.N {
				if _, err := opt.Step(theta, grad); err != nil {
					b.Fatal(err)
				}
			}
			reportBandwidth(b, n, bytesPerParam)
		})
	}
}

// axpy is the reference memory-bound loop y += a·x.
func axpy(a float32, x, y []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += a * x[i]
	}
}

// BenchmarkAxpy is the bandwidth yardstick for BenchmarkStep: y += a·x in
// float32. Bytes counted per element: x read (4), y read+write (8) = 12.
func BenchmarkAxpy(b *testing.B) {
	const bytesPerParam = 12
	for _, n := range benchSizes {
		b.Run(benchName(n), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			x := randomVec(rng, n, 1)
			y := randomVec(rng, n, 1)
			b.SetBytes(bytesPerParam * int64(n))
			b.ResetTimer()
			for range b.N {
				axpy(1e-7, x, y)
			}
			reportBandwidth(b, n, bytesPerParam)
		})
	}
}

// BenchmarkStepVsAxpy is the must-show comparison of docs/BENCHMARKS.md:
// every iteration runs one DP-AdamBC step and one axpy over the same n,
// alternating which goes first, and times each, so both see the same load
// on a shared machine. It reports the step's ns/param and GB/s (28
// bytes/param, as BenchmarkStep), the axpy's GB/s (12 bytes/param, as
// BenchmarkAxpy) and bw-ratio = step GB/s ÷ axpy GB/s (the target is at
// least 0.5). ns/op is the pair.
func BenchmarkStepVsAxpy(b *testing.B) {
	const stepBytes, axpyBytes = 28, 12
	for _, n := range benchSizes {
		b.Run(benchName(n), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			cfg := DefaultConfig()
			cfg.NoiseMultiplier, cfg.ClipNorm, cfg.ExpectedBatchSize = 0.4, 0.1, 256
			opt, err := New(cfg, n)
			if err != nil {
				b.Fatal(err)
			}
			theta := randomVec(rng, n, 0.1)
			grad := randomVec(rng, n, 2e-4)
			x := randomVec(rng, n, 1)
			y := randomVec(rng, n, 1)
			step := func() {
				if _, err := opt.Step(theta, grad); err != nil {
					b.Fatal(err)
				}
			}
			step() // warm-up: first touch of m and v
			axpy(1e-7, x, y)
			var tStep, tAxpy time.Duration
			iters := 0
			for b.Loop() {
				if iters%2 == 0 {
					t0 := time.Now()
					step()
					t1 := time.Now()
					axpy(1e-7, x, y)
					tStep, tAxpy = tStep+t1.Sub(t0), tAxpy+time.Since(t1)
				} else {
					t0 := time.Now()
					axpy(1e-7, x, y)
					t1 := time.Now()
					step()
					tAxpy, tStep = tAxpy+t1.Sub(t0), tStep+time.Since(t1)
				}
				iters++
			}
			stepNs := float64(tStep.Nanoseconds()) / float64(iters)
			axpyNs := float64(tAxpy.Nanoseconds()) / float64(iters)
			stepGBs := float64(stepBytes*n) / stepNs
			axpyGBs := float64(axpyBytes*n) / axpyNs
			b.ReportMetric(stepNs/float64(n), "ns/param")
			b.ReportMetric(stepGBs, "step-GB/s")
			b.ReportMetric(axpyGBs, "axpy-GB/s")
			b.ReportMetric(stepGBs/axpyGBs, "bw-ratio")
		})
	}
}

// BenchmarkCheckGradient measures the g̃ validity check the coordinator's
// leader and state machine run on every step besides Step's own: it reads
// g̃ once (4 bytes/param).
func BenchmarkCheckGradient(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(benchName(n), func(b *testing.B) {
			grad := randomVec(rand.New(rand.NewPCG(1, 2)), n, 2e-4)
			b.SetBytes(4 * int64(n))
			for b.Loop() {
				if err := CheckGradient(grad); err != nil {
					b.Fatal(err)
				}
			}
			reportBandwidth(b, n, 4)
		})
	}
}
