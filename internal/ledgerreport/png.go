package ledgerreport

import (
	"image"
	"image/color"
	"image/png"
	"io"
	"math"

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
)

// PNG writes the chart alone as a Width×Height PNG image, drawn in this
// order: white background, light grid lines at the ε ticks, grey axes with
// tick marks at the step and ε ticks, the target ε as a red dashed line,
// each new Raft term as a purple dashed vertical line, ε spent as a blue
// line 2 pixels wide through one point per charge, and each replay as an
// orange disc of radius 5. It carries no text (the standard library has no
// font); the HTML report has the labels and the figures.
func PNG(w io.Writer, tl ledger.Timeline) error {
	c := newChart(tl)
	img := image.NewRGBA(image.Rect(0, 0, Width, Height))
	fillRect(img, 0, 0, Width, Height, colorBackground)
	left, right := float64(marginLeft), float64(Width-marginRight)
	top, bottom := float64(marginTop), float64(Height-marginBottom)
	for _, e := range c.epsTicks(6) {
		line(img, left, c.y(e), right, c.y(e), 1, 0, colorGrid)
		line(img, left-5, c.y(e), left, c.y(e), 1, 0, colorAxis)
	}
	for _, s := range c.stepTicks(8) {
		line(img, c.x(s), bottom, c.x(s), bottom+5, 1, 0, colorAxis)
	}
	line(img, left, bottom, right, bottom, 1, 0, colorAxis)
	line(img, left, top, left, bottom, 1, 0, colorAxis)
	line(img, left, c.y(tl.TargetEpsilon), right, c.y(tl.TargetEpsilon), 2, 8, colorTarget)
	for _, m := range tl.Marks {
		if m.Kind == ledger.MarkNewTerm {
			x := c.x(tl.Points[m.Point].Step)
			line(img, x, top, x, bottom, 1, 4, colorNewTerm)
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
