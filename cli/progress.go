package cli

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/dpcluster/dpcluster/coordinator"
)

// progress reports a run's progress: a one-line bar redrawn in place on a
// terminal (steps, ε, the last evaluation, steps/s and the time left),
// with log lines printed above it, or a structured log line every
// logEvery steps and at every evaluation otherwise. It shows only public values (step, ε, accuracy on
// public data) and an accuracy on rows held out of the training data only
// under its NON-PRIVATE label (coordinator.EvalData.Label).
type progress struct {
	w        io.Writer
	bar      bool
	log      *slog.Logger
	logEvery int64
	now      func() time.Time

	mu        sync.Mutex
	start     time.Time
	startStep int64
	drawn     time.Time
	last      coordinator.Progress
	eval      coordinator.Progress // last progress that carried an evaluation
	dirty     bool
}

// newProgress picks the bar when mode is "on", or "auto" and w is a
// terminal.
func newProgress(w io.Writer, mode string, log *slog.Logger) (*progress, error) {
	p := &progress{w: w, log: log, logEvery: 100, now: time.Now}
	switch mode {
	case "on":
		p.bar = true
	case "off":
	case "auto":
		p.bar = isTerminal(w)
	default:
		return nil, fmt.Errorf("--progress must be auto, on or off, not %q", mode)
	}
	return p, nil
}

// isTerminal reports whether w writes to a terminal: a file (unwrapped
// from stderr's lockedWriter) whose descriptor the terminal ioctl
// accepts. A character device that is not a terminal (/dev/null) is not.
func isTerminal(w io.Writer) bool {
	if lw, ok := w.(*lockedWriter); ok {
		w = lw.w
	}
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// update records a step; it is the Server's OnStep and does not block.
func (p *progress) update(pr coordinator.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if p.start.IsZero() {
		p.start, p.startStep = now, pr.Step-1
	}
	if pr.Step >= p.last.Step {
		p.last = pr
	}
	if pr.EvalStep > 0 {
		p.eval = pr // an evaluation, reported once done (it may follow later steps)
	}
	if !p.bar {
		// Evaluations are logged by the coordinator itself.
		if pr.EvalStep == 0 && pr.Step%p.logEvery == 0 {
			p.log.Info("training", "step", pr.Step, "max_steps", pr.MaxSteps, "epsilon", pr.Epsilon,
				"target_epsilon", pr.TargetEpsilon, "steps_per_s", p.rate(now))
		}
		return
	}
	p.dirty = true
	if now.Sub(p.drawn) >= 100*time.Millisecond || pr.EvalStep > 0 {
		p.draw(now)
	}
}

func (p *progress) rate(now time.Time) float64 {
	el := now.Sub(p.start).Seconds()
	if el <= 0 {
		return 0
	}
	return float64(p.last.Step-p.startStep) / el
}

// line renders the bar.
func (p *progress) line(now time.Time) string {
	const width = 24
	pr := p.last
	frac := 0.0
	if pr.MaxSteps > 0 {
		frac = float64(pr.Step) / float64(pr.MaxSteps)
	} else if pr.TargetEpsilon > 0 {
		frac = pr.Epsilon / pr.TargetEpsilon
	}
	frac = min(max(frac, 0), 1)
	n := int(frac * width)
	var b strings.Builder
	fmt.Fprintf(&b, "[%s%s] step %d", strings.Repeat("#", n), strings.Repeat(".", width-n), pr.Step)
	if pr.MaxSteps > 0 {
		fmt.Fprintf(&b, "/%d", pr.MaxSteps)
	}
	fmt.Fprintf(&b, "  ε %.3f/%.3g", pr.Epsilon, pr.TargetEpsilon)
	if p.eval.EvalStep > 0 {
		fmt.Fprintf(&b, "  %s acc %.1f%% (step %d)", p.eval.EvalData.Label(), 100*p.eval.Eval.Accuracy, p.eval.EvalStep)
	}
	rate := p.rate(now)
	fmt.Fprintf(&b, "  %.1f steps/s", rate)
	if left, ok := p.left(rate); ok {
		fmt.Fprintf(&b, "  ETA %s", left)
	}
	return b.String()
}

// left estimates the time to the end of the run at the current rate: to
// MaxSteps, or, without a step limit, to the target ε at the rate ε has
// grown so far (ε grows more slowly than the steps, so that estimate is
// high). false when there is nothing to estimate from yet.
func (p *progress) left(rate float64) (time.Duration, bool) {
	pr := p.last
	steps := pr.Step - p.startStep
	if rate <= 0 || steps <= 0 {
		return 0, false
	}
	var todo float64
	switch {
	case pr.MaxSteps > 0:
		todo = float64(pr.MaxSteps - pr.Step)
	case pr.TargetEpsilon > 0 && pr.Epsilon > 0:
		todo = float64(steps) * (pr.TargetEpsilon - pr.Epsilon) / pr.Epsilon
	default:
		return 0, false
	}
	return (time.Duration(max(todo, 0)/rate*1e9) + time.Second/2).Truncate(time.Second), true
}

func (p *progress) draw(now time.Time) {
	if lw, ok := p.w.(*lockedWriter); ok {
		lw.setBar(p.line(now))
	} else {
		fmt.Fprintf(p.w, "%s%s", clearLine, p.line(now))
	}
	p.drawn, p.dirty = now, false
}

// finish draws the last state and ends the bar's line.
func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.bar || p.start.IsZero() {
		return
	}
	p.draw(p.now())
	if lw, ok := p.w.(*lockedWriter); ok {
		lw.endBar()
	} else {
		fmt.Fprintln(p.w)
	}
}
