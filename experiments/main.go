// Command experiments reproduces the findings of Tang, Shpilevskiy and
// Lécuyer, "DP-AdamBC: Your DP-Adam Is Actually DP-SGD (Unless You Apply
// Bias Correction)" (AAAI 2024) with dpcluster's own training engine
// (train.Run, model, sampling, ledger) and optimizers (dpadam), in one
// process, and writes CSV files, markdown tables and PNG plots.
//
//	cd experiments && go run -tags openblas . -exp all -out ../docs/results
//
// experiments/ is a Go module of its own (github.com/dpcluster/dpcluster/experiments,
// with a replace directive to the product in ../), so that the product's go.mod
// does not require gonum/plot and its font, LaTeX and PDF packages. Build, vet
// and test it from this directory; `go test ./...` at the root skips it.
//
// Experiments (-exp, comma-separated, or "all"):
//
//	table    the paper's Table 1: DP-SGD, DP-Adam and DP-AdamBC at
//	         ε ∈ {1, 3, 7} (δ = 1e-5), hyperparameters tuned on a grid
//	         on a validation split (at -tune-eps, or at every ε with
//	         -tune-per-eps), mean (std) test accuracy over seeds
//	sgdm     Figure 2 and Eq. 3: DP-Adam and DP-SGDM with the learning-rate
//	         schedule of Eq. 3 on the same noise and batches
//	moments  Table 2 and Figure 3: summary statistics of m̂ᶜ, m̂ᵖ, v̂ᶜ, v̂ᵖ,
//	         v̂ᶜᵒʳʳ and the updates at the end of a DP-AdamBC run
//	phi      Figure 4 (upper left): DP-AdamBC subtracting Φ' = 0.1Φ, Φ, 10Φ
//	nodp     reference without noise (σ = 0, NOT private): does Adam beat
//	         SGD on each task at all?
//	gridcheck  extra grid points past the edges the table's tuning chose
//	cell     one fixed setting (-cell) at every ε and seed, no tuning
//	probe    time one DP-AdamBC run per task (cost per step) before big runs
//
// These are experiments, not private training runs: noise and sampling
// are seeded (reproducible, NOT private), hyperparameter tuning spends no
// privacy budget in the accounting (as in the paper), and the moments and
// sgdm experiments compute NON-PRIVATE diagnostics (moments of the
// un-noised clipped gradients, training loss). Those exist only in this
// program; nothing here changes the product's code paths.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/model"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "experiments:", err)
		os.Exit(1)
	}
}

// options are the command-line settings.
type options struct {
	exps     []string
	tasks    []string
	out      string
	seeds    int
	eps      []float64
	tuneEps  float64
	workers  int
	stepsMul float64
	// tunePerEps tunes the table at every ε of eps instead of at tuneEps
	// only (each ε then gets its own chosen setting).
	tunePerEps bool
	// wideGrid replaces each task's Grid with its WideGrid.
	wideGrid bool
	// cellAlgo and cellHyper are the setting of the cell experiment.
	cellAlgo  dpadam.Algorithm
	cellHyper Hyper
}

func run(args []string) error {
	fs := flag.NewFlagSet("experiments", flag.ContinueOnError)
	var (
		exps     = fs.String("exp", "all", "experiments to run: table, sgdm, moments, phi (comma-separated) or all")
		tasks    = fs.String("tasks", strings.Join(taskNames, ","), "tasks for the table experiment")
		out      = fs.String("out", "docs/results", "output directory for CSV, markdown and PNG files")
		seeds    = fs.Int("seeds", 3, "seeds per table cell")
		epsList  = fs.String("eps", "1,3,7", "privacy budgets ε of the table (δ = 1e-5)")
		tuneEps  = fs.Float64("tune-eps", 3, "ε at which the table's hyperparameters are tuned (one seed)")
		workers  = fs.Int("workers", 1, "runs in parallel (each run also uses GOMAXPROCS goroutines)")
		stepsMul = fs.Float64("steps-scale", 1, "multiply every task's number of steps (σ is recalibrated)")
		perEps   = fs.Bool("tune-per-eps", false, "tune the table at every ε of -eps (the paper's protocol) instead of at -tune-eps only")
		wide     = fs.Bool("wide-grid", false, "tune over each task's wide grid (only tasks that define one: fortunes-lm)")
		cellSpec = fs.String("cell", "", "the cell experiment's setting: optimizer,η,γ (dp-adam) or γ'/Φ (dp-adambc) or 0 (dp-sgd, dp-sgdm: momentum 0.9), e.g. dp-adambc,0.03,3")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	o := options{out: *out, seeds: *seeds, tuneEps: *tuneEps, workers: *workers, stepsMul: *stepsMul, tunePerEps: *perEps, wideGrid: *wide}
	tuneEpsSet := false
	fs.Visit(func(f *flag.Flag) { tuneEpsSet = tuneEpsSet || f.Name == "tune-eps" })
	if tuneEpsSet && o.tunePerEps {
		return fmt.Errorf("-tune-eps and -tune-per-eps exclude each other")
	}
	if *cellSpec != "" {
		var err error
		if o.cellAlgo, o.cellHyper, err = parseCell(*cellSpec); err != nil {
			return err
		}
	}
	o.exps = strings.Split(*exps, ",")
	if *exps == "all" {
		o.exps = []string{"table", "sgdm", "moments", "phi"}
	}
	o.tasks = strings.Split(*tasks, ",")
	for _, s := range strings.Split(*epsList, ",") {
		var e float64
		if _, err := fmt.Sscan(s, &e); err != nil {
			return fmt.Errorf("-eps: %q: %w", s, err)
		}
		o.eps = append(o.eps, e)
	}
	if o.seeds < 1 || o.stepsMul <= 0 {
		return fmt.Errorf("-seeds must be ≥ 1 and -steps-scale > 0")
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	log.Info("experiments: seeded noise and sampling: these runs are NOT differentially private releases",
		"backend", model.DefaultBackend().Name(), "GOMAXPROCS", runtime.GOMAXPROCS(0))

	cache := map[string]*Task{}
	load := func(name string) (*Task, error) {
		if t, ok := cache[name]; ok {
			return t, nil
		}
		t, err := loadTask(ctx, name, log)
		if err != nil {
			return nil, err
		}
		t.Steps = max(1, int(float64(t.Steps)*o.stepsMul+0.5))
		if o.wideGrid {
			if t.WideGrid == nil {
				return nil, fmt.Errorf("-wide-grid: task %s has no wide grid", name)
			}
			t.Grid = t.WideGrid
		}
		cache[name] = t
		return t, nil
	}
	// loadAll loads every task named by -tasks (once each, cached).
	loadAll := func() ([]*Task, error) {
		var ts []*Task
		for _, n := range o.tasks {
			t, err := load(n)
			if err != nil {
				return nil, err
			}
			ts = append(ts, t)
		}
		return ts, nil
	}
	for _, e := range o.exps {
		start := time.Now()
		var err error
		switch e {
		case "table":
			ts, lerr := loadAll()
			if lerr != nil {
				return lerr
			}
			err = tableExperiment(ctx, ts, o, log)
		case "nodp":
			ts, lerr := loadAll()
			if lerr != nil {
				return lerr
			}
			err = nodpExperiment(ctx, ts, o, log)
		case "cell":
			if *cellSpec == "" {
				return fmt.Errorf("-exp cell needs -cell")
			}
			ts, lerr := loadAll()
			if lerr != nil {
				return lerr
			}
			err = cellExperiment(ctx, ts, o, log)
		case "replot-table":
			err = replotTable(o)
		case "gridcheck":
			ts, lerr := loadAll()
			if lerr != nil {
				return lerr
			}
			err = gridcheckExperiment(ctx, ts, o, log)
		case "probe":
			for _, n := range o.tasks {
				t, lerr := load(n)
				if lerr != nil {
					return lerr
				}
				if err = probe(ctx, t, log); err != nil {
					break
				}
			}
		case "sgdm", "moments", "phi":
			name := "fortunes"
			if !slices.Contains(o.tasks, name) {
				name = o.tasks[0]
			}
			t, lerr := load(name)
			if lerr != nil {
				return lerr
			}
			switch e {
			case "sgdm":
				err = sgdmExperiment(ctx, t, o, log)
			case "moments":
				err = momentsExperiment(ctx, t, o, log)
			case "phi":
				err = phiExperiment(ctx, t, o, log)
			}
		default:
			err = fmt.Errorf("unknown experiment %q", e)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", e, err)
		}
		log.Info("experiment done", "exp", e, "wall", time.Since(start).Round(time.Second))
	}
	return nil
}
