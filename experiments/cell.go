package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/model"
)

// cellExperiment trains one fixed setting (o.cellAlgo with o.cellHyper,
// no tuning) of each task at every ε of o.eps for seeds 1..o.seeds, as
// the table's runs do, so that a grid point found past the table's grid
// (by gridcheck, on seed 1) can be given the table's seeds. It writes
// cell.csv (one row per run) and cell.md (mean (std) over seeds of test
// accuracy and, for next-token tasks, perplexity). With -seeds 1 it is a
// gridcheck of one point at every ε: cell.csv also gives the validation
// accuracy that tuning would choose by.
func cellExperiment(ctx context.Context, tasks []*Task, o options, log *slog.Logger) error {
	var cells []*cell
	type job struct {
		c    *cell
		t    *Task
		seed int
	}
	var jobs []job
	for _, t := range tasks {
		for _, e := range o.eps {
			s, err := sigmaFor(t, e)
			if err != nil {
				return fmt.Errorf("%s ε=%v: %w", t.Name, e, err)
			}
			c := &cell{Task: t.Name, Algo: o.cellAlgo, Eps: e, Sigma: s, Hyper: o.cellHyper,
				Acc: make([]float64, o.seeds), Loss: make([]float64, o.seeds)}
			cells = append(cells, c)
			for seed := range o.seeds {
				jobs = append(jobs, job{c, t, seed})
			}
		}
	}
	errs := make([]error, len(jobs))
	vals := make([]model.Evaluation, len(jobs))
	parallel(len(jobs), o.workers, func(i int) {
		j := jobs[i]
		cfg := optimizerConfig(j.t, j.c.Algo, j.c.Hyper, j.c.Sigma)
		r := trainRun(ctx, j.t, cfg, uint64(j.seed+1), 0)
		logRun(log, "cell", j.t, cfg, uint64(j.seed+1), r)
		j.c.Acc[j.seed], j.c.Loss[j.seed], errs[i] = r.Test.Accuracy, r.Test.Loss, r.Err
		vals[i] = r.Val
	})
	if err := ctx.Err(); err != nil {
		return err
	}
	rows := [][]string{{"task", "optimizer", "epsilon", "sigma", "steps", "lr", "adam_eps", "gamma_prime_over_phi", "seed", "val_accuracy", "val_loss", "test_accuracy", "test_loss", "test_perplexity", "error"}}
	var md strings.Builder
	fmt.Fprintf(&md, "%s, η = %g, γ = %g, γ'/Φ = %g; test accuracy %% and perplexity, mean (std) over %d seeds:\n\n",
		o.cellAlgo, o.cellHyper.LR, o.cellHyper.AdamEps, o.cellHyper.GammaPrimeRel, o.seeds)
	md.WriteString("| task | ε | σ | accuracy % | perplexity |\n| --- | --- | --- | --- | --- |\n")
	for i, j := range jobs {
		e := ""
		if errs[i] != nil {
			e = errs[i].Error()
		}
		c := j.c
		rows = append(rows, []string{c.Task, string(c.Algo), g(c.Eps), g(c.Sigma), fmt.Sprint(j.t.Steps), g(c.Hyper.LR), g(c.Hyper.AdamEps),
			g(c.Hyper.GammaPrimeRel), fmt.Sprint(j.seed + 1), g(vals[i].Accuracy), g(vals[i].Loss), g(c.Acc[j.seed]), g(c.Loss[j.seed]), g(perplexity(c.Loss[j.seed])), e})
	}
	for _, c := range cells {
		am, as, n := meanStd(c.Acc)
		ppl := make([]float64, len(c.Loss))
		for i, l := range c.Loss {
			ppl[i] = perplexity(l)
		}
		pm, ps, _ := meanStd(ppl)
		fmt.Fprintf(&md, "| %s | %g | %.3f | %.2f (%.2f) | %.2f (%.2f) |", c.Task, c.Eps, c.Sigma, 100*am, 100*as, pm, ps)
		if n < len(c.Acc) {
			fmt.Fprintf(&md, " %d/%d diverged |", len(c.Acc)-n, len(c.Acc))
		}
		md.WriteString("\n")
	}
	if err := writeCSV(filepath.Join(o.out, "cell.csv"), rows); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.out, "cell.md"), []byte(md.String()), 0o644)
}

// parseCell parses -cell "algo,lr,second": the optimizer, its learning
// rate, and γ for DP-Adam or γ'/Φ for DP-AdamBC (ignored for DP-SGD).
func parseCell(s string) (dpadam.Algorithm, Hyper, error) {
	f := strings.Split(s, ",")
	if len(f) != 3 {
		return "", Hyper{}, fmt.Errorf("-cell %q: want algo,lr,second", s)
	}
	a := dpadam.Algorithm(f[0])
	var h Hyper
	var second float64
	if _, err := fmt.Sscan(f[1], &h.LR); err != nil || h.LR <= 0 {
		return "", Hyper{}, fmt.Errorf("-cell %q: learning rate %q", s, f[1])
	}
	if _, err := fmt.Sscan(f[2], &second); err != nil || second < 0 {
		return "", Hyper{}, fmt.Errorf("-cell %q: second value %q", s, f[2])
	}
	switch a {
	case dpadam.SGD, dpadam.SGDM: // the second value is unused (DP-SGDM: momentum 0.9)
	case dpadam.Adam:
		h.AdamEps = second
	case dpadam.AdamBC:
		h.GammaPrimeRel = second
	default:
		return "", Hyper{}, fmt.Errorf("-cell %q: optimizer %q is not one of %v or %s", s, f[0], tableAlgos, dpadam.SGDM)
	}
	if second == 0 && a != dpadam.SGD && a != dpadam.SGDM {
		return "", Hyper{}, fmt.Errorf("-cell %q: %s needs γ or γ'/Φ > 0", s, a)
	}
	return a, h, nil
}
