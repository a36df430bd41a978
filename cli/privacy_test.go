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
	// Opacus 1.4 reference from testdata/conformance/accountant_vectors.json.
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

func TestPrivacyEpsilonPLD(t *testing.T) {
	args := []string{"privacy", "epsilon", "--sample-rate", "0.04", "--noise-multiplier", "1.5",
		"--steps", "2250", "--delta", "1e-5", "--accountant", "pld"}
	out, err := run(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "ε = 6.76") || !strings.Contains(out, "PLD accountant") || !strings.Contains(out, "Gaussian") {
		t.Errorf("output %q: want ε = 6.76…, naming the PLD accountant and the mechanism", out)
	}
	out, err = run(t, append(args, "--json")...)
	if err != nil {
		t.Fatal(err)
	}
	var got epsilonResult
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if got.Accountant != "pld" || got.Mechanism != "gaussian" || got.Order != nil {
		t.Errorf("JSON does not name the PLD accountant and Gaussian mechanism: %+v", got)
	}
	// dp_accounting's PLD value from testdata/conformance (0.5% tolerance).
	if want := 6.768787376865218; got.Epsilon < want*(1-0.005) || got.Epsilon > want*(1+0.005) {
		t.Errorf("epsilon = %v, want %v ± 0.5%%", got.Epsilon, want)
	}
	// The default is still RDP, which is larger here.
	rdp, err := run(t, append(args[:len(args)-2], "--json")...)
	if err != nil {
		t.Fatal(err)
	}
	var r epsilonResult
	if err := json.Unmarshal([]byte(rdp), &r); err != nil {
		t.Fatal(err)
	}
	if r.Accountant != "rdp" || r.Epsilon <= got.Epsilon {
		t.Errorf("default accountant %q ε=%v, want rdp above PLD's %v", r.Accountant, r.Epsilon, got.Epsilon)
	}
}

func TestPrivacySigmaPLD(t *testing.T) {
	out, err := run(t, "privacy", "sigma", "--target-epsilon", "3", "--sample-rate", "0.004266666666666667",
		"--steps", "2343", "--delta", "1e-5", "--accountant", "pld", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got sigmaResult
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if got.Accountant != "pld" || got.Epsilon > 3 {
		t.Errorf("accountant %q, σ=%v gives ε=%v (target 3)", got.Accountant, got.NoiseMultiplier, got.Epsilon)
	}
	// RDP needs σ = 0.742 for this target (testdata/conformance); PLD less.
	if got.NoiseMultiplier >= 0.7420020719159987 {
		t.Errorf("PLD σ = %v not below RDP's 0.742", got.NoiseMultiplier)
	}
	text, err := run(t, "privacy", "sigma", "--target-epsilon", "3", "--sample-rate", "0.004266666666666667",
		"--steps", "2343", "--delta", "1e-5", "--accountant", "pld")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(text, "σ = ") || !strings.Contains(text, "PLD accountant") {
		t.Errorf("output %q", text)
	}
}

func TestPrivacyDiscreteGaussian(t *testing.T) {
	out, err := run(t, "privacy", "epsilon", "--sample-rate", "0.04", "--noise-multiplier", "1.5",
		"--steps", "2250", "--mechanism", "discrete-gaussian", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got epsilonResult
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.Mechanism != "discrete-gaussian" || got.Accountant != "rdp" {
		t.Errorf("JSON does not name the discrete mechanism: %+v", got)
	}
	// The discrete bound is the Gaussian's at integer orders and above it
	// at fractional ones, so its ε is at least the Gaussian's.
	if got.Epsilon < 7.3 {
		t.Errorf("discrete Gaussian ε = %v below the Gaussian's", got.Epsilon)
	}
	if _, err := run(t, "privacy", "sigma", "--target-epsilon", "3", "--sample-rate", "0.01",
		"--steps", "100", "--mechanism", "discrete-gaussian"); err != nil {
		t.Errorf("rdp calibration for the discrete Gaussian: %v", err)
	}
}

// TestPrivacyDiscretePLD: with --dim, the discrete Gaussian is the
// leader's for the run's σ: PLD accounts for it through its lattice, just
// above the continuous Gaussian's PLD ε at the same σ and below the
// discrete RDP ε of the same event; sigma calibrates it within the target
// and below the RDP σ; the JSON names the lattice and σ_eff.
func TestPrivacyDiscretePLD(t *testing.T) {
	args := []string{"--sample-rate", "0.004266666666666667", "--steps", "1000", "--json"}
	eps := func(extra ...string) epsilonResult {
		t.Helper()
		out, err := run(t, append(append([]string{"privacy", "epsilon", "--noise-multiplier", "0.7"}, args...), extra...)...)
		if err != nil {
			t.Fatal(err)
		}
		var r epsilonResult
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	disc := eps("--accountant", "pld", "--mechanism", "discrete-gaussian", "--dim", "269322")
	cont := eps("--accountant", "pld")
	rdp := eps("--mechanism", "discrete-gaussian", "--dim", "269322")
	if disc.Dim != 269322 || disc.ClipNorm != 1 || !(disc.EffectiveNoiseMultiplier < 0.7 && disc.EffectiveNoiseMultiplier > 0.7*(1-1e-4)) {
		t.Errorf("JSON lattice: %+v", disc)
	}
	if !(disc.Epsilon >= cont.Epsilon && disc.Epsilon < cont.Epsilon*1.01 && disc.Epsilon < rdp.Epsilon) {
		t.Errorf("discrete PLD ε = %v, want in [continuous PLD %v, +1%%) and below discrete RDP %v", disc.Epsilon, cont.Epsilon, rdp.Epsilon)
	}
	sig := func(accountant string) sigmaResult {
		t.Helper()
		out, err := run(t, append([]string{"privacy", "sigma", "--target-epsilon", "3", "--accountant", accountant,
			"--mechanism", "discrete-gaussian", "--dim", "269322"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		var r sigmaResult
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	p, r := sig("pld"), sig("rdp")
	if p.Epsilon > 3 || !(p.NoiseMultiplier < r.NoiseMultiplier) {
		t.Errorf("PLD σ = %v (ε %v), RDP σ = %v: want ε ≤ 3 and σ below RDP's", p.NoiseMultiplier, p.Epsilon, r.NoiseMultiplier)
	}
}

func TestPrivacyAccountantRejects(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"bad accountant", []string{"epsilon", "--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "10", "--accountant", "prv"}, "--accountant"},
		{"bad mechanism", []string{"epsilon", "--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "10", "--mechanism", "laplace"}, "--mechanism"},
		{"pld discrete without a lattice", []string{"epsilon", "--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "10", "--accountant", "pld", "--mechanism", "discrete-gaussian"}, "--dim"},
		{"pld sigma discrete without a lattice", []string{"sigma", "--target-epsilon", "1", "--sample-rate", "0.1", "--steps", "10", "--accountant", "pld", "--mechanism", "discrete-gaussian"}, "--dim"},
		{"dim for the Gaussian", []string{"epsilon", "--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "10", "--dim", "100"}, "--dim"},
		{"negative dim", []string{"epsilon", "--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "10", "--mechanism", "discrete-gaussian", "--dim", "-1"}, "--dim"},
		{"clip zero", []string{"epsilon", "--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "10", "--mechanism", "discrete-gaussian", "--dim", "10", "--clip", "0"}, "--clip"},
		{"pld q zero", []string{"epsilon", "--sample-rate", "0", "--noise-multiplier", "1", "--steps", "10", "--accountant", "pld"}, "sample rate"},
		{"pld delta one", []string{"epsilon", "--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "10", "--delta", "1", "--accountant", "pld"}, "delta"},
		{"pld target zero", []string{"sigma", "--target-epsilon", "0", "--sample-rate", "0.1", "--steps", "10", "--accountant", "pld"}, "target epsilon"},
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
