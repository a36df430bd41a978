package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"image/png"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/cli/ledgerreport"
	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/seed"
)

// TestLedgerAuditReport: --report draws the audited ledger in the format
// its extension names, next to the usual audit output; another extension
// is refused before anything is read or written.
func TestLedgerAuditReport(t *testing.T) {
	tl := newTestLedger(t)
	mustNotChange(t, tl.path)
	out := t.TempDir()

	html := filepath.Join(out, "audit.html")
	text, err := run(t, "ledger", "audit", tl.dir, "--report", html)
	if err != nil {
		t.Fatalf("audit --report: %v", err)
	}
	if !strings.Contains(text, "audit    OK") || !strings.Contains(text, "report   "+html+"\n") {
		t.Errorf("audit --report does not print the audit and where the report went:\n%s", text)
	}
	page, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	svg := string(page[bytes.Index(page, []byte("<svg")):])
	points := svg[strings.Index(svg, `class="epsilon" points="`)+len(`class="epsilon" points="`):]
	points = points[:strings.IndexByte(points, '"')]
	if got := len(strings.Fields(points)); got != 6 {
		t.Errorf("the ε polyline has %d points, want 6 (one per charge)", got)
	}
	if got := strings.Count(svg, `class="replay"`); got != 1 {
		t.Errorf("%d replay markers, want 1 (the replay of step 4)", got)
	}
	if got := strings.Count(svg, `class="target"`); got != 1 {
		t.Errorf("%d target lines, want 1", got)
	}
	if !strings.Contains(string(page), tl.head.Hash) || !strings.Contains(string(page), "target ε = 10") {
		t.Errorf("the page lacks the head hash or the target")
	}

	img := filepath.Join(out, "audit.PNG")
	if _, err := run(t, "ledger", "audit", tl.path, "--report", img); err != nil {
		t.Fatalf("audit --report .PNG: %v", err)
	}
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	if err != nil || cfg.Width != ledgerreport.Width || cfg.Height != ledgerreport.Height {
		t.Errorf("PNG report: %+v, %v", cfg, err)
	}

	for _, bad := range []string{"audit.svg", "audit.pdf", "audit"} {
		path := filepath.Join(out, bad)
		text, err := run(t, "ledger", "audit", tl.dir, "--report", path)
		if !errors.Is(err, ledgerreport.ErrFormat) {
			t.Errorf("--report %s: %v, want ErrFormat", bad, err)
		}
		if text != "" {
			t.Errorf("--report %s printed an audit before refusing:\n%s", bad, text)
		}
		if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("--report %s wrote a file: %v", bad, err)
		}
	}
}

// TestLedgerShowJSONFields pins the field names of ledger show --json:
// scripts read them, so a rename must fail here first.
func TestLedgerShowJSONFields(t *testing.T) {
	tl := newTestLedger(t)
	out, err := run(t, "ledger", "show", tl.dir, "--json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(out, "\n}\n") != 1 || !strings.HasSuffix(out, "}\n") {
		t.Errorf("show --json is not one JSON object:\n%s", out)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &top); err != nil {
		t.Fatal(err)
	}
	wantKeys(t, "top level", top, "path", "run", "target_epsilon", "delta", "noise", "mechanism", "accountant", "history",
		"epsilon", "count", "head_hash", "torn_bytes", "live", "damage", "records")
	var recs []map[string]json.RawMessage
	if err := json.Unmarshal(top["records"], &recs); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 7 {
		t.Fatalf("%d records, want 7", len(recs))
	}
	wantKeys(t, "run record", recs[0], "format", "seq", "kind", "run", "target_epsilon", "delta", "noise",
		"mechanism", "history", "prev_hash", "hash")
	wantKeys(t, "charge", recs[1], "format", "seq", "kind", "history", "step", "event", "term", "index",
		"epsilon", "prev_hash", "hash")
	wantKeys(t, "replay charge", recs[5], "format", "seq", "kind", "history", "step", "event", "term", "index",
		"replay", "epsilon", "prev_hash", "hash")
	var event map[string]json.RawMessage
	if err := json.Unmarshal(recs[1]["event"], &event); err != nil {
		t.Fatal(err)
	}
	wantKeys(t, "event", event, "kind", "sample_rate", "event")
	if string(recs[5]["replay"]) != "true" || string(recs[1]["kind"]) != `"charge"` || string(recs[0]["kind"]) != `"run"` {
		t.Errorf("replay %s, kinds %s %s", recs[5]["replay"], recs[1]["kind"], recs[0]["kind"])
	}
}

func wantKeys(t *testing.T, what string, m map[string]json.RawMessage, want ...string) {
	t.Helper()
	var got []string
	for k := range m {
		got = append(got, k)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s: fields %v, want %v", what, got, want)
	}
}

// TestLedgerShowDiscreteParams: ledger show prints q and σ of a run with
// discrete Gaussian noise (the main job's), not the event's kind.
func TestLedgerShowDiscreteParams(t *testing.T) {
	dir := t.TempDir()
	l, err := ledger.Open(filepath.Join(dir, coordinator.LedgerFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start("discrete", 3, 1e-5, seed.Crypto, ledger.MechanismDiscrete, ledger.AccountantRDP, cliHistory); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Charge(1, accounting.SubsampledDiscreteGaussian(0.0042, 0.7), ledger.Position{History: cliHistory, Term: 2, Index: 5}, false); err != nil {
		t.Fatal(err)
	}
	l.Close()
	out, err := run(t, "ledger", "show", dir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, " 0.0042 ") || !strings.Contains(out, " 0.7 ") || strings.Contains(out, "poisson_sampled") {
		t.Errorf("show does not print q = 0.0042 and σ = 0.7 for a discrete Gaussian charge:\n%s", out)
	}
}
