package main

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/dpadam"
)

// TestTablePerEps tunes two tiny tasks at every ε: the tuning has every
// grid point at every ε, one choice per (task, optimizer, ε), each cell
// uses the choice made at its own ε, and its seed-1 result is the chosen
// tuning run's, which a fresh run with the same seed reproduces bit for
// bit (so reusing it changes no number).
func TestTablePerEps(t *testing.T) {
	tasks, err := tinyTasks()
	if err != nil {
		t.Fatal(err)
	}
	tasks = tasks[:2]
	// Two learning rates far apart make the choice depend on ε.
	for _, task := range tasks {
		task.Grid[dpadam.Adam] = grid(dpadam.Adam, []float64{1e-3, 1e-1}, 1e-8)
	}
	o := tinyOptions(t)
	o.eps, o.seeds, o.tunePerEps = []float64{0.5, 8}, 2, true
	o.tuneEps = 3 // ignored with tunePerEps: no tuning row may be at ε = 3
	cells, tuning, err := accuracyTable(context.Background(), tasks, o, quiet())
	if err != nil {
		t.Fatal(err)
	}
	col := map[string]int{}
	for i, h := range tuning[0] {
		col[h] = i
	}
	grid := 0
	for _, task := range tasks {
		for _, a := range tableAlgos {
			grid += len(task.Grid[a])
		}
	}
	if got, want := len(tuning)-1, grid*len(o.eps); got != want {
		t.Fatalf("%d tuning rows, want %d (every grid point at every ε)", got, want)
	}
	chosen := map[string][]string{}
	for _, r := range tuning[1:] {
		if r[col["epsilon"]] == "3" {
			t.Errorf("tuning row at ε = 3, which is not in -eps: %v", r)
		}
		if r[col["chosen"]] == "true" {
			k := r[col["task"]] + "/" + r[col["optimizer"]] + "/" + r[col["epsilon"]]
			if chosen[k] != nil {
				t.Errorf("two choices for %s", k)
			}
			chosen[k] = r
		}
	}
	if got, want := len(chosen), len(tasks)*len(tableAlgos)*len(o.eps); got != want {
		t.Fatalf("%d choices, want %d", got, want)
	}
	for _, c := range cells {
		r := chosen[c.Task+"/"+string(c.Algo)+"/"+g(c.Eps)]
		if r == nil {
			t.Fatalf("no choice for cell %s/%s/%g", c.Task, c.Algo, c.Eps)
		}
		if r[col["lr"]] != g(c.Hyper.LR) || r[col["adam_eps"]] != g(c.Hyper.AdamEps) || r[col["gamma_prime_over_phi"]] != g(c.Hyper.GammaPrimeRel) {
			t.Errorf("cell %s/%s/%g uses %+v, its ε chose %v", c.Task, c.Algo, c.Eps, c.Hyper, r)
		}
		if r[col["test_accuracy"]] != g(c.Acc[0]) || r[col["test_loss"]] != g(c.Loss[0]) {
			t.Errorf("cell %s/%s/%g seed 1: %v, %v; the chosen tuning run: %v, %v", c.Task, c.Algo, c.Eps, c.Acc[0], c.Loss[0], r[col["test_accuracy"]], r[col["test_loss"]])
		}
		task := taskByName(tasks, c.Task)
		fresh := trainRun(context.Background(), task, optimizerConfig(task, c.Algo, c.Hyper, c.Sigma), 1, 0)
		if fresh.Err != nil || fresh.Test.Accuracy != c.Acc[0] || fresh.Test.Loss != c.Loss[0] {
			t.Errorf("cell %s/%s/%g: a fresh seed-1 run gives %v, %v (%v), the reused one %v, %v", c.Task, c.Algo, c.Eps,
				fresh.Test.Accuracy, fresh.Test.Loss, fresh.Err, c.Acc[0], c.Loss[0])
		}
	}
	md, err := tuningMarkdown(tuning)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| ε = 0.5 | ε = 8 |", "| tiny-zipf | " + string(dpadam.Adam) + " | 8 |", "γ = 1e-08"} {
		if !strings.Contains(md, want) {
			t.Errorf("tuning.md has no %q:\n%s", want, md)
		}
	}
	if got, want := strings.Count(md, "**"), 2*len(chosen); got != want {
		t.Errorf("tuning.md has %d bold markers, want %d (one per choice):\n%s", got, want, md)
	}
}

func TestTableExperimentWritesTuning(t *testing.T) {
	tasks, err := tinyTasks()
	if err != nil {
		t.Fatal(err)
	}
	o := tinyOptions(t)
	o.eps, o.seeds, o.tunePerEps = []float64{1, 8}, 1, true
	if err := tableExperiment(context.Background(), tasks[:1], o, quiet()); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(o.out, "tuning.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "| tiny-zipf | "+string(dpadam.SGD)+" | 1 |") {
		t.Errorf("tuning.md has no DP-SGD choice at ε = 1:\n%s", md)
	}
}

func TestGridEdge(t *testing.T) {
	bc := grid(dpadam.AdamBC, []float64{1e-3, 3e-3, 1e-2}, 0.01, 0.1, 1)
	for _, c := range []struct {
		grid []Hyper
		h    Hyper
		want string
	}{
		{bc, Hyper{LR: 3e-3, GammaPrimeRel: 0.1}, ""},
		{bc, Hyper{LR: 1e-2, GammaPrimeRel: 0.1}, "η top"},
		{bc, Hyper{LR: 1e-3, GammaPrimeRel: 1}, "η bottom, γ' top"},
		{bc, Hyper{LR: 3e-3, GammaPrimeRel: 0.01}, "γ' bottom"},
		{grid(dpadam.Adam, []float64{0.01, 0.03}, 1e-8), Hyper{LR: 0.03, AdamEps: 1e-8}, "η top"},
		{grid(dpadam.SGD, []float64{3}), Hyper{LR: 3}, ""},
	} {
		if got := gridEdge(c.grid, c.h); got != c.want {
			t.Errorf("gridEdge(%+v) = %q, want %q", c.h, got, c.want)
		}
	}
}

func TestPerEps(t *testing.T) {
	eps := []float64{1, 3, 8}
	if got := perEps([]string{"0.003", "0.003", "0.003"}, eps); got != "0.003" {
		t.Errorf("same value: %q", got)
	}
	if got, want := perEps([]string{"0.01", "0.003", "0.003"}, eps), "0.01 (ε=1), 0.003 (ε=3), 0.003 (ε=8)"; got != want {
		t.Errorf("perEps = %q, want %q", got, want)
	}
}

// TestGridcheckFortunesLM checks that gridcheck's fortunes-lm points lie
// past lmWideGrid (each beyond its range on η or γ'), and runs them on a
// tiny task under that name: one gridcheck.csv row per point, with a
// finite test loss.
func TestGridcheckFortunesLM(t *testing.T) {
	wide := lmWideGrid()
	for a, hs := range extraGrid("fortunes-lm") {
		var maxLR, minLR, maxGP = 0.0, math.Inf(1), 0.0
		for _, h := range wide[a] {
			maxLR, minLR, maxGP = max(maxLR, h.LR), min(minLR, h.LR), max(maxGP, h.GammaPrimeRel)
		}
		for _, h := range hs {
			if !(h.LR > maxLR || h.LR < minLR || h.GammaPrimeRel > maxGP) {
				t.Errorf("%s %+v is not past the wide grid", a, h)
			}
		}
	}
	tasks, err := tinyTasks()
	if err != nil {
		t.Fatal(err)
	}
	task := tasks[1]
	task.Name = "fortunes-lm"
	o := tinyOptions(t)
	if err := gridcheckExperiment(context.Background(), []*Task{task}, o, quiet()); err != nil {
		t.Fatal(err)
	}
	rows := readCSV(t, filepath.Join(o.out, "gridcheck.csv"))
	n := 0
	for _, hs := range extraGrid("fortunes-lm") {
		n += len(hs)
	}
	li := slices.Index(rows[0], "test_loss")
	if n == 0 || li < 0 {
		t.Fatalf("no fortunes-lm extra points (%d) or no test_loss column", n)
	}
	if len(rows)-1 != n {
		t.Fatalf("gridcheck.csv has %d rows, want %d", len(rows)-1, n)
	}
	for _, r := range rows[1:] {
		if x, err := strconv.ParseFloat(r[li], 64); err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
			t.Errorf("row %v: test loss %q not finite", r, r[li])
		}
	}
}
