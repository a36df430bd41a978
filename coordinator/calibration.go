package coordinator

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"

	"github.com/dpcluster/dpcluster/internal/durable"
)

// CalibrationFile is where a replica remembers its run's calibrated σ,
// inside its data directory (RunPlan.RunConfigCached).
const CalibrationFile = "calibration.json"

// calibrationVersion names the calibration procedure whose results the
// file holds; a change to how RunConfig calibrates σ (the accountants, the
// search, CalibrationMargin) must change it, so that no σ from the old
// procedure is taken for the new one's.
const calibrationVersion = "dpcluster calibration v2"

// calibrationRecord is CalibrationFile's content.
type calibrationRecord struct {
	// Key identifies the plan σ was calibrated for (calibrationKey).
	Key string `json:"key"`
	// Sigma is the calibrated σ and SigmaBits its exact float64 bits;
	// both are read back and must agree.
	Sigma     float64 `json:"sigma"`
	SigmaBits uint64  `json:"sigma_bits"`
	// Epsilon is the ε that σ spends over the plan's max steps, by the
	// run's accountant (for people; it is recomputed on every read).
	Epsilon float64 `json:"epsilon"`
}

// RunConfigCached is RunConfig for a process that keeps state in dir (a
// replica's data directory): when σ must be calibrated, it reuses the σ a
// previous start calibrated for the very same plan, instead of repeating
// the search. With the PLD accountant the search takes seconds (tens of
// PLD evaluations), and a replica restarted after a crash did it before
// it could rejoin Raft: a second replica failing in that window left the
// cluster without a quorum for as long (most of the 3–9 s failovers of
// TestProcessFailoverSoak with seed 7; docs/RELIABILITY.md).
//
// What makes reuse safe:
//   - The σ is keyed by a hash of the whole plan (every input of the
//     calibration and more) and calibrationVersion; any difference
//     calibrates afresh.
//   - A remembered σ is checked before use: its ε over MaxSteps, by the
//     run's accountant, must be within TargetEpsilon·(1 − CalibrationMargin),
//     as the calibration guarantees (one accountant evaluation instead of
//     tens). A σ that fails (a damaged or edited file) is ignored with a
//     warning and calibrated afresh. The budget itself is still enforced
//     by the ledger, at every charge, whatever σ is used.
//   - A σ that passes but is not the calibration's (an edited file, larger
//     than calibrated) gives a configuration that differs from the run's
//     committed one, which the replica refuses to lead (ErrRunMismatch,
//     from the round loop), as it refuses any other changed configuration.
//
// The file is written crash-safely (internal/durable) after a calibration;
// failing to write it only costs the next start the search, so it is a
// warning, not an error. With dir "" or σ given in the plan this is
// RunConfig.
func (p RunPlan) RunConfigCached(dir string, log *slog.Logger) (RunConfig, error) {
	if dir == "" || p.Sigma != 0 {
		return p.RunConfig()
	}
	path := filepath.Join(dir, CalibrationFile)
	key, err := calibrationKey(p)
	if err != nil {
		return p.RunConfig() // an unencodable plan: RunConfig says what is wrong
	}
	if sigma, ok := readCalibration(path, key, log); ok {
		q := p
		q.Sigma = sigma
		c, err := q.RunConfig()
		if err == nil {
			var eps float64
			if eps, err = plannedEpsilon(c); err == nil && eps <= p.TargetEpsilon*(1-CalibrationMargin) {
				log.Info("σ from the calibration file", "file", path, "sigma", sigma, "epsilon", eps)
				return c, nil
			}
			if err == nil {
				err = fmt.Errorf("ε = %v over %d steps exceeds the target %v", eps, p.MaxSteps, p.TargetEpsilon)
			}
		}
		log.Warn("ignoring the calibration file's σ; calibrating afresh", "file", path, "sigma", sigma, "err", err)
	}
	c, err := p.RunConfig()
	if err != nil {
		return c, err
	}
	if err := writeCalibration(path, key, c); err != nil {
		log.Warn("could not remember the calibrated σ; the next start calibrates again", "file", path, "err", err)
	}
	return c, nil
}

// PlannedEpsilon is the ε that c's σ spends over c.MaxSteps steps at
// c.Delta, by c's accountant (plannedEpsilon): what a run that is not
// stopped early spends.
func (c RunConfig) PlannedEpsilon() (float64, error) { return plannedEpsilon(c) }

// plannedEpsilon is the ε that c's σ spends over c.MaxSteps steps at
// c.Delta, by c's accountant: the quantity RunConfig calibrates σ for,
// with the same accountant (RunConfig.Accounting).
func plannedEpsilon(c RunConfig) (float64, error) {
	acc, err := c.Accounting()
	if err != nil {
		return 0, err
	}
	return acc.Epsilon(c.Event(), c.MaxSteps, c.Delta)
}

// calibrationKey hashes the plan, with σ cleared, and calibrationVersion.
func calibrationKey(p RunPlan) (string, error) {
	p.Sigma = 0
	// The δ the plan derives, not how: a run that gave δ = 1e-5 before δ
	// was derived keeps its remembered σ.
	if n, _, err := p.sampling(); err == nil {
		if d, err := p.delta(n); err == nil {
			p.Delta = d
		}
	}
	b, err := json.Marshal(p)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write([]byte(calibrationVersion))
	h.Write([]byte{0})
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// readCalibration returns the σ the file at path remembers for key. A
// missing file, or one for another plan, is a quiet miss; a damaged one is
// a miss with a warning.
func readCalibration(path, key string, log *slog.Logger) (float64, bool) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false
	}
	var r calibrationRecord
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	if err == nil && r.Key == key {
		sigma := math.Float64frombits(r.SigmaBits)
		if sigma > 0 && !math.IsInf(sigma, 0) && sigma == r.Sigma {
			return sigma, true
		}
		err = fmt.Errorf("sigma %v and sigma_bits %#x disagree or are not a positive σ", r.Sigma, r.SigmaBits)
	}
	if err != nil {
		log.Warn("unreadable calibration file; calibrating afresh", "file", path, "err", err)
	}
	return 0, false
}

// writeCalibration remembers c's σ for key in the file at path.
func writeCalibration(path, key string, c RunConfig) error {
	eps, err := plannedEpsilon(c)
	if err != nil {
		return err
	}
	sigma := c.Optimizer.NoiseMultiplier
	b, err := json.MarshalIndent(calibrationRecord{Key: key, Sigma: sigma, SigmaBits: math.Float64bits(sigma), Epsilon: eps}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return durable.Replace(path, 0o644, func(f *os.File) error {
		_, err := f.Write(append(b, '\n'))
		return err
	})
}
