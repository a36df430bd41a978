package ledgerreport

import (
	"bytes"
	"encoding/xml"
	"errors"
	"image/png"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/seed"
)

const testHistory = "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e"

// testReport writes a real ledger: eight charges in terms 2, 3 and 5, two
// of them replays (the second one opening term 5), and returns its
// timeline and audit.
func testReport(t *testing.T) (ledger.Timeline, ledger.AuditReport) {
	t.Helper()
	return testReportOf(t, ledger.AccountantRDP)
}

// testReportOf is testReport for a run that enforces accountant.
func testReportOf(t *testing.T, accountant string) (ledger.Timeline, ledger.AuditReport) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.log")
	l, err := ledger.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Start("report-test", 8, 1e-5, seed.Crypto, ledger.MechanismFloat, accountant, testHistory); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		step   int64
		term   uint64
		index  uint64
		replay bool
	}{{1, 2, 3, false}, {2, 2, 4, false}, {2, 2, 5, true}, {3, 2, 6, false}, {4, 3, 9, false}, {5, 3, 10, false}, {5, 5, 13, true}, {6, 5, 14, false}} {
		if _, err := l.Charge(c.step, accounting.SubsampledGaussian(0.05, 1.0), ledger.Position{History: testHistory, Term: c.term, Index: c.index}, c.replay); err != nil {
			t.Fatal(err)
		}
	}
	recs, _, err := ledger.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := ledger.NewTimeline(recs)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := ledger.Audit(path)
	if err != nil || !rep.OK {
		t.Fatalf("audit: %+v, %v", rep, err)
	}
	return tl, rep
}

// svgElem is any SVG element, with its attributes and children.
type svgElem struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Content string     `xml:",chardata"`
	Kids    []svgElem  `xml:",any"`
}

func (e svgElem) attr(name string) string {
	for _, a := range e.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

func (e svgElem) num(t *testing.T, name string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(e.attr(name), 64)
	if err != nil {
		t.Fatalf("<%s> %s=%q: %v", e.XMLName.Local, name, e.attr(name), err)
	}
	return v
}

// byClass returns the elements of the given class.
func (e svgElem) byClass(class string) []svgElem {
	var out []svgElem
	for _, k := range e.Kids {
		if k.attr("class") == class {
			out = append(out, k)
		}
	}
	return out
}

// near reports whether a SVG coordinate (written with one decimal) is v.
func near(got, want float64) bool { return math.Abs(got-want) <= 0.051 }

func TestHTML(t *testing.T) {
	tl, rep := testReport(t)
	var b bytes.Buffer
	if err := HTML(&b, tl, rep); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, bad := range []string{"<script", "http://", "https://", "src=", "<link"} {
		if strings.Contains(strings.ReplaceAll(page, `xmlns="http://www.w3.org/2000/svg"`, ""), bad) {
			t.Errorf("page is not self-contained: it contains %q", bad)
		}
	}
	for _, want := range []string{"report-test", "passed", rep.HeadHash, testHistory, "2 replays", "6 applied steps", "target ε = 8"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	start, end := strings.Index(page, "<svg"), strings.Index(page, "</svg>")
	if start < 0 || end < start {
		t.Fatal("no inline SVG")
	}
	var svg svgElem
	if err := xml.Unmarshal([]byte(page[start:end+len("</svg>")]), &svg); err != nil {
		t.Fatalf("the SVG is not well-formed XML: %v", err)
	}
	c := newChart(tl)

	lines := svg.byClass("epsilon")
	if len(lines) != 1 {
		t.Fatalf("%d ε polylines, want 1", len(lines))
	}
	pts := strings.Fields(lines[0].attr("points"))
	if len(pts) != len(tl.Points) || len(pts) != rep.Charges {
		t.Fatalf("polyline has %d points, want one per charge (%d)", len(pts), rep.Charges)
	}
	for i, p := range pts {
		x, y, _ := strings.Cut(p, ",")
		gx, _ := strconv.ParseFloat(x, 64)
		gy, _ := strconv.ParseFloat(y, 64)
		if want := tl.Points[i]; !near(gx, c.x(want.Step)) || !near(gy, c.y(want.Epsilon)) {
			t.Errorf("point %d = %s, want step %d ε %v at (%.1f, %.1f)", i, p, want.Step, want.Epsilon, c.x(want.Step), c.y(want.Epsilon))
		}
	}
	target := svg.byClass("target")
	if len(target) != 1 {
		t.Fatalf("%d target lines, want 1", len(target))
	}
	if ty := target[0].num(t, "y1"); !near(ty, c.y(8)) || target[0].num(t, "y2") != ty {
		t.Errorf("target line at y=%v, want horizontal at %.1f (ε = 8)", ty, c.y(8))
	}

	terms := svg.byClass("new-term")
	if len(terms) != 2 {
		t.Fatalf("%d new-term lines, want 2", len(terms))
	}
	for i, step := range []int64{4, 5} {
		if x := terms[i].num(t, "x1"); !near(x, c.x(step)) || terms[i].num(t, "x2") != x {
			t.Errorf("new-term line %d at x=%v, want vertical at step %d (%.1f)", i, x, step, c.x(step))
		}
	}
	replays := svg.byClass("replay")
	if len(replays) != 2 {
		t.Fatalf("%d replay markers, want 2", len(replays))
	}
	for i, pi := range []int{2, 6} {
		p := tl.Points[pi]
		if x, y := replays[i].num(t, "cx"), replays[i].num(t, "cy"); !near(x, c.x(p.Step)) || !near(y, c.y(p.Epsilon)) {
			t.Errorf("replay %d at (%v, %v), want charge %d (step %d) at (%.1f, %.1f)", i, x, y, pi, p.Step, c.x(p.Step), c.y(p.Epsilon))
		}
	}
}

func TestHTMLFailedAudit(t *testing.T) {
	tl, rep := testReport(t)
	rep.OK, rep.Problems = false, []string{"record 4: <forged> ε"}
	var b bytes.Buffer
	if err := HTML(&b, tl, rep); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if !strings.Contains(page, "FAILED") || !strings.Contains(page, "record 4: &lt;forged&gt; ε") {
		t.Errorf("a failed audit's page lacks the verdict or the escaped problem:\n%s", page)
	}
}

func TestPNG(t *testing.T) {
	tl, _ := testReport(t)
	var b bytes.Buffer
	if err := PNG(&b, tl); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	if r := img.Bounds(); r.Dx() != Width || r.Dy() != Height {
		t.Fatalf("image is %v, want %dx%d", r, Width, Height)
	}
	c := newChart(tl)
	at := func(x, y float64) [3]uint32 { return pixelAt(img, x, y) }
	// The target line: dashes of 8 pixels from the plot's left edge.
	if got := at(marginLeft+3, c.y(tl.TargetEpsilon)); got != rgb(colorTarget) {
		t.Errorf("target line pixel %v, want %v", got, rgb(colorTarget))
	}
	if got := at(marginLeft+11, c.y(tl.TargetEpsilon)); got == rgb(colorTarget) {
		t.Errorf("target line is not dashed")
	}
	// Replays: discs at their charges.
	for _, m := range tl.Marks {
		p := tl.Points[m.Point]
		switch m.Kind {
		case ledger.MarkReplay:
			if got := at(c.x(p.Step)+3, c.y(p.Epsilon)); got != rgb(colorReplay) {
				t.Errorf("replay at step %d: pixel %v, want %v", p.Step, got, rgb(colorReplay))
			}
		case ledger.MarkNewTerm:
			if got := at(c.x(p.Step), marginTop+1); got != rgb(colorNewTerm) {
				t.Errorf("new term at step %d: pixel %v, want %v", p.Step, got, rgb(colorNewTerm))
			}
		}
	}
	// ε: the midpoint of every segment between two charges at different
	// steps is on the line (replays and new terms are drawn over some).
	for i := 1; i < len(tl.Points); i++ {
		p, q := tl.Points[i-1], tl.Points[i]
		if p.Step == q.Step {
			continue
		}
		mx, my := (c.x(p.Step)+c.x(q.Step))/2, (c.y(p.Epsilon)+c.y(q.Epsilon))/2
		if got := at(mx, my); got != rgb(colorEpsilon) && got != rgb(colorNewTerm) {
			t.Errorf("segment %d→%d: midpoint pixel %v, want the ε line %v", i-1, i, got, rgb(colorEpsilon))
		}
	}
	// Left of the y axis, away from the tick labels and the axis title:
	// background only.
	if got := at(marginLeft/2, Height/2); got != rgb(colorBackground) {
		t.Errorf("outside the plot: pixel %v, want background", got)
	}
}

func TestFormatOf(t *testing.T) {
	for _, tc := range []struct {
		path string
		want Format
	}{{"a.html", FormatHTML}, {"dir/A.HTM", FormatHTML}, {"x.png", FormatPNG}, {"x.PNG", FormatPNG}} {
		if got, err := FormatOf(tc.path); err != nil || got != tc.want {
			t.Errorf("FormatOf(%q) = %q, %v; want %q", tc.path, got, err, tc.want)
		}
	}
	for _, path := range []string{"a.svg", "a.pdf", "report", "a.html.txt", ""} {
		if got, err := FormatOf(path); !errors.Is(err, ErrFormat) {
			t.Errorf("FormatOf(%q) = %q, %v; want ErrFormat", path, got, err)
		}
	}
}

func TestWriteFile(t *testing.T) {
	tl, rep := testReport(t)
	dir := t.TempDir()
	for _, name := range []string{"r.html", "r.png"} {
		path := filepath.Join(dir, name)
		if err := WriteFile(path, tl, rep); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if isPNG := bytes.HasPrefix(data, []byte("\x89PNG")); isPNG != strings.HasSuffix(name, ".png") {
			t.Errorf("%s: PNG signature %v", name, isPNG)
		}
	}
	bad := filepath.Join(dir, "r.svg")
	if err := WriteFile(bad, tl, rep); !errors.Is(err, ErrFormat) {
		t.Errorf("WriteFile(.svg) = %v, want ErrFormat", err)
	}
	if _, err := os.Stat(bad); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("WriteFile(.svg) left a file: %v", err)
	}
}

// TestHTMLNamesAccountant: the page names the accountant the run enforced
// (it said "RDP" for every run), and for a PLD run shows the PLD ε of
// exactly its charges beside ε spent.
func TestHTMLNamesAccountant(t *testing.T) {
	for _, acc := range []string{ledger.AccountantRDP, ledger.AccountantPLD} {
		tl, rep := testReportOf(t, acc)
		var b bytes.Buffer
		if err := HTML(&b, tl, rep); err != nil {
			t.Fatal(err)
		}
		page := b.String()
		want, other := "("+strings.ToUpper(acc)+" accountant;", "(RDP accountant;"
		if acc == ledger.AccountantRDP {
			other = "(PLD accountant;"
		}
		if !strings.Contains(page, want) || strings.Contains(page, other) {
			t.Errorf("%s run: the page does not name its accountant as %q (or names %q)", acc, want, other)
		}
		if check := strings.Contains(page, "the PLD accountant's ε of exactly these charges is "+strconv.FormatFloat(*rep.PLDEpsilon, 'g', 8, 64)); check != (acc == ledger.AccountantPLD) {
			t.Errorf("%s run: PLD check row shown = %v", acc, check)
		}
	}
}
