package main

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/model"
)

// TestFortunesLMTask builds the fortunes-lm task from a small generated
// fortunes directory: the splits are the corpus's, by document, with no
// window shared between them; the model accepts every split; and each
// optimizer has a grid (DP-AdamBC's with γ'). A short DP-AdamBC run
// reports a finite perplexity within (1, ByteVocab·e) and a table row.
func TestFortunesLMTask(t *testing.T) {
	dir := t.TempDir()
	var entries []string
	for i := range 60 {
		entries = append(entries, strings.Repeat("the cat sat on the mat, said fortune "+string(rune('a'+i%26))+". ", 1+i%3))
	}
	if err := os.WriteFile(filepath.Join(dir, "cats"), []byte(strings.Join(entries, "\n%\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	task, err := fortunesLMTask(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !nextToken(task) || task.Spec.Classes != dataset.ByteVocab || task.Spec.Input[0] != lmContext+1 {
		t.Fatalf("spec %+v is not a byte-level next-token model at T = %d", task.Spec, lmContext)
	}
	m, err := model.New(task.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if m.NumParams() != 54930 {
		t.Errorf("%d parameters, the doc comment says 54,930", m.NumParams())
	}
	for name, d := range map[string]*dataset.Dataset{"train": task.Train, "val": task.Val, "test": task.Test} {
		if d == nil || d.Len() == 0 {
			t.Fatalf("%s split is empty", name)
		}
		if err := m.CheckDataset(d); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if n := task.Train.Len() + task.Val.Len() + task.Test.Len(); task.Train.Len() < n/2 {
		t.Errorf("train holds %d of %d windows, want the 80%% split's share", task.Train.Len(), n)
	}
	for _, a := range tableAlgos {
		if len(task.Grid[a]) == 0 {
			t.Errorf("no grid for %s", a)
		}
	}
	// The wide grid holds the grid and reaches one learning-rate step
	// past an edge of it for every optimizer.
	for _, a := range tableAlgos {
		lrs := func(hs []Hyper) (lo, hi float64) {
			lo, hi = math.Inf(1), 0
			for _, h := range hs {
				lo, hi = min(lo, h.LR), max(hi, h.LR)
			}
			return lo, hi
		}
		for _, h := range task.Grid[a] {
			if !slices.Contains(task.WideGrid[a], h) {
				t.Errorf("%s: wide grid lacks the grid's %+v", a, h)
			}
		}
		glo, ghi := lrs(task.Grid[a])
		wlo, whi := lrs(task.WideGrid[a])
		if !(wlo < glo || whi > ghi) {
			t.Errorf("%s: wide grid's η range [%g, %g] is not past the grid's [%g, %g]", a, wlo, whi, glo, ghi)
		}
	}
	for _, h := range task.Grid[dpadam.AdamBC] {
		if h.GammaPrimeRel <= 0 {
			t.Errorf("DP-AdamBC grid point %+v has no γ'", h)
		}
	}
	task.Steps, task.B = 3, 16
	sigma, err := sigmaFor(task, 3)
	if err != nil {
		t.Fatal(err)
	}
	r := trainRun(context.Background(), task, optimizerConfig(task, dpadam.AdamBC, task.Grid[dpadam.AdamBC][0], sigma), 1, 0)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if p := perplexity(r.Test.Loss); !(p > 1 && p < dataset.ByteVocab*math.E) || r.Test.Tokens == 0 {
		t.Errorf("test perplexity %v over %d tokens, want in (1, %v)", p, r.Test.Tokens, dataset.ByteVocab*math.E)
	}
	c := cell{Task: task.Name, Algo: dpadam.AdamBC, Eps: 3, Acc: []float64{r.Test.Accuracy}, Loss: []float64{r.Test.Loss}}
	find := func(string, dpadam.Algorithm, float64) *cell { return &c }
	md := perplexityMarkdown([]*Task{task}, []float64{3}, find)
	if !strings.Contains(md, "| fortunes-lm | "+string(dpadam.AdamBC)+" |") {
		t.Errorf("perplexity table has no DP-AdamBC row:\n%s", md)
	}
}

// TestFortunesLMPackage builds the task from the installed Debian
// fortunes, and skips when the package is absent.
func TestFortunesLMPackage(t *testing.T) {
	if _, err := os.Stat(FortunesDir); err != nil {
		t.Skipf("the Debian package fortunes is not installed: %v", err)
	}
	task, err := fortunesLMTask(FortunesDir)
	if err != nil {
		t.Fatal(err)
	}
	if task.Train.Len() < 10000 || task.Val.Len() < 1000 || task.Test.Len() < 1000 {
		t.Errorf("windows train %d, validation %d, test %d: smaller than the fortunes give", task.Train.Len(), task.Val.Len(), task.Test.Len())
	}
}
