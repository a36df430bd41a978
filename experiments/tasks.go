package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/model"
)

// Task is one learning problem of the experiments with its DP mechanism
// constants and the hyperparameter grid each optimizer is tuned over.
type Task struct {
	Name string
	// Favors is "adam" or "sgd": which optimizer the paper's argument
	// predicts does better without DP.
	Favors string
	Spec   model.Spec
	// Train is the training set, Val a validation split carved from the
	// original training data (used only to choose hyperparameters) and
	// Test the held-out test set (reported).
	Train, Val, Test *dataset.Dataset
	// B is the expected batch size, C the clipping norm, Steps the number
	// of noisy steps of every run (σ is calibrated for them).
	B, C  float64
	Steps int
	// Grid holds the candidate settings per optimizer.
	Grid map[dpadam.Algorithm][]Hyper
	// WideGrid, if not nil, is a larger grid that -wide-grid tunes over
	// instead of Grid.
	WideGrid map[dpadam.Algorithm][]Hyper
}

// Hyper is one grid point: the learning rate and, for DP-Adam, γ, and for
// DP-AdamBC, γ' as a multiple of Φ (GammaPrimeRel; γ' = GammaPrimeRel·Φ,
// so the floor follows the noise level when ε changes).
type Hyper struct {
	LR            float64
	AdamEps       float64
	GammaPrimeRel float64
}

// grid returns the cross product of lrs with the second values.
func grid(algo dpadam.Algorithm, lrs []float64, seconds ...float64) []Hyper {
	if len(seconds) == 0 {
		seconds = []float64{0}
	}
	var out []Hyper
	for _, s := range seconds {
		for _, lr := range lrs {
			h := Hyper{LR: lr}
			switch algo {
			case dpadam.Adam:
				h.AdamEps = s
			case dpadam.AdamBC:
				h.GammaPrimeRel = s
			}
			out = append(out, h)
		}
	}
	return out
}

// optimizerConfig is the dpadam configuration of one run: the product's
// defaults (β1 = 0.9, β2 = 0.999, μ = 0.9) with the task's mechanism
// constants, σ, and the grid point.
func optimizerConfig(t *Task, algo dpadam.Algorithm, h Hyper, sigma float64) dpadam.Config {
	c := dpadam.DefaultConfig()
	c.Algorithm = algo
	c.LearningRate = h.LR
	c.NoiseMultiplier = sigma
	c.ClipNorm = t.C
	c.ExpectedBatchSize = t.B
	if h.AdamEps > 0 {
		c.AdamEps = h.AdamEps
	}
	if h.GammaPrimeRel > 0 {
		c.GammaPrime = h.GammaPrimeRel * c.Phi()
	}
	return c
}

// taskNames lists the tasks of the full experiments, Adam-favoring first.
var taskNames = []string{"zipf", "fortunes", "fmnist-mlp", "fmnist-cnn"}

// extraTasks are tasks loadTask knows that the default -tasks list leaves
// out (run them by name).
var extraTasks = []string{"fortunes-lm"}

// loadTask builds the named task at full scale. Fashion-MNIST comes from
// dataset.LoadFashionMNIST (the Debian package dataset-fashion-mnist),
// the text task from FortunesDir.
func loadTask(ctx context.Context, name string, log *slog.Logger) (*Task, error) {
	lrSGD := []float64{0.5, 1, 2, 4}
	lrAdam := []float64{1e-3, 3e-3, 1e-2, 3e-2}
	lrBC := []float64{3e-4, 1e-3, 3e-3, 1e-2}
	grids := func(sgd, adam, bc []float64) map[dpadam.Algorithm][]Hyper {
		return map[dpadam.Algorithm][]Hyper{
			dpadam.SGD:    grid(dpadam.SGD, sgd),
			dpadam.Adam:   grid(dpadam.Adam, adam, 1e-8),
			dpadam.AdamBC: grid(dpadam.AdamBC, bc, 0.01, 0.1),
		}
	}
	switch name {
	case "zipf":
		cfg := dataset.DefaultZipfConfig() // 1000 classes, s = 1, 64 dims
		cfg.N = 50000
		d, err := dataset.ZipfClasses(cfg)
		if err != nil {
			return nil, err
		}
		tr, te, err := dataset.Split(d, 0.2, 1)
		if err != nil {
			return nil, err
		}
		return finishTask(&Task{Name: name, Favors: "adam", Spec: model.LogReg([]int{cfg.Dim}, cfg.Classes),
			B: 256, C: 1, Steps: 600, Grid: grids([]float64{8, 32, 128}, []float64{1e-2, 3e-2, 1e-1}, []float64{3e-3, 1e-2, 3e-2})}, tr, te)
	case "fortunes":
		docs, err := readFortunes(FortunesDir)
		if err != nil {
			return nil, err
		}
		tr, te, classes, err := textTask(docs, 50, 4000, 64, 0.2, 1)
		if err != nil {
			return nil, err
		}
		log.Info("fortunes task", "classes", len(classes), "train", tr.Len(), "test", te.Len(), "largest", classes[0], "smallest", classes[len(classes)-1])
		return finishTask(&Task{Name: name, Favors: "adam", Spec: model.TextBag(4000, 64, 64, len(classes), 64),
			B: 256, C: 1, Steps: 600, Grid: grids([]float64{2, 8, 32}, lrAdam, lrBC)}, tr, te)
	case "fortunes-lm":
		t, err := fortunesLMTask(FortunesDir)
		if err == nil {
			log.Info("fortunes-lm task", "train", t.Train.Len(), "validation", t.Val.Len(), "test", t.Test.Len())
		}
		return t, err
	case "fmnist-mlp", "fmnist-cnn":
		steps := 400
		if name == "fmnist-cnn" {
			// The cnn step costs ~4× the mlp's: fewer steps and a smaller
			// grid keep the task within the machine's budget.
			steps = 300
			lrSGD, lrAdam, lrBC = []float64{1, 2, 4}, []float64{1e-3, 3e-3, 1e-2}, []float64{1e-3, 3e-3}
		}
		opts := dataset.DefaultLoadOptions()
		opts.Logger = log
		tr, te, err := dataset.LoadFashionMNIST(ctx, opts)
		if err != nil {
			return nil, err
		}
		spec, _ := model.Preset(name[len("fmnist-"):])
		return finishTask(&Task{Name: name, Favors: "sgd", Spec: spec,
			B: 256, C: 1, Steps: steps, Grid: grids(lrSGD, lrAdam, lrBC)}, tr, te)
	}
	return nil, fmt.Errorf("unknown task %q (have %v and %v)", name, taskNames, extraTasks)
}

// finishTask carves a 10% validation split out of train.
func finishTask(t *Task, train, test *dataset.Dataset) (*Task, error) {
	tr, val, err := dataset.Split(train, 0.1, 2)
	if err != nil {
		return nil, err
	}
	t.Train, t.Val, t.Test = tr, val, test
	return t, nil
}

// tinyTasks are generated stand-ins for the real tasks, small enough for
// unit tests: a 10-class Zipf task (logreg), a synthetic token task
// (textbag) and a tiny image task (a small MLP).
func tinyTasks() ([]*Task, error) {
	small := func() map[dpadam.Algorithm][]Hyper {
		return map[dpadam.Algorithm][]Hyper{
			dpadam.SGD:    grid(dpadam.SGD, []float64{1, 4}),
			dpadam.Adam:   grid(dpadam.Adam, []float64{1e-2}, 1e-8),
			dpadam.AdamBC: grid(dpadam.AdamBC, []float64{1e-2}, 0.1),
		}
	}
	zc := dataset.ZipfConfig{N: 600, Dim: 8, Classes: 10, Exponent: 1, Separation: 1, Noise: 0.1, Seed: 3}
	z, err := dataset.ZipfClasses(zc)
	if err != nil {
		return nil, err
	}
	ztr, zte, err := dataset.Split(z, 0.2, 1)
	if err != nil {
		return nil, err
	}
	zipf, err := finishTask(&Task{Name: "tiny-zipf", Favors: "adam", Spec: model.LogReg([]int{8}, 10),
		B: 32, C: 1, Steps: 20, Grid: small()}, ztr, zte)
	if err != nil {
		return nil, err
	}
	// Token task: class c prefers tokens in [10c, 10c+10).
	r := rand.New(rand.NewPCG(5, 6))
	var docs [][]int32
	var labels []int32
	for range 500 {
		c := int32(r.IntN(4))
		doc := make([]int32, 3+r.IntN(8))
		for j := range doc {
			if r.IntN(2) == 0 {
				doc[j] = 10*c + int32(r.IntN(10))
			} else {
				doc[j] = int32(r.IntN(50))
			}
		}
		docs, labels = append(docs, doc), append(labels, c)
	}
	tok, err := dataset.FromTokens(docs, labels, 12, 50, 4)
	if err != nil {
		return nil, err
	}
	ttr, tte, err := dataset.Split(tok, 0.2, 1)
	if err != nil {
		return nil, err
	}
	text, err := finishTask(&Task{Name: "tiny-text", Favors: "adam", Spec: model.TextBag(50, 8, 8, 4, 12),
		B: 32, C: 1, Steps: 20, Grid: small()}, ttr, tte)
	if err != nil {
		return nil, err
	}
	g, err := dataset.GaussianMixture(500, 16, 3, 4, 7)
	if err != nil {
		return nil, err
	}
	gtr, gte, err := dataset.Split(g, 0.2, 1)
	if err != nil {
		return nil, err
	}
	img, err := finishTask(&Task{Name: "tiny-mlp", Favors: "sgd", Spec: model.MLP([]int{16}, []int{8}, 3),
		B: 32, C: 1, Steps: 20, Grid: small()}, gtr, gte)
	if err != nil {
		return nil, err
	}
	return []*Task{zipf, text, img}, nil
}
