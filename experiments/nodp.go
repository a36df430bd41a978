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

// nodpExperiment checks the premise of the table: which optimizer wins
// each task without noise. It trains DP-SGD and DP-Adam with clipping but
// σ = 0 (NOT private: a reference point only) over each task's grid, seed
// 1, chooses η on the validation split and reports the test accuracy.
// (With σ = 0, Φ = 0 and DP-AdamBC is DP-Adam up to where the stability
// constant sits, so it is not run separately.) It writes nodp.csv and
// nodp.md.
func nodpExperiment(ctx context.Context, tasks []*Task, o options, log *slog.Logger) error {
	type job struct {
		t    *Task
		algo dpadam.Algorithm
		h    Hyper
		res  runResult
	}
	var jobs []*job
	for _, t := range tasks {
		for _, a := range []dpadam.Algorithm{dpadam.SGD, dpadam.Adam} {
			for _, h := range t.Grid[a] {
				jobs = append(jobs, &job{t: t, algo: a, h: h})
			}
		}
	}
	parallel(len(jobs), o.workers, func(i int) {
		j := jobs[i]
		cfg := optimizerConfig(j.t, j.algo, j.h, 0)
		j.res = trainRun(ctx, j.t, cfg, 1, 0)
		logRun(log, "nodp", j.t, cfg, 1, j.res)
	})
	if err := ctx.Err(); err != nil {
		return err
	}
	rows := [][]string{{"task", "optimizer", "lr", "val_accuracy", "test_accuracy", "val_loss", "test_loss", "error"}}
	best := map[string]*job{}
	for _, j := range jobs {
		e := ""
		if j.res.Err != nil {
			e = j.res.Err.Error()
		}
		rows = append(rows, []string{j.t.Name, string(j.algo), g(j.h.LR), g(j.res.Val.Accuracy), g(j.res.Test.Accuracy), g(j.res.Val.Loss), g(j.res.Test.Loss), e})
		k := j.t.Name + "/" + string(j.algo)
		if j.res.Err == nil && (best[k] == nil || j.res.Val.Accuracy > best[k].res.Val.Accuracy) {
			best[k] = j
		}
	}
	if err := writeCSV(filepath.Join(o.out, "nodp.csv"), rows); err != nil {
		return err
	}
	var md strings.Builder
	md.WriteString("Clipping only, σ = 0 (NOT private; reference), seed 1, η chosen on the validation split from the table's grid.\n\n")
	md.WriteString("| task | steps | SGD: η, test accuracy | Adam: η, test accuracy |\n| --- | --- | --- | --- |\n")
	for _, t := range tasks {
		fmt.Fprintf(&md, "| %s | %d |", t.Name, t.Steps)
		for _, a := range []dpadam.Algorithm{dpadam.SGD, dpadam.Adam} {
			if b := best[t.Name+"/"+string(a)]; b != nil {
				fmt.Fprintf(&md, " %g, %.2f%%", b.h.LR, 100*b.res.Test.Accuracy)
				if nextToken(t) {
					fmt.Fprintf(&md, " (perplexity %.2f)", perplexity(b.res.Test.Loss))
				}
				md.WriteString(" |")
			} else {
				md.WriteString(" diverged |")
			}
		}
		md.WriteString("\n")
	}
	return os.WriteFile(filepath.Join(o.out, "nodp.md"), []byte(md.String()), 0o644)
}
