package main

import (
	"fmt"
	"math"
	"strings"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/model"
)

// The fortunes-lm task: a byte-level transformer language model on the
// Debian fortunes (issue 30). Its size is chosen for a 2-core machine:
// a DP step at B = 128 windows of T = 32 tokens costs about 0.12 s with
// OpenBLAS (0.4 s pure Go) on an idle machine, so a 100-step run with
// its evaluations takes about 20 s. The learning-rate grids are two
// points per optimizer, each reaching one step past the edge that the
// first (100-step, two-point) tuning chose, and DP-AdamBC also tunes
// γ' ∈ {0.01, 0.1, 1}·Φ; docs/RESULTS.md runs it with -steps-scale 2.
const (
	lmContext = 32 // T: a window holds T+1 byte ids
	lmWidth   = 48
	lmBlocks  = 1
	lmHeads   = 4
	// lmEvalWindows is how many validation windows tuning evaluates on,
	// and how many test windows are reported (the first ones of each
	// split: whole documents in shuffled order), to keep each run's
	// evaluation cost below its training cost.
	lmEvalWindows = 4096
)

// fortunesLMTask builds the fortunes-lm task from the fortunes in dir
// (FortunesDir if ""): dataset.LoadFortunesSequences at context lmContext
// with its default 80/10/10 split by document (seed 1); Train is the
// corpus's train split, Val and Test the first lmEvalWindows windows of
// its validation and test splits, so no validation or test document is
// trained on. The model is
// model.TransformerLM(ByteVocab, lmContext, lmWidth, lmBlocks, lmHeads),
// 54,930 parameters. The unit of privacy is a window (see
// dataset.SequenceCorpus).
func fortunesLMTask(dir string) (*Task, error) {
	c := dataset.DefaultSequenceConfig()
	c.Context = lmContext
	sc, err := dataset.LoadFortunesSequences(dir, c)
	if err != nil {
		return nil, fmt.Errorf("fortunes-lm: %w", err)
	}
	spec := model.TransformerLM(dataset.ByteVocab, lmContext, lmWidth, lmBlocks, lmHeads)
	return &Task{Name: "fortunes-lm", Favors: "adam", Spec: spec,
		Train: sc.Train, Val: evalSubset(sc.Validation, lmEvalWindows), Test: evalSubset(sc.Test, lmEvalWindows),
		B: 128, C: 1, Steps: 100,
		Grid: map[dpadam.Algorithm][]Hyper{
			dpadam.SGD:    grid(dpadam.SGD, []float64{1, 3}),
			dpadam.Adam:   grid(dpadam.Adam, []float64{3e-2, 1e-1}, 1e-8),
			dpadam.AdamBC: grid(dpadam.AdamBC, []float64{1e-3, 3e-3}, 0.01, 0.1, 1),
		},
		WideGrid: lmWideGrid()}, nil
}

// lmWideGrid is fortunes-lm's grid under -wide-grid: one learning-rate
// step past every edge that the 200-step tuning at ε = 3 chose (DP-SGD
// η = 3 and DP-AdamBC η = 0.003 were at the top, DP-Adam's η = 0.03 at
// the bottom), so that tuning at other ε can move either way: DP-SGD
// η ∈ {1, 3, 10}, DP-Adam η ∈ {0.01, 0.03, 0.1} with γ = 1e-8, DP-AdamBC
// η ∈ {0.001, 0.003, 0.01} × γ' ∈ {0.01, 0.1, 1}·Φ; 15 points per ε.
// DP-Adam's γ is not tuned: its denominator is √v̂ + γ, and v̂ stays near
// Φ (the 200-step moments run: min v̂ᵖ = 0.66·Φ), so √v̂ ≥ 0.8·σC/B ≥
// 0.0026 at ε ≤ 8; any γ ≤ 1e-4 changes the update by under 4%, and a
// larger one acts as a smaller η.
func lmWideGrid() map[dpadam.Algorithm][]Hyper {
	return map[dpadam.Algorithm][]Hyper{
		dpadam.SGD:    grid(dpadam.SGD, []float64{1, 3, 10}),
		dpadam.Adam:   grid(dpadam.Adam, []float64{1e-2, 3e-2, 1e-1}, 1e-8),
		dpadam.AdamBC: grid(dpadam.AdamBC, []float64{1e-3, 3e-3, 1e-2}, 0.01, 0.1, 1),
	}
}

// nextToken reports whether t is a next-token task, whose evaluations
// also report perplexity.
func nextToken(t *Task) bool { return t.Spec.Loss == model.NextToken }

// perplexity is exp of a loss in nats per token; NaN stays NaN.
func perplexity(loss float64) float64 { return math.Exp(loss) }

// perplexityMarkdown renders, for the next-token tasks among tasks, the
// test perplexity of every (optimizer, ε) cell as "mean (std)" over the
// seeds, where each seed's perplexity is exp of its test loss per token;
// the lowest mean per ε is in bold. It returns "" when no task is a
// next-token task.
func perplexityMarkdown(tasks []*Task, eps []float64, find func(string, dpadam.Algorithm, float64) *cell) string {
	var b strings.Builder
	for _, t := range tasks {
		if !nextToken(t) {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("\nTest perplexity (exp of the loss per target token; lower is better), mean (std) over seeds:\n\n| task | optimizer |")
			for _, e := range eps {
				fmt.Fprintf(&b, " ε = %g |", e)
			}
			b.WriteString("\n| --- | --- |" + strings.Repeat(" --- |", len(eps)) + "\n")
		}
		ppl := func(a dpadam.Algorithm, e float64) (mean, std float64, n int) {
			c := find(t.Name, a, e)
			xs := make([]float64, len(c.Loss))
			for i, l := range c.Loss {
				xs[i] = perplexity(l)
			}
			return meanStd(xs)
		}
		for _, a := range tableAlgos {
			fmt.Fprintf(&b, "| %s | %s |", t.Name, a)
			for _, e := range eps {
				m, s, _ := ppl(a, e)
				best := math.Inf(1)
				for _, a2 := range tableAlgos {
					if m2, _, _ := ppl(a2, e); m2 < best {
						best = m2
					}
				}
				txt := fmt.Sprintf("%.2f (%.2f)", m, s)
				if m == best {
					txt = "**" + txt + "**"
				}
				fmt.Fprintf(&b, " %s |", txt)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}
