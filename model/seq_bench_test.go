package model

import "testing"

// BenchmarkTransformerStep: the "transformer" preset (vocabulary 2048,
// context 64, width 128, 2 blocks, 4 heads; 0.93M parameters) at B = 64
// sequences (4096 target tokens), random token ids: the non-private mean
// gradient, the clipped sum ("dp") and the paired ratio dp/nonprivate, as
// benchStep reports for the other presets.
func BenchmarkTransformerStep(b *testing.B) {
	const B = 64
	spec, err := Preset("transformer")
	if err != nil {
		b.Fatal(err)
	}
	m, theta, x, y := benchInputs(b, spec, B)
	ws, err := m.NewWorkspace(B)
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]float32, m.NumParams())
	nonprivate := func() error { _, err := ws.MeanGrad(dst, theta, x, y); return err }
	dp := func() error { _, err := ws.ClippedSum(dst, theta, x, y, 1); return err }
	benchRun(b, "nonprivate", B, nonprivate)
	benchRun(b, "dp", B, dp)
	b.Run("paired", func(b *testing.B) {
		tNP, tDP, iters := pairedSteps(b, nonprivate, dp)
		b.ReportMetric(float64(B*iters)/tNP.Seconds(), "nonprivate-examples/s")
		b.ReportMetric(float64(B*iters)/tDP.Seconds(), "dp-examples/s")
		b.ReportMetric(tDP.Seconds()/tNP.Seconds(), "dp/nonprivate")
	})
}
