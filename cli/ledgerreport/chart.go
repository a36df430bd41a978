// Package ledgerreport draws a privacy ledger's audit report: ε spent
// over the training steps against the run's target, with the replays and
// the new Raft terms (leader changes and restarts) marked, as a
// self-contained HTML page (inline SVG, no scripts, no external assets)
// or as a PNG image (text set in the Go font, golang.org/x/image). Both
// draw the same chart: a title, axes with ticks, tick labels and titles,
// and a legend naming each series drawn (layout.go).
//
// The data comes from package ledger: ledger.NewTimeline for the points
// and marks, ledger.Audit for the verdict. This package only draws.
//
//	recs, _, _ := ledger.ReadFile(path)
//	tl, err := ledger.NewTimeline(recs)
//	rep, err := ledger.Audit(path)
//	err = ledgerreport.WriteFile("audit.html", tl, rep) // or audit.png
package ledgerreport

import (
	"math"

	"github.com/dpcluster/dpcluster/ledger"
)

// The chart's size in pixels (SVG user units and PNG pixels alike) and
// its plot area's margins: the title and the legend above the plot, the
// ε tick labels and the y axis title left of it, the step tick labels and
// the x axis title below it.
const (
	Width        = 960
	Height       = 540
	marginLeft   = 84
	marginRight  = 28
	marginTop    = 76
	marginBottom = 64
)

// chart maps (step, ε) to image coordinates: x grows with the step from
// the first charged step to the last, y with ε from 0 to a little above
// the larger of the target and the last ε.
type chart struct {
	minStep, maxStep int64
	maxEps           float64
}

func newChart(tl ledger.Timeline) chart {
	c := chart{maxEps: tl.TargetEpsilon}
	for i, p := range tl.Points {
		if i == 0 || p.Step < c.minStep {
			c.minStep = p.Step
		}
		if i == 0 || p.Step > c.maxStep {
			c.maxStep = p.Step
		}
		c.maxEps = math.Max(c.maxEps, p.Epsilon)
	}
	if c.maxStep <= c.minStep {
		c.maxStep = c.minStep + 1
	}
	if !(c.maxEps > 0) || math.IsInf(c.maxEps, 0) {
		c.maxEps = 1
	}
	c.maxEps *= 1.08
	return c
}

// x returns the horizontal position of step.
func (c chart) x(step int64) float64 {
	f := float64(step-c.minStep) / float64(c.maxStep-c.minStep)
	return marginLeft + f*(Width-marginLeft-marginRight)
}

// y returns the vertical position of ε (clamped to the plot area).
func (c chart) y(eps float64) float64 {
	f := math.Min(math.Max(eps/c.maxEps, 0), 1)
	return Height - marginBottom - f*(Height-marginTop-marginBottom)
}

// stepTicks returns up to n round step values to label along x.
func (c chart) stepTicks(n int) []int64 {
	span := float64(c.maxStep - c.minStep)
	d := int64(niceStep(span / float64(n)))
	d = max(d, 1)
	var ticks []int64
	for s := (c.minStep + d - 1) / d * d; s <= c.maxStep; s += d {
		ticks = append(ticks, s)
	}
	return ticks
}

// epsTicks returns round ε values to label along y, 0 included.
func (c chart) epsTicks(n int) []float64 {
	d := niceStep(c.maxEps / float64(n))
	var ticks []float64
	for i := 0; float64(i)*d <= c.maxEps; i++ {
		ticks = append(ticks, float64(i)*d)
	}
	return ticks
}

// niceStep rounds v up to 1, 2 or 5 times a power of ten.
func niceStep(v float64) float64 {
	if !(v > 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
