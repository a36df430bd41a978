package accounting

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/dpcluster/dpcluster/internal/conformance"
)

// accountantVectors is the format of testdata/conformance/accountant_vectors.json.
type accountantVectors struct {
	About string `json:"about"`
	Cases []struct {
		Name            string  `json:"name"`
		SampleRate      float64 `json:"sample_rate"`
		NoiseMultiplier float64 `json:"noise_multiplier"`
		Steps           int64   `json:"steps"`
		Delta           float64 `json:"delta"`
		RDPEpsilon      float64 `json:"rdp_epsilon"`
		PLDEpsilon      float64 `json:"pld_epsilon"`
	} `json:"cases"`
	Calibration []struct {
		TargetEpsilon float64 `json:"target_epsilon"`
		Delta         float64 `json:"delta"`
		SampleRate    float64 `json:"sample_rate"`
		Steps         int64   `json:"steps"`
		RDPSigma      float64 `json:"rdp_sigma"`
	} `json:"calibration"`
}

// vectorFiles returns the reference files to check: the committed one
// (testdata/conformance, see its README.md), and the file named by
// ACCOUNTANT_VECTORS if set. A named file that cannot be read fails the
// test rather than skipping it.
func vectorFiles(t *testing.T) []string {
	t.Helper()
	files := []string{conformance.Path(t, "accountant_vectors.json")}
	if f := os.Getenv("ACCOUNTANT_VECTORS"); f != "" {
		files = append(files, f)
	}
	return files
}

func loadVectors(t *testing.T, path string) accountantVectors {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading reference vectors: %v", err)
	}
	var v accountantVectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("parsing %s: %v", path, err)
	}
	if len(v.Cases)+len(v.Calibration) == 0 {
		t.Fatalf("%s holds no cases", path)
	}
	return v
}

func TestConformance(t *testing.T) {
	for _, path := range vectorFiles(t) {
		v := loadVectors(t, path)
		t.Run(filepath.Base(path), func(t *testing.T) {
			for _, c := range v.Cases {
				t.Run(c.Name, func(t *testing.T) {
					// Tolerance from the file's about field: relative 1e-6
					// against Opacus on Opacus's orders.
					got, order, err := opacusRDP(t).EpsilonOrder(SubsampledGaussian(c.SampleRate, c.NoiseMultiplier), c.Steps, c.Delta)
					if err != nil {
						t.Fatal(err)
					}
					if rel := math.Abs(got-c.RDPEpsilon) / c.RDPEpsilon; rel > 1e-6 {
						t.Errorf("ε on Opacus orders = %.12g (order %v), want %.12g (relative error %.2g > 1e-6)", got, order, c.RDPEpsilon, rel)
					}
					// More orders may only lower ε.
					def, _, err := RDP{}.EpsilonOrder(SubsampledGaussian(c.SampleRate, c.NoiseMultiplier), c.Steps, c.Delta)
					if err != nil {
						t.Fatal(err)
					}
					if def > got {
						t.Errorf("ε on default orders = %.12g exceeds ε on Opacus orders %.12g", def, got)
					}
				})
			}
			for _, c := range v.Calibration {
				name := "calibration"
				t.Run(name, func(t *testing.T) {
					// The about field: rdp_epsilon(σ) ≤ target and
					// σ ≤ rdp_sigma·(1+1e-3).
					sigma, err := RDP{}.Calibrate(c.TargetEpsilon, c.Steps, c.Delta, func(s float64) Event { return SubsampledGaussian(c.SampleRate, s) })
					if err != nil {
						t.Fatal(err)
					}
					eps, _, err := RDP{}.EpsilonOrder(SubsampledGaussian(c.SampleRate, sigma), c.Steps, c.Delta)
					if err != nil {
						t.Fatal(err)
					}
					if eps > c.TargetEpsilon {
						t.Errorf("calibrated σ=%.10g gives ε=%.12g > target %v", sigma, eps, c.TargetEpsilon)
					}
					if sigma > c.RDPSigma*(1+1e-3) {
						t.Errorf("calibrated σ=%.10g > reference %.10g·(1+1e-3)", sigma, c.RDPSigma)
					}
					// Also on Opacus's orders alone, where the reference was
					// bisected, the calibrator must be as tight.
					so, err := opacusRDP(t).Calibrate(c.TargetEpsilon, c.Steps, c.Delta, func(s float64) Event { return SubsampledGaussian(c.SampleRate, s) })
					if err != nil {
						t.Fatal(err)
					}
					if eo, _, _ := opacusRDP(t).EpsilonOrder(SubsampledGaussian(c.SampleRate, so), c.Steps, c.Delta); eo > c.TargetEpsilon {
						t.Errorf("Opacus-order σ=%.10g gives ε=%.12g > target", so, eo)
					}
					if rel := math.Abs(so-c.RDPSigma) / c.RDPSigma; rel > 1e-6 {
						t.Errorf("Opacus-order σ=%.10g, reference %.10g (relative %.2g)", so, c.RDPSigma, rel)
					}
				})
			}
		})
	}
}

// opacusRDP returns the RDP accountant over Opacus's orders.
func opacusRDP(t testing.TB) RDP {
	t.Helper()
	r, err := NewRDP(OpacusOrders())
	if err != nil {
		t.Fatal(err)
	}
	return r
}
