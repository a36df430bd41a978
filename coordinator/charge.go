package coordinator

import (
	"context"
	"fmt"
	"time"
)

// This file is the leader's charge and release of a step (steps 5-6 of
// the Server doc comment): the charge entry, proposed before the step's
// round closes, and what follows once it is applied here: θ_t out and g̃
// into the log.

// stepCharge is a step's charge entry, proposed before or as the step's
// round opens: the charge does not depend on the data, so its commit and
// fsync overlap the release of θ and the nodes' computation instead of
// following the round.
type stepCharge struct {
	step int64
	// roundID is the ID of the step's first round, which the charge
	// names; opened says that round was opened.
	roundID  uint64
	opened   bool
	proposed time.Time
	// ar is the charge's result once applied here: ar.Pending says it is
	// (a refused charge is dropped, so a kept one is pending or in flight).
	ar ApplyResult
}

// formedStep is a g̃ waiting for its step's charge.
type formedStep struct {
	s stepInFlight
	g []float32
}

// chargeAhead proposes step t's charge as step t−1 is released, right
// behind t−1's grad entry (Raft may write both in one batch), unless the
// run ends before step t (MaxSteps, or one more step would exceed the
// budget: advance then stops the run).
func (l *loop) chargeAhead(t int64) {
	if last := l.s.run.MaxSteps; last > 0 && t > last {
		return
	}
	if exceed, err := l.rep.FSM().WouldExceed(); err != nil || exceed {
		return // advance decides, and reports
	}
	l.proposeCharge(t)
}

// proposeCharge proposes step t's charge entry (step 5 of the Server doc
// comment) after the previous g̃ (its grad entry holds its place in the
// log first), naming the step's first round by a fresh ID, and waits on
// the operation's goroutine for its commit and local apply
// (onChargeResult). A round that closes empty is retried under it. It
// returns the charge, or nil if it failed the loop.
func (l *loop) proposeCharge(t int64) *stepCharge {
	ls := l.lead
	id, err := randomID()
	if err != nil {
		l.fail(err)
		return nil
	}
	c := &stepCharge{step: t, roundID: id, proposed: time.Now()}
	ls.charge = c
	event, queued := l.s.run.Event(), l.gradQueued
	round := fmt.Sprintf("%s/%d/%016x", l.rep.ID(), ls.term, id)
	l.start(opCharge, ls.term, func(ctx context.Context) opResult {
		s := stepInFlight{step: t}
		if err := waitQueued(ctx, queued); err != nil {
			return opResult{err: err, step: s}
		}
		ar, err := l.rep.ProposeCharge(ctx, t, event, round)
		return opResult{ar: ar, err: err, step: s}
	})
	return c
}

// onChargeResult records step t's charge, applied here. A pending charge
// releases the g̃ that waits for it, if the round has closed (onCharged);
// else the round's close does. A refused one (the budget, the run stopped,
// not the next step) releases nothing of step t: its round, open or
// closed, is discarded, and advance sees why.
func (l *loop) onChargeResult(ctx context.Context, t int64, ar ApplyResult) {
	ls := l.lead
	c := ls.charge
	if c == nil || c.step != t {
		return // cannot happen: one charge per step and term
	}
	if ar.Pending {
		l.s.metrics.phase(phaseCharge, time.Since(c.proposed))
		c.ar = ar
		if f := ls.formed; f != nil {
			ls.formed = nil
			l.onCharged(ctx, f.s, ar, f.g)
		}
		return
	}
	ls.charge = nil
	ls.log.Info("step not applied", "step", t, "reason", ar.Err)
	switch {
	case ls.round != nil && ls.round.step == t:
		clear(ls.round.r.Close().Sum) // discarded unreleased
		ls.round, ls.phase = nil, phaseIdle
	case ls.formed != nil:
		l.putGrad(ls.formed.g)
		ls.formed, ls.phase = nil, phaseIdle
	}
	l.ahead.valid = false
	if err := l.syncAhead(); err == nil && l.ahead.step != ls.released {
		ls.released = l.ahead.step
		l.publishParams(ctx, ls.term)
	}
}

// onCharged continues step t once its charge is committed and applied
// here (the ledger charged and fsynced on this replica, the entry durable
// on a quorum): θ_t = update(θ_{t−1}, g̃) on ahead, then g̃ to the log in
// its grad entry (proposeGrad, on a goroutine of its own) and θ_t to the
// nodes (step 6), then evaluation and progress. Nothing derived from g̃ left
// this process before.
func (l *loop) onCharged(ctx context.Context, s stepInFlight, ar ApplyResult, g []float32) {
	ls := l.lead
	ls.phase, ls.charge = phaseIdle, nil
	if err := l.stepAhead(s.step, g); err != nil {
		l.putGrad(g)
		l.fail(err)
		return
	}
	l.proposeGrad(ls.term, s, ar.Index, g)
	ls.released = s.step
	charged := time.Now()
	l.s.metrics.phase(phaseCommit, charged.Sub(s.formed)) // the chain's wait for the charge
	l.chargeAhead(s.step + 1)
	// 6. Release θ_t.
	l.publishParams(ctx, ls.term)
	l.s.metrics.phase(phaseRelease, time.Since(charged))
	took := time.Since(s.started) // round open to θ_t released; not the evaluation below
	p := Progress{
		Step: s.step, MaxSteps: l.s.run.MaxSteps, Epsilon: ar.Epsilon, TargetEpsilon: l.s.run.TargetEpsilon,
		Participants: s.participants,
	}
	ls.log.Debug("step charged and released", "step", s.step, "epsilon", ar.Epsilon, "participants", s.participants,
		"step_ms", took.Milliseconds())
	cfg := l.s.cfg
	if cfg.Evaluator != nil && cfg.EvalEvery > 0 && s.step%cfg.EvalEvery == 0 {
		l.startEval(p, l.ahead.theta, l.ahead.step)
	}
	l.s.metrics.stepApplied(p)
	l.recordStep(p, took)
	l.statusDirty = true
	if cfg.OnStep != nil {
		cfg.OnStep(p)
	}
}

// proposeGrad proposes step s's g̃ for the charge entry at index, on a
// goroutine of its own that reports (opGrad) once the entry is applied
// here. gradQueued is closed as soon as the entry holds its place in the
// log: the next charge and the stop wait for it, so they follow it.
func (l *loop) proposeGrad(term uint64, s stepInFlight, index uint64, g []float32) {
	queued := make(chan struct{})
	l.gradQueued = queued
	l.ops.Add(1)
	go func() {
		defer l.ops.Done()
		started := time.Now()
		// Not cancelled with the run: the step is charged and θ_t may be
		// out, so its g̃ goes to the log even if Run is returning (settle
		// waits for it). Raft bounds the wait: the entry commits, or the
		// leadership (or raft) ends.
		wait, err := l.rep.ProposeGrad(context.WithoutCancel(l.opCtx), s.step, index, g)
		close(queued)
		r := opResult{kind: opGrad, term: term, g: g, step: s, err: err}
		if err == nil {
			r.ar, r.err = wait()
		}
		if r.err == nil {
			l.s.metrics.phase(phaseLog, time.Since(started)) // here: Run may return before the loop reads r
		}
		select {
		case l.results <- r:
		case <-l.opCtx.Done():
		}
	}()
}

// onGradApplied records a grad entry applied here. One the state machine
// refused stops the run there (advance sees it).
func (l *loop) onGradApplied(r opResult) {
	if !r.ar.Applied {
		l.lead.log.Error("g̃ not applied", "step", r.step.step, "reason", r.ar.Err)
		l.ahead.valid = false
	}
}
