package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/model"
)

// TestLocalTransformerOnFortunes: `local` trains a (small) transformer on
// the fortunes-seq next-token data through the real path, and the
// validation perplexity it reports falls (issue 30). The preset is the
// same architecture, wider; this one keeps the test to seconds.
func TestLocalTransformerOnFortunes(t *testing.T) {
	if _, err := os.Stat(dataset.FortunesDir); err != nil {
		t.Skipf("the Debian package fortunes is not installed (%v); .ci/run installs it", err)
	}
	spec, err := json.Marshal(model.TransformerLM(dataset.ByteVocab, 16, 32, 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	specPath := filepath.Join(t.TempDir(), "tiny-transformer.json")
	if err := os.WriteFile(specPath, spec, 0o644); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var evals []coordinator.Progress
	hooks := LocalHooks{OnStep: func(p coordinator.Progress) {
		if p.EvalStep == p.Step && p.EvalStep > 0 {
			mu.Lock()
			evals = append(evals, p)
			mu.Unlock()
		}
	}}
	var stdout, stderr lockedBuffer
	args := []string{"--model-spec", specPath, "--dataset", "fortunes-seq", "--nodes", "1", "--batch-size", "64",
		"--max-steps", "40", "--eval-every", "20", "--target-epsilon", "8", "--data-dir", t.TempDir(), "--progress", "off"}
	if err := RunLocal(context.Background(), args, &stdout, &stderr, hooks); err != nil {
		t.Fatalf("local: %v\n%s", err, stderr.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(evals) < 2 {
		t.Fatalf("%d evaluations during the run, want at least 2:\n%s", len(evals), stderr.String())
	}
	first, last := evals[0].Eval, evals[len(evals)-1].Eval
	for _, e := range []coordinator.Evaluation{first, last} {
		if e.Tokens <= e.N || e.Perplexity() <= 1 {
			t.Fatalf("evaluation %+v: not a next-token evaluation (tokens over examples, perplexity > 1)", e)
		}
	}
	if !(last.Perplexity() < first.Perplexity()) {
		t.Errorf("validation perplexity %.2f at step %d, %.2f at step %d: it did not fall",
			first.Perplexity(), evals[0].EvalStep, last.Perplexity(), evals[len(evals)-1].EvalStep)
	}
	if !strings.Contains(stdout.String(), "perplexity") {
		t.Errorf("the summary does not give the perplexity:\n%s", stdout.String())
	}
	t.Logf("validation perplexity %.2f at step %d → %.2f at step %d", first.Perplexity(), evals[0].EvalStep,
		last.Perplexity(), evals[len(evals)-1].EvalStep)
}
