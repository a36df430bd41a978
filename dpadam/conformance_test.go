package dpadam

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/dpcluster/dpcluster/internal/conformance"
)

// conformanceFile is the reference-vector file: float64 trajectories
// of Algorithm 1 and the baselines, produced independently of this package.
type conformanceFile struct {
	About string            `json:"about"`
	Cases []conformanceCase `json:"cases"`
}

type conformanceCase struct {
	Name              string      `json:"name"`
	Optimizer         Algorithm   `json:"optimizer"`
	D                 int         `json:"d"`
	Steps             int         `json:"steps"`
	ExpectedBatchSize float64     `json:"expected_batch_size"`
	ClipNorm          float64     `json:"clip_norm"`
	NoiseMultiplier   float64     `json:"noise_multiplier"`
	LR                float64     `json:"lr"`
	Theta0            []float64   `json:"theta0"`
	Beta1             *float64    `json:"beta1"`
	Beta2             *float64    `json:"beta2"`
	GammaPrime        *float64    `json:"gamma_prime"`
	Eps               *float64    `json:"eps"`
	Momentum          *float64    `json:"momentum"`
	Phi               float64     `json:"phi"`
	NoisyGrads        [][]float64 `json:"noisy_grads"`
	Theta             [][]float64 `json:"theta"`
}

// config builds the Config of c, taking DefaultConfig values for the fields
// the case does not specify (e.g. DP-SGD has no betas).
func (c *conformanceCase) config() Config {
	cfg := DefaultConfig()
	cfg.Algorithm = c.Optimizer
	cfg.LearningRate = c.LR
	cfg.NoiseMultiplier = c.NoiseMultiplier
	cfg.ClipNorm = c.ClipNorm
	cfg.ExpectedBatchSize = c.ExpectedBatchSize
	for _, f := range []struct {
		dst *float64
		src *float64
	}{
		{&cfg.Beta1, c.Beta1},
		{&cfg.Beta2, c.Beta2},
		{&cfg.GammaPrime, c.GammaPrime},
		{&cfg.AdamEps, c.Eps},
		{&cfg.Momentum, c.Momentum},
	} {
		if f.src != nil {
			*f.dst = *f.src
		}
	}
	return cfg
}

// TestConformance runs every case of the committed vector file
// (testdata/conformance/dpadam_vectors.json; see its README.md) and of the
// file named by $DPADAM_VECTORS, if set. A missing or unreadable file is a
// failure, never a skip.
func TestConformance(t *testing.T) {
	files := []string{conformance.Path(t, "dpadam_vectors.json")}
	if extra := os.Getenv("DPADAM_VECTORS"); extra != "" {
		files = append(files, extra)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			runConformanceFile(t, path)
		})
	}
}

func runConformanceFile(t *testing.T, path string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading conformance vectors: %v", err)
	}
	var f conformanceFile
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatalf("parsing %s: %v", path, err)
	}
	if len(f.Cases) == 0 {
		t.Fatalf("%s holds no cases", path)
	}
	t.Logf("%s: %s", path, f.About)
	for _, c := range f.Cases {
		t.Run(c.Name, func(t *testing.T) { runConformanceCase(t, &c) })
	}
}

func runConformanceCase(t *testing.T, c *conformanceCase) {
	if len(c.Theta0) != c.D || len(c.NoisyGrads) != c.Steps || len(c.Theta) != c.Steps {
		t.Fatalf("malformed case: d=%d steps=%d but %d theta0, %d noisy_grads, %d theta",
			c.D, c.Steps, len(c.Theta0), len(c.NoisyGrads), len(c.Theta))
	}
	cfg := c.config()
	if got, want := cfg.Phi(), c.Phi; math.Abs(got-want) > 1e-12*math.Abs(want) {
		t.Errorf("Phi() = %.17g, want %.17g (relative tolerance 1e-12)", got, want)
	}
	opt, err := New(cfg, c.D)
	if err != nil {
		t.Fatalf("New(%+v, %d): %v", cfg, c.D, err)
	}
	theta := make([]float32, c.D)
	for i, x := range c.Theta0 {
		theta[i] = float32(x)
	}
	grad := make([]float32, c.D)
	for step := range c.Steps {
		if len(c.NoisyGrads[step]) != c.D || len(c.Theta[step]) != c.D {
			t.Fatalf("step %d: malformed vectors", step+1)
		}
		for i, x := range c.NoisyGrads[step] {
			grad[i] = float32(x)
		}
		d, err := opt.Step(theta, grad)
		if err != nil {
			t.Fatalf("step %d: %v", step+1, err)
		}
		if d.Step != int64(step+1) {
			t.Fatalf("step %d: Diagnostics.Step = %d", step+1, d.Step)
		}
		bad := 0
		for i, want := range c.Theta[step] {
			// Tolerance from the file's "about": a float32
			// implementation must match within 1e-4 + 1e-3·|want|.
			got := float64(theta[i])
			if math.Abs(got-want) > 1e-4+1e-3*math.Abs(want) {
				if bad < 5 {
					t.Errorf("step %d: theta[%d] = %.9g, want %.9g", step+1, i, got, want)
				}
				bad++
			}
		}
		if bad > 0 {
			t.Fatalf("step %d: %d of %d coordinates out of tolerance", step+1, bad, c.D)
		}
	}
}
