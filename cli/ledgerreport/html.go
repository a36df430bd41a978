package ledgerreport

import (
	"fmt"
	"html/template"
	"io"
	"strconv"
	"strings"

	"github.com/dpcluster/dpcluster/ledger"
)

// HTML writes the report as one self-contained HTML page: the audit's
// verdict and figures, the chart as inline SVG (class "epsilon": a
// polyline with one point per charge; "target": the target ε line;
// "new-term": one vertical line per new Raft term; "replay": one circle
// per replay; with the PNG's title, axis titles, tick labels and legend,
// in the same places and words, the legend's swatches of class
// "swatch epsilon" and so on), the marks as a table, and what they mean.
// It needs no script and loads nothing.
func HTML(w io.Writer, tl ledger.Timeline, rep ledger.AuditReport) error {
	return page.Execute(w, newPageData(tl, rep))
}

type pageData struct {
	Timeline ledger.Timeline
	Audit    ledger.AuditReport
	Width    int
	Height   int
	Points   string // the polyline's points attribute
	Target   struct{ X1, X2, Y float64 }
	Plot     struct{ X1, X2, Y1, Y2 float64 }
	XTicks   []tick
	YTicks   []tick
	Terms    []markData
	Replays  []markData
	Spent    float64
	Applied  int
	// The chart's title, axis titles and legend, where the PNG draws
	// them, and where its other text goes (layout.go).
	Title          string
	XTitle, YTitle struct {
		Text string
		X, Y float64
	}
	Legend                                          legendBox
	TitleY, YTickGap, XTickBaseline, TermDX, TermDY float64
	// GridRatio bounds a PLD ledger's ε above the PLD accountant's ε of
	// exactly its charges (ledger.PLDGridRatio).
	GridRatio float64
}

type markData struct {
	X, Y  float64
	Title string
	Label string // a new term's "term N", "" where it would not fit
	Mark  ledger.Mark
}

func newPageData(tl ledger.Timeline, rep ledger.AuditReport) pageData {
	c := newChart(tl)
	d := pageData{Timeline: tl, Audit: rep, Width: Width, Height: Height, GridRatio: ledger.PLDGridRatio}
	var pts strings.Builder
	for i, p := range tl.Points {
		if i > 0 {
			pts.WriteByte(' ')
		}
		fmt.Fprintf(&pts, "%.1f,%.1f", c.x(p.Step), c.y(p.Epsilon))
		d.Spent = p.Epsilon
		if !p.Replay {
			d.Applied++
		}
	}
	if rep.Ended {
		d.Applied = rep.Applied // the end record's statement (Audit)
	}
	d.Points = pts.String()
	d.Plot.X1, d.Plot.X2, d.Plot.Y1, d.Plot.Y2 = marginLeft, Width-marginRight, marginTop, Height-marginBottom
	d.Target.X1, d.Target.X2, d.Target.Y = marginLeft, Width-marginRight, c.y(tl.TargetEpsilon)
	d.XTicks, d.YTicks = c.xTicks(), c.yTicks()
	d.Title, d.Legend = chartTitle(tl), newLegend(tl)
	d.TitleY, d.YTickGap, d.XTickBaseline, d.TermDX, d.TermDY = titleBaseline, yTickLabelGap, xTickBaseline, termLabelOffset, termLabelBase
	d.XTitle.Text, d.XTitle.X, d.XTitle.Y = xAxisTitle, (d.Plot.X1+d.Plot.X2)/2, d.Plot.Y2+xTitleBaseline
	d.YTitle.Text, d.YTitle.X, d.YTitle.Y = yAxisTitle, yTitleCenter, (d.Plot.Y1+d.Plot.Y2)/2
	terms := termLabels(c, tl)
	for _, m := range tl.Marks {
		p := tl.Points[m.Point]
		md := markData{X: c.x(p.Step), Y: c.y(p.Epsilon), Mark: m}
		switch m.Kind {
		case ledger.MarkNewTerm:
			md.Label, terms = terms[0], terms[1:] // "" where it would not fit
			md.Title = fmt.Sprintf("new Raft term %d (after term %d) at step %d, record %d: a leader change or a restart", m.Term, m.PrevTerm, m.Step, m.Seq)
			d.Terms = append(d.Terms, md)
		case ledger.MarkReplay:
			md.Title = fmt.Sprintf("replay of step %d, record %d: charged, not applied again", m.Step, m.Seq)
			d.Replays = append(d.Replays, md)
		}
	}
	return d
}

var page = template.Must(template.New("report").Funcs(template.FuncMap{
	"f":    func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
	"g":    func(v float64) string { return strconv.FormatFloat(v, 'g', 8, 64) },
	"plus": func(a, b float64) string { return strconv.FormatFloat(a+b, 'f', 1, 64) },
	// accountant names the accountant the audit reports the run enforced.
	"accountant": func(a string) string { return strings.ToUpper(a) },
	"deref":      func(v *float64) float64 { return *v },
}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Privacy audit: {{.Timeline.Run}}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; max-width: 1000px; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
td, th { padding: 0.15rem 0.8rem 0.15rem 0; text-align: left; vertical-align: top; }
.ok { color: #1a7f37; font-weight: bold; } .failed { color: #c00; font-weight: bold; }
svg { max-width: 100%; height: auto; border: 1px solid #ddd; }
svg text { font-size: 13px; fill: #444; }
svg text.title { font-size: 16px; font-weight: bold; fill: #222; }
svg text.axis-title { font-size: 14px; }
svg text.term { fill: #7b3fb5; }
.axis { stroke: #888; } .grid { stroke: #eee; }
.legend-box { fill: #fff; stroke: #ccc; }
.epsilon { fill: none; stroke: #1f5fbf; stroke-width: 2; }
.target { stroke: #c00; stroke-width: 1.5; stroke-dasharray: 6 4; }
.new-term { stroke: #7b3fb5; stroke-width: 1.5; stroke-dasharray: 3 3; }
.replay { fill: #e07b00; stroke: #fff; }
code { font-size: 0.9em; }
</style>
</head>
<body>
<h1>Privacy audit: {{.Timeline.Run}}</h1>
<p>Audit {{if .Audit.OK}}<span class="ok">passed</span>{{else}}<span class="failed">FAILED</span>{{end}}: <code>{{.Audit.Path}}</code></p>
<table>
<tr><th>ε spent</th><td>{{g .Spent}} of the target {{g .Timeline.TargetEpsilon}} at δ = {{g .Timeline.Delta}} ({{accountant .Audit.Accountant}} accountant; recomputed by the audit: {{g .Audit.RecomputedEpsilon}})</td></tr>
{{- if and (eq .Audit.Accountant "pld") .Audit.PLDEpsilon}}
<tr><th>check</th><td>the PLD accountant's ε of exactly these charges is {{g (deref .Audit.PLDEpsilon)}}; the ledger records ε on its count grid, at most {{g .GridRatio}} × that</td></tr>
{{- end}}
<tr><th>charges</th><td>{{len .Timeline.Points}}: {{.Applied}} applied steps, {{len .Replays}} replays{{if .Audit.Ended}}, {{.Audit.Unapplied}} charged and never applied; the run ended after step {{.Audit.EndStep}} ({{.Audit.EndReason}}){{end}}</td></tr>
<tr><th>new Raft terms</th><td>{{len .Terms}} (leader changes or restarts)</td></tr>
<tr><th>noise</th><td>{{if .Audit.Private}}{{.Audit.Noise}} (differentially private){{else}}{{.Audit.Noise}}: NOT differentially private{{end}}, mechanism {{.Audit.Mechanism}}</td></tr>
<tr><th>history</th><td><code>{{.Audit.History}}</code></td></tr>
<tr><th>head hash</th><td><code>{{.Audit.HeadHash}}</code></td></tr>
{{- if .Audit.TornBytes}}
<tr><th>torn tail</th><td>{{.Audit.TornBytes}} bytes after the last complete record</td></tr>
{{- end}}
</table>
{{- if .Audit.Problems}}
<h2>Problems</h2>
<ul>{{range .Audit.Problems}}<li>{{.}}</li>{{end}}</ul>
{{- end}}
<h2>ε over steps</h2>
<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {{.Width}} {{.Height}}" width="{{.Width}}" height="{{.Height}}" role="img" aria-label="ε spent over training steps">
<text class="title" x="{{f .Plot.X1}}" y="{{f .TitleY}}">{{.Title}}</text>
<rect class="legend-box" x="{{f .Legend.X}}" y="{{f .Legend.Y}}" width="{{f .Legend.W}}" height="{{f .Legend.H}}"/>
{{- range .Legend.Items}}
{{- if eq .Series "epsilon"}}
<line class="swatch epsilon" x1="{{f .X}}" y1="{{f $.Legend.Mid}}" x2="{{f .End}}" y2="{{f $.Legend.Mid}}"/>
{{- else if eq .Series "target"}}
<line class="swatch target" x1="{{f .X}}" y1="{{f $.Legend.Mid}}" x2="{{f .End}}" y2="{{f $.Legend.Mid}}"/>
{{- else if eq .Series "new-term"}}
<line class="swatch new-term" x1="{{f .Center}}" y1="{{plus $.Legend.Mid -8}}" x2="{{f .Center}}" y2="{{plus $.Legend.Mid 8}}"/>
{{- else if eq .Series "replay"}}
<circle class="swatch replay" cx="{{f .Center}}" cy="{{f $.Legend.Mid}}" r="5"/>
{{- end}}
<text class="legend" x="{{f .TextX}}" y="{{f $.Legend.Baseline}}" textLength="{{f .TextW}}" lengthAdjust="spacingAndGlyphs">{{.Label}}</text>
{{- end}}
{{- range .YTicks}}
<line class="grid" x1="{{f $.Plot.X1}}" y1="{{f .Pos}}" x2="{{f $.Plot.X2}}" y2="{{f .Pos}}"/>
<line class="axis" x1="{{plus $.Plot.X1 -5}}" y1="{{f .Pos}}" x2="{{f $.Plot.X1}}" y2="{{f .Pos}}"/>
<text x="{{f $.Plot.X1}}" y="{{f .Pos}}" dx="-{{$.YTickGap}}" dy="5" text-anchor="end">{{.Label}}</text>
{{- end}}
{{- range .XTicks}}
<line class="axis" x1="{{f .Pos}}" y1="{{f $.Plot.Y2}}" x2="{{f .Pos}}" y2="{{plus $.Plot.Y2 5}}"/>
<text x="{{f .Pos}}" y="{{f $.Plot.Y2}}" dy="{{$.XTickBaseline}}" text-anchor="middle">{{.Label}}</text>
{{- end}}
<line class="axis" x1="{{f .Plot.X1}}" y1="{{f .Plot.Y2}}" x2="{{f .Plot.X2}}" y2="{{f .Plot.Y2}}"/>
<line class="axis" x1="{{f .Plot.X1}}" y1="{{f .Plot.Y1}}" x2="{{f .Plot.X1}}" y2="{{f .Plot.Y2}}"/>
<text class="axis-title" x="{{f .XTitle.X}}" y="{{f .XTitle.Y}}" text-anchor="middle">{{.XTitle.Text}}</text>
<text class="axis-title" transform="translate({{f .YTitle.X}} {{f .YTitle.Y}}) rotate(-90)" dy="5" text-anchor="middle">{{.YTitle.Text}}</text>
<line class="target" x1="{{f .Target.X1}}" y1="{{f .Target.Y}}" x2="{{f .Target.X2}}" y2="{{f .Target.Y}}"><title>target ε = {{g .Timeline.TargetEpsilon}}</title></line>
{{- range .Terms}}
<line class="new-term" x1="{{f .X}}" y1="{{f $.Plot.Y1}}" x2="{{f .X}}" y2="{{f $.Plot.Y2}}"><title>{{.Title}}</title></line>
{{- if .Label}}
<text class="term" x="{{f .X}}" y="{{f $.Plot.Y1}}" dx="{{$.TermDX}}" dy="{{$.TermDY}}">{{.Label}}</text>
{{- end}}
{{- end}}
<polyline class="epsilon" points="{{.Points}}"><title>ε spent after each charge</title></polyline>
{{- range .Replays}}
<circle class="replay" cx="{{f .X}}" cy="{{f .Y}}" r="5"><title>{{.Title}}</title></circle>
{{- end}}
</svg>
<p>Blue: ε spent after each charge, one point per ledger charge record. Red dashes: the run's target ε.
Purple dashes: the first charge of a new Raft term, where a new leader had been elected, after a leader
change or after the cluster restarted and resumed the run (the ledger records the term, not which
replica led, so it cannot tell the two apart; with one replica every new term is a restart). Orange
dots: replays, releases of a step that had already been applied: charged once, not applied again.</p>
{{- if .Timeline.Marks}}
<h2>Marks</h2>
<table>
<tr><th>kind</th><th>record</th><th>step</th><th>term</th></tr>
{{- range .Timeline.Marks}}
<tr><td>{{if eq .Kind "new_term"}}new term (leader change or restart){{else}}{{.Kind}}{{end}}</td><td>{{.Seq}}</td><td>{{.Step}}</td><td>{{if .PrevTerm}}{{.PrevTerm}} → {{end}}{{.Term}}</td></tr>
{{- end}}
</table>
{{- end}}
<p>Generated by <code>coordinator ledger audit --report</code> from the ledger alone.</p>
</body>
</html>
`))
