package coordinator

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readRecord reads dir's calibration file.
func readRecord(t *testing.T, dir string) calibrationRecord {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, CalibrationFile))
	if err != nil {
		t.Fatal(err)
	}
	var r calibrationRecord
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRunConfigCached: a calibrated σ is remembered in the data directory
// and reused for the same plan, and only for it; a remembered σ that would
// overspend the planned budget, a damaged file, or another plan's file is
// ignored (and replaced) in favour of a fresh calibration.
func TestRunConfigCached(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	dir := filepath.Join(t.TempDir(), "data") // not there yet: created
	plan := testPlan()
	plan.Accountant = AccountantRDP // fast; TestRunConfigCachedPLD covers PLD
	want, err := plan.RunConfig()
	if err != nil {
		t.Fatal(err)
	}
	sigma := want.Optimizer.NoiseMultiplier
	key, err := calibrationKey(plan)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, CalibrationFile)

	// First start: calibrates, as RunConfig does, and remembers σ.
	got, err := plan.RunConfigCached(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	if !sameConfig(got, want) {
		t.Fatalf("first start: %+v, want RunConfig's %+v", got, want)
	}
	if r := readRecord(t, dir); r.Key != key || r.Sigma != sigma || r.SigmaBits == 0 || !(r.Epsilon > 0 && r.Epsilon <= plan.TargetEpsilon) {
		t.Fatalf("calibration file %+v, want key %s, σ %v and its ε", r, key, sigma)
	}

	// The file is what a restart uses: a σ it holds (here a larger one,
	// within budget) comes back instead of a fresh calibration's.
	larger := want
	larger.Optimizer.NoiseMultiplier = sigma * 1.25
	if err := writeCalibration(path, key, larger); err != nil {
		t.Fatal(err)
	}
	got, err = plan.RunConfigCached(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	if got.Optimizer.NoiseMultiplier != sigma*1.25 {
		t.Fatalf("restart: σ %v, want the file's %v", got.Optimizer.NoiseMultiplier, sigma*1.25)
	}
	if !strings.Contains(logs.String(), "σ from the calibration file") {
		t.Errorf("no log line for the remembered σ:\n%s", logs.String())
	}

	// A remembered σ below the calibrated one overspends the budget: it is
	// refused, σ is calibrated afresh and the file corrected.
	smaller := want
	smaller.Optimizer.NoiseMultiplier = sigma * 0.8
	if err := writeCalibration(path, key, smaller); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	got, err = plan.RunConfigCached(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	if !sameConfig(got, want) {
		t.Fatalf("file with a too small σ: got σ %v, want the calibrated %v", got.Optimizer.NoiseMultiplier, sigma)
	}
	if !strings.Contains(logs.String(), "ignoring the calibration file") || !strings.Contains(logs.String(), "exceeds the target") {
		t.Errorf("no warning for the overspending σ:\n%s", logs.String())
	}
	if r := readRecord(t, dir); r.Sigma != sigma {
		t.Errorf("file after recalibrating holds σ %v, want %v", r.Sigma, sigma)
	}

	// Another plan (more steps) does not take this plan's σ.
	other := plan
	other.MaxSteps = 80
	wantOther, err := other.RunConfig()
	if err != nil {
		t.Fatal(err)
	}
	if wantOther.Optimizer.NoiseMultiplier == sigma {
		t.Fatal("test plans calibrate to the same σ")
	}
	if got, err = other.RunConfigCached(dir, log); err != nil || !sameConfig(got, wantOther) {
		t.Fatalf("another plan: σ %v, %v; want its own %v", got.Optimizer.NoiseMultiplier, err, wantOther.Optimizer.NoiseMultiplier)
	}
	if r := readRecord(t, dir); r.Sigma != wantOther.Optimizer.NoiseMultiplier {
		t.Errorf("file holds σ %v, want the last plan's %v", r.Sigma, wantOther.Optimizer.NoiseMultiplier)
	}

	// Damaged files: garbage, and σ that disagrees with its bits.
	for name, content := range map[string]string{
		"garbage":         "{not json",
		"bits disagree":   `{"key":"` + key + `","sigma":5,"sigma_bits":4607182418800017408}`,
		"σ zero":          `{"key":"` + key + `","sigma":0,"sigma_bits":0}`,
		"σ negative bits": `{"key":"` + key + `","sigma":-1,"sigma_bits":13830554455654793216}`,
	} {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		logs.Reset()
		got, err := plan.RunConfigCached(dir, log)
		if err != nil || !sameConfig(got, want) {
			t.Fatalf("%s: σ %v, %v; want the calibrated %v", name, got.Optimizer.NoiseMultiplier, err, sigma)
		}
		if !strings.Contains(logs.String(), "calibrating afresh") {
			t.Errorf("%s: no warning:\n%s", name, logs.String())
		}
		if r := readRecord(t, dir); r.Sigma != sigma || r.Key != key {
			t.Errorf("%s: file not replaced: %+v", name, r)
		}
	}

	// A data directory that cannot hold the file costs only the cache.
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	if got, err := plan.RunConfigCached(notDir, log); err != nil || !sameConfig(got, want) {
		t.Fatalf("unwritable dir: %v, %v", got.Optimizer.NoiseMultiplier, err)
	}
	if !strings.Contains(logs.String(), "could not remember") {
		t.Errorf("no warning for the unwritable directory:\n%s", logs.String())
	}

	// A plan that gives σ calibrates nothing and writes nothing.
	fixed := plan
	fixed.Sigma = 1.5
	fixedDir := t.TempDir()
	if got, err := fixed.RunConfigCached(fixedDir, log); err != nil || got.Optimizer.NoiseMultiplier != 1.5 {
		t.Fatalf("given σ: %v, %v", got.Optimizer.NoiseMultiplier, err)
	}
	if _, err := os.Stat(filepath.Join(fixedDir, CalibrationFile)); !os.IsNotExist(err) {
		t.Errorf("a plan with σ given wrote a calibration file: %v", err)
	}
}

// TestRunConfigCachedPLD: with the PLD accountant (the default), a σ fresh
// from calibration passes the check on reuse, so a restart does not
// calibrate again.
func TestRunConfigCachedPLD(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	dir := t.TempDir()
	plan := testPlan()
	first, err := plan.RunConfigCached(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	if first.Accountant != AccountantPLD {
		t.Fatalf("accountant %q, want the default %q", first.Accountant, AccountantPLD)
	}
	logs.Reset()
	again, err := plan.RunConfigCached(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	if !sameConfig(again, first) || !strings.Contains(logs.String(), "σ from the calibration file") {
		t.Fatalf("restart: σ %v (first %v), logs:\n%s", again.Optimizer.NoiseMultiplier, first.Optimizer.NoiseMultiplier, logs.String())
	}
}
