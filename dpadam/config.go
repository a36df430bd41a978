package dpadam

import (
	"errors"
	"fmt"
	"math"
)

// Algorithm names an update rule. The values are the names used in
// configuration files and in the conformance vectors.
type Algorithm string

// The four optimizers of the DP-AdamBC paper (Tang, Shpilevskiy, Lécuyer,
// "DP-AdamBC: Your DP-Adam Is Actually DP-SGD (Unless You Apply Bias
// Correction)", AAAI 2024). All four consume the same privatized gradient g̃;
// they differ only in the update rule.
const (
	// AdamBC is DP-AdamBC, Algorithm 1 of the paper (Eq. 4):
	// θ ← θ − η·m̂/sqrt(max(v̂ − Φ, γ')), Φ = (σC/B)².
	AdamBC Algorithm = "dp-adambc"
	// Adam is DP-Adam, the paper's §3 baseline (Adam applied to g̃):
	// θ ← θ − η·m̂/(sqrt(v̂) + γ).
	Adam Algorithm = "dp-adam"
	// SGD is DP-SGD (Abadi et al. 2016, Algorithm 1): θ ← θ − η·g̃.
	SGD Algorithm = "dp-sgd"
	// SGDM is DP-SGD with momentum, the paper's §3.2 formulation:
	// b ← μ·b + g̃; θ ← θ − η·b.
	SGDM Algorithm = "dp-sgdm"
)

// ErrInvalidConfig is returned (wrapped, with the offending field) by
// Config.Validate, New and UnmarshalBinary when a configuration value is out
// of range, non-finite, or names an unknown algorithm.
var ErrInvalidConfig = errors.New("dpadam: invalid config")

// Config holds the optimizer's hyperparameters. It is a plain value: copy it
// freely. Every field is validated by Validate, including fields the chosen
// Algorithm does not use (a wrong option is an error, never ignored).
//
// NoiseMultiplier, ClipNorm and ExpectedBatchSize must be the values of the
// Gaussian mechanism that actually produced g̃ (σ, C and the public expected
// batch size B of g̃ = (Σ clipped + N(0, σ²C²I))/B): DP-AdamBC subtracts the
// noise variance Φ = (σC/B)² they imply from v̂, so wrong values silently
// mis-correct. The defaults for these three are placeholders.
type Config struct {
	// Algorithm selects the update rule. Default AdamBC.
	Algorithm Algorithm
	// LearningRate is η, > 0. Default 1e-3.
	LearningRate float64
	// Beta1 and Beta2 are Adam's moment decay rates, each in [0, 1).
	// Defaults 0.9 and 0.999 (the paper's experiments).
	Beta1, Beta2 float64
	// AdamEps is γ of DP-Adam, added to sqrt(v̂); > 0 for Adam, ≥ 0
	// otherwise. Default 1e-8.
	AdamEps float64
	// GammaPrime is γ' of DP-AdamBC, the floor under v̂ − Φ (inside the square
	// root, paper §4 "The numerical stability constant"); > 0 for AdamBC,
	// ≥ 0 otherwise. Default 1e-10.
	GammaPrime float64
	// Momentum is μ of DP-SGDM, in [0, 1). Default 0.9.
	Momentum float64
	// NoiseMultiplier is σ, ≥ 0. Default 1 (placeholder, see above).
	NoiseMultiplier float64
	// ClipNorm is the per-example L2 clipping norm C, > 0. Default 1
	// (placeholder).
	ClipNorm float64
	// ExpectedBatchSize is B, the public expected batch size g̃ is divided
	// by, > 0. Default 256 (placeholder).
	ExpectedBatchSize float64
	// PhiScale multiplies Φ in the DP-AdamBC correction, ≥ 0; 1 is the
	// paper, 0 means 1 (so a zero Config field keeps the paper's rule).
	// Other values serve the Φ' over/under-correction experiments.
	// Default 1.
	PhiScale float64
}

// DefaultConfig returns the defaults: DP-AdamBC with η = 1e-3,
// β = (0.9, 0.999), γ' = 1e-10, γ = 1e-8, μ = 0.9, PhiScale = 1, and
// placeholder mechanism parameters σ = 1, C = 1, B = 256 that callers must
// replace with their run's values.
func DefaultConfig() Config {
	return Config{
		Algorithm:         AdamBC,
		LearningRate:      1e-3,
		Beta1:             0.9,
		Beta2:             0.999,
		AdamEps:           1e-8,
		GammaPrime:        1e-10,
		Momentum:          0.9,
		NoiseMultiplier:   1,
		ClipNorm:          1,
		ExpectedBatchSize: 256,
		PhiScale:          1,
	}
}

// Validate reports whether c is usable. The error wraps ErrInvalidConfig and
// names the first offending field. Rules: the Algorithm is one of the four
// constants; every number is finite (no NaN, no ±Inf); LearningRate,
// ClipNorm and ExpectedBatchSize are > 0; Beta1, Beta2 and Momentum are in
// [0, 1); NoiseMultiplier, AdamEps, GammaPrime and PhiScale are ≥ 0;
// GammaPrime > 0 for AdamBC and AdamEps > 0 for Adam; Φ is finite.
func (c Config) Validate() error {
	switch c.Algorithm {
	case AdamBC, Adam, SGD, SGDM:
	default:
		return fmt.Errorf("%w: unknown algorithm %q (want %q, %q, %q or %q)",
			ErrInvalidConfig, c.Algorithm, AdamBC, Adam, SGD, SGDM)
	}
	fields := [...]struct {
		name string
		val  float64
	}{
		{"LearningRate", c.LearningRate},
		{"Beta1", c.Beta1},
		{"Beta2", c.Beta2},
		{"AdamEps", c.AdamEps},
		{"GammaPrime", c.GammaPrime},
		{"Momentum", c.Momentum},
		{"NoiseMultiplier", c.NoiseMultiplier},
		{"ClipNorm", c.ClipNorm},
		{"ExpectedBatchSize", c.ExpectedBatchSize},
		{"PhiScale", c.PhiScale},
	}
	for _, f := range fields {
		if math.IsNaN(f.val) || math.IsInf(f.val, 0) {
			return fmt.Errorf("%w: %s = %v is not finite", ErrInvalidConfig, f.name, f.val)
		}
	}
	positive := func(name string, v float64) error {
		if v <= 0 {
			return fmt.Errorf("%w: %s = %v, want > 0", ErrInvalidConfig, name, v)
		}
		return nil
	}
	nonNegative := func(name string, v float64) error {
		if v < 0 {
			return fmt.Errorf("%w: %s = %v, want >= 0", ErrInvalidConfig, name, v)
		}
		return nil
	}
	unit := func(name string, v float64) error {
		if v < 0 || v >= 1 {
			return fmt.Errorf("%w: %s = %v, want in [0, 1)", ErrInvalidConfig, name, v)
		}
		return nil
	}
	for _, err := range [...]error{
		positive("LearningRate", c.LearningRate),
		unit("Beta1", c.Beta1),
		unit("Beta2", c.Beta2),
		nonNegative("AdamEps", c.AdamEps),
		nonNegative("GammaPrime", c.GammaPrime),
		unit("Momentum", c.Momentum),
		nonNegative("NoiseMultiplier", c.NoiseMultiplier),
		positive("ClipNorm", c.ClipNorm),
		positive("ExpectedBatchSize", c.ExpectedBatchSize),
		nonNegative("PhiScale", c.PhiScale),
	} {
		if err != nil {
			return err
		}
	}
	switch c.Algorithm {
	case AdamBC:
		if c.GammaPrime <= 0 {
			return fmt.Errorf("%w: GammaPrime = %v, want > 0 for %s", ErrInvalidConfig, c.GammaPrime, c.Algorithm)
		}
	case Adam:
		if c.AdamEps <= 0 {
			return fmt.Errorf("%w: AdamEps = %v, want > 0 for %s", ErrInvalidConfig, c.AdamEps, c.Algorithm)
		}
	}
	if phi := c.Phi(); math.IsInf(phi, 0) || math.IsNaN(phi) {
		return fmt.Errorf("%w: Phi = (σC/B)²·PhiScale = %v is not finite", ErrInvalidConfig, phi)
	}
	return nil
}

// Phi returns the DP noise bias of the second moment, Φ = (σC/B)² (paper
// Eq. 3: E[v_t] = E[v_t^c] + (1−β2^t)Φ, so E[v̂_t] = E[v̂_t^c] + Φ), multiplied
// by PhiScale (0 meaning 1). It is the quantity DP-AdamBC subtracts from v̂.
// It depends only on public hyperparameters, so using it costs no privacy
// (paper §4, post-processing).
func (c Config) Phi() float64 {
	s := c.NoiseMultiplier * c.ClipNorm / c.ExpectedBatchSize
	phi := s * s
	if c.PhiScale != 0 {
		phi *= c.PhiScale
	}
	return phi
}
