package coordinator

import (
	"fmt"
	"path/filepath"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/raftlog"
)

// EachLoggedGradient calls fn with the step and the noisy gradient g̃ of
// every grad and step entry the Raft log under dataDir holds, oldest
// first, reading the log in place as LoggedReleases does. g̃ is what the
// leader released: g̃ = (S + z)/B, S the round's clipped sum, z the
// mechanism's noise of scale σ·C, B the run's expected batch size
// (RunConfig.Optimizer.ExpectedBatchSize; mechanism.NoiseSource's
// NoisyGradient64 and DiscreteNoisyGradient64). dim is the run's number
// of parameters; g has that length and is reused between calls (fn must
// copy what it keeps). An error of fn stops the walk and is returned.
//
// Entries compacted into a snapshot are gone: a caller that needs every
// release (the privacy audit, cli's audit-privacy) runs its replica with
// snapshots that keep the whole log (SnapshotThreshold and the trailing
// logs above the run's number of entries) and checks the steps it got.
func EachLoggedGradient(dataDir string, dim int, fn func(step int64, g []float32) error) error {
	if dim <= 0 {
		return fmt.Errorf("%w: dimension %d", ErrBadEntry, dim)
	}
	logs, err := raftlog.OpenReadOnly(filepath.Join(dataDir, "raft"))
	if err != nil {
		return err
	}
	defer logs.Close()
	first, err := logs.FirstIndex()
	if err != nil {
		return err
	}
	last, err := logs.LastIndex()
	if err != nil {
		return err
	}
	g := make([]float32, dim)
	for i := first; i <= last && first > 0; i++ {
		var e raft.Log
		if err := logs.GetLog(i, &e); err != nil {
			return fmt.Errorf("coordinator: Raft log entry %d: %w", i, err)
		}
		if e.Type != raft.LogCommand {
			continue
		}
		t, body, err := decodeEntry(e.Data)
		if err != nil || (t != entryGrad && t != entryStep) {
			continue
		}
		var step int64
		var gradErr error
		if t == entryGrad {
			var ge gradEntry
			ge, gradErr, err = decodeGradInto(body, g)
			step = ge.Step
		} else {
			var se stepEntry
			se, gradErr, err = decodeStepInto(body, g)
			step = se.Step
		}
		if err == nil {
			err = gradErr
		}
		if err != nil {
			return fmt.Errorf("%w: entry %d: %v", ErrBadEntry, i, err)
		}
		if err := fn(step, g); err != nil {
			return err
		}
	}
	return nil
}
