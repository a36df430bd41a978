package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"time"

	"github.com/dpcluster/dpcluster/aggregation"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/transport"
)

// This file is the leader's side of the loop: one step's data path, top to
// bottom (steps 1-4 of the Server doc comment; charge.go has steps 5-6).

// leadPhase is where the leader is in its cycle.
type leadPhase int

const (
	phaseBarrier   leadPhase = iota // 1. Barrier in flight
	phaseConfigure                  // 1. the run configuration's proposal in flight
	phaseIdle                       // no round open, no proposal in flight: advance decides
	phaseRound                      // 2-3. a round is open (its step's charge in flight or applied)
	phaseProposing                  // 5. g̃ formed, waiting for its charge; or the stop in flight
	phaseDraining                   // the run stopped: waiting for the voters' reports
)

// leading is the state of one leadership term, as the loop sees it.
type leading struct {
	term  uint64
	log   *slog.Logger
	phase leadPhase
	// gained is when this replica saw it was elected (the Barrier's start).
	gained time.Time
	round  *openRound // phaseRound only
	// retryAt is when an idle leader that found no round to open looks
	// again (the registry changes with every heartbeat).
	retryAt time.Time
	// announcing is set once the leader has caught up (after step 1);
	// it announces Leader{term} every AnnounceEvery from then on.
	announcing   bool
	nextAnnounce time.Time
	drain        draining // phaseDraining only
	// released is the step whose θ this leader last published (θ_0 for
	// none): the state machine's applied step at the start of the term,
	// then each step whose charge is applied (onCharged). The next round
	// is released+1.
	released int64
	// charge is the charge of step released+1 (nil: none yet): proposed
	// as step released is released (chargeAhead), or when the step's
	// first round opens. It outlives a round that closes empty: the
	// retried round is released under it.
	charge *stepCharge
	// formed is step released+1's g̃ once its round closed, while its
	// charge is not yet applied (phaseProposing); nil otherwise.
	formed *formedStep
}

// aheadState is θ and the optimizer state at step: a copy of the state
// machine's, moved one step ahead with a g̃ as soon as its charge is
// applied here, so that θ_t is released without waiting for g̃'s entry to
// be written to the log. Step is a pure function of (state, θ, g̃), so
// ahead equals what every replica computes when it applies the grad entry,
// bit for bit (TestThetaNeverReleasedBeforeCommit, coordinatortest.Check).
// It belongs to the loop.
type aheadState struct {
	theta []float32
	opt   dpadam.Optimizer
	step  int64
	valid bool
}

type openRound struct {
	r       *aggregation.Round
	id      uint64
	step    int64
	started time.Time
	// awaited are the members the round waits for (standing.go), fixed
	// as it opens; awaiting those of them not yet accepted nor refused:
	// the loop closes the round when it empties (closedByStanding), before
	// the deadline, unless every member was awaited (then the round
	// closes itself, aggregation.CauseAllAnswered). refused is each
	// member's last refusal for its values.
	awaited, awaiting map[string]bool
	refused           map[string]aggregation.Reason
	closedByStanding  bool
}

// stepInFlight is what the loop keeps of a step while its proposal runs.
type stepInFlight struct {
	step         int64
	participants int
	started      time.Time // the round opened
	formed       time.Time // g̃ formed (the round closed and was privatized)
}

// Stop reasons the Server writes into the log.
const (
	stopBudget   = "privacy budget exhausted"
	stopMaxSteps = "max steps reached"
)

// StopDiverged begins the stop reason (Summary.Stopped, the ledger's end
// record) of a run the leader stopped because its evaluation loss
// diverged (checkDivergence); the rest of the reason says how.
const StopDiverged = "training diverged"

// checkLeadership follows the replica's Raft role: a replica that became
// leader starts step 1 (Barrier); one that lost leadership, or whose term
// moved on, abandons its round. A leader that is draining finishes the run
// whatever happens to its leadership: the run has stopped in the log.
func (l *loop) checkLeadership() {
	isLeader, term := l.rep.IsLeader(), l.rep.Term()
	if ls := l.lead; ls != nil && ls.phase != phaseDraining && (!isLeader || term != ls.term) {
		l.stepDown("lost leadership")
	}
	if l.lead != nil || !isLeader {
		return
	}
	ls := &leading{term: term, log: l.log.With("term", term), phase: phaseBarrier, gained: time.Now()}
	l.lead = ls
	l.start(opBarrier, term, func(ctx context.Context) opResult {
		return opResult{err: l.rep.Barrier(ctx)}
	})
}

// stepDown forgets the leadership: the open round is discarded unreleased
// with its noise; operations still running report to nobody.
func (l *loop) stepDown(why string) {
	ls := l.lead
	if ls == nil {
		return
	}
	if ls.round != nil {
		clear(ls.round.r.Close().Sum) // discarded unreleased
		ls.round = nil
	}
	if ls.formed != nil {
		l.putGrad(ls.formed.g) // discarded unreleased
		ls.formed = nil
	}
	l.awaitNoise()
	l.pending.Clear()
	l.setBlocked(nil)
	l.waiting = nil
	l.lead = nil
	ls.log.Info(why)
}

// onLeading continues step 1 after the Barrier (or the configuration's
// proposal) returned: propose the run configuration if the log has none,
// refuse another run's log, then announce and publish the committed θ.
func (l *loop) onLeading(ctx context.Context, done opKind) {
	ls := l.lead
	c, ok := l.rep.FSM().Config()
	switch {
	case !ok && done == opBarrier:
		ls.phase = phaseConfigure
		run := l.s.run
		l.start(opConfigure, ls.term, func(ctx context.Context) opResult {
			return opResult{err: l.rep.Configure(ctx, run)}
		})
		return
	case !ok:
		l.fail(fmt.Errorf("coordinator: the run configuration was committed but is not applied"))
		return
	case !sameRun(c, l.s.run):
		l.fail(runMismatch(c, l.s.run))
		return
	}
	if err := l.syncAhead(); err != nil {
		l.fail(err)
		return
	}
	ls.released = l.ahead.step
	// barrier_ms: from the election won to leading (every committed entry
	// applied here, the configuration checked).
	ls.log.Info("leading", "step", ls.released, "barrier_ms", time.Since(ls.gained).Milliseconds())
	ls.phase = phaseIdle
	ls.announcing, ls.nextAnnounce = true, time.Now() // at once, at the top of the loop
	l.publishParams(ctx, ls.term)
}

// syncAhead makes ahead a copy of the state machine's θ and optimizer.
func (l *loop) syncAhead() error {
	a := &l.ahead
	theta, step, ok := l.rep.FSM().CopyTraining(a.theta, &a.opt)
	if !ok {
		a.valid = false
		return fmt.Errorf("coordinator: the run is not configured")
	}
	a.theta, a.step, a.valid = theta, step, true
	return nil
}

// stepAhead moves ahead to step t with g̃ (θ_t = update(θ_{t−1}, g̃)),
// copying the state machine's state first if ahead is not at t−1. Called
// once t's charge is applied (pending): the state machine is then at
// t−1.
func (l *loop) stepAhead(t int64, g []float32) error {
	a := &l.ahead
	if !a.valid || a.step != t-1 {
		if err := l.syncAhead(); err != nil {
			return err
		}
		if a.step != t-1 {
			a.valid = false
			return fmt.Errorf("coordinator: step %d's charge is pending but the state machine is at step %d", t, a.step)
		}
	}
	if _, err := a.opt.Step(a.theta, g); err != nil {
		a.valid = false
		return err
	}
	a.step = t
	return nil
}

// advance lets an idle leader decide what comes next: the end of the run,
// the stop at a diverged loss (checkDivergence) or at the budget, or round
// t (step 2), beside which θ₀ is evaluated (evaluateTheta0); or nothing
// yet, if the live nodes cannot make a round.
func (l *loop) advance(ctx context.Context) {
	ls := l.lead
	if ls == nil || ls.phase != phaseIdle || time.Now().Before(ls.retryAt) {
		return
	}
	fsm := l.rep.FSM()
	st := fsm.State()
	l.s.metrics.observe(st, l.rep)
	switch {
	case st.Fatal != nil:
		l.finishWith(st, st.Fatal)
		return
	case st.Stopped != "":
		l.finish(ctx, st)
		return
	}
	if last := l.s.run.MaxSteps; last > 0 && ls.released >= last {
		return // the last step is released; the run stops when its g̃ is applied (onState)
	}
	if l.diverged != "" {
		ls.log.Warn("stopping the run: " + l.diverged)
		l.proposeStop(l.diverged)
		return
	}
	l.evaluateTheta0(st)
	exceed, err := false, error(nil)
	if c := ls.charge; c == nil || c.step != ls.released+1 {
		exceed, err = fsm.WouldExceed() // else the step is charged already
	}
	if err != nil {
		l.fail(err)
		return
	}
	if exceed {
		ls.log.Info("privacy budget reached; stopping", "epsilon", st.Epsilon, "target", l.s.run.TargetEpsilon)
		l.proposeStop(stopBudget)
		return
	}
	order, claims := l.nodes.live(time.Now(), l.s.cfg.NodeTimeout)
	l.standingMetrics() // live dropped the nodes gone silent
	// The next round's members are the live nodes whose shards are
	// disjoint; a node whose claim conflicts with an older one is left
	// out (admission.go).
	nodes, b := checkShards(claims, order, l.s.run.TotalExamples)
	l.setBlocked(b)
	l.setWaiting(newNodeWait(nodes, l.s.cfg.MinNodes, l.s.run.Nodes))
	if l.waiting != nil {
		ls.retryAt = time.Now().Add(50 * time.Millisecond)
		return
	}
	shards := make(map[string]int64, len(nodes))
	for _, id := range nodes {
		shards[id] = claims[id].size
	}
	l.openRound(ctx, ls.released+1, nodes, shards)
}

// proposeStop proposes the end of the run, after the last g̃ proposed.
func (l *loop) proposeStop(reason string) {
	ls := l.lead
	ls.phase = phaseProposing
	queued := l.gradQueued
	l.start(opStop, ls.term, func(ctx context.Context) opResult {
		if err := waitQueued(ctx, queued); err != nil {
			return opResult{err: err}
		}
		return opResult{err: l.rep.ProposeStop(ctx, reason)}
	})
}

// waitQueued waits until queued is closed (nil: at once) or ctx ends.
func waitQueued(ctx context.Context, queued <-chan struct{}) error {
	if queued == nil {
		return nil
	}
	select {
	case <-queued:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// setBlocked records why the leader opens no round (nil: it may open
// them) for the status reports and metrics, and logs a change at once and
// an unchanged block every 10 s.
func (l *loop) setBlocked(b *roundBlock) {
	if b == nil {
		if l.blocked != nil {
			l.log.Info("rounds no longer blocked")
		}
		l.blocked, l.blockLogged = nil, ""
		l.s.metrics.roundsBlocked("")
		return
	}
	l.blocked = b
	l.s.metrics.roundsBlocked(b.reason)
	now := time.Now()
	if msg := b.String(); msg != l.blockLogged || now.Sub(l.blockLoggedAt) >= 10*time.Second {
		l.blockLogged, l.blockLoggedAt = msg, now
		l.log.Warn("leaving nodes out of rounds: their shard claims conflict with older ones", "reason", b.reason, "detail", b.detail)
	}
}

// openRound opens round t over nodes (step 2) and, unless it was drawn
// during the previous proposal, draws the release's noise while the nodes
// compute: it does not depend on the data.
func (l *loop) openRound(ctx context.Context, t int64, nodes []string, shards map[string]int64) {
	ls := l.lead
	c := ls.charge
	if c == nil || c.step != t {
		if c = l.proposeCharge(t); c == nil {
			return
		}
	}
	id := c.roundID
	if c.opened {
		var err error
		if id, err = randomID(); err != nil { // a retry: a round ID of its own
			l.fail(err)
			return
		}
	}
	c.opened = true
	started := time.Now()
	deadline := started.Add(l.s.cfg.RoundTimeout)
	run := l.s.run
	if len(l.sum) != run.Dim {
		l.sum = make([]float64, run.Dim)
	}
	r, err := aggregation.NewRound(uint64(t), nodes, run.Dim, run.Optimizer.ClipNorm, deadline,
		aggregation.WithRoundID(id), aggregation.WithShardSizes(countLimits(shards, run.SampleRate)), aggregation.WithSumBuffer(l.sum))
	if err != nil {
		l.fail(err)
		return
	}
	err = l.s.conn.Publish(ctx, transport.RoundStart{
		Run: run.Run, Step: uint64(t), RoundID: id, Term: ls.term, Leader: l.rep.ID(),
		ParamsVersion: uint64(t - 1), Deadline: deadline.UnixNano(),
		SampleRate: run.SampleRate, ClipNorm: run.Optimizer.ClipNorm, ModelHash: run.ModelHash,
	})
	if err != nil {
		r.Close()
		l.fail(fmt.Errorf("coordinator: publishing round %d: %w", t, err))
		return
	}
	// The noise is usually drawn (or being drawn) already, since the
	// previous step's proposal (closeRound); after a new leadership or an
	// empty round it is drawn from here, while the nodes compute.
	l.startNoise()
	awaited := l.nodes.awaited(nodes, started)
	ls.phase, ls.round = phaseRound, &openRound{r: r, id: id, step: t, started: started,
		awaited: awaited, awaiting: maps.Clone(awaited), refused: make(map[string]aggregation.Reason)}
}

// onContribution hands a contribution to the open round (step 3), if any.
func (l *loop) onContribution(ctx context.Context, c transport.Contribution) {
	ls := l.lead
	if ls == nil || ls.round == nil {
		if l.rep.IsLeader() {
			l.s.metrics.rejected(aggregation.ReasonLate) // between rounds
		}
		return // followers do not aggregate
	}
	or := ls.round
	err := or.r.Add(aggregation.Contribution{
		NodeID: c.NodeID, Step: c.Step, RoundID: c.RoundID, Count: c.Count, Sum: c.Sum,
	})
	if err == nil {
		l.s.metrics.accepted()
		delete(or.refused, c.NodeID) // a corrected answer stands
		l.stopAwaiting(ctx, or, c.NodeID)
		return
	}
	reason := aggregation.ReasonOf(err)
	l.s.metrics.rejected(reason)
	// The reason is public; the values are not, and are never logged. A
	// contribution for another step, round or after the close is usually
	// an answer that came late (from a member out of good standing that
	// the round did not wait for, or for an earlier leader's round): not
	// worth a line each.
	lvl := slog.LevelInfo
	if reason == aggregation.ReasonWrongStep || reason == aggregation.ReasonWrongRound || reason == aggregation.ReasonLate {
		lvl = slog.LevelDebug
	}
	l.log.Log(ctx, lvl, "contribution rejected", "node", c.NodeID, "step", c.Step, "reason", reason.String())
	if reason != aggregation.ReasonWrongStep && reason != aggregation.ReasonWrongRound {
		l.publish(ctx, transport.Status{ModelHash: l.s.run.ModelHash,
			Run: l.s.run.Run, From: l.rep.ID(), Node: c.NodeID, Step: c.Step,
			Code: transport.StatusRejected, Detail: reason.String(),
		})
	}
	if valueRefusal(reason) {
		// Refused for its values: the member loses good standing when the
		// round closes (unless a corrected answer is accepted first), and
		// the round stops waiting for it now.
		or.refused[c.NodeID] = reason
		l.stopAwaiting(ctx, or, c.NodeID)
	}
}

// stopAwaiting takes id off the members the open round or waits for and,
// once none is left, closes it: the members in good standing (and those
// given a chance) have answered or been refused. A round that waits for
// every member closes itself once all are accepted (aggregation.Round),
// so the loop closes it only when some member was not waited for or was
// refused.
func (l *loop) stopAwaiting(ctx context.Context, or *openRound, id string) {
	if !or.awaiting[id] {
		return
	}
	delete(or.awaiting, id)
	if len(or.awaiting) > 0 {
		return
	}
	select {
	case <-or.r.Done():
		return // every member accepted: the round closed itself (the loop sees Done next)
	default:
	}
	or.closedByStanding = true
	l.closeRound(ctx)
}

// closeRound closes the round (every node answered, or the deadline
// passed), privatizes its sum (step 4) and proposes the step (step 5).
func (l *loop) closeRound(ctx context.Context) {
	ls := l.lead
	or := ls.round
	res := or.r.Close()
	ls.round, ls.phase = nil, phaseIdle
	t := or.step
	l.s.metrics.roundClosed(res, time.Since(or.started), closeCause(or, res))
	l.nodes.counted(res.Accepted, res.Missing)
	l.onStandingChanges(l.nodes.settleStanding(or, res, time.Now(), l.s.cfg.RoundTimeout))
	if len(res.Accepted) == 0 {
		// Nobody answered (all nodes died, or the deadline was too
		// short): releasing noise over an empty sum would spend budget
		// for nothing. Forget the silent nodes and try again.
		ls.log.Warn("round closed with no contribution; not releasing", "step", t, "cause", res.ClosedBy.String())
		l.nodes.forget(res.Missing)
		l.awaitNoise()
		l.pending.Clear()
		return
	}
	// 4. Noise over the sum, by the run's noise mode; then clear the sum
	// and the noise. The Result's Sum is this round's own buffer.
	g := l.getGrad()
	privStart := time.Now()
	err := l.awaitNoise()
	if err == nil {
		err = privatize(l.s.run, l.s.noise, &l.pending, g, res.Sum)
	}
	if err == nil {
		breakMechanism(g, res.Sum, l.s.run.Optimizer.ExpectedBatchSize) // a no-op but in -tags dpbrokenmechanism
	}
	clear(res.Sum)
	l.pending.Clear()
	if err != nil {
		l.fail(err)
		return
	}
	// g̃ must be one the state machine will accept: the optimizer's rule,
	// the same function the FSM applies before charging. A g̃ that fails
	// it (a clip norm so large that g̃ overflows the optimizer's bound, or
	// a broken noise source) is never proposed, so never released; the
	// run stops, since drawing noise again until g̃ passes would make the
	// release depend on the sum through the rejection. The log line and
	// the stop reason (written to the Raft log and the ledger) say only
	// that g̃ failed, never where or with what value: g̃ is not released,
	// and its step's charge may not even be applied yet.
	if !dpadam.GradientValid(g) {
		l.putGrad(g)
		ls.log.Error("noisy gradient invalid; stopping the run", "step", t, "err", dpadam.ErrNonFinite)
		l.proposeStop(fmt.Sprintf("step %d: noisy gradient not proposed: %v", t, dpadam.ErrNonFinite))
		return
	}
	l.s.metrics.phase(phasePrivatize, time.Since(privStart))
	ls.log.Debug("round closed", "step", t, "participants", len(res.Accepted), "missing", len(res.Missing),
		"rejected", len(res.Rejected), "round_ms", time.Since(or.started).Milliseconds())
	// 5. The charge, proposed before the round closed (chargeAhead, or
	// openRound): release g̃ now if it is applied here, else once it is
	// (onChargeResult). g̃ stays in this process's memory until then.
	s := stepInFlight{step: t, participants: len(res.Accepted), started: or.started, formed: time.Now()}
	c := ls.charge
	if c == nil || c.step != t {
		l.putGrad(g)
		l.fail(fmt.Errorf("coordinator: round %d closed without its charge", t))
		return
	}
	// Start drawing the noise of round t+1 now: it depends on nothing,
	// and drawn on its own goroutine it uses the cores the charge's fsync
	// leaves idle without holding up the loop.
	if last := l.s.run.MaxSteps; last == 0 || t < last {
		l.startNoise()
	}
	if !c.ar.Pending { // in flight
		ls.phase, ls.formed = phaseProposing, &formedStep{s: s, g: g}
		return
	}
	l.onCharged(ctx, s, c.ar, g)
}

// startNoise starts drawing the next release's discrete noise into
// pending on goroutines of the loop's, unless a draw is under way or
// pending already holds unused noise: each release uses one fresh draw,
// consumed (zeroed) by the release's privatize, or cleared unused when the
// leader steps down or a round closes empty. For the floating-point modes
// it does nothing: their noise is drawn in privatize. The draw is bounded
// work on half the cores (noiseWorkers); the loop waits for it
// (awaitNoise), lending it the rest, before it touches pending and before
// it returns.
func (l *loop) startNoise() {
	m, ok := l.s.run.Discrete()
	if !ok || l.drawing != nil || l.drawErr != nil || l.pending.Ready() {
		return
	}
	l.drawing, l.drawErr = l.s.noise.StartDrawDiscrete(&l.pending, m, noiseWorkers(runtime.GOMAXPROCS(0)))
}

// noiseWorkers is how many goroutines draw the next release's noise on a
// machine of procs cores: half of them, at least one. The draw runs beside
// the chain (θ's release, the next round, the charge's fsync); on all the
// cores it would take the chain's, and the step's (docs/BENCHMARKS.md,
// "The noise drawn on half the cores"). If the round closes first, the
// loop lends the draw every core (awaitNoise).
func noiseWorkers(procs int) int { return max(1, procs/2) }

// awaitNoise waits for the draw under way, if any, with as many more
// goroutines as there are cores, and returns the draw's error if it could
// not start.
func (l *loop) awaitNoise() error {
	if l.drawing != nil {
		l.drawing.Wait(runtime.GOMAXPROCS(0))
		l.drawing = nil
	}
	err := l.drawErr
	l.drawErr = nil
	return err
}

// getGrad returns a noisy-gradient buffer of the run's dimension.
func (l *loop) getGrad() []float32 {
	if n := len(l.grads); n > 0 {
		g := l.grads[n-1]
		l.grads = l.grads[:n-1]
		return g
	}
	return make([]float32, l.s.run.Dim)
}

// putGrad gives a noisy-gradient buffer back (at most two are kept).
func (l *loop) putGrad(g []float32) {
	if len(g) == l.s.run.Dim && len(l.grads) < 2 {
		l.grads = append(l.grads, g)
	}
}

// privatize forms the noisy gradient g̃ of the run's mechanism from the
// round's float64 sum (step 4 of the Server doc comment): the discrete
// Gaussian mechanism for NoiseDiscrete (RunConfig.Discrete), with the noise
// in pending if it is ready (drawn at the round's start; Apply zeroes it)
// or fresh noise otherwise; the legacy floating-point sampler for
// NoiseFloat and NoiseLegacy. It is the one place the leader's noise is
// added; RunConfig.Event is the one place it is accounted.
func privatize(run RunConfig, noise *mechanism.NoiseSource, pending *mechanism.Noise, g []float32, sum []float64) error {
	oc := run.Optimizer
	if run.NoiseMode == NoiseDiscrete {
		m, ok := run.Discrete()
		if !ok {
			return fmt.Errorf("%w: noise mode %q cannot be built", ErrInvalidRunConfig, run.NoiseMode)
		}
		if pending != nil && pending.Ready() {
			return m.Apply(g, sum, oc.ExpectedBatchSize, pending)
		}
		return noise.DiscreteNoisyGradient64(g, sum, m, oc.ExpectedBatchSize)
	}
	return noise.NoisyGradient64(g, sum, oc.NoiseMultiplier, oc.ClipNorm, oc.ExpectedBatchSize)
}

// noiseModeLabel names a noise mode for logs.
func noiseModeLabel(mode string) string {
	if mode == NoiseLegacy {
		return "float (legacy: configured before noise modes)"
	}
	return mode
}

// finish ends the run on the leader once the log says it stopped:
// evaluate the final θ, then drain (reports.go) before announcing the end.
func (l *loop) finish(ctx context.Context, st State) {
	ls := l.lead
	sum := l.summary(st)
	if cfg := l.s.cfg; cfg.Evaluator != nil {
		p := Progress{Step: st.Applied, MaxSteps: l.s.run.MaxSteps, Epsilon: st.Epsilon, TargetEpsilon: l.s.run.TargetEpsilon}
		l.evaluateNow(&p)
		if p.EvalStep > 0 {
			sum.Final, sum.FinalEvaluated, sum.EvalData = p.Eval, true, p.EvalData
			if cfg.OnStep != nil {
				cfg.OnStep(p)
			}
		}
	}
	ls.phase = phaseDraining
	l.startDrain(ctx, st, sum)
}

func randomID() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("coordinator: round id: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}
