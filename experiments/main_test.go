package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/model"
)

func tinyOptions(t *testing.T) options {
	t.Helper()
	return options{out: t.TempDir(), seeds: 2, eps: []float64{1, 3, 7}, tuneEps: 3, workers: 2, stepsMul: 1}
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func readCSV(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func assertPNG(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 8 || string(b[1:4]) != "PNG" {
		t.Fatalf("%s is not a PNG (%d bytes)", path, len(b))
	}
}

func TestTableTinyHasEveryRow(t *testing.T) {
	tasks, err := tinyTasks()
	if err != nil {
		t.Fatal(err)
	}
	o := tinyOptions(t)
	if err := tableExperiment(context.Background(), tasks, o, quiet()); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(o.out, "table.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		for _, a := range tableAlgos {
			prefix := fmt.Sprintf("| %s (%s-favoring) | %s |", task.Name, task.Favors, a)
			var row string
			for _, l := range strings.Split(string(md), "\n") {
				if strings.HasPrefix(l, prefix) {
					row = l
				}
			}
			if row == "" {
				t.Fatalf("table.md has no row %q:\n%s", prefix, md)
			}
			if got, want := strings.Count(row, "|"), 2+1+len(o.eps); got != want {
				t.Errorf("row %q has %d separators, want %d", row, got, want)
			}
			if strings.Contains(row, "NaN") {
				t.Errorf("row %q has a NaN", row)
			}
		}
	}
	runs := readCSV(t, filepath.Join(o.out, "table_runs.csv"))
	if got, want := len(runs)-1, len(tasks)*len(tableAlgos)*len(o.eps)*o.seeds; got != want {
		t.Errorf("table_runs.csv has %d runs, want %d", got, want)
	}
	for _, r := range runs[1:] {
		if acc := r[len(r)-1]; acc == "NaN" {
			t.Errorf("diverged run %v", r)
		}
	}
	tuning := readCSV(t, filepath.Join(o.out, "table_tuning.csv"))
	grid := 0
	for _, task := range tasks {
		for _, a := range tableAlgos {
			grid += len(task.Grid[a])
		}
	}
	if got := len(tuning) - 1; got != grid {
		t.Errorf("table_tuning.csv has %d rows, want %d grid points", got, grid)
	}
	assertPNG(t, filepath.Join(o.out, "table.png"))
}

func TestTableDeterministic(t *testing.T) {
	tasks, err := tinyTasks()
	if err != nil {
		t.Fatal(err)
	}
	o := tinyOptions(t)
	o.eps, o.seeds = []float64{3}, 1
	a, _, err := accuracyTable(context.Background(), tasks[:1], o, quiet())
	if err != nil {
		t.Fatal(err)
	}
	o.workers = 1
	b, _, err := accuracyTable(context.Background(), tasks[:1], o, quiet())
	if err != nil {
		t.Fatal(err)
	}
	for i := range a {
		if !slices.Equal(a[i].Acc, b[i].Acc) || a[i].Hyper != b[i].Hyper {
			t.Errorf("cell %d differs between runs: %+v vs %+v", i, a[i], b[i])
		}
	}
}

func TestOtherExperimentsTiny(t *testing.T) {
	tasks, err := tinyTasks()
	if err != nil {
		t.Fatal(err)
	}
	o := tinyOptions(t)
	ctx := context.Background()
	text := tasks[1]
	for _, e := range []struct {
		name  string
		run   func(context.Context, *Task, options, *slog.Logger) error
		files []string
	}{
		{"sgdm", sgdmExperiment, []string{"sgdm.csv", "sgdm.md", "sgdm_loss.png", "sgdm_lr.png"}},
		{"moments", momentsExperiment, []string{"moments.csv", "moments.md", "moments_v.png", "moments_updates.png"}},
		{"phi", phiExperiment, []string{"phi.csv", "phi.md", "phi.png"}},
		{"nodp", func(ctx context.Context, t *Task, o options, log *slog.Logger) error {
			return nodpExperiment(ctx, []*Task{t}, o, log)
		}, []string{"nodp.csv", "nodp.md"}},
	} {
		t.Run(e.name, func(t *testing.T) {
			if err := e.run(ctx, text, o, quiet()); err != nil {
				t.Fatal(err)
			}
			for _, f := range e.files {
				p := filepath.Join(o.out, f)
				if strings.HasSuffix(f, ".png") {
					assertPNG(t, p)
				} else if st, err := os.Stat(p); err != nil || st.Size() == 0 {
					t.Errorf("%s missing or empty: %v", f, err)
				}
			}
		})
	}
	phi := readCSV(t, filepath.Join(o.out, "phi.csv"))
	for _, s := range phiScales {
		found := false
		for _, r := range phi[1:] {
			if r[1] == g(s) {
				found = true
			}
		}
		if !found {
			t.Errorf("phi.csv has no run with Φ'/Φ = %g", s)
		}
	}
	mom := readCSV(t, filepath.Join(o.out, "moments.csv"))
	var names []string
	for _, r := range mom[1:] {
		names = append(names, r[0])
		if private := r[len(r)-1]; strings.HasSuffix(r[0], "c") && private != "false" {
			t.Errorf("%s is computed from un-noised gradients but not labelled non-private", r[0])
		}
	}
	if want := []string{"m̂c", "m̂p", "v̂c", "v̂p", "v̂corr", "Δc", "Δp", "Δcorr"}; !slices.Equal(names, want) {
		t.Errorf("moments.csv quantities %v, want %v", names, want)
	}
}

// TestScheduledSGDMMatchesProduct checks the Eq. 3 experiment's SGDM
// against dpadam's SGDM with a constant learning rate, bit for bit.
func TestScheduledSGDMMatchesProduct(t *testing.T) {
	const dim, lr = 37, 0.3
	cfg := dpadam.DefaultConfig()
	cfg.Algorithm, cfg.LearningRate = dpadam.SGDM, lr
	opt, err := dpadam.New(cfg, dim)
	if err != nil {
		t.Fatal(err)
	}
	s := &scheduledSGDM{mu: cfg.Momentum, b: make([]float32, dim)}
	r := rand.New(rand.NewPCG(1, 2))
	a, b := make([]float32, dim), make([]float32, dim)
	for i := range a {
		a[i] = float32(r.NormFloat64())
		b[i] = a[i]
	}
	grad := make([]float32, dim)
	for range 50 {
		for i := range grad {
			grad[i] = float32(r.NormFloat64())
		}
		if _, err := opt.Step(a, grad); err != nil {
			t.Fatal(err)
		}
		s.Step(b, grad, lr)
	}
	if !slices.Equal(a, b) {
		t.Fatalf("scheduled SGDM differs from dpadam SGDM:\n%v\n%v", a, b)
	}
}

// TestEq3LR checks Eq. 3 against the paper's numbers (§3.2, Figure 2
// left): with η = 1e-3 and β = 0.9 the asymptotic DP-SGDM learning rate is
// ≈ 0.645 for Φ ≈ 2.4e-8 and ≈ 0.026 for Φ ≈ 1.5e-5 (rounded there).
func TestEq3LR(t *testing.T) {
	for _, c := range []struct{ phi, want float64 }{
		{math.Pow(0.4*0.1/256, 2), 0.645},
		{math.Pow(1.0/256, 2), 0.026},
	} {
		if got := eq3LR(1e-3, 0.9, 10000, c.phi); math.Abs(got-c.want) > 0.02*c.want {
			t.Errorf("eq3LR(Φ=%g) = %g, want ≈ %g (2%%, the paper rounds)", c.phi, got, c.want)
		}
	}
	if got, want := eq3LR(1e-3, 0.9, 1, 1), 1e-3; math.Abs(got-want) > 1e-15 {
		t.Errorf("eq3LR at t=1 = %g, want η = %g", got, want)
	}
}

// TestOptimizerMoments checks that the moments decoded from the product
// optimizer's snapshot are Adam's moments of the gradients it was fed.
func TestOptimizerMoments(t *testing.T) {
	const dim = 9
	cfg := dpadam.DefaultConfig()
	opt, err := dpadam.New(cfg, dim)
	if err != nil {
		t.Fatal(err)
	}
	theta := make([]float32, dim)
	wantM, wantV := make([]float64, dim), make([]float64, dim)
	r := rand.New(rand.NewPCG(3, 4))
	grad := make([]float32, dim)
	for range 20 {
		for i := range grad {
			grad[i] = float32(r.NormFloat64())
			gi := float64(grad[i])
			wantM[i] = cfg.Beta1*wantM[i] + (1-cfg.Beta1)*gi
			wantV[i] = cfg.Beta2*wantV[i] + (1-cfg.Beta2)*gi*gi
		}
		if _, err := opt.Step(theta, grad); err != nil {
			t.Fatal(err)
		}
	}
	m, v, err := optimizerMoments(opt)
	if err != nil {
		t.Fatal(err)
	}
	for i := range dim {
		// float32 state: relative error ~1e-6 per step, 20 steps.
		if math.Abs(float64(m[i])-wantM[i]) > 1e-5*(math.Abs(wantM[i])+1e-3) || math.Abs(float64(v[i])-wantV[i]) > 1e-5*wantV[i] {
			t.Errorf("coordinate %d: (m, v) = (%g, %g), want (%g, %g)", i, m[i], v[i], wantM[i], wantV[i])
		}
	}
}

func TestSummarize(t *testing.T) {
	s := summarize([]float64{4, 1, math.Inf(1), 3, 2, 5, math.NaN()})
	want := summary{Min: 1, Q1: 2, Median: 3, Q3: 4, Max: 5, Mean: 3, Excluded: 2}
	if s != want {
		t.Errorf("summarize = %+v, want %+v", s, want)
	}
}

func TestTextTask(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, entries ...string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.Join(entries, "\n%\n")+"\n%\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var cats, dogs []string
	for i := range 30 {
		cats = append(cats, fmt.Sprintf("The CAT sat on mat %d.\n-- _\bKitty", i))
	}
	for i := range 20 {
		dogs = append(dogs, fmt.Sprintf("A dog barks %d times!", i))
	}
	write("cats", cats...)
	write("dogs", dogs...)
	write("rare", "only one")
	write("cats.dat", "binary index, skipped")
	docs, err := readFortunes(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(docs), 51; got != want {
		t.Fatalf("read %d entries, want %d", got, want)
	}
	if got, want := docs[0].words, []string{"the", "cat", "sat", "on", "mat", "0", "kitty"}; !slices.Equal(got, want) {
		t.Errorf("tokens %q, want %q", got, want)
	}
	tr, te, classes, err := textTask(docs, 10, 20, 6, 0.2, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(classes, []string{"cats", "dogs"}) {
		t.Errorf("classes %v, want [cats dogs] (most frequent first, rare dropped)", classes)
	}
	if tr.Len()+te.Len() != 50 || te.Len() != 10 {
		t.Errorf("split %d + %d, want 40 + 10", tr.Len(), te.Len())
	}
	if tr.Vocab != 20 || tr.Dim != 6 {
		t.Errorf("vocab %d, maxLen %d; want 20, 6", tr.Vocab, tr.Dim)
	}
	// The dataset fits the textbag model.
	m, err := model.New(model.TextBag(20, 4, 4, 2, 6))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.CheckDataset(tr); err != nil {
		t.Fatal(err)
	}
}

func TestRunFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-exp", "nonsense", "-out", t.TempDir(), "-tasks", "zipf"},
		{"-seeds", "0"},
		{"-eps", "x"},
		{"-tune-per-eps", "-tune-eps", "1", "-out", t.TempDir()},
		{"-wide-grid", "-exp", "table", "-tasks", "zipf", "-out", t.TempDir()},
		{"-exp", "cell", "-tasks", "zipf", "-out", t.TempDir()},
		{"-cell", "dp-adambc,0.03", "-out", t.TempDir()},
	} {
		if err := run(args); err == nil {
			t.Errorf("run(%q) succeeded, want an error", args)
		}
	}
}
