package ledgerreport

import (
	"fmt"
	"math"
	"strconv"
	"sync"

	"golang.org/x/image/font"
	"golang.org/x/image/font/gofont/gobold"
	"golang.org/x/image/font/gofont/goregular"
	"golang.org/x/image/font/opentype"
	"golang.org/x/image/math/fixed"

	"github.com/dpcluster/dpcluster/ledger"
)

// The chart's words, the same in both formats.
const (
	xAxisTitle = "step"
	yAxisTitle = "ε (privacy spent)"
)

// Series names: the HTML's CSS classes and the legend's keys.
const (
	seriesEpsilon = "epsilon"
	seriesTarget  = "target"
	seriesNewTerm = "new-term"
	seriesReplay  = "replay"
)

// Text sizes in pixels, and where the text goes: baselines (y) and
// distances from the plot area's edges.
const (
	titleSize     = 16
	labelSize     = 13 // tick labels, legend, term labels
	axisTitleSize = 14

	titleBaseline   = 24
	legendTop       = 36
	legendHeight    = 26
	legendPad       = 10 // inside the box, left and right
	swatchWidth     = 24
	swatchGap       = 6  // swatch to its label
	legendItemGap   = 18 // one item's label to the next swatch
	yTickLabelGap   = 8  // the ε tick labels' right edge, left of the y axis
	xTickBaseline   = 20 // the step tick labels' baseline, below the x axis
	xTitleBaseline  = 48 // the x axis title's baseline, below the x axis
	yTitleCenter    = 20 // the y axis title's centre, from the image's left edge
	termLabelOffset = 3  // a term label's left edge, right of its line
	termLabelBase   = 14 // a term label's baseline, below the plot's top
)

// tick is a labelled position along an axis (pixels).
type tick struct {
	Pos   float64
	Label string
}

// stepLabel is the label of the step tick s.
func stepLabel(s int64) string { return strconv.FormatInt(s, 10) }

// epsLabel is the label of the ε tick e: at most 4 significant digits,
// so a tick computed as 3 × 0.1 reads 0.3.
func epsLabel(e float64) string { return strconv.FormatFloat(e, 'g', 4, 64) }

// xTicks returns the labelled step ticks (stepTicks(8)).
func (c chart) xTicks() []tick {
	var ts []tick
	for _, s := range c.stepTicks(8) {
		ts = append(ts, tick{Pos: c.x(s), Label: stepLabel(s)})
	}
	return ts
}

// yTicks returns the labelled ε ticks (epsTicks(8)).
func (c chart) yTicks() []tick {
	var ts []tick
	for _, e := range c.epsTicks(8) {
		ts = append(ts, tick{Pos: c.y(e), Label: epsLabel(e)})
	}
	return ts
}

// fmtG formats v as the HTML report's figures do.
func fmtG(v float64) string { return strconv.FormatFloat(v, 'g', 8, 64) }

// chartTitle is the chart's title: the run and δ, the run's name cut
// short ("…") where the title would be wider than the plot.
func chartTitle(tl ledger.Timeline) string {
	face := newFace(true, titleSize)
	defer face.Close()
	run := []rune(tl.Run)
	for n := len(run); ; n-- {
		name := string(run[:n])
		if n < len(run) {
			name += "…"
		}
		t := fmt.Sprintf("%s: ε spent over steps at δ = %s", name, fmtG(tl.Delta))
		if n == 0 || measure(face, t) <= Width-marginLeft-marginRight {
			return t
		}
	}
}

// legendItem is one series in the legend: its swatch from X to
// X+swatchWidth, its label from TextX, TextW wide in the Go font (the
// HTML sets the label to that width, whatever font the browser has).
type legendItem struct {
	Series string
	Label  string
	X      float64
	TextX  float64
	TextW  float64
}

// End is the right edge of the item's swatch.
func (it legendItem) End() float64 { return it.X + swatchWidth }

// Center is the horizontal centre of the item's swatch.
func (it legendItem) Center() float64 { return it.X + swatchWidth/2 }

// legendBox is the legend: one row of items in a box above the plot,
// from its left edge.
type legendBox struct {
	Items      []legendItem
	X, Y, W, H float64
	Mid        float64 // the row's vertical centre (swatches)
	Baseline   float64 // the labels' baseline
}

// newLegend lays out the legend of the series tl draws: ε spent (if it
// has a charge), the target, and new Raft terms and replays if any.
func newLegend(tl ledger.Timeline) legendBox {
	type entry struct{ series, label string }
	var es []entry
	if len(tl.Points) > 0 {
		es = append(es, entry{seriesEpsilon, "ε spent"})
	}
	es = append(es, entry{seriesTarget, "target ε = " + fmtG(tl.TargetEpsilon)})
	if tl.Count(ledger.MarkNewTerm) > 0 {
		es = append(es, entry{seriesNewTerm, "new Raft term (leader change or restart)"})
	}
	if tl.Count(ledger.MarkReplay) > 0 {
		es = append(es, entry{seriesReplay, "replay (charged, not applied again)"})
	}
	face := newFace(false, labelSize)
	defer face.Close()
	l := legendBox{X: marginLeft, Y: legendTop, H: legendHeight, Mid: legendTop + legendHeight/2, Baseline: legendTop + legendHeight/2 + 5}
	x := l.X + legendPad
	for i, e := range es {
		if i > 0 {
			x += legendItemGap
		}
		it := legendItem{Series: e.series, Label: e.label, X: x, TextX: x + swatchWidth + swatchGap, TextW: measure(face, e.label)}
		l.Items = append(l.Items, it)
		x = it.TextX + it.TextW
	}
	l.W = x + legendPad - l.X
	return l
}

// termLabels returns the label of each new Raft term mark of tl, in
// order ("term N", drawn right of the mark's line at the plot's top), ""
// for one that would overlap the label before it or run past the plot.
func termLabels(c chart, tl ledger.Timeline) []string {
	face := newFace(false, labelSize)
	defer face.Close()
	var labels []string
	end := math.Inf(-1) // the right edge of the last label drawn
	for _, m := range tl.Marks {
		if m.Kind != ledger.MarkNewTerm {
			continue
		}
		label := fmt.Sprintf("term %d", m.Term)
		x := c.x(tl.Points[m.Point].Step) + termLabelOffset
		w := measure(face, label)
		if x < end+8 || x+w > Width-marginRight {
			label = ""
		} else {
			end = x + w
		}
		labels = append(labels, label)
	}
	return labels
}

// The Go fonts, parsed once: they are embedded, so a parse error is a
// bug in the build, not a condition to handle.
var goFonts = sync.OnceValue(func() [2]*opentype.Font {
	var fs [2]*opentype.Font
	for i, ttf := range [][]byte{goregular.TTF, gobold.TTF} {
		f, err := opentype.Parse(ttf)
		if err != nil {
			panic("ledgerreport: parsing an embedded Go font: " + err.Error())
		}
		fs[i] = f
	}
	return fs
})

// newFace returns a face of Go Regular (or Go Bold) at size pixels. A
// face is not safe for concurrent use: each render makes its own.
func newFace(bold bool, size float64) font.Face {
	f := goFonts()[0]
	if bold {
		f = goFonts()[1]
	}
	face, err := opentype.NewFace(f, &opentype.FaceOptions{Size: size, DPI: 72, Hinting: font.HintingFull})
	if err != nil {
		panic("ledgerreport: " + err.Error())
	}
	return face
}

// measure returns the advance width of s in face, in pixels.
func measure(face font.Face, s string) float64 {
	return fixedToFloat(font.MeasureString(face, s))
}

func fixedToFloat(v fixed.Int26_6) float64 { return float64(v) / 64 }
