package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/dpcluster/dpcluster/dpadam"
)

// extraGrid holds the grid points beyond the table's grid that
// gridcheckExperiment tries: one step past every edge where the table's
// tuning chose a boundary value, and larger floors γ' for DP-AdamBC.
func extraGrid(task string) map[dpadam.Algorithm][]Hyper {
	switch task {
	case "zipf":
		return map[dpadam.Algorithm][]Hyper{
			dpadam.Adam: {{LR: 0.3, AdamEps: 1e-8}},
			dpadam.AdamBC: {{LR: 0.1, GammaPrimeRel: 0.01}, {LR: 0.1, GammaPrimeRel: 0.1},
				{LR: 0.03, GammaPrimeRel: 0.3}, {LR: 0.03, GammaPrimeRel: 1}, {LR: 0.1, GammaPrimeRel: 1}},
		}
	case "fortunes-lm":
		// Past the edges that per-ε tuning over lmWideGrid chose at
		// 200 steps: DP-Adam's η = 0.01 (bottom) and DP-AdamBC's
		// η = 0.01 with γ' = Φ (top of both axes).
		return map[dpadam.Algorithm][]Hyper{
			dpadam.Adam: {{LR: 3e-3, AdamEps: 1e-8}},
			dpadam.AdamBC: {{LR: 3e-2, GammaPrimeRel: 1}, {LR: 1e-2, GammaPrimeRel: 3},
				{LR: 3e-2, GammaPrimeRel: 3}},
		}
	case "fortunes":
		return map[dpadam.Algorithm][]Hyper{
			dpadam.SGD: {{LR: 0.5}, {LR: 1}},
			dpadam.AdamBC: {{LR: 1e-3, GammaPrimeRel: 0.3}, {LR: 3e-3, GammaPrimeRel: 0.3}, {LR: 1e-2, GammaPrimeRel: 0.3},
				{LR: 1e-3, GammaPrimeRel: 1}, {LR: 3e-3, GammaPrimeRel: 1}, {LR: 1e-2, GammaPrimeRel: 1}},
		}
	}
	return nil
}

// gridcheckExperiment runs extraGrid's points at ε = o.tuneEps, seed 1,
// exactly as the table's tuning runs (validation accuracy chooses), so
// they can be compared with table_tuning.csv. It writes gridcheck.csv and
// gridcheck.md.
func gridcheckExperiment(ctx context.Context, tasks []*Task, o options, log *slog.Logger) error {
	type job struct {
		t    *Task
		algo dpadam.Algorithm
		h    Hyper
		res  runResult
	}
	var jobs []*job
	sigma := map[string]float64{}
	for _, t := range tasks {
		s, err := sigmaFor(t, o.tuneEps)
		if err != nil {
			return err
		}
		sigma[t.Name] = s
		for _, a := range tableAlgos {
			for _, h := range extraGrid(t.Name)[a] {
				jobs = append(jobs, &job{t: t, algo: a, h: h})
			}
		}
	}
	parallel(len(jobs), o.workers, func(i int) {
		j := jobs[i]
		cfg := optimizerConfig(j.t, j.algo, j.h, sigma[j.t.Name])
		j.res = trainRun(ctx, j.t, cfg, 1, 0)
		logRun(log, "gridcheck", j.t, cfg, 1, j.res)
	})
	if err := ctx.Err(); err != nil {
		return err
	}
	rows := [][]string{{"task", "optimizer", "epsilon", "sigma", "lr", "adam_eps", "gamma_prime_over_phi", "val_accuracy", "test_accuracy", "val_loss", "test_loss", "error"}}
	var md strings.Builder
	fmt.Fprintf(&md, "Extra grid points at ε = %g, seed 1 (compare with table_tuning.csv).\n\n", o.tuneEps)
	md.WriteString("| task | optimizer | η | γ'/Φ | validation accuracy | test accuracy |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, j := range jobs {
		e := ""
		if j.res.Err != nil {
			e = j.res.Err.Error()
		}
		rows = append(rows, []string{j.t.Name, string(j.algo), g(o.tuneEps), g(sigma[j.t.Name]), g(j.h.LR), g(j.h.AdamEps),
			g(j.h.GammaPrimeRel), g(j.res.Val.Accuracy), g(j.res.Test.Accuracy), g(j.res.Val.Loss), g(j.res.Test.Loss), e})
		fmt.Fprintf(&md, "| %s | %s | %g | %g | %.2f%% | %.2f%% |\n", j.t.Name, j.algo, j.h.LR, j.h.GammaPrimeRel, 100*j.res.Val.Accuracy, 100*j.res.Test.Accuracy)
	}
	if err := writeCSV(filepath.Join(o.out, "gridcheck.csv"), rows); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.out, "gridcheck.md"), []byte(md.String()), 0o644)
}
