package coordinator

import (
	"errors"
	"fmt"
	"math"
)

// Evaluation is one score of θ on evaluation data, as an Evaluator reports
// it and Progress.Eval and Summary.Final carry it. It is not one of the
// Prometheus collectors (Metrics); those export it under names labelled by
// EvalData.Key.
type Evaluation struct {
	// Loss is the mean loss per example (for the model package's
	// classifiers, softmax cross-entropy in nats).
	Loss float64
	// Accuracy is the fraction of examples classified correctly.
	Accuracy float64
	// N is the number of examples scored.
	N int
	// Tokens is, for a next-token model, the number of target tokens Loss
	// and Accuracy average over (Loss is then nats per token, and
	// exp(Loss) the perplexity); 0 for a classifier.
	Tokens int
}

// Perplexity is exp(Loss) for a next-token evaluation (Tokens > 0), else 0.
func (e Evaluation) Perplexity() float64 {
	if e.Tokens == 0 {
		return 0
	}
	return math.Exp(e.Loss)
}

// EvalData says where an Evaluator's examples come from, which decides
// whether the metrics it computes may be released as differentially
// private. It is the one place that decides how an evaluation is labelled:
// the Server's evaluation logs, the Prometheus metric names, Progress and
// Summary (and through them the command line's progress bar, summaries and
// JSON) all take their label from its methods.
//
// The rule (docs/PRIVACY.md item 10): θ is a DP release, so any
// function of θ and of data outside the private training set is
// post-processing and costs no privacy (Dwork and Roth 2014, "The
// Algorithmic Foundations of Differential Privacy", Prop. 2.1). Rows held
// out of the private training data are private records that the noise
// never touched: replacing one of n such rows moves the accuracy by up to
// 1/n with no noise added, so an accuracy released on them has no DP
// guarantee (ε = ∞ for those rows), like training loss on private batches.
// The rule is a label, not arithmetic: there is no numeric error to bound.
type EvalData uint8

const (
	// EvalDataUnset is the zero value. ServerConfig.Validate refuses an
	// Evaluator whose data is unset: the Server never assumes data is
	// public.
	EvalDataUnset EvalData = iota
	// EvalPublic is a separate, public evaluation set: Fashion-MNIST's
	// t10k files, a CSV given with --eval-path, or a split of public
	// synthetic data. Metrics on it are post-processing of θ; they are
	// labelled "test".
	EvalPublic
	// EvalTrainHoldout is rows held out of the private training data
	// (--eval-split-from-train). They are not trained on, but metrics on
	// them are NOT differentially private; every output labels them
	// NON-PRIVATE and never under a "test" name.
	EvalTrainHoldout
)

// ErrEvalDataUnset is returned (wrapped) by ServerConfig.Validate when an
// Evaluator is configured without saying where its data comes from.
var ErrEvalDataUnset = errors.New("coordinator: evaluation data of undeclared origin")

// Private reports whether metrics on d are covered by the run's
// differential-privacy guarantee: true only for EvalPublic.
func (d EvalData) Private() bool { return d == EvalPublic }

// Label names evaluations on d in human-readable output: "test" for
// public data, "NON-PRIVATE holdout" otherwise (unset data is treated as
// private data: when in doubt, label it NON-PRIVATE).
func (d EvalData) Label() string {
	if d.Private() {
		return "test"
	}
	return "NON-PRIVATE holdout"
}

// Key is Label for machine-readable names (Prometheus metrics, JSON keys,
// log attributes): "test" or "nonprivate_holdout". Metrics and keys on
// public data keep their historical test_ names.
func (d EvalData) Key() string {
	if d.Private() {
		return "test"
	}
	return "nonprivate_holdout"
}

// Examples describes the examples of an evaluation on d, after a count:
// "held-out examples" for public data, and a NOT differentially private
// warning for a holdout of the training data.
func (d EvalData) Examples() string {
	if d.Private() {
		return "held-out examples"
	}
	return "examples held out of the private training data (NOT differentially private)"
}

// evalResult is an evaluation startEval ran: of θ of step, for the
// progress p of that step.
type evalResult struct {
	p    Progress
	step int64
	m    Evaluation
	err  error
	// theta is θ of step for an evaluation that waits for θ₀'s
	// (loop.evalNext); nil otherwise.
	theta []float32
}

// startEval scores θ of step (released: its charge is applied) on the
// evaluation data on a goroutine of the loop's, so that the next round
// does not wait for it: θ is copied first, and the result
// comes back on evalResults (onEval). One evaluation runs at a time (the
// Evaluator is called from one goroutine); a step that comes due while
// one runs is not evaluated, and says so, except while θ₀'s runs: the
// first step that comes due then is evaluated after it (onEval), its θ
// kept in a copy until then, so θ₀'s costs the run no evaluation but
// the ones that overlap as any two do (the final θ is always evaluated).
func (l *loop) startEval(p Progress, theta []float32, step int64) {
	if l.evalBusy {
		if l.evalStep == 0 && step > 0 && l.evalNext == nil {
			l.evalNext = &evalResult{p: p, step: step, theta: append([]float32(nil), theta...)}
			return
		}
		l.log.Debug("evaluation skipped: the last one is still running", "step", step)
		return
	}
	l.evalBusy, l.evalStep = true, step
	l.evalTheta = append(l.evalTheta[:0], theta...)
	ev, th := l.s.cfg.Evaluator, l.evalTheta
	l.ops.Add(1)
	go func() {
		defer l.ops.Done()
		m, err := ev.Evaluate(th)
		l.evalResults <- evalResult{p: p, step: step, m: m, err: err} // buffered: one in flight
	}()
}

// onEval records an evaluation startEval ran (recordEval) and reports it
// to OnStep with the progress of the step it evaluated.
func (l *loop) onEval(e evalResult) {
	l.evalBusy = false
	if next := l.evalNext; next != nil {
		// Started after this one is recorded: OnStep sees steps in order.
		l.evalNext = nil
		defer l.startEval(next.p, next.theta, next.step)
	}
	if e.err != nil {
		l.log.Warn("evaluation failed", "step", e.step, "err", e.err)
		return
	}
	if e.step == 0 {
		// θ₀'s (evaluateTheta0): logged and exported like any other, and
		// the base of checkDivergence, but not a step's Progress (EvalStep
		// 0 means none there, and OnStep reports trained steps).
		l.logEval(e.m, 0, 0)
		l.checkDivergence(e.m.Loss, 0)
		return
	}
	if e.step <= l.last.EvalStep {
		return // a later θ was evaluated meanwhile (finish)
	}
	p := e.p
	l.recordEval(&p, e.m, e.step)
	l.checkDivergence(e.m.Loss, e.step)
	l.statusDirty = true
	if l.s.cfg.OnStep != nil {
		l.s.cfg.OnStep(p)
	}
}

// evaluateNow scores the state machine's θ on the loop and records it in
// p: the final θ, once the run has stopped, after any evaluation still
// running (its θ is reused when it is of the same step).
func (l *loop) evaluateNow(p *Progress) {
	for l.evalBusy { // the one running, and one that waited for θ₀'s
		l.onEval(<-l.evalResults)
	}
	if l.last.EvalStep == p.Step && p.Step > 0 {
		p.Eval, p.EvalStep, p.EvalData = l.last.Eval, l.last.EvalStep, l.last.EvalData // θ has not moved since
		return
	}
	theta, step := l.rep.FSM().Params(l.evalTheta) // a copy the loop owns: nothing else runs Evaluate now
	l.evalTheta = theta
	m, err := l.s.cfg.Evaluator.Evaluate(theta)
	if err != nil {
		l.log.Warn("evaluation failed", "step", step, "err", err)
		return
	}
	l.recordEval(p, m, step)
}

// recordEval records evaluation m of θ of step in p, l.last, the metrics
// and the log (logEval).
func (l *loop) recordEval(p *Progress, m Evaluation, step int64) {
	p.Eval, p.EvalStep, p.EvalData = m, step, l.s.cfg.EvalData
	l.last = *p
	l.logEval(m, step, p.Epsilon)
}

// logEval exports evaluation m of θ of step, after ε spent epsilon, to the
// metrics and the log, labelled by ServerConfig.EvalData.
func (l *loop) logEval(m Evaluation, step int64, epsilon float64) {
	d := l.s.cfg.EvalData
	l.s.metrics.evaluated(m, d)
	attrs := []any{"step", step, "accuracy", m.Accuracy, "loss", m.Loss, "examples", m.N}
	if m.Tokens > 0 {
		attrs = append(attrs, "tokens", m.Tokens, "perplexity", m.Perplexity())
	}
	l.log.Info(d.Label()+" evaluation", append(attrs, "eval_data", d.Key(), "private", d.Private(), "epsilon", epsilon)...)
}

// divergenceFactor is how far the evaluation loss may grow over the base
// loss (θ₀'s) before the run is stopped as diverged: far beyond the noise
// of evaluating a noisy model, and passed within a step by a learning rate
// that makes θ blow up (--lr 1e10 takes a loss of 1 to 1e9 and beyond).
const divergenceFactor = 1000

// evaluateTheta0 starts the evaluation of θ₀ (step 0), once, on a leader
// starting a run with evaluation data: its loss is the base checkDivergence
// measures against, and it is logged like any evaluation ("test
// evaluation" at step 0: the starting accuracy). It runs beside the first
// rounds, as startEval runs every evaluation, so it delays no round; a
// step that comes due while it runs is not evaluated.
func (l *loop) evaluateTheta0(st State) {
	if l.baseAsked || l.haveBase || st.Applied != 0 || l.s.cfg.Evaluator == nil || l.s.cfg.EvalEvery <= 0 {
		return
	}
	l.baseAsked = true
	theta, _ := l.rep.FSM().Params(nil)
	l.startEval(Progress{}, theta, 0)
}

// checkDivergence records in l.diverged why training diverged, once, when
// the evaluation loss of step is NaN or infinite, or more than
// divergenceFactor times the base loss: θ₀'s, or for a resumed run or a
// new leader its own first evaluation's. advance then stops the run with
// that reason, through the log, as it stops at the budget. A run without
// evaluation data has no loss to watch.
func (l *loop) checkDivergence(loss float64, step int64) {
	switch {
	case l.diverged != "":
	case math.IsNaN(loss) || math.IsInf(loss, 0):
		l.diverged = fmt.Sprintf("%s: evaluation loss %v at step %d", StopDiverged, loss, step)
	case !l.haveBase:
		l.baseLoss, l.baseStep, l.haveBase = loss, step, true
	case l.baseLoss > 0 && loss > divergenceFactor*l.baseLoss:
		l.diverged = fmt.Sprintf("%s: evaluation loss grew from %.3g at step %d to %.3g at step %d (more than %d×)",
			StopDiverged, l.baseLoss, l.baseStep, loss, step, divergenceFactor)
	}
}
