package ledgerreport

import (
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"

	"golang.org/x/image/font"
	"golang.org/x/image/math/fixed"

	"github.com/dpcluster/dpcluster/ledger"
)

// The PNG's colours, the same as the HTML chart's.
var (
	colorBackground = color.RGBA{0xff, 0xff, 0xff, 0xff}
	colorAxis       = color.RGBA{0x88, 0x88, 0x88, 0xff}
	colorGrid       = color.RGBA{0xee, 0xee, 0xee, 0xff}
	colorEpsilon    = color.RGBA{0x1f, 0x5f, 0xbf, 0xff}
	colorTarget     = color.RGBA{0xcc, 0x00, 0x00, 0xff}
	colorNewTerm    = color.RGBA{0x7b, 0x3f, 0xb5, 0xff}
	colorReplay     = color.RGBA{0xe0, 0x7b, 0x00, 0xff}
	colorText       = color.RGBA{0x44, 0x44, 0x44, 0xff}
	colorTitle      = color.RGBA{0x22, 0x22, 0x22, 0xff}
	colorLegendEdge = color.RGBA{0xcc, 0xcc, 0xcc, 0xff}
)

// PNG writes the chart alone as a Width×Height PNG image, drawn in this
// order: white background; the title (run, δ); the legend, a box above
// the plot naming each series drawn; light grid lines at the ε ticks;
// grey axes with tick marks at the step and ε ticks, labelled, and the
// axis titles ("step", "ε (privacy spent)", the latter reading upwards);
// the target ε as a red dashed line; each new Raft term as a purple
// dashed vertical line, labelled "term N" at the top where the label
// fits; ε spent as a blue line 2 pixels wide through one point per
// charge; and each replay as an orange disc of radius 5. The text is set
// in the Go font (golang.org/x/image/font/gofont), anti-aliased; the
// same timeline always gives the same bytes. The HTML report draws the
// same chart, with the audit's figures.
func PNG(w io.Writer, tl ledger.Timeline) error {
	c := newChart(tl)
	img := image.NewRGBA(image.Rect(0, 0, Width, Height))
	fillRect(img, 0, 0, Width, Height, colorBackground)
	title, label, axisTitle := newFace(true, titleSize), newFace(false, labelSize), newFace(false, axisTitleSize)
	defer title.Close()
	defer label.Close()
	defer axisTitle.Close()
	left, right := float64(marginLeft), float64(Width-marginRight)
	top, bottom := float64(marginTop), float64(Height-marginBottom)

	drawText(img, title, chartTitle(tl), left, titleBaseline, alignLeft, colorTitle)
	drawLegend(img, label, newLegend(tl))

	for _, t := range c.yTicks() {
		line(img, left, t.Pos, right, t.Pos, 1, 0, colorGrid)
		line(img, left-5, t.Pos, left, t.Pos, 1, 0, colorAxis)
		drawText(img, label, t.Label, left-yTickLabelGap, t.Pos+5, alignRight, colorText)
	}
	for _, t := range c.xTicks() {
		line(img, t.Pos, bottom, t.Pos, bottom+5, 1, 0, colorAxis)
		drawText(img, label, t.Label, t.Pos, bottom+xTickBaseline, alignCenter, colorText)
	}
	line(img, left, bottom, right, bottom, 1, 0, colorAxis)
	line(img, left, top, left, bottom, 1, 0, colorAxis)
	drawText(img, axisTitle, xAxisTitle, (left+right)/2, bottom+xTitleBaseline, alignCenter, colorText)
	drawTextUp(img, axisTitle, yAxisTitle, yTitleCenter, (top+bottom)/2, colorText)

	line(img, left, c.y(tl.TargetEpsilon), right, c.y(tl.TargetEpsilon), 2, 8, colorTarget)
	terms := termLabels(c, tl)
	for _, m := range tl.Marks {
		if m.Kind == ledger.MarkNewTerm {
			x := c.x(tl.Points[m.Point].Step)
			line(img, x, top, x, bottom, 1, 4, colorNewTerm)
			if terms[0] != "" {
				drawText(img, label, terms[0], x+termLabelOffset, top+termLabelBase, alignLeft, colorNewTerm)
			}
			terms = terms[1:]
		}
	}
	for i := 1; i < len(tl.Points); i++ {
		p, q := tl.Points[i-1], tl.Points[i]
		line(img, c.x(p.Step), c.y(p.Epsilon), c.x(q.Step), c.y(q.Epsilon), 2, 0, colorEpsilon)
	}
	if len(tl.Points) == 1 {
		p := tl.Points[0]
		disc(img, c.x(p.Step), c.y(p.Epsilon), 2, colorEpsilon)
	}
	for _, m := range tl.Marks {
		if m.Kind == ledger.MarkReplay {
			p := tl.Points[m.Point]
			disc(img, c.x(p.Step), c.y(p.Epsilon), 5, colorReplay)
		}
	}
	return png.Encode(w, img)
}

// drawLegend draws the legend box and, for each item, its series' swatch
// (drawn as the series is) and its label.
func drawLegend(img *image.RGBA, face font.Face, l legendBox) {
	x0, y0 := int(math.Round(l.X)), int(math.Round(l.Y))
	x1, y1 := int(math.Round(l.X+l.W)), int(math.Round(l.Y+l.H))
	fillRect(img, x0, y0, x1, y1, colorBackground)
	for _, e := range [][4]int{{x0, y0, x1, y0}, {x0, y1, x1, y1}, {x0, y0, x0, y1}, {x1, y0, x1, y1}} {
		line(img, float64(e[0]), float64(e[1]), float64(e[2]), float64(e[3]), 1, 0, colorLegendEdge)
	}
	for _, it := range l.Items {
		mid := l.Mid
		switch it.Series {
		case seriesEpsilon:
			line(img, it.X, mid, it.End(), mid, 2, 0, colorEpsilon)
		case seriesTarget:
			line(img, it.X, mid, it.End(), mid, 2, 8, colorTarget)
		case seriesNewTerm:
			line(img, it.Center(), mid-8, it.Center(), mid+8, 1, 4, colorNewTerm)
		case seriesReplay:
			disc(img, it.Center(), mid, 5, colorReplay)
		}
		drawText(img, face, it.Label, it.TextX, l.Baseline, alignLeft, colorText)
	}
}

type align int

const (
	alignLeft align = iota
	alignCenter
	alignRight
)

// drawText draws s in face with its baseline at y, starting at x
// (alignLeft), centred on x or ending at x.
func drawText(img *image.RGBA, face font.Face, s string, x, y float64, a align, col color.RGBA) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(col), Face: face}
	switch a {
	case alignCenter:
		x -= fixedToFloat(d.MeasureString(s)) / 2
	case alignRight:
		x -= fixedToFloat(d.MeasureString(s))
	}
	d.Dot = fixed.P(int(math.Round(x)), int(math.Round(y)))
	d.DrawString(s)
}

// drawTextUp draws s in face reading upwards (turned 90° anticlockwise),
// centred on (cx, cy): it sets s on a mask, turns the mask, and paints
// col through it.
func drawTextUp(img *image.RGBA, face font.Face, s string, cx, cy float64, col color.RGBA) {
	m := face.Metrics()
	w, asc := font.MeasureString(face, s).Ceil(), m.Ascent.Ceil()
	h := asc + m.Descent.Ceil()
	flat := image.NewAlpha(image.Rect(0, 0, w, h))
	d := font.Drawer{Dst: flat, Src: image.Opaque, Face: face, Dot: fixed.P(0, asc)}
	d.DrawString(s)
	up := image.NewAlpha(image.Rect(0, 0, h, w))
	for y := range h {
		for x := range w {
			up.SetAlpha(y, w-1-x, flat.AlphaAt(x, y))
		}
	}
	x0, y0 := int(math.Round(cx))-h/2, int(math.Round(cy))-w/2
	draw.DrawMask(img, image.Rect(x0, y0, x0+h, y0+w), image.NewUniform(col), image.Point{}, up, image.Point{}, draw.Over)
}

func fillRect(img *image.RGBA, x0, y0, x1, y1 int, col color.RGBA) {
	for y := y0; y < y1; y++ {
		for x := x0; x < x1; x++ {
			img.SetRGBA(x, y, col)
		}
	}
}

// line draws from (x0, y0) to (x1, y1), width pixels wide, by stepping
// one pixel at a time along the longer axis (a DDA). With dash > 0 it
// draws dash pixels on, dash pixels off.
func line(img *image.RGBA, x0, y0, x1, y1 float64, width, dash int, col color.RGBA) {
	dx, dy := x1-x0, y1-y0
	n := int(math.Ceil(math.Max(math.Abs(dx), math.Abs(dy))))
	for i := 0; i <= n; i++ {
		if dash > 0 && (i/dash)%2 == 1 {
			continue
		}
		t := 0.0
		if n > 0 {
			t = float64(i) / float64(n)
		}
		px, py := int(math.Round(x0+t*dx)), int(math.Round(y0+t*dy))
		for ox := 0; ox < width; ox++ {
			for oy := 0; oy < width; oy++ {
				img.SetRGBA(px+ox-width/2, py+oy-width/2, col) // outside the image: ignored
			}
		}
	}
}

// disc fills the pixels within radius r of (cx, cy).
func disc(img *image.RGBA, cx, cy float64, r int, col color.RGBA) {
	x0, y0 := int(math.Round(cx)), int(math.Round(cy))
	for y := -r; y <= r; y++ {
		for x := -r; x <= r; x++ {
			if x*x+y*y <= r*r {
				img.SetRGBA(x0+x, y0+y, col)
			}
		}
	}
}
