package dpadam

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestDefaultConfigValid(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v", err)
	}
	for _, alg := range algorithms {
		cfg := DefaultConfig()
		cfg.Algorithm = alg
		if err := cfg.Validate(); err != nil {
			t.Errorf("DefaultConfig with %s: %v", alg, err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	tests := []struct {
		name   string
		mutate func(*Config)
		field  string // must appear in the error; "" means valid
	}{
		{"unknown algorithm", func(c *Config) { c.Algorithm = "dp-adamw" }, "algorithm"},
		{"empty algorithm", func(c *Config) { c.Algorithm = "" }, "algorithm"},
		{"zero lr", func(c *Config) { c.LearningRate = 0 }, "LearningRate"},
		{"negative lr", func(c *Config) { c.LearningRate = -1e-3 }, "LearningRate"},
		{"NaN lr", func(c *Config) { c.LearningRate = nan }, "LearningRate"},
		{"Inf lr", func(c *Config) { c.LearningRate = inf }, "LearningRate"},
		{"beta1 = 1", func(c *Config) { c.Beta1 = 1 }, "Beta1"},
		{"beta1 < 0", func(c *Config) { c.Beta1 = -0.1 }, "Beta1"},
		{"beta1 NaN", func(c *Config) { c.Beta1 = nan }, "Beta1"},
		{"beta1 = 0", func(c *Config) { c.Beta1 = 0 }, ""},
		{"beta2 = 1", func(c *Config) { c.Beta2 = 1 }, "Beta2"},
		{"beta2 > 1", func(c *Config) { c.Beta2 = 1.5 }, "Beta2"},
		{"beta2 NaN", func(c *Config) { c.Beta2 = nan }, "Beta2"},
		{"gamma' zero for adambc", func(c *Config) { c.GammaPrime = 0 }, "GammaPrime"},
		{"gamma' negative", func(c *Config) { c.GammaPrime = -1e-10 }, "GammaPrime"},
		{"gamma' NaN", func(c *Config) { c.GammaPrime = nan }, "GammaPrime"},
		{"gamma' zero for adam", func(c *Config) { c.Algorithm, c.GammaPrime = Adam, 0 }, ""},
		{"eps zero for adam", func(c *Config) { c.Algorithm, c.AdamEps = Adam, 0 }, "AdamEps"},
		{"eps negative", func(c *Config) { c.AdamEps = -1 }, "AdamEps"},
		{"eps NaN", func(c *Config) { c.AdamEps = nan }, "AdamEps"},
		{"eps zero for adambc", func(c *Config) { c.AdamEps = 0 }, ""},
		{"momentum = 1", func(c *Config) { c.Momentum = 1 }, "Momentum"},
		{"momentum < 0", func(c *Config) { c.Momentum = -0.5 }, "Momentum"},
		{"momentum NaN", func(c *Config) { c.Algorithm, c.Momentum = SGDM, nan }, "Momentum"},
		{"momentum = 0 for sgdm", func(c *Config) { c.Algorithm, c.Momentum = SGDM, 0 }, ""},
		{"sigma negative", func(c *Config) { c.NoiseMultiplier = -1 }, "NoiseMultiplier"},
		{"sigma NaN", func(c *Config) { c.NoiseMultiplier = nan }, "NoiseMultiplier"},
		{"sigma zero", func(c *Config) { c.NoiseMultiplier = 0 }, ""},
		{"clip zero", func(c *Config) { c.ClipNorm = 0 }, "ClipNorm"},
		{"clip negative", func(c *Config) { c.ClipNorm = -1 }, "ClipNorm"},
		{"clip Inf", func(c *Config) { c.ClipNorm = inf }, "ClipNorm"},
		{"clip NaN", func(c *Config) { c.ClipNorm = nan }, "ClipNorm"},
		{"batch -Inf", func(c *Config) { c.ExpectedBatchSize = -inf }, "ExpectedBatchSize"},
		{"batch zero", func(c *Config) { c.ExpectedBatchSize = 0 }, "ExpectedBatchSize"},
		{"batch negative", func(c *Config) { c.ExpectedBatchSize = -256 }, "ExpectedBatchSize"},
		{"batch NaN", func(c *Config) { c.ExpectedBatchSize = nan }, "ExpectedBatchSize"},
		{"phi scale negative", func(c *Config) { c.PhiScale = -1 }, "PhiScale"},
		{"phi scale NaN", func(c *Config) { c.PhiScale = nan }, "PhiScale"},
		{"phi scale zero", func(c *Config) { c.PhiScale = 0 }, ""},
		{"phi overflows", func(c *Config) { c.NoiseMultiplier, c.ClipNorm, c.ExpectedBatchSize = 1e200, 1e200, 1e-200 }, "Phi"},
		{"sgd ignores nothing: bad beta", func(c *Config) { c.Algorithm, c.Beta1 = SGD, 2 }, "Beta1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.mutate(&cfg)
			err := cfg.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("Validate() = %q, want it to name %s", err, tc.field)
			}
			if _, err := New(cfg, 4); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("New accepted the invalid config: %v", err)
			}
		})
	}
}
