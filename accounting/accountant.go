package accounting

import (
	"fmt"
	"math"
)

// Accountant answers the privacy questions of a run of DP-SGD style steps
// with one accounting method. Its implementations are RDP (Rényi DP) and
// PLD (privacy loss distributions); New returns one by Name.
//
// Every method is a deterministic function of its arguments: the same
// inputs give the same result, bit for bit, on every machine, so replicas
// and auditors that ask the same question agree. Implementations are safe
// for concurrent use.
type Accountant interface {
	// Name returns the accountant's name, as run files and ledgers spell it.
	Name() Name
	// Epsilon returns the ε, at δ, of count runs of event e (count ≥ 0).
	// It is an upper bound on the exact ε of the composition (see the
	// implementation for its numeric error). An event the accountant
	// cannot charge is ErrInvalidEvent; a bad count or δ is
	// ErrInvalidParameter.
	Epsilon(e Event, count int64, delta float64) (float64, error)
	// Calibrate returns the smallest noise multiplier σ in [1e-3, 1e4]
	// (to the implementation's relative precision) such that steps runs
	// of event(σ) reach ε ≤ target at δ. event must be the event charged
	// for a run with noise multiplier σ, and its ε must be non-increasing
	// in σ (true of every event whose noise grows with σ). The returned σ
	// is the upper end of the final bracket: its ε never exceeds the
	// target. It returns ErrUnreachable if σ = 1e4 does not reach the
	// target, and ErrInvalidParameter for a bad target, step count or δ.
	Calibrate(target float64, steps int64, delta float64, event func(sigma float64) Event) (float64, error)
	// StepLimit returns the largest count T of runs of step whose ε at δ
	// is at most target (0 if one run exceeds it), at most MaxStepLimit.
	// planned, if positive, is a guess of T (the run's planned steps) that
	// may make the search cheaper; the result does not depend on it.
	StepLimit(step Event, target, delta float64, planned int64) (int64, error)
}

// Name names an accountant: what the --accountant flag, a run file's
// accountant key and a ledger's run record hold.
type Name string

// The accountants New knows.
const (
	// NameRDP is the Rényi DP accountant over DefaultOrders (RDP).
	NameRDP Name = "rdp"
	// NamePLD is the privacy-loss-distribution accountant (PLD).
	NamePLD Name = "pld"
)

// New returns the accountant called name: RDP{} (over DefaultOrders) for
// NameRDP, PLD{} for NamePLD. Any other name is ErrInvalidParameter.
func New(name Name) (Accountant, error) {
	switch name {
	case NameRDP:
		return RDP{}, nil
	case NamePLD:
		return PLD{}, nil
	}
	return nil, fmt.Errorf("%w: accountant %q must be %q or %q", ErrInvalidParameter, name, NameRDP, NamePLD)
}

// MaxStepLimit caps StepLimit: a run of identical steps is refused beyond
// it even if its ε would still be within the target.
const MaxStepLimit = int64(1) << 40

// ValidateRun returns ErrInvalidParameter unless steps runs of the
// Poisson-subsampled Gaussian mechanism with rate q and noise multiplier
// sigma, asked about at δ, are a question the accountants answer: q in
// (0, 1], σ positive and finite, steps ≥ 1 and δ in (0, 1).
func ValidateRun(q, sigma float64, steps int64, delta float64) error {
	if err := checkParams(q, steps, delta); err != nil {
		return err
	}
	if !(sigma > 0) || math.IsInf(sigma, 0) {
		return fmt.Errorf("%w: noise multiplier %v must be positive and finite", ErrInvalidParameter, sigma)
	}
	return nil
}

func checkParams(q float64, steps int64, delta float64) error {
	switch {
	case !(q > 0 && q <= 1):
		return fmt.Errorf("%w: sample rate %v must be in (0, 1]", ErrInvalidParameter, q)
	case steps < 1:
		return fmt.Errorf("%w: steps %d must be at least 1", ErrInvalidParameter, steps)
	case !(delta > 0 && delta < 1):
		return fmt.Errorf("%w: delta %v must be in (0, 1)", ErrInvalidParameter, delta)
	}
	return nil
}
