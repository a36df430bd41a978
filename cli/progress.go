package cli

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/dpcluster/dpcluster/coordinator"
)

// progress reports a run's progress: a one-line bar redrawn in place on a
// terminal, or a structured log line every logEvery steps and at every
// evaluation otherwise. It shows only public values (step, ε, accuracy on
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

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
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
	fmt.Fprintf(&b, "  %.1f steps/s", p.rate(now))
	return b.String()
}

func (p *progress) draw(now time.Time) {
	fmt.Fprintf(p.w, "\r\x1b[K%s", p.line(now))
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
	fmt.Fprintln(p.w)
}
