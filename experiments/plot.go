package main

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// palette holds distinguishable line colours (Okabe–Ito).
var palette = []color.Color{
	color.RGBA{0, 114, 178, 255},
	color.RGBA{213, 94, 0, 255},
	color.RGBA{0, 158, 115, 255},
	color.RGBA{204, 121, 167, 255},
	color.RGBA{230, 159, 0, 255},
	color.RGBA{86, 180, 233, 255},
}

// series is one named curve.
type series struct {
	Name string
	X, Y []float64
}

// plotLines writes a line plot of the series to path (PNG).
func plotLines(path, title, xlabel, ylabel string, ss []series) error {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, xlabel, ylabel
	// Legend where the curves are not: at the top for decreasing curves
	// (losses, schedules), at the bottom for increasing ones (accuracy).
	p.Legend.Top = len(ss) > 0 && len(ss[0].Y) > 1 && ss[0].Y[len(ss[0].Y)-1] < ss[0].Y[0]
	for i, s := range ss {
		xy := make(plotter.XYs, 0, len(s.X))
		for k := range s.X {
			if !math.IsNaN(s.Y[k]) && !math.IsInf(s.Y[k], 0) {
				xy = append(xy, plotter.XY{X: s.X[k], Y: s.Y[k]})
			}
		}
		if len(xy) == 0 {
			continue
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		if i%2 == 1 {
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(s.Name, l)
	}
	p.Add(plotter.NewGrid())
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

// plotHists writes overlaid step histograms of the value sets to path.
func plotHists(path, title, xlabel string, names []string, vals [][]float64, bins int) error {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, xlabel, "fraction of coordinates"
	p.Legend.Top = true
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, vs := range vals {
		for _, v := range vs {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if !(hi > lo) {
		hi = lo + 1
	}
	w := (hi - lo) / float64(bins)
	for i, vs := range vals {
		counts := make([]float64, bins)
		n := 0
		for _, v := range vs {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			k := min(int((v-lo)/w), bins-1)
			counts[k]++
			n++
		}
		// A step outline, so overlapping histograms stay readable.
		xy := plotter.XYs{{X: lo, Y: 0}}
		for k, c := range counts {
			y := c / float64(max(n, 1))
			xy = append(xy, plotter.XY{X: lo + float64(k)*w, Y: y}, plotter.XY{X: lo + float64(k+1)*w, Y: y})
		}
		xy = append(xy, plotter.XY{X: hi, Y: 0})
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(names[i], l)
	}
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

// plotTable draws the accuracy table as grouped bars: one panel per task
// would need a grid of plots, so the x axis enumerates (task, ε) and each
// optimizer is a bar group.
func plotTable(path string, tasks []string, cells []cell, eps []float64) error {
	p := plot.New()
	p.Title.Text = "Test accuracy (mean over seeds; tuned per optimizer)"
	p.Y.Label.Text = "test accuracy (%)"
	var labels []string
	lo := math.Inf(1)
	for _, t := range tasks {
		for _, e := range eps {
			labels = append(labels, fmt.Sprintf("%s\nε=%g", t, e))
		}
	}
	for _, c := range cells {
		if m, _, _ := meanStd(c.Acc); m < lo {
			lo = m
		}
	}
	w := vg.Points(7)
	for i, a := range tableAlgos {
		var vals plotter.Values
		for _, t := range tasks {
			for _, e := range eps {
				for _, c := range cells {
					if c.Task == t && c.Algo == a && c.Eps == e {
						m, _, _ := meanStd(c.Acc)
						if math.IsNaN(m) {
							m = 0
						}
						vals = append(vals, 100*m)
					}
				}
			}
		}
		b, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		b.Color = palette[i]
		b.LineStyle.Width = 0
		b.Offset = w * vg.Length(i-1)
		p.Add(b)
		p.Legend.Add(string(a), b)
	}
	// Zoom on the differences: the axis starts a few points under the
	// lowest mean (bars are clipped there).
	p.Y.Min = math.Max(0, math.Floor(100*lo/5)*5-5)
	p.Legend.Top = true
	p.Legend.Left = true
	p.NominalX(labels...)
	p.X.Tick.Label.Rotation = 0
	return p.Save(vg.Length(max(8, 1.1*float64(len(labels))))*vg.Inch, 4.5*vg.Inch, path)
}
