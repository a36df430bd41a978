package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/coordinator"
)

// chromium returns the path of Debian's chromium, failing the test under
// DPCLUSTER_CI when it is missing and skipping it otherwise.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if inCI() {
		t.Fatal("DPCLUSTER_CI is set but chromium is missing (scripts/lib/setup.sh installs it)")
	}
	t.Skip("needs chromium (apt-get install chromium); never skipped in CI")
	return ""
}

// headless runs chromium headless on url with args (--dump-dom,
// --screenshot=…), giving the page's script 3 s of virtual time to fetch
// and draw, and returns its standard output.
func headless(t *testing.T, browser, url string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// --no-sandbox: the test may run as root, where chromium's sandbox
	// refuses to start; the page is our own, served on loopback.
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=3000"}, args...)
	cmd := exec.CommandContext(ctx, browser, append(all, url)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", browser, err, stderr.Bytes())
	}
	return stdout.String()
}

func getStatus(t *testing.T, url string) (coordinator.Status, bool) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		return coordinator.Status{}, false
	}
	defer res.Body.Close()
	var st coordinator.Status
	b, _ := io.ReadAll(res.Body)
	return st, res.StatusCode == http.StatusOK && json.Unmarshal(b, &st) == nil
}

// TestDashboardInChromium runs `coordinator local` in-process with
// --metrics-addr, waits until the run has evaluated θ, then loads the
// dashboard in headless Chromium and checks what the page's script
// rendered: the step and ε (at least what /api/status said before the
// load, and within the budget), the run's name, a row per node, the
// replica as leader, and charts drawn from the history (each canvas
// records how many points it drew). With DPCLUSTER_DASHBOARD_SCREENSHOT
// set to a PNG path, it also saves a screenshot there.
func TestDashboardInChromium(t *testing.T) {
	browser := chromium(t)
	addr, err := freeLoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	cmd := NewCoordinatorCmd()
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"local", "--dataset", "gaussian", "--model", "logreg", "--batch-size", "100",
		"--max-steps", "0", "--sigma", "5", "--eval-every", "10", "--round-timeout", "20s", "--run", "t-dash",
		"--data-dir", t.TempDir(), "--progress", "off", "--metrics-addr", addr})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("local: %v", err)
		}
	}()

	base := "http://" + addr + "/"
	var before coordinator.Status
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if st, ok := getStatus(t, base+"api/status"); ok && st.Eval != nil && st.Step >= 20 {
			before = st
			break
		}
		select {
		case err := <-done:
			t.Fatalf("local returned early: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no evaluated step on /api/status within a minute")
		}
	}

	dom := headless(t, browser, base, "--dump-dom")
	text := func(id string) string {
		t.Helper()
		m := regexp.MustCompile(`id="` + id + `"[^>]*>([^<]*)<`).FindStringSubmatch(dom)
		if m == nil {
			t.Fatalf("no #%s in the rendered page:\n%s", id, dom)
		}
		return m[1]
	}
	if got := text("run"); got != "t-dash" {
		t.Errorf("run %q", got)
	}
	if step, err := strconv.ParseInt(text("step"), 10, 64); err != nil || step < before.Step {
		t.Errorf("rendered step %q, /api/status said %d before the load", text("step"), before.Step)
	}
	eps, err := strconv.ParseFloat(text("epsilon"), 64)
	if err != nil || eps < float64(before.Epsilon)-0.0005 || eps > float64(before.TargetEpsilon) {
		t.Errorf("rendered ε %q, /api/status said %.4f before the load (target %v)", text("epsilon"), before.Epsilon, before.TargetEpsilon)
	}
	if got, want := text("target-epsilon"), fmt.Sprintf("%.3f", before.TargetEpsilon); got != want {
		t.Errorf("target ε %q, want %q", got, want)
	}
	if got := text("accuracy"); !regexp.MustCompile(`^\d+\.\d\d %$`).MatchString(got) {
		t.Errorf("accuracy %q", got)
	}
	for _, n := range before.Nodes {
		row := regexp.MustCompile(`<tr data-id="` + regexp.QuoteMeta(n.ID) + `"[^>]*><td>` + regexp.QuoteMeta(n.ID) + `</td><td>(\d+) of (\d+)</td>`)
		if m := row.FindStringSubmatch(dom); m == nil || m[1] != strconv.Itoa(n.ShardIndex) || m[2] != "3" {
			t.Errorf("no row for node %s (shard %d of 3): %v", n.ID, n.ShardIndex, m)
		}
	}
	if len(before.Nodes) != 3 {
		t.Errorf("%d nodes in /api/status, want 3", len(before.Nodes))
	}
	if !regexp.MustCompile(`<tr data-id="local"[^>]*><td>local \(this one\)</td><td>leader</td>`).MatchString(dom) {
		t.Errorf("no leader row for replica local")
	}
	for _, chart := range []string{"epsilon", "accuracy", "loss", "latency", "participants"} {
		m := regexp.MustCompile(`id="chart-` + chart + `"[^>]*data-points="(\d+)"`).FindStringSubmatch(dom)
		if m == nil || m[1] == "0" {
			t.Errorf("chart %s not drawn: %v", chart, m)
		}
	}
	if bytes.Contains([]byte(dom), []byte("not updating")) {
		t.Errorf("the page reports a fetch error")
	}

	if path := os.Getenv("DPCLUSTER_DASHBOARD_SCREENSHOT"); path != "" {
		headless(t, browser, base, "--hide-scrollbars", "--window-size=1280,1100", "--screenshot="+path)
		if fi, err := os.Stat(path); err != nil || fi.Size() < 10000 {
			t.Errorf("screenshot %s: %v", path, err)
		}
	}
}
