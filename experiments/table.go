package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dpcluster/dpcluster/dpadam"
)

// tableAlgos are the optimizers of the paper's Table 1, in its row order.
var tableAlgos = []dpadam.Algorithm{dpadam.SGD, dpadam.Adam, dpadam.AdamBC}

// cell is one (task, optimizer, ε) entry of the accuracy table.
type cell struct {
	Task  string
	Algo  dpadam.Algorithm
	Eps   float64
	Sigma float64
	Hyper Hyper
	Acc   []float64 // test accuracy per seed; NaN for a diverged run
	// Loss is the test loss per seed (nats; per target token for a
	// next-token task); NaN for a diverged run.
	Loss []float64
}

// mean and sample standard deviation, over finite values; n is how many.
func meanStd(xs []float64) (mean, std float64, n int) {
	for _, x := range xs {
		if !math.IsNaN(x) {
			mean += x
			n++
		}
	}
	if n == 0 {
		return math.NaN(), math.NaN(), 0
	}
	mean /= float64(n)
	for _, x := range xs {
		if !math.IsNaN(x) {
			std += (x - mean) * (x - mean)
		}
	}
	if n > 1 {
		std = math.Sqrt(std / float64(n-1))
	} else {
		std = 0
	}
	return mean, std, n
}

// tableExperiment tunes each optimizer's hyperparameters per task on the
// validation split at ε = o.tuneEps (seed 1), then trains every
// (task, optimizer, ε) with the chosen setting for o.seeds seeds and
// reports the mean (std) test accuracy (with -tune-per-eps, tuned at each
// ε; see accuracyTable). It writes table_tuning.csv, tuning.md,
// table_runs.csv, table.md and table.png into o.out.
func tableExperiment(ctx context.Context, tasks []*Task, o options, log *slog.Logger) error {
	cells, tuning, err := accuracyTable(ctx, tasks, o, log)
	if err != nil {
		return err
	}
	if err := writeCSV(filepath.Join(o.out, "table_tuning.csv"), tuning); err != nil {
		return err
	}
	tmd, err := tuningMarkdown(tuning)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "tuning.md"), []byte(tmd), 0o644); err != nil {
		return err
	}
	runs := [][]string{{"task", "optimizer", "epsilon", "delta", "sigma", "steps", "lr", "adam_eps", "gamma_prime_over_phi", "seed", "test_accuracy", "test_loss", "test_perplexity"}}
	for _, c := range cells {
		t := taskByName(tasks, c.Task)
		for s, a := range c.Acc {
			runs = append(runs, []string{c.Task, string(c.Algo), g(c.Eps), g(Delta), g(c.Sigma), fmt.Sprint(t.Steps),
				g(c.Hyper.LR), g(c.Hyper.AdamEps), g(c.Hyper.GammaPrimeRel), fmt.Sprint(s + 1), g(a), g(c.Loss[s]), g(perplexity(c.Loss[s]))})
		}
	}
	if err := writeCSV(filepath.Join(o.out, "table_runs.csv"), runs); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "table.md"), []byte(tableMarkdown(tasks, cells, o.eps)), 0o644); err != nil {
		return err
	}
	var names []string
	for _, t := range tasks {
		names = append(names, t.Name)
	}
	return plotTable(filepath.Join(o.out, "table.png"), names, cells, o.eps)
}

// replotTable redraws table.png from o.out/table_runs.csv.
func replotTable(o options) error {
	f, err := os.Open(filepath.Join(o.out, "table_runs.csv"))
	if err != nil {
		return err
	}
	rows, err := csv.NewReader(f).ReadAll()
	f.Close()
	if err != nil {
		return err
	}
	if len(rows) == 0 {
		return fmt.Errorf("table_runs.csv is empty")
	}
	accCol := slices.Index(rows[0], "test_accuracy")
	if accCol < 0 {
		return fmt.Errorf("table_runs.csv has no test_accuracy column")
	}
	var names []string
	var eps []float64
	var cells []cell
	for _, r := range rows[1:] {
		var e, acc float64
		fmt.Sscan(r[2], &e)
		fmt.Sscan(r[accCol], &acc)
		if !slices.Contains(names, r[0]) {
			names = append(names, r[0])
		}
		if !slices.Contains(eps, e) {
			eps = append(eps, e)
		}
		i := slices.IndexFunc(cells, func(c cell) bool { return c.Task == r[0] && string(c.Algo) == r[1] && c.Eps == e })
		if i < 0 {
			cells = append(cells, cell{Task: r[0], Algo: dpadam.Algorithm(r[1]), Eps: e})
			i = len(cells) - 1
		}
		cells[i].Acc = append(cells[i].Acc, acc)
	}
	return plotTable(filepath.Join(o.out, "table.png"), names, cells, eps)
}

func taskByName(ts []*Task, name string) *Task {
	for _, t := range ts {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// tuneJob is one grid point's tuning run: seed 1 at ε = Eps.
type tuneJob struct {
	t          *Task
	algo       dpadam.Algorithm
	eps, sigma float64
	h          Hyper
	res        runResult
}

// tuneKey names the choice of one optimizer on one task at one ε.
func tuneKey(t *Task, a dpadam.Algorithm, eps float64) string {
	return fmt.Sprintf("%s/%s/%g", t.Name, a, eps)
}

// accuracyTable runs the tuning and the table runs and returns the cells
// (task-major, then optimizer, then ε) and the tuning rows (with header).
// Tuning runs every grid point at seed 1 on the validation split, at
// ε = o.tuneEps, or at every ε of o.eps when o.tunePerEps; the highest
// validation accuracy chooses per (task, optimizer, tuning ε). A table
// cell at ε uses the choice made at ε (per-ε tuning) or at o.tuneEps.
// The cell's seed-1 run is the chosen tuning run itself when that run was
// made at the cell's ε (same seed, σ and setting; runs are
// deterministic, so rerunning it would give the same bits).
func accuracyTable(ctx context.Context, tasks []*Task, o options, log *slog.Logger) ([]cell, [][]string, error) {
	tuneEps := []float64{o.tuneEps}
	if o.tunePerEps {
		tuneEps = o.eps
	}
	var jobs []*tuneJob
	for _, t := range tasks {
		for _, e := range tuneEps {
			s, err := sigmaFor(t, e)
			if err != nil {
				return nil, nil, fmt.Errorf("%s ε=%v: %w", t.Name, e, err)
			}
			for _, a := range tableAlgos {
				for _, h := range t.Grid[a] {
					jobs = append(jobs, &tuneJob{t: t, algo: a, eps: e, sigma: s, h: h})
				}
			}
		}
	}
	parallel(len(jobs), o.workers, func(i int) {
		j := jobs[i]
		cfg := optimizerConfig(j.t, j.algo, j.h, j.sigma)
		j.res = trainRun(ctx, j.t, cfg, 1, 0)
		logRun(log, "tune", j.t, cfg, 1, j.res)
	})
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	best := map[string]*tuneJob{}
	for _, j := range jobs {
		k := tuneKey(j.t, j.algo, j.eps)
		if j.res.Err == nil && (best[k] == nil || j.res.Val.Accuracy > best[k].res.Val.Accuracy) {
			best[k] = j
		}
	}
	tuning := [][]string{{"task", "optimizer", "epsilon", "sigma", "lr", "adam_eps", "gamma_prime_over_phi", "val_accuracy", "test_accuracy", "val_loss", "test_loss", "error", "wall_s", "chosen", "grid_edge"}}
	for _, j := range jobs {
		errStr := ""
		if j.res.Err != nil {
			errStr = j.res.Err.Error()
		}
		chosen := best[tuneKey(j.t, j.algo, j.eps)] == j
		edge := ""
		if chosen {
			edge = gridEdge(j.t.Grid[j.algo], j.h)
		}
		tuning = append(tuning, []string{j.t.Name, string(j.algo), g(j.eps), g(j.sigma), g(j.h.LR), g(j.h.AdamEps),
			g(j.h.GammaPrimeRel), g(j.res.Val.Accuracy), g(j.res.Test.Accuracy), g(j.res.Val.Loss), g(j.res.Test.Loss), errStr,
			fmt.Sprintf("%.1f", j.res.Wall.Seconds()), fmt.Sprint(chosen), edge})
	}
	var cells []*cell
	type runJob struct {
		c    *cell
		seed int
	}
	var rjobs []runJob
	for _, t := range tasks {
		for _, a := range tableAlgos {
			for _, e := range o.eps {
				te := o.tuneEps
				if o.tunePerEps {
					te = e
				}
				b := best[tuneKey(t, a, te)]
				if b == nil {
					return nil, nil, fmt.Errorf("%s: every %s grid point diverged at ε = %g", t.Name, a, te)
				}
				s, err := sigmaFor(t, e)
				if err != nil {
					return nil, nil, fmt.Errorf("%s ε=%v: %w", t.Name, e, err)
				}
				c := &cell{Task: t.Name, Algo: a, Eps: e, Sigma: s, Hyper: b.h, Acc: make([]float64, o.seeds), Loss: make([]float64, o.seeds)}
				cells = append(cells, c)
				for seed := range o.seeds {
					if seed == 0 && b.eps == e {
						c.Acc[0], c.Loss[0] = b.res.Test.Accuracy, b.res.Test.Loss
						continue
					}
					rjobs = append(rjobs, runJob{c, seed})
				}
			}
		}
	}
	parallel(len(rjobs), o.workers, func(i int) {
		j := rjobs[i]
		t := taskByName(tasks, j.c.Task)
		cfg := optimizerConfig(t, j.c.Algo, j.c.Hyper, j.c.Sigma)
		r := trainRun(ctx, t, cfg, uint64(j.seed+1), 0)
		logRun(log, "table", t, cfg, uint64(j.seed+1), r)
		j.c.Acc[j.seed], j.c.Loss[j.seed] = r.Test.Accuracy, r.Test.Loss
		if r.Err != nil {
			j.c.Acc[j.seed], j.c.Loss[j.seed] = math.NaN(), math.NaN()
		}
	})
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	out := make([]cell, len(cells))
	for i, c := range cells {
		out[i] = *c
	}
	return out, tuning, nil
}

// tableMarkdown renders the cells as the paper's Table 1: rows task ×
// optimizer, columns ε, entries "mean (std)" test accuracy in percent,
// the best mean per (task, ε) in bold; then the chosen hyperparameters.
func tableMarkdown(tasks []*Task, cells []cell, eps []float64) string {
	var b strings.Builder
	b.WriteString("| task | optimizer |")
	for _, e := range eps {
		fmt.Fprintf(&b, " ε = %g |", e)
	}
	b.WriteString("\n| --- | --- |")
	for range eps {
		b.WriteString(" --- |")
	}
	b.WriteString("\n")
	find := func(task string, a dpadam.Algorithm, e float64) *cell {
		for i := range cells {
			if cells[i].Task == task && cells[i].Algo == a && cells[i].Eps == e {
				return &cells[i]
			}
		}
		return nil
	}
	for _, t := range tasks {
		for _, a := range tableAlgos {
			fmt.Fprintf(&b, "| %s (%s-favoring) | %s |", t.Name, t.Favors, a)
			for _, e := range eps {
				c := find(t.Name, a, e)
				m, s, n := meanStd(c.Acc)
				bestMean := math.Inf(-1)
				for _, a2 := range tableAlgos {
					if m2, _, _ := meanStd(find(t.Name, a2, e).Acc); m2 > bestMean {
						bestMean = m2
					}
				}
				txt := fmt.Sprintf("%.2f (%.2f)", 100*m, 100*s)
				if n < len(c.Acc) {
					txt += fmt.Sprintf(" [%d/%d diverged]", len(c.Acc)-n, len(c.Acc))
				}
				if m == bestMean {
					txt = "**" + txt + "**"
				}
				fmt.Fprintf(&b, " %s |", txt)
			}
			b.WriteString("\n")
		}
	}
	b.WriteString(perplexityMarkdown(tasks, eps, find))
	b.WriteString("\nChosen hyperparameters (tuned on the validation split) and σ per ε:\n\n")
	b.WriteString("| task | optimizer | η | γ / γ' | steps, B, C | σ |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, t := range tasks {
		for _, a := range tableAlgos {
			// lr and second list one value per ε when the choice
			// differs across ε (per-ε tuning), else the one value.
			var lrs, seconds, sig []string
			for _, e := range eps {
				c := find(t.Name, a, e)
				lrs = append(lrs, fmt.Sprintf("%g", c.Hyper.LR))
				second := "—"
				switch a {
				case dpadam.Adam:
					second = fmt.Sprintf("γ = %g", c.Hyper.AdamEps)
				case dpadam.AdamBC:
					second = fmt.Sprintf("γ' = %g·Φ", c.Hyper.GammaPrimeRel)
				}
				seconds = append(seconds, second)
				sig = append(sig, fmt.Sprintf("%.3f (ε=%g)", c.Sigma, e))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %d, %g, %g | %s |\n", t.Name, a, perEps(lrs, eps), perEps(seconds, eps), t.Steps, t.B, t.C, strings.Join(sig, ", "))
		}
	}
	return b.String()
}

// perEps joins one value per ε as "v (ε=e), …", or returns the value
// alone when it is the same at every ε.
func perEps(vs []string, eps []float64) string {
	if len(slices.Compact(slices.Clone(vs))) == 1 {
		return vs[0]
	}
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = fmt.Sprintf("%s (ε=%g)", v, eps[i])
	}
	return strings.Join(out, ", ")
}

func g(x float64) string { return fmt.Sprintf("%.6g", x) }

func writeCSV(path string, rows [][]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	if err := w.WriteAll(rows); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
