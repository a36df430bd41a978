package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/ledger"
)

// TestEpsilonOneAnswer: a run stopped early (its context cancelled, what
// SIGINT does, well before its plan's last step) gives, for every step,
// one ε everywhere it is reported, and that ε is the PLD accountant's ε of
// exactly the charges taken, rounded up by at most ledger.PLDGridRatio:
// the ledger's records, /api/status, /api/history (the dashboard's data),
// the Prometheus gauge, the JSON logs, the progress bar, the interrupted
// line, ledger show, ledger audit (text and JSON), the HTML report and the
// exported model's metadata. Before, a PLD ledger recorded the plan's ε
// (or the RDP bound) for any count, and the audit's lines disagreed.
//
// With a progress bar the round loop's info logs are quiet, so the run is
// made twice: with the bar, and with JSON logs.
func TestEpsilonOneAnswer(t *testing.T) {
	for _, progress := range []string{"on", "off"} {
		t.Run("progress-"+progress, func(t *testing.T) { testEpsilonOneAnswer(t, progress) })
	}
}

func testEpsilonOneAnswer(t *testing.T, progress string) {
	dir := t.TempDir()
	addr, err := freeLoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	var stdout, stderr lockedBuffer
	reached := make(chan struct{})
	var once sync.Once
	hooks := LocalHooks{Registry: reg, OnStep: func(p coordinator.Progress) {
		if p.Step >= 12 {
			once.Do(func() { close(reached) })
		}
	}}
	args := []string{"--dataset", "gaussian", "--model", "logreg", "--batch-size", "100",
		"--max-steps", "400", "--eval-every", "3", "--round-timeout", "20s", "--data-dir", dir,
		"--progress", progress, "--log-format", "json", "--metrics-addr", addr, "--run", "t-one-answer"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- RunLocal(ctx, args, &stdout, &stderr, hooks) }()
	select {
	case <-reached:
	case err := <-done:
		t.Fatalf("run ended before step 12: %v\n%s", err, stderr.String())
	case <-time.After(2 * time.Minute):
		t.Fatal("no step 12 in 2 minutes")
	}
	var st coordinator.Status
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if s, ok := getStatus(t, "http://"+addr+"/api/status"); ok && s.Step >= 12 {
			st = s
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/api/status never reached step 12")
		}
	}
	var hist coordinator.History
	if res, err := httpGetJSON("http://"+addr+"/api/history", &hist); err != nil {
		t.Fatalf("/api/history: %v (%v)", err, res)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("interrupted run: %v", err)
	}

	// The ledger: ε after each applied step (0 at step 0, before any
	// charge: θ₀'s evaluation is logged there), and the run's event.
	recs, _, err := ledger.ReadFile(filepath.Join(dir, coordinator.LedgerFile))
	if err != nil {
		t.Fatal(err)
	}
	eps := map[int64]float64{0: 0}
	var last ledger.Record
	var charges int64
	for _, r := range recs {
		if r.Kind != ledger.RecordCharge {
			continue
		}
		charges++
		last = r
		if !r.Replay {
			eps[r.Step] = r.Epsilon
		}
	}
	final := last.Epsilon
	n := last.Step
	if n < 12 || n >= 400 {
		t.Fatalf("stopped at step %d, want between 12 and 400", n)
	}
	exact, err := accounting.PLD{}.Epsilon(*last.Event, charges, recs[0].Delta)
	if err != nil {
		t.Fatal(err)
	}
	if recs[0].Accountant != ledger.AccountantPLD || final < exact || final > exact*ledger.PLDGridRatio {
		t.Errorf("after %d charges the %s ledger records ε=%v; the PLD accountant's ε of exactly those charges is %v", charges, recs[0].Accountant, final, exact)
	}
	same := func(what string, step int64, got float64) {
		t.Helper()
		want, ok := eps[step]
		if !ok || got != want {
			t.Errorf("%s: ε=%v at step %d, the ledger's is %v", what, got, step, want)
		}
	}
	// A printed value: the ledger's, rounded as printed.
	printed := func(what string, step int64, text string, digits int) {
		t.Helper()
		if want := strconv.FormatFloat(eps[step], 'f', digits, 64); text != want {
			t.Errorf("%s: ε %s at step %d, the ledger's is %s", what, text, step, want)
		}
	}

	same("/api/status", st.Step, float64(st.Epsilon))
	if len(hist.Steps) == 0 {
		t.Error("/api/history has no steps")
	}
	for _, p := range hist.Steps {
		same("/api/history", p.Step, float64(p.Epsilon))
	}
	for _, p := range hist.Evals {
		same("/api/history evaluation", p.Step, float64(p.Epsilon))
	}
	if g := gaugeValue(t, reg, "dpcluster_coordinator_epsilon_spent"); g != final {
		t.Errorf("Prometheus epsilon_spent %v, the ledger's last ε %v", g, final)
	}
	logLines := 0
	sc := bufio.NewScanner(strings.NewReader(stderr.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	bar := regexp.MustCompile(`step (\d+)/400  ε ([0-9.]+)/3`)
	bars := 0
	for sc.Scan() {
		line := sc.Text()
		var l struct {
			Step    *int64   `json:"step"`
			Epsilon *float64 `json:"epsilon"`
			Msg     string   `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Step != nil && l.Epsilon != nil {
			same("log line "+l.Msg, *l.Step, *l.Epsilon)
			logLines++
		}
		for _, m := range bar.FindAllStringSubmatch(line, -1) {
			step, _ := strconv.ParseInt(m[1], 10, 64)
			printed("progress bar", step, m[2], 3)
			bars++
		}
	}
	if progress == "on" && bars == 0 || progress == "off" && logLines == 0 {
		t.Errorf("progress %s: %d log lines and %d progress bars with ε", progress, logLines, bars)
	}
	// The steps applied: n, or n−1 when the interruption fell between step
	// n's charge and its update (then the line says it was charged).
	applied := n
	if m := regexp.MustCompile(`interrupted after (\d+) steps \(ε = ([0-9.]+)(, charged through step (\d+))?\)`).FindStringSubmatch(stdout.String()); m == nil {
		t.Errorf("stdout %q: no 'interrupted after N steps' line", stdout.String())
	} else {
		if m[3] != "" {
			applied--
			if m[4] != strconv.FormatInt(n, 10) {
				t.Errorf("stdout %q: charged through step %s, the ledger's last step is %d", stdout.String(), m[4], n)
			}
		}
		if m[1] != strconv.FormatInt(applied, 10) {
			t.Errorf("stdout %q: %s steps, want %d (the ledger's last step is %d)", stdout.String(), m[1], applied, n)
		}
		printed("interrupted line", n, m[2], 4)
	}

	var show showResult
	if err := runJSON(t, &show, "ledger", "show", dir, "--json"); err != nil || show.Epsilon != final {
		t.Errorf("ledger show --json: ε %v (%v), want %v", show.Epsilon, err, final)
	}
	var rep ledger.AuditReport
	if err := runJSON(t, &rep, "ledger", "audit", dir, "--json"); err != nil || !rep.OK ||
		rep.RecordedEpsilon != final || rep.RecomputedEpsilon != final || rep.PLDEpsilon == nil || *rep.PLDEpsilon != exact {
		t.Errorf("ledger audit --json: %+v (%v); want ε %v, PLD check %v", rep, err, final, exact)
	}
	html := filepath.Join(t.TempDir(), "audit.html")
	out, err := run(t, "ledger", "audit", dir, "--report", html)
	if err != nil {
		t.Fatalf("ledger audit: %v\n%s", err, out)
	}
	if !strings.Contains(out, fmt.Sprintf("ε spent  %.12g (pld accountant", final)) {
		t.Errorf("ledger audit does not print ε spent %.12g:\n%s", final, out)
	}
	page, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), strconv.FormatFloat(final, 'g', 8, 64)+" of the target") || !strings.Contains(string(page), "(PLD accountant;") {
		t.Errorf("the HTML report does not give ε %s of the target under the PLD accountant", strconv.FormatFloat(final, 'g', 8, 64))
	}
	_, _, meta := readModelFile(t, filepath.Join(dir, ModelFile))
	if meta["epsilon"] != strconv.FormatFloat(final, 'g', -1, 64) || meta["step"] != strconv.FormatInt(applied, 10) {
		t.Errorf("model.safetensors metadata: ε %s at step %s, want %v at %d", meta["epsilon"], meta["step"], final, applied)
	}
	if math.IsNaN(final) || final <= 0 {
		t.Errorf("ε %v", final)
	}
}

// gaugeValue returns the value of the gauge named name in reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// httpGetJSON decodes the JSON body of a GET of url into v.
func httpGetJSON(url string, v any) (int, error) {
	res, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return res.StatusCode, fmt.Errorf("status %s", res.Status)
	}
	return res.StatusCode, json.NewDecoder(res.Body).Decode(v)
}
