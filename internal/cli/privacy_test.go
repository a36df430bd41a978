package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// run executes the coordinator command tree with args and returns stdout.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewCoordinatorCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestPrivacyEpsilon(t *testing.T) {
	out, err := run(t, "privacy", "epsilon", "--sample-rate", "0.004266666666666667",
		"--noise-multiplier", "1.1", "--steps", "14062", "--delta", "1e-5")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "ε = 2.5966 ") {
		t.Errorf("output %q does not state ε = 2.5966", out)
	}
}

func TestPrivacyEpsilonJSON(t *testing.T) {
	out, err := run(t, "privacy", "epsilon", "--sample-rate", "0.04",
		"--noise-multiplier", "1.5", "--steps", "2250", "--delta", "1e-5", "--orders", "opacus", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got epsilonResult
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if got.SampleRate != 0.04 || got.NoiseMultiplier != 1.5 || got.Steps != 2250 || got.Delta != 1e-5 || got.Orders != "opacus" {
		t.Errorf("inputs not echoed: %+v", got)
	}
	// Opacus 1.4 reference from shared/conformance/accountant_vectors.json.
	if want := 7.3291111714386545; got.Epsilon < want*(1-1e-6) || got.Epsilon > want*(1+1e-6) {
		t.Errorf("epsilon = %v, want %v", got.Epsilon, want)
	}
}

func TestPrivacySigmaJSON(t *testing.T) {
	out, err := run(t, "privacy", "sigma", "--target-epsilon", "3", "--sample-rate", "0.004266666666666667",
		"--steps", "2343", "--delta", "1e-5", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got sigmaResult
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if got.Epsilon > 3 {
		t.Errorf("σ=%v gives ε=%v > target 3", got.NoiseMultiplier, got.Epsilon)
	}
	if want := 0.7420020719159987; got.NoiseMultiplier > want*(1+1e-3) {
		t.Errorf("σ = %v, want ≤ %v·(1+1e-3)", got.NoiseMultiplier, want)
	}
	if got.TargetEpsilon != 3 || got.Steps != 2343 {
		t.Errorf("inputs not echoed: %+v", got)
	}
}

func TestPrivacyRejects(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"q zero", []string{"epsilon", "--sample-rate", "0", "--noise-multiplier", "1", "--steps", "10"}, "sample rate"},
		{"q above one", []string{"epsilon", "--sample-rate", "1.5", "--noise-multiplier", "1", "--steps", "10"}, "sample rate"},
		{"sigma zero", []string{"epsilon", "--sample-rate", "0.1", "--noise-multiplier", "0", "--steps", "10"}, "noise multiplier"},
		{"sigma negative", []string{"epsilon", "--sample-rate", "0.1", "--noise-multiplier", "-1", "--steps", "10"}, "noise multiplier"},
		{"delta zero", []string{"epsilon", "--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "10", "--delta", "0"}, "delta"},
		{"delta one", []string{"epsilon", "--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "10", "--delta", "1"}, "delta"},
		{"steps zero", []string{"epsilon", "--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "0"}, "steps"},
		{"missing sigma", []string{"epsilon", "--sample-rate", "0.1", "--steps", "10"}, "noise-multiplier"},
		{"not a number", []string{"epsilon", "--sample-rate", "abc", "--noise-multiplier", "1", "--steps", "10"}, "sample-rate"},
		{"bad orders", []string{"epsilon", "--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "10", "--orders", "x"}, "--orders"},
		{"target zero", []string{"sigma", "--target-epsilon", "0", "--sample-rate", "0.1", "--steps", "10"}, "target epsilon"},
		{"target unreachable", []string{"sigma", "--target-epsilon", "0.0001", "--sample-rate", "0.5", "--steps", "1000"}, "unreachable"},
		{"missing target", []string{"sigma", "--sample-rate", "0.1", "--steps", "10"}, "target-epsilon"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := run(t, append([]string{"privacy"}, tt.args...)...)
			if err == nil {
				t.Fatal("command succeeded, want an error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
		})
	}
}
