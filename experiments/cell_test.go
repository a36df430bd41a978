package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/dpadam"
)

// TestCellExperiment runs one fixed DP-AdamBC setting on a tiny task at
// two ε and two seeds: one cell.csv row per (ε, seed), and seed 1 at
// each ε is the run a seed-1 trainRun of that setting gives (the same
// run gridcheck reports), bit for bit.
func TestCellExperiment(t *testing.T) {
	tasks, err := tinyTasks()
	if err != nil {
		t.Fatal(err)
	}
	o := tinyOptions(t)
	o.eps, o.seeds = []float64{1, 8}, 2
	o.cellAlgo, o.cellHyper = dpadam.AdamBC, Hyper{LR: 0.03, GammaPrimeRel: 3}
	if err := cellExperiment(context.Background(), tasks[:1], o, quiet()); err != nil {
		t.Fatal(err)
	}
	rows := readCSV(t, filepath.Join(o.out, "cell.csv"))
	if got, want := len(rows)-1, len(o.eps)*o.seeds; got != want {
		t.Fatalf("cell.csv has %d rows, want %d", got, want)
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	for _, r := range rows[1:] {
		if r[col["gamma_prime_over_phi"]] != "3" || r[col["lr"]] != "0.03" || r[col["error"]] != "" || r[col["val_accuracy"]] == "" {
			t.Errorf("row %v is not the setting, or failed", r)
		}
		if r[col["seed"]] != "1" {
			continue
		}
		task := tasks[0]
		var e float64
		for _, x := range o.eps {
			if g(x) == r[col["epsilon"]] {
				e = x
			}
		}
		s, err := sigmaFor(task, e)
		if err != nil {
			t.Fatal(err)
		}
		fresh := trainRun(context.Background(), task, optimizerConfig(task, o.cellAlgo, o.cellHyper, s), 1, 0)
		if g(fresh.Test.Accuracy) != r[col["test_accuracy"]] || g(fresh.Test.Loss) != r[col["test_loss"]] || g(fresh.Val.Accuracy) != r[col["val_accuracy"]] {
			t.Errorf("ε = %g seed 1: %v, %v; a fresh run: %v, %v", e, r[col["test_accuracy"]], r[col["test_loss"]], fresh.Test.Accuracy, fresh.Test.Loss)
		}
	}
	md, err := os.ReadFile(filepath.Join(o.out, "cell.md"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(md), "| tiny-zipf |"); got != len(o.eps) {
		t.Errorf("cell.md has %d task rows, want %d:\n%s", got, len(o.eps), md)
	}
}

func TestParseCell(t *testing.T) {
	a, h, err := parseCell("dp-adambc,0.03,3")
	if err != nil || a != dpadam.AdamBC || h != (Hyper{LR: 0.03, GammaPrimeRel: 3}) {
		t.Errorf("parseCell = %v, %+v, %v", a, h, err)
	}
	a, h, err = parseCell("dp-adam,0.01,1e-8")
	if err != nil || a != dpadam.Adam || h != (Hyper{LR: 0.01, AdamEps: 1e-8}) {
		t.Errorf("parseCell = %v, %+v, %v", a, h, err)
	}
	a, h, err = parseCell("dp-sgdm,0.2,0")
	if err != nil || a != dpadam.SGDM || h != (Hyper{LR: 0.2}) {
		t.Errorf("parseCell = %v, %+v, %v", a, h, err)
	}
	for _, bad := range []string{"", "dp-adambc,0.03", "sgd,1,0", "dp-adambc,x,3", "dp-adambc,0.03,0", "dp-adam,-1,1e-8"} {
		if _, _, err := parseCell(bad); err == nil {
			t.Errorf("parseCell(%q) succeeded, want an error", bad)
		}
	}
}
