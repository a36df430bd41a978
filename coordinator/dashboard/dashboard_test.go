package dashboard_test

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/coordinator/dashboard"
)

// source is a fixed Source with every field of Status and History set.
type source struct {
	st coordinator.Status
	h  coordinator.History
}

func (s source) Status() coordinator.Status   { return s.st }
func (s source) History() coordinator.History { return s.h }

func fullSource() source {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	ev := &coordinator.EvalPoint{Step: 40, Epsilon: 0.9, Accuracy: 0.8, Loss: 0.5, N: 1000, Data: "test", Label: "test", Private: true}
	return source{
		st: coordinator.Status{
			Run: "r", Replica: "r1", Role: coordinator.RoleLeader, Term: 3, Leader: "r1", Step: 40, MaxSteps: 100,
			Epsilon: 0.9, TargetEpsilon: 2, Delta: 1e-5, Accountant: "rdp", NoiseMode: "discrete", Private: true,
			Stopped: "x", Blocked: "y", Eval: ev, WaitingForNodes: 1, MissingNodes: []string{"n1"}, OutOfStanding: []string{"n0"},
			Nodes: []coordinator.NodeStatus{{ID: "n0", ShardIndex: 0, ShardCount: 2, ShardSize: 500, LastSeen: now, Answered: 39, Skipped: 1,
				Standing: "refused", StandingDetail: "nan", OutSinceStep: 38}},
			Replicas: []coordinator.ReplicaStatus{{ID: "r1", Role: coordinator.RoleLeader, Term: 3, Step: 40, Leader: "r1", Self: true, Reported: now}},
			Updated:  now,
		},
		h: coordinator.History{
			Steps:  []coordinator.StepPoint{{Step: 40, Epsilon: 0.9, RoundSeconds: 0.02, Participants: 2}},
			Evals:  []coordinator.EvalPoint{*ev},
			Stride: 1,
		},
	}
}

func get(t *testing.T, h http.Handler, method, path string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Result()
}

// TestRoutes: the page, its two assets and the two JSON documents are
// served with their content types (the page under a CSP that allows only
// its own origin); anything else is 404 and a POST is 405.
func TestRoutes(t *testing.T) {
	h := dashboard.New(fullSource())
	for _, tc := range []struct {
		method, path string
		code         int
		ctype        string
	}{
		{"GET", "/", 200, "text/html"},
		{"HEAD", "/", 200, "text/html"},
		{"GET", "/dashboard.js", 200, "text/javascript"},
		{"GET", "/dashboard.css", 200, "text/css"},
		{"GET", "/api/status", 200, "application/json"},
		{"GET", "/api/history", 200, "application/json"},
		{"GET", "/index.html", 404, ""},
		{"GET", "/nope", 404, ""},
		{"GET", "/assets/dashboard.js", 404, ""},
		{"POST", "/api/status", 405, ""},
	} {
		res := get(t, h, tc.method, tc.path)
		if res.StatusCode != tc.code || !strings.HasPrefix(res.Header.Get("Content-Type"), tc.ctype) {
			t.Errorf("%s %s: %d %q, want %d %q", tc.method, tc.path, res.StatusCode, res.Header.Get("Content-Type"), tc.code, tc.ctype)
		}
		if tc.path == "/" && !strings.Contains(res.Header.Get("Content-Security-Policy"), "default-src 'none'") {
			t.Errorf("page CSP %q", res.Header.Get("Content-Security-Policy"))
		}
	}
}

// TestJSONShape decodes /api/status and /api/history and compares every
// object's keys with the list of what may be shown. A field added to
// Status or History fails here until it is added to the list, after
// checking that it is public (no sum, no example count, no training
// loss); no key may even mention one.
func TestJSONShape(t *testing.T) {
	h := dashboard.New(fullSource())
	want := map[string][]string{
		"status": {"run", "replica", "role", "term", "leader", "step", "applied_step", "charged_step", "charges", "max_steps",
			"epsilon", "target_epsilon", "delta",
			"accountant", "noise_mode", "private", "stopped", "blocked", "waiting_for_nodes", "missing_nodes", "out_of_standing", "eval", "nodes", "replicas", "updated"},
		"status.eval":     {"step", "epsilon", "accuracy", "loss", "n", "data", "label", "private"},
		"status.nodes":    {"id", "shard_index", "shard_count", "shard_size", "last_seen", "answered", "skipped", "standing", "standing_detail", "out_since_step"},
		"status.replicas": {"id", "role", "term", "step", "leader", "self", "reported"},
		"history":         {"steps", "evals", "stride"},
		"history.steps":   {"step", "epsilon", "round_seconds", "participants"},
		"history.evals":   {"step", "epsilon", "accuracy", "loss", "n", "data", "label", "private"},
	}
	got := map[string][]string{}
	for _, doc := range []string{"status", "history"} {
		res := get(t, h, "GET", "/api/"+doc)
		var v map[string]any
		if err := json.NewDecoder(res.Body).Decode(&v); err != nil {
			t.Fatalf("/api/%s: %v", doc, err)
		}
		collectKeys(doc, v, got)
	}
	for name, keys := range want {
		slices.Sort(keys)
		if !slices.Equal(got[name], keys) {
			t.Errorf("%s keys %v, want %v", name, got[name], keys)
		}
	}
	for name, keys := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("unexpected object %s %v", name, keys)
		}
		for _, k := range keys {
			for _, bad := range []string{"sum", "count", "grad", "train", "theta", "param"} {
				if strings.Contains(k, bad) && k != "shard_count" && k != "accountant" {
					t.Errorf("%s.%s: a key that names a private quantity", name, k)
				}
			}
		}
	}
}

// collectKeys records the sorted keys of every object under v, by path
// (array elements share their array's path).
func collectKeys(path string, v any, out map[string][]string) {
	switch x := v.(type) {
	case map[string]any:
		var keys []string
		for k, e := range x {
			keys = append(keys, k)
			collectKeys(path+"."+k, e, out)
		}
		slices.Sort(keys)
		out[path] = keys
	case []any:
		for _, e := range x {
			collectKeys(path, e, out)
		}
	}
}

// TestAssetsSelfContained: the page loads nothing from another origin
// and the script never writes server data as HTML.
func TestAssetsSelfContained(t *testing.T) {
	h := dashboard.New(fullSource())
	for _, p := range []string{"/", "/dashboard.js", "/dashboard.css"} {
		body, err := io.ReadAll(get(t, h, "GET", p).Body)
		if err != nil || len(body) < 500 {
			t.Fatalf("%s: %d bytes, %v", p, len(body), err)
		}
		s := string(body)
		for _, bad := range []string{"http://", "https://", "src=\"//", "href=\"//", "@import", "url(", "innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("} {
			if strings.Contains(s, bad) {
				t.Errorf("%s contains %q", p, bad)
			}
		}
	}
}

func TestSourceIsServer(t *testing.T) {
	var _ dashboard.Source = (*coordinator.Server)(nil)
}

// TestNonFiniteEvaluation: a diverged model's loss (NaN, +Inf) does not
// break /api/status; it reads null.
func TestNonFiniteEvaluation(t *testing.T) {
	src := fullSource()
	src.st.Eval.Loss = coordinator.Float(math.NaN())
	src.st.Eval.Accuracy = coordinator.Float(math.Inf(1))
	res := get(t, dashboard.New(src), "GET", "/api/status")
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 || !strings.Contains(string(b), `"accuracy":null,"loss":null`) {
		t.Errorf("%d %s", res.StatusCode, b)
	}
}
