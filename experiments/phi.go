package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/dpcluster/dpcluster/dpadam"
)

// phiScales are the Φ'/Φ ratios of the paper's Figure 4 (upper left).
var phiScales = []float64{0.1, 1, 10}

// phiExperiment trains DP-AdamBC on t at ε = o.tuneEps subtracting
// Φ' = s·Φ for s in phiScales (dpadam.Config.PhiScale; γ' stays 0.01·Φ
// of the true Φ), with the learning rate coarsely tuned on the validation
// split (seed 1) for each s, plus DP-Adam tuned the same way as the
// reference, then runs each chosen setting for o.seeds seeds. It writes
// phi.csv, phi.md and phi.png (test accuracy over steps, seed 1).
func phiExperiment(ctx context.Context, t *Task, o options, log *slog.Logger) error {
	sigma, err := sigmaFor(t, o.tuneEps)
	if err != nil {
		return err
	}
	every := max(1, t.Steps/20)
	type variant struct {
		name  string
		algo  dpadam.Algorithm
		scale float64
		lrs   []float64
	}
	variants := []variant{{name: "DP-Adam (no correction)", algo: dpadam.Adam, lrs: []float64{1e-3, 3e-3, 1e-2}}}
	for _, s := range phiScales {
		variants = append(variants, variant{name: fmt.Sprintf("DP-AdamBC Φ' = %g·Φ", s), algo: dpadam.AdamBC, scale: s, lrs: []float64{3e-4, 1e-3, 3e-3}})
	}
	config := func(v variant, lr float64) dpadam.Config {
		c := optimizerConfig(t, v.algo, Hyper{LR: lr, AdamEps: 1e-8, GammaPrimeRel: 0.01}, sigma)
		if v.algo == dpadam.Adam {
			c.GammaPrime = dpadam.DefaultConfig().GammaPrime
		} else {
			c.PhiScale = v.scale
		}
		return c
	}
	type job struct {
		v    variant
		lr   float64
		seed uint64
		res  runResult
	}
	var tune []*job
	for _, v := range variants {
		for _, lr := range v.lrs {
			tune = append(tune, &job{v: v, lr: lr, seed: 1})
		}
	}
	parallel(len(tune), o.workers, func(i int) {
		j := tune[i]
		cfg := config(j.v, j.lr)
		j.res = trainRun(ctx, t, cfg, j.seed, every)
		logRun(log, "phi", t, cfg, j.seed, j.res)
	})
	if err := ctx.Err(); err != nil {
		return err
	}
	best := map[string]*job{}
	for _, j := range tune {
		if j.res.Err == nil && (best[j.v.name] == nil || j.res.Val.Accuracy > best[j.v.name].res.Val.Accuracy) {
			best[j.v.name] = j
		}
	}
	var more []*job
	for _, v := range variants {
		if b := best[v.name]; b != nil {
			for s := 2; s <= o.seeds; s++ {
				more = append(more, &job{v: v, lr: b.lr, seed: uint64(s)})
			}
		}
	}
	parallel(len(more), o.workers, func(i int) {
		j := more[i]
		cfg := config(j.v, j.lr)
		j.res = trainRun(ctx, t, cfg, j.seed, 0)
		logRun(log, "phi", t, cfg, j.seed, j.res)
	})
	if err := ctx.Err(); err != nil {
		return err
	}
	rows := [][]string{{"variant", "phi_scale", "lr", "seed", "val_accuracy", "test_accuracy", "error", "chosen"}}
	for _, j := range append(tune, more...) {
		e := ""
		if j.res.Err != nil {
			e = j.res.Err.Error()
		}
		b := best[j.v.name]
		rows = append(rows, []string{j.v.name, g(j.v.scale), g(j.lr), fmt.Sprint(j.seed), g(j.res.Val.Accuracy), g(j.res.Test.Accuracy), e,
			fmt.Sprint(b != nil && b.lr == j.lr)})
	}
	if err := writeCSV(filepath.Join(o.out, "phi.csv"), rows); err != nil {
		return err
	}
	var md strings.Builder
	trueCfg := config(variants[1], 1e-3)
	trueCfg.PhiScale = 1
	phi := trueCfg.Phi()
	fmt.Fprintf(&md, "Task %s, ε = %g (σ = %.4f), Φ = %.4g, γ' = 0.01·Φ, %d steps; η tuned on the validation split (seed 1), test accuracy over %d seeds.\n\n",
		t.Name, o.tuneEps, sigma, phi, t.Steps, o.seeds)
	md.WriteString("| variant | η | test accuracy, mean (std) |\n| --- | --- | --- |\n")
	var curves []series
	for _, v := range variants {
		b := best[v.name]
		if b == nil {
			fmt.Fprintf(&md, "| %s | — | every η diverged |\n", v.name)
			continue
		}
		acc := []float64{b.res.Test.Accuracy}
		for _, j := range more {
			if j.v.name == v.name {
				a := j.res.Test.Accuracy
				if j.res.Err != nil {
					a = math.NaN()
				}
				acc = append(acc, a)
			}
		}
		m, s, _ := meanStd(acc)
		fmt.Fprintf(&md, "| %s | %g | %.2f (%.2f) |\n", v.name, b.lr, 100*m, 100*s)
		c := series{Name: fmt.Sprintf("%s, η=%g", v.name, b.lr)}
		for _, p := range b.res.History {
			c.X, c.Y = append(c.X, float64(p.Step)), append(c.Y, 100*p.Eval.Accuracy)
		}
		curves = append(curves, c)
	}
	if err := os.WriteFile(filepath.Join(o.out, "phi.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	return plotLines(filepath.Join(o.out, "phi.png"), fmt.Sprintf("%s: subtracting Φ' instead of Φ (ε=%g, seed 1)", t.Name, o.tuneEps),
		"step", "test accuracy (%)", curves)
}
