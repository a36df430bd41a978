package coordinator

import (
	"errors"
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
	g := make([]float32, dim)
	return eachLoggedRelease(dataDir, func(e *raft.Log, t entryType, body []byte) error {
		var (
			step            int64
			gradErr, decErr error
		)
		if t == entryGrad {
			var ge gradEntry
			ge, gradErr, decErr = decodeGradInto(body, g)
			step = ge.Step
		} else {
			var se stepEntry
			se, gradErr, decErr = decodeStepInto(body, g)
			step = se.Step
		}
		if err := errors.Join(decErr, gradErr); err != nil {
			return fmt.Errorf("%w: entry %d: %v", ErrBadEntry, e.Index, err)
		}
		return fn(step, g)
	})
}

// eachLoggedRelease opens the Raft log under dataDir read-only and calls
// fn with every entry that carries a g̃ (grad and step entries), oldest
// first; an error of fn stops the walk and is returned.
func eachLoggedRelease(dataDir string, fn func(e *raft.Log, t entryType, body []byte) error) error {
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
	if err != nil || first == 0 {
		return err
	}
	return eachCommand(logs, first, last, func(e *raft.Log, t entryType, body []byte) error {
		if t != entryGrad && t != entryStep {
			return nil
		}
		return fn(e, t, body)
	})
}

// eachCommand calls fn with every command entry from index from to last
// of logs that decodes (its type and body), in log order. Entries of
// other Raft types and entries that do not decode are skipped; an error
// reading the log, or of fn, stops the walk and is returned.
func eachCommand(logs *raftlog.Store, from, last uint64, fn func(e *raft.Log, t entryType, body []byte) error) error {
	for i := from; i <= last; i++ {
		var e raft.Log
		if err := logs.GetLog(i, &e); err != nil {
			return fmt.Errorf("coordinator: Raft log entry %d: %w", i, err)
		}
		if e.Type != raft.LogCommand {
			continue
		}
		t, body, err := decodeEntry(e.Data)
		if err != nil {
			continue
		}
		if err := fn(&e, t, body); err != nil {
			return err
		}
	}
	return nil
}
