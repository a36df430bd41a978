package ledgerreport

import (
	"bytes"
	"encoding/xml"
	"image"
	"image/color"
	"image/png"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/image/font/sfnt"

	"github.com/dpcluster/dpcluster/ledger"
)

func TestTickLabelFormat(t *testing.T) {
	for _, tc := range []struct {
		eps  float64
		want string
	}{{0, "0"}, {0.5, "0.5"}, {3 * 0.1, "0.3"}, {7 * 0.2, "1.4"}, {3, "3"}, {2.5, "2.5"}, {0.0002, "0.0002"}, {1e-5, "1e-05"}, {12.5, "12.5"}, {1000, "1000"}} {
		if got := epsLabel(tc.eps); got != tc.want {
			t.Errorf("epsLabel(%v) = %q, want %q", tc.eps, got, tc.want)
		}
	}
	for _, tc := range []struct {
		step int64
		want string
	}{{0, "0"}, {200, "200"}, {1000, "1000"}, {1234567, "1234567"}} {
		if got := stepLabel(tc.step); got != tc.want {
			t.Errorf("stepLabel(%d) = %q, want %q", tc.step, got, tc.want)
		}
	}
}

// TestTickLabels: the labelled ticks are the helpers' values, at their
// positions, formatted by stepLabel and epsLabel.
func TestTickLabels(t *testing.T) {
	// The main job: 1000 steps from step 1, target ε = 3.
	c := chart{minStep: 1, maxStep: 1000, maxEps: 3 * 1.08}
	labels := func(ts []tick) []string {
		var out []string
		for _, t := range ts {
			out = append(out, t.Label)
		}
		return out
	}
	if got, want := labels(c.xTicks()), []string{"200", "400", "600", "800", "1000"}; !slices.Equal(got, want) {
		t.Errorf("step tick labels %q, want %q", got, want)
	}
	if got, want := labels(c.yTicks()), []string{"0", "0.5", "1", "1.5", "2", "2.5", "3"}; !slices.Equal(got, want) {
		t.Errorf("ε tick labels %q, want %q", got, want)
	}
	for _, c := range []chart{c, {minStep: 1, maxStep: 6, maxEps: 8.64}, {minStep: 17, maxStep: 23, maxEps: 0.0123}, {minStep: 0, maxStep: 1e6, maxEps: 1.08}} {
		steps, xs := c.stepTicks(8), c.xTicks()
		if len(xs) != len(steps) || len(xs) == 0 {
			t.Fatalf("%+v: %d step ticks labelled, stepTicks gives %d", c, len(xs), len(steps))
		}
		for i, s := range steps {
			if xs[i].Label != stepLabel(s) || xs[i].Pos != c.x(s) {
				t.Errorf("%+v: step tick %d = %+v, want %q at %v", c, i, xs[i], stepLabel(s), c.x(s))
			}
		}
		eps, ys := c.epsTicks(8), c.yTicks()
		if len(ys) != len(eps) || len(ys) < 2 {
			t.Fatalf("%+v: %d ε ticks labelled, epsTicks gives %d", c, len(ys), len(eps))
		}
		for i, e := range eps {
			if ys[i].Label != epsLabel(e) || ys[i].Pos != c.y(e) {
				t.Errorf("%+v: ε tick %d = %+v, want %q at %v", c, i, ys[i], epsLabel(e), c.y(e))
			}
		}
	}
}

// plainTimeline is a run of n steps with no marks: the legend has ε and
// the target only.
func plainTimeline(n int, target float64) ledger.Timeline {
	tl := ledger.Timeline{Run: "plain", TargetEpsilon: target, Delta: 1e-5, Points: []ledger.TimelinePoint{}, Marks: []ledger.Mark{}}
	for i := range n {
		tl.Points = append(tl.Points, ledger.TimelinePoint{Seq: uint64(i + 1), Step: int64(i + 1), Epsilon: target * math.Sqrt(float64(i+1)/float64(n)), Term: 2})
	}
	return tl
}

func legendSeries(l legendBox) []string {
	var out []string
	for _, it := range l.Items {
		out = append(out, it.Series)
	}
	return out
}

// TestLegend: the legend names the series drawn, no others, in one row
// that fits above the plot.
func TestLegend(t *testing.T) {
	tl, _ := testReport(t)
	l := newLegend(tl)
	if got, want := legendSeries(l), []string{seriesEpsilon, seriesTarget, seriesNewTerm, seriesReplay}; !slices.Equal(got, want) {
		t.Errorf("legend of a run with new terms and replays: %q, want %q", got, want)
	}
	if l.Items[1].Label != "target ε = 8" {
		t.Errorf("target legend label %q", l.Items[1].Label)
	}
	if got, want := legendSeries(newLegend(plainTimeline(10, 3))), []string{seriesEpsilon, seriesTarget}; !slices.Equal(got, want) {
		t.Errorf("legend of a run without marks: %q, want %q", got, want)
	}
	// The widest legend: every series, a target with all its digits.
	tl.TargetEpsilon = 1.2345678e-12
	l = newLegend(tl)
	if l.X < marginLeft || l.X+l.W > Width-marginRight || l.Y <= titleBaseline || l.Y+l.H >= marginTop {
		t.Errorf("legend box (%v, %v) %v×%v is not between the title and the plot, within the plot's width", l.X, l.Y, l.W, l.H)
	}
	for i, it := range l.Items {
		if it.TextX <= it.End() || it.TextW <= 0 || (i > 0 && it.X <= l.Items[i-1].TextX+l.Items[i-1].TextW) {
			t.Errorf("legend item %d %+v overlaps its swatch or the item before", i, it)
		}
	}
}

func TestChartTitle(t *testing.T) {
	tl := plainTimeline(3, 3)
	tl.Run = "fashion-mlp"
	if got, want := chartTitle(tl), "fashion-mlp: ε spent over steps at δ = 1e-05"; got != want {
		t.Errorf("title %q, want %q", got, want)
	}
	tl.Run = strings.Repeat("very-long-run-name-", 20)
	got := chartTitle(tl)
	face := newFace(true, titleSize)
	defer face.Close()
	if !strings.Contains(got, "…: ε spent over steps at δ = 1e-05") || measure(face, got) > Width-marginLeft-marginRight {
		t.Errorf("title of a long run name %q (%.0f px) is not cut short to the plot's width", got, measure(face, got))
	}
}

// TestFontHasGlyphs: every character the chart sets is in the Go font,
// so none is drawn as a missing glyph (ε, δ, …).
func TestFontHasGlyphs(t *testing.T) {
	tl, _ := testReport(t)
	tl.Run = strings.Repeat("x", 200)
	texts := []string{xAxisTitle, yAxisTitle, "term 1234567890", "0123456789.-+e"}
	for _, it := range newLegend(tl).Items {
		texts = append(texts, it.Label)
	}
	var buf sfnt.Buffer
	for i, f := range goFonts() {
		all := texts
		if i == 1 {
			all = []string{chartTitle(tl)}
		}
		for _, s := range all {
			for _, r := range s {
				if g, err := f.GlyphIndex(&buf, r); err != nil || g == 0 {
					t.Errorf("font %d has no glyph for %q (in %q): %v", i, r, s, err)
				}
			}
		}
	}
}

// decodePNG renders tl and decodes it.
func decodePNG(t *testing.T, tl ledger.Timeline) (image.Image, []byte) {
	t.Helper()
	var b bytes.Buffer
	if err := PNG(&b, tl); err != nil {
		t.Fatal(err)
	}
	data := slices.Clone(b.Bytes())
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	return img, data
}

// ink counts the pixels in [x0, x1)×[y0, y1) dark enough to be text (the
// grid, the legend box and the background are lighter).
func ink(img image.Image, x0, y0, x1, y1 float64) int {
	n := 0
	for y := int(math.Round(y0)); y < int(math.Round(y1)); y++ {
		for x := int(math.Round(x0)); x < int(math.Round(x1)); x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			if max(r, g, b)>>8 < 0xa0 {
				n++
			}
		}
	}
	return n
}

// rgb is c's 8-bit red, green and blue.
func rgb(c color.Color) [3]uint32 {
	r, g, b, _ := c.RGBA()
	return [3]uint32{r >> 8, g >> 8, b >> 8}
}

// pixelAt is the colour of img's pixel nearest (x, y).
func pixelAt(img image.Image, x, y float64) [3]uint32 {
	return rgb(img.At(int(math.Round(x)), int(math.Round(y))))
}

// TestPNGText: the PNG has its text where the layout puts it (title,
// legend, tick labels, axis titles) and none between the step labels.
func TestPNGText(t *testing.T) {
	tl, _ := testReport(t)
	img, _ := decodePNG(t, tl)
	c := newChart(tl)
	left, right := float64(marginLeft), float64(Width-marginRight)
	top, bottom := float64(marginTop), float64(Height-marginBottom)
	if n := ink(img, left, titleBaseline-12, left+200, titleBaseline+4); n < 50 {
		t.Errorf("title: %d dark pixels", n)
	}
	for _, tk := range c.yTicks() {
		if n := ink(img, 0, tk.Pos-7, left-6, tk.Pos+7); n < 5 {
			t.Errorf("ε tick %s: %d dark pixels left of the axis", tk.Label, n)
		}
	}
	// The ε tick labels end yTickLabelGap left of the axis.
	if n := ink(img, left-yTickLabelGap+1, top, left-5, bottom); n != 0 {
		t.Errorf("%d dark pixels between the ε tick labels and their ticks", n)
	}
	xs := c.xTicks()
	for i, tk := range xs {
		if n := ink(img, tk.Pos-15, bottom+7, tk.Pos+15, bottom+xTickBaseline+4); n < 5 {
			t.Errorf("step tick %s: %d dark pixels below the axis", tk.Label, n)
		}
		if i > 0 {
			mid := (xs[i-1].Pos + tk.Pos) / 2
			if n := ink(img, mid-3, bottom+7, mid+3, bottom+xTickBaseline+4); n != 0 {
				t.Errorf("%d dark pixels between the labels of steps %s and %s", n, xs[i-1].Label, tk.Label)
			}
		}
	}
	if n := ink(img, (left+right)/2-30, bottom+xTickBaseline+8, (left+right)/2+30, bottom+xTitleBaseline+4); n < 20 {
		t.Errorf("x axis title: %d dark pixels", n)
	}
	if n := ink(img, 0, (top+bottom)/2-60, yTitleCenter+12, (top+bottom)/2+60); n < 50 {
		t.Errorf("y axis title: %d dark pixels", n)
	}
	if n := ink(img, 0, (top+bottom)/2+70, yTitleCenter+12, bottom); n != 0 {
		t.Errorf("y axis title: %d dark pixels below its extent", n)
	}

	// The legend: its box, each series' swatch in the series' colour, and
	// a label beside it.
	l := newLegend(tl)
	if got := pixelAt(img, l.X, l.Mid); got != rgb(colorLegendEdge) {
		t.Errorf("legend box's left edge: pixel %v, want %v", got, rgb(colorLegendEdge))
	}
	if got := pixelAt(img, l.X+l.W, l.Mid); got != rgb(colorLegendEdge) {
		t.Errorf("legend box's right edge: pixel %v, want %v", got, rgb(colorLegendEdge))
	}
	for _, it := range l.Items {
		var x, y float64
		var want [3]uint32
		switch it.Series {
		case seriesEpsilon:
			x, y, want = it.X+3, l.Mid, rgb(colorEpsilon)
		case seriesTarget:
			x, y, want = it.X+3, l.Mid, rgb(colorTarget)
		case seriesNewTerm:
			x, y, want = it.Center(), l.Mid-7, rgb(colorNewTerm)
		case seriesReplay:
			x, y, want = it.Center(), l.Mid, rgb(colorReplay)
		}
		if got := pixelAt(img, x, y); got != want {
			t.Errorf("legend swatch of %s: pixel %v, want %v", it.Series, got, want)
		}
		if n := ink(img, it.TextX, l.Mid-8, it.TextX+it.TextW, l.Mid+8); n < 15 {
			t.Errorf("legend label %q: %d dark pixels", it.Label, n)
		}
	}
	if n := ink(img, l.X+l.W+2, l.Y, Width, l.Y+l.H); n != 0 {
		t.Errorf("%d dark pixels right of the legend box", n)
	}

	// A run without new terms or replays: neither is in the legend, nor
	// anywhere in the image.
	img, _ = decodePNG(t, plainTimeline(50, 3))
	for y := range Height {
		for x := range Width {
			if got := pixelAt(img, float64(x), float64(y)); got == rgb(colorNewTerm) || got == rgb(colorReplay) {
				t.Fatalf("a run without marks: pixel (%d, %d) is %v, a mark's colour", x, y, got)
			}
		}
	}
}

// TestPNGDeterministic: the same timeline gives the same bytes, also
// when drawn on several goroutines at once (each draws with its own
// font faces).
func TestPNGDeterministic(t *testing.T) {
	tl, _ := testReport(t)
	_, want := decodePNG(t, tl)
	got := make([][]byte, 4)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			var b bytes.Buffer
			if err := PNG(&b, tl); err != nil {
				t.Error(err)
			}
			got[i] = b.Bytes()
		})
	}
	wg.Wait()
	for i, g := range got {
		if !bytes.Equal(g, want) {
			t.Errorf("render %d differs from the first (%d bytes, %d)", i, len(g), len(want))
		}
	}
	// And the text is part of it: another run name, other bytes.
	tl.Run = "report-tesT"
	if _, other := decodePNG(t, tl); bytes.Equal(other, want) {
		t.Error("a renamed run draws the same PNG: the title is not drawn")
	}
}

// TestTermLabels: a term's label is hidden where it would overlap the
// label before it or run past the plot.
func TestTermLabels(t *testing.T) {
	tl := plainTimeline(1000, 3)
	for i, step := range []int64{100, 105, 400, 999} {
		p := int(step - 1)
		tl.Marks = append(tl.Marks, ledger.Mark{Kind: ledger.MarkNewTerm, Seq: uint64(step), Step: step, Point: p, Term: uint64(3 + i), PrevTerm: uint64(2 + i)})
	}
	if got, want := termLabels(newChart(tl), tl), []string{"term 3", "", "term 5", ""}; !slices.Equal(got, want) {
		t.Errorf("term labels %q, want %q", got, want)
	}
}

// TestHTMLChartText: the SVG has the PNG's words: the title, the axis
// titles, the tick labels and the legend (each series drawn, with its
// swatch).
func TestHTMLChartText(t *testing.T) {
	for _, tl := range []ledger.Timeline{plainTimeline(20, 3), must(testReport(t))} {
		var b bytes.Buffer
		if err := HTML(&b, tl, ledger.AuditReport{OK: true}); err != nil {
			t.Fatal(err)
		}
		page := b.String()
		var svg svgElem
		if err := xml.Unmarshal([]byte(page[strings.Index(page, "<svg"):strings.Index(page, "</svg>")+len("</svg>")]), &svg); err != nil {
			t.Fatal(err)
		}
		var texts, legend []string
		swatches := map[string]int{}
		for _, k := range svg.Kids {
			switch {
			case k.XMLName.Local == "text" && k.attr("class") == "legend":
				legend = append(legend, k.Content)
			case k.XMLName.Local == "text":
				texts = append(texts, k.Content)
			case strings.HasPrefix(k.attr("class"), "swatch "):
				swatches[strings.TrimPrefix(k.attr("class"), "swatch ")]++
			}
		}
		c := newChart(tl)
		want := []string{chartTitle(tl)}
		for _, tk := range append(c.yTicks(), c.xTicks()...) {
			want = append(want, tk.Label)
		}
		want = append(want, xAxisTitle, yAxisTitle)
		for _, l := range termLabels(c, tl) {
			if l != "" {
				want = append(want, l)
			}
		}
		if !slices.Equal(texts, want) {
			t.Errorf("%s: SVG text %q, want %q", tl.Run, texts, want)
		}
		var wantLegend []string
		for _, it := range newLegend(tl).Items {
			wantLegend = append(wantLegend, it.Label)
			if swatches[it.Series] != 1 {
				t.Errorf("%s: %d legend swatches of %s, want 1", tl.Run, swatches[it.Series], it.Series)
			}
		}
		if !slices.Equal(legend, wantLegend) || len(swatches) != len(wantLegend) {
			t.Errorf("%s: SVG legend %q with swatches %v, want %q", tl.Run, legend, swatches, wantLegend)
		}
	}
}

func must(tl ledger.Timeline, _ ledger.AuditReport) ledger.Timeline { return tl }
