package ledger

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// ErrBudgetExceeded is returned by Charge when the charge would push ε past
// the run's target. Nothing is recorded; the run must stop.
var ErrBudgetExceeded = errors.New("ledger: privacy budget exceeded")

// ErrRunMismatch is returned by Start when the ledger already belongs to a
// run with other parameters.
var ErrRunMismatch = errors.New("ledger: ledger belongs to a different run")

// Ledger is the durable privacy ledger of one coordinator replica: a File of
// records and the accountant state those records imply. Charges are
// accounted with the RDP accountant over DefaultOrders, one Compose per
// record in file order, so an auditor who replays the file gets the same ε
// bit for bit.
//
// Ledger is not safe for concurrent use; the coordinator's state machine
// owns it.
type Ledger struct {
	file      *File
	acc       *Accountant
	run       *Record // the run record, nil before Start
	lastIndex uint64  // Raft index of the last charge
	lastStep  int64   // highest step charged
	charges   uint64
}

// Open opens (or creates) the ledger file at path, repairing a torn tail
// (see OpenFile), and replays its records into a fresh accountant.
func Open(path string, opts ...Option) (*Ledger, error) {
	f, _, err := OpenFile(path, opts...)
	if err != nil {
		return nil, err
	}
	recs, _, err := ReadFile(path)
	if err != nil {
		f.Close()
		return nil, err
	}
	l, err := replay(recs)
	if err != nil {
		f.Close()
		return nil, err
	}
	l.file = f
	return l, nil
}

// replay rebuilds ledger state from verified records.
func replay(recs []Record) (*Ledger, error) {
	acc, err := NewAccountant(nil)
	if err != nil {
		return nil, err
	}
	l := &Ledger{acc: acc}
	for i := range recs {
		r := recs[i]
		switch r.Kind {
		case RecordRun:
			if l.run != nil {
				return nil, fmt.Errorf("%w: second run record at seq %d", ErrCorrupt, r.Seq)
			}
			l.run = &r
		case RecordCharge:
			if l.run == nil {
				return nil, fmt.Errorf("%w: charge at seq %d before the run record", ErrCorrupt, r.Seq)
			}
			if err := l.acc.Compose(*r.Event, 1); err != nil {
				return nil, fmt.Errorf("%w: seq %d: %v", ErrCorrupt, r.Seq, err)
			}
			l.lastIndex = max(l.lastIndex, r.Index)
			l.lastStep = max(l.lastStep, r.Step)
			l.charges++
		}
	}
	return l, nil
}

// Noise sources a run record can name.
const (
	NoiseCrypto = "crypto" // a CSPRNG keyed from the OS: the run is private
	NoiseSeeded = "seeded" // a seeded, predictable source: NOT private
)

// Noise mechanisms a run record can name.
const (
	// MechanismDiscrete: the sum snapped to a grid plus exactly sampled
	// discrete Gaussian noise (package mechanism); charged as
	// KindDiscreteGaussian.
	MechanismDiscrete = "discrete"
	// MechanismFloat: floating-point Gaussian noise, charged as
	// KindGaussian. It is not protected against floating-point attacks
	// (Mironov 2012). Run records written before mechanisms were recorded
	// hold "", which means the same.
	MechanismFloat = "float"
)

// MechanismKind returns the event kind a run with the given mechanism
// charges for its noise: KindDiscreteGaussian for MechanismDiscrete,
// KindGaussian for MechanismFloat and "" (a run record from before the
// field), and false for an unknown mechanism.
func MechanismKind(mechanism string) (Kind, bool) {
	switch mechanism {
	case MechanismDiscrete:
		return KindDiscreteGaussian, true
	case MechanismFloat, "":
		return KindGaussian, true
	}
	return "", false
}

// Start records the run's identity, budget, noise source (NoiseCrypto or
// NoiseSeeded) and noise mechanism (MechanismDiscrete, MechanismFloat, or ""
// for a run configured before mechanisms were recorded) as the ledger's
// first record. If the ledger already holds a run record, Start checks that
// it matches and records nothing.
func (l *Ledger) Start(run string, targetEps, delta float64, noise, mechanism string) error {
	if noise != NoiseCrypto && noise != NoiseSeeded {
		return fmt.Errorf("%w: noise source %q", ErrInvalidParameter, noise)
	}
	if _, ok := MechanismKind(mechanism); !ok {
		return fmt.Errorf("%w: noise mechanism %q", ErrInvalidParameter, mechanism)
	}
	if !(targetEps > 0) || math.IsInf(targetEps, 0) {
		return fmt.Errorf("%w: target epsilon %v", ErrInvalidParameter, targetEps)
	}
	if !(delta > 0 && delta < 1) {
		return fmt.Errorf("%w: delta %v", ErrInvalidParameter, delta)
	}
	if l.run != nil {
		if l.run.Run != run || l.run.TargetEpsilon != targetEps || l.run.Delta != delta || l.run.Noise != noise || l.run.Mechanism != mechanism {
			return fmt.Errorf("%w: ledger has run %q (ε=%v, δ=%v, noise %q, mechanism %q), asked for %q (ε=%v, δ=%v, noise %q, mechanism %q)",
				ErrRunMismatch, l.run.Run, l.run.TargetEpsilon, l.run.Delta, l.run.Noise, l.run.Mechanism, run, targetEps, delta, noise, mechanism)
		}
		return nil
	}
	r, err := l.file.Append(Record{Kind: RecordRun, Run: run, TargetEpsilon: targetEps, Delta: delta, Noise: noise, Mechanism: mechanism})
	if err != nil {
		return err
	}
	l.run = &r
	return nil
}

// Charge durably records one release of event e for a training step,
// carried by the Raft entry at (term, index). replay marks a release for a
// step already applied. It returns ErrBudgetExceeded, recording nothing, if
// the charge would take ε past the target; and an error wrapping ErrBroken
// if the record could not be made durable. Only when Charge returns nil may
// the caller apply the step's update.
func (l *Ledger) Charge(step int64, e Event, term, index uint64, replay bool) (Record, error) {
	if l.run == nil {
		return Record{}, errors.New("ledger: Charge before Start")
	}
	if err := e.Validate(); err != nil {
		return Record{}, err
	}
	// Account on a copy first: a refused charge leaves the state untouched.
	saved := slices.Clone(l.acc.rdp)
	if err := l.acc.Compose(e, 1); err != nil {
		return Record{}, err
	}
	eps, _, err := l.acc.Epsilon(l.run.Delta)
	if err == nil && eps > l.run.TargetEpsilon {
		err = fmt.Errorf("%w: step %d would spend ε=%.6g > target %.6g", ErrBudgetExceeded, step, eps, l.run.TargetEpsilon)
	}
	if err == nil {
		var r Record
		r, err = l.file.Append(Record{
			Kind: RecordCharge, Step: step, Event: &e, Term: term, Index: index,
			Replay: replay, Epsilon: eps,
		})
		if err == nil {
			l.lastIndex = max(l.lastIndex, index)
			l.lastStep = max(l.lastStep, step)
			l.charges++
			return r, nil
		}
	}
	copy(l.acc.rdp, saved)
	return Record{}, err
}

// WouldExceed reports whether charging e now would take ε past the target,
// without recording anything. The leader uses it to stop before proposing a
// step that the state machine would refuse.
func (l *Ledger) WouldExceed(e Event) (bool, error) {
	if l.run == nil {
		return false, errors.New("ledger: WouldExceed before Start")
	}
	saved := slices.Clone(l.acc.rdp)
	defer copy(l.acc.rdp, saved)
	if err := l.acc.Compose(e, 1); err != nil {
		return false, err
	}
	eps, _, err := l.acc.Epsilon(l.run.Delta)
	if err != nil {
		return false, err
	}
	return eps > l.run.TargetEpsilon, nil
}

// Spent returns ε spent so far at the run's δ (0 before the first charge).
func (l *Ledger) Spent() float64 {
	if l.run == nil || l.charges == 0 {
		return 0
	}
	eps, _, err := l.acc.Epsilon(l.run.Delta)
	if err != nil || math.IsInf(eps, 1) {
		return 0
	}
	return eps
}

// LastIndex returns the Raft index of the last charge (0 if none). Charges
// are appended in log order, so an entry at or below LastIndex has already
// been charged: after a restart, Raft replays it and the state machine must
// not charge it twice.
func (l *Ledger) LastIndex() uint64 { return l.lastIndex }

// Charges returns the number of charge records.
func (l *Ledger) Charges() uint64 { return l.charges }

// Head returns the last record and the record count.
func (l *Ledger) Head() (Record, uint64) { return l.file.Head() }

// Path returns the ledger file's path.
func (l *Ledger) Path() string { return l.file.Path() }

// Close closes the ledger file.
func (l *Ledger) Close() error { return l.file.Close() }

// Size returns the byte length of the ledger's durable records (see
// File.Size).
func (l *Ledger) Size() int64 { return l.file.Size() }

// Run returns the run record, or false before Start.
func (l *Ledger) Run() (Record, bool) {
	if l.run == nil {
		return Record{}, false
	}
	return *l.run, true
}
