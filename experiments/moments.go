package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/model"
)

// optimizerMoments decodes the first and second moments m and v from the
// product optimizer's snapshot (dpadam's documented binary format,
// version 1: a 112-byte header, then m and v as little-endian float32,
// then a CRC), so the "p" statistics are the product's own state.
func optimizerMoments(opt *dpadam.Optimizer) (m, v []float32, err error) {
	b, err := opt.MarshalBinary()
	if err != nil {
		return nil, nil, err
	}
	const header = 112
	d := opt.Dim()
	if len(b) != header+8*d+4 {
		return nil, nil, fmt.Errorf("optimizer state has %d bytes, want %d for Adam moments of dim %d", len(b), header+8*d+4, d)
	}
	m, v = make([]float32, d), make([]float32, d)
	for i := range d {
		m[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[header+4*i:]))
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[header+4*(d+i):]))
	}
	return m, v, nil
}

// summary is the row of the paper's Table 2: min, quartiles, max, mean,
// over the finite values (Excluded counts the others, e.g. m̂/√v̂ᶜ where
// a coordinate never had a gradient and v̂ᶜ = 0).
type summary struct {
	Min, Q1, Median, Q3, Max, Mean float64
	Excluded                       int
}

func summarize(xs []float64) summary {
	v := make([]float64, 0, len(xs))
	for _, x := range xs {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			v = append(v, x)
		}
	}
	s := summary{Excluded: len(xs) - len(v)}
	if len(v) == 0 {
		nan := math.NaN()
		s.Min, s.Q1, s.Median, s.Q3, s.Max, s.Mean = nan, nan, nan, nan, nan, nan
		return s
	}
	slices.Sort(v)
	q := func(p float64) float64 { // linear interpolation between order statistics
		h := p * float64(len(v)-1)
		lo := int(h)
		if lo+1 >= len(v) {
			return v[len(v)-1]
		}
		return v[lo] + (h-float64(lo))*(v[lo+1]-v[lo])
	}
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	s.Min, s.Q1, s.Median, s.Q3, s.Max, s.Mean = v[0], q(0.25), q(0.5), q(0.75), v[len(v)-1], sum/float64(len(v))
	return s
}

// momentStats are the end-of-run quantities of Table 2. "c" quantities
// come from the un-noised clipped gradients ḡ_t = S_t/B and are
// NON-PRIVATE diagnostics.
type momentStats struct {
	Names []string
	Vals  [][]float64
}

// momentsExperiment trains with the product's DP-AdamBC on t at
// ε = o.tuneEps and, in the same loop, runs a shadow Adam state on the
// un-noised clipped mean ḡ_t = S_t/B (NON-PRIVATE). At the end it writes
// summary statistics of m̂ᶜ, m̂ᵖ, v̂ᶜ, v̂ᵖ, v̂ᶜᵒʳʳ = max(v̂ᵖ − Φ, γ') and of
// the updates Δᶜ = m̂ᵖ/√v̂ᶜ, Δᵖ = m̂ᵖ/√v̂ᵖ, Δᶜᵒʳʳ = m̂ᵖ/√v̂ᶜᵒʳʳ (paper §5.2,
// Table 2) to moments.csv and moments.md, and the histograms of Figure 3
// to moments_v.png and moments_updates.png.
func momentsExperiment(ctx context.Context, t *Task, o options, log *slog.Logger) error {
	sigma, err := sigmaFor(t, o.tuneEps)
	if err != nil {
		return err
	}
	cfg := optimizerConfig(t, dpadam.AdamBC, Hyper{LR: 1e-3, GammaPrimeRel: 0.01}, sigma)
	st, err := momentsRun(ctx, t, cfg, 1)
	if err != nil {
		return err
	}
	phi := cfg.Phi()
	rows := [][]string{{"quantity", "min", "q1", "median", "q3", "max", "mean", "excluded_nonfinite", "private"}}
	var md strings.Builder
	fmt.Fprintf(&md, "Task %s, DP-AdamBC, ε = %g (σ = %.4f), B = %g, C = %g, η = %g, γ' = %.3g (0.01·Φ), Φ = (σC/B)² = %.4g, t = %d, seed 1.\n"+
		"Rows marked NON-PRIVATE are computed from un-noised clipped gradients, for this diagnosis only.\n\n",
		t.Name, o.tuneEps, sigma, t.B, t.C, cfg.LearningRate, cfg.GammaPrime, phi, t.Steps)
	md.WriteString("| quantity | Min | Q1 | Median | Q3 | Max | Mean |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	for i, name := range st.Names {
		s := summarize(st.Vals[i])
		private := name == "m̂p" || name == "v̂p" || name == "v̂corr" || name == "Δp" || name == "Δcorr"
		label := name
		if !private {
			label += " (NON-PRIVATE)"
		}
		ex := ""
		if s.Excluded > 0 {
			ex = fmt.Sprintf(" (%d non-finite excluded)", s.Excluded)
		}
		fmt.Fprintf(&md, "| %s | %.4g | %.4g | %.4g | %.4g | %.4g | %.4g%s |\n", label, s.Min, s.Q1, s.Median, s.Q3, s.Max, s.Mean, ex)
		rows = append(rows, []string{name, g(s.Min), g(s.Q1), g(s.Median), g(s.Q3), g(s.Max), g(s.Mean), fmt.Sprint(s.Excluded), fmt.Sprint(private)})
	}
	vp := st.Vals[slices.Index(st.Names, "v̂p")]
	vc := st.Vals[slices.Index(st.Names, "v̂c")]
	floor := 0
	for _, x := range vp {
		if x-phi < cfg.GammaPrime {
			floor++
		}
	}
	fmt.Fprintf(&md, "\nmean(v̂ᵖ)/Φ = %.4f; mean(v̂ᶜ)/Φ = %.4g; fraction of coordinates at the floor γ' = %.3f.\n",
		summarize(vp).Mean/phi, summarize(vc).Mean/phi, float64(floor)/float64(len(vp)))
	log.Info("moments", "task", t.Name, "phi", phi, "mean_vp_over_phi", summarize(vp).Mean/phi, "mean_vc_over_phi", summarize(vc).Mean/phi)
	if err := writeCSV(filepath.Join(o.out, "moments.csv"), rows); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "moments.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	sqrtLog := func(xs []float64) []float64 {
		out := make([]float64, len(xs))
		for i, x := range xs {
			out[i] = 0.5 * math.Log10(x)
		}
		return out
	}
	vcorr := st.Vals[slices.Index(st.Names, "v̂corr")]
	if err := plotHists(filepath.Join(o.out, "moments_v.png"),
		fmt.Sprintf("%s: second moments at t=%d (√Φ = %.3g, γ' = %.2g)", t.Name, t.Steps, math.Sqrt(phi), cfg.GammaPrime),
		"log10 √v̂", []string{"√v̂ᵖ (private)", "√v̂ᶜ (un-noised, NON-PRIVATE)", "√v̂ᶜᵒʳʳ = √max(v̂ᵖ−Φ, γ')"},
		[][]float64{sqrtLog(vp), sqrtLog(vc), sqrtLog(vcorr)}, 80); err != nil {
		return err
	}
	scaled := func(xs []float64) []float64 {
		mx := 0.0
		for _, x := range xs {
			mx = math.Max(mx, math.Abs(x))
		}
		out := make([]float64, len(xs))
		for i, x := range xs {
			out[i] = x / mx
		}
		return out
	}
	dp := st.Vals[slices.Index(st.Names, "Δp")]
	dcorr := st.Vals[slices.Index(st.Names, "Δcorr")]
	return plotHists(filepath.Join(o.out, "moments_updates.png"),
		fmt.Sprintf("%s: updates at t=%d, each scaled to [-1, 1]", t.Name, t.Steps),
		"Δ / max|Δ|", []string{"Δᵖ = m̂ᵖ/√v̂ᵖ (DP-Adam)", "Δᶜᵒʳʳ = m̂ᵖ/√v̂ᶜᵒʳʳ (DP-AdamBC)"},
		[][]float64{scaled(dp), scaled(dcorr)}, 80)
}

// momentsRun trains t with cfg (an Adam or AdamBC config) for t.Steps
// steps through the product optimizer and returns the Table 2 quantities
// at the end: the "p" moments decoded from the optimizer's state, the "c"
// moments from a float64 shadow Adam fed the un-noised S_t/B.
func momentsRun(ctx context.Context, t *Task, cfg dpadam.Config, seed uint64) (momentStats, error) {
	m, err := model.New(t.Spec)
	if err != nil {
		return momentStats{}, err
	}
	theta := make([]float32, m.NumParams())
	if err := m.Init(theta, seed); err != nil {
		return momentStats{}, err
	}
	opt, err := dpadam.New(cfg, m.NumParams())
	if err != nil {
		return momentStats{}, err
	}
	st, err := newStepper(t, m, cfg, seed)
	if err != nil {
		return momentStats{}, err
	}
	d := m.NumParams()
	mc, vc := make([]float64, d), make([]float64, d) // NON-PRIVATE shadow state
	b1, b2 := cfg.Beta1, cfg.Beta2
	for step := 1; step <= t.Steps; step++ {
		if err := ctx.Err(); err != nil {
			return momentStats{}, err
		}
		if err := st.Next(theta); err != nil {
			return momentStats{}, err
		}
		for i, s := range st.Sum {
			gc := float64(s) / cfg.ExpectedBatchSize
			mc[i] = b1*mc[i] + (1-b1)*gc
			vc[i] = b2*vc[i] + (1-b2)*gc*gc
		}
		if _, err := opt.Step(theta, st.G); err != nil {
			return momentStats{}, err
		}
	}
	mp, vp, err := optimizerMoments(opt)
	if err != nil {
		return momentStats{}, err
	}
	T := float64(t.Steps)
	c1, c2 := 1-math.Pow(b1, T), 1-math.Pow(b2, T)
	phi := cfg.Phi()
	names := []string{"m̂c", "m̂p", "v̂c", "v̂p", "v̂corr", "Δc", "Δp", "Δcorr"}
	vals := make([][]float64, len(names))
	for k := range vals {
		vals[k] = make([]float64, d)
	}
	for i := range d {
		mhc, mhp := mc[i]/c1, float64(mp[i])/c1
		vhc, vhp := vc[i]/c2, float64(vp[i])/c2
		vcorr := math.Max(vhp-phi, cfg.GammaPrime)
		vals[0][i], vals[1][i], vals[2][i], vals[3][i], vals[4][i] = mhc, mhp, vhc, vhp, vcorr
		vals[5][i] = mhp / math.Sqrt(vhc)
		vals[6][i] = mhp / math.Sqrt(vhp)
		vals[7][i] = mhp / math.Sqrt(vcorr)
	}
	return momentStats{Names: names, Vals: vals}, nil
}
