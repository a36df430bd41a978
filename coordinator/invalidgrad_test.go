package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/mechanism"
)

// invalidGradRun is a leader's run whose first g̃ fails dpadam.CheckGradient:
// C = 1e25 and the node's sum puts all of its norm, 0.9·count·C, in
// coordinate invalidGradIndex, so g̃ there is about 9e23, above the
// optimizer's bound 2^63 (and finite in float32). Step 1's charge is
// proposed before its round opens, so the run stops with that step charged
// and never applied.
type invalidGradRun struct {
	dir    string
	sum    Summary
	status Status
	logs   string // the replica's and the server's, as JSON lines
}

const invalidGradIndex = 3

func runInvalidGrad(t *testing.T) invalidGradRun {
	t.Helper()
	c := testRunConfig()
	c.Optimizer.ClipNorm = 1e25
	c.MaxSteps = 3
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var logs lockedBuffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	coordConn, dial := natsPair(t, c.Run)
	startScriptNode(t, ctx, dial("n"), "n", c.ModelHash, shardOf(0), func(uint64) (int64, []float32) {
		s := make([]float32, c.Dim)
		s[invalidGradIndex] = float32(0.9 * 10 * c.Optimizer.ClipNorm)
		return 10, s
	})
	dir := t.TempDir()
	rcfg := DefaultReplicaConfig()
	rcfg.ID, rcfg.RaftAddr, rcfg.DataDir, rcfg.Bootstrap, rcfg.Logger = "r1", freeAddr(t), dir, true, log
	r, err := OpenReplica(rcfg, testInit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	waitLeader(t, r)
	scfg := DefaultServerConfig()
	scfg.Noise = mechanism.NewSeededNoiseSource(4)
	s, err := NewServer(r, coordConn, c, scfg, log)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := s.Run(ctx)
	if err != nil {
		t.Fatalf("Run: %v\nlogs:\n%s", err, logs.String())
	}
	return invalidGradRun{dir: dir, sum: sum, status: s.Status(), logs: logs.String()}
}

// TestInvalidNoisyGradientStopsWithoutItsValue: a g̃ that fails the
// optimizer's check is never proposed, and no message says anything of it
// but that it failed: the stop reason (in the Raft log, the ledger's end
// record and the summary) and every log line hold neither the index nor
// the value of any coordinate. That g̃ is the nodes' sum with noise, never
// released, and the leader may write the reason before its step's charge
// is applied (the charge entry proposed ahead may still be in flight).
func TestInvalidNoisyGradientStopsWithoutItsValue(t *testing.T) {
	run := runInvalidGrad(t)
	const wantReason = "step 1: noisy gradient not proposed: dpadam: non-finite noisy gradient"
	if run.sum.Stopped != wantReason || run.sum.Steps != 0 {
		t.Errorf("summary %+v, want no step applied and reason %q", run.sum, wantReason)
	}
	rep, err := ledger.Audit(filepath.Join(run.dir, LedgerFile))
	if err != nil || !rep.OK || rep.EndReason != wantReason {
		t.Errorf("ledger end reason %q (audit %+v, %v), want %q", rep.EndReason, rep, err, wantReason)
	}
	if !strings.Contains(run.logs, "noisy gradient invalid") {
		t.Fatalf("the invalid g̃ was not logged:\n%s", run.logs)
	}
	if leak := gradLeak.FindString(run.logs); leak != "" {
		t.Errorf("the logs hold %q, part of g̃:\n%s", leak, run.logs)
	}
}

// gradLeak matches what a message would hold of the g̃ of runInvalidGrad
// (every coordinate of order σC/B = 1e23, or 9e23 at invalidGradIndex):
// a value (e+2x), an index ([i]) or the name dpadam.CheckGradient's
// detailed error gives g̃.
var gradLeak = regexp.MustCompile(`e\+2\d|\[\d+\]|noisyGrad`)

// TestStatusPairsEpsilonWithTheLastCharge: when the run ends between a
// step's charge and its update (here, step 1's g̃ fails the optimizer's
// check), ε counts that charge, and every report pairs ε with it: the
// Summary's and Status's charged step is 1 while no step is applied, with
// the ledger's ε and charge count beside them.
func TestStatusPairsEpsilonWithTheLastCharge(t *testing.T) {
	run := runInvalidGrad(t)
	rep, err := ledger.Audit(filepath.Join(run.dir, LedgerFile))
	if err != nil || !rep.OK || rep.Charges != 1 || rep.LastStep != 1 || rep.Applied != 0 {
		t.Fatalf("audit %+v, %v: want step 1 charged, nothing applied", rep, err)
	}
	eps := rep.RecordedEpsilon
	if s := run.sum; s.Steps != 0 || s.Charged != 1 || s.Charges != 1 || s.Epsilon != eps {
		t.Errorf("summary: %d applied, charged through step %d (%d charges), ε %v; want 0, 1 (1), %v",
			s.Steps, s.Charged, s.Charges, s.Epsilon, eps)
	}
	st := run.status
	if st.AppliedStep != 0 || st.ChargedStep != 1 || st.Step != 1 || st.Charges != 1 || float64(st.Epsilon) != eps {
		t.Errorf("status: applied step %d, charged step %d, step %d, %d charges, ε %v; want 0, 1, 1, 1, %v",
			st.AppliedStep, st.ChargedStep, st.Step, st.Charges, st.Epsilon, eps)
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range []string{`"step":1,`, `"applied_step":0,`, `"charged_step":1,`, `"charges":1,`} {
		if !strings.Contains(string(b), kv) {
			t.Errorf("status JSON lacks %s: %s", kv, b)
		}
	}
}

// TestFSMRefusedLegacyStepHoldsNoGradValue: a legacy step entry (charge
// and g̃ in one) whose g̃ fails the optimizer's check is refused before it
// is charged, and the reason the run stopped (the state, the ledger's end
// record, the log) says so without the offending index or value.
func TestFSMRefusedLegacyStepHoldsNoGradValue(t *testing.T) {
	dir := t.TempDir()
	var logs lockedBuffer
	f, err := NewFSM(dir, testInit, slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	c := testRunConfig()
	mustApply(t, f, logEntry(t, 1, entryConfig, c))
	g := noisyGrads(1, 9)[0]
	g[5] = 1.5e25
	res := mustApply(t, f, stepLog(t, 2, 1, c, g))
	if res.Charged || res.Applied || !errors.Is(res.Err, dpadam.ErrNonFinite) {
		t.Fatalf("step entry: %+v, want refused, uncharged, for ErrNonFinite", res)
	}
	rep, err := ledger.Audit(filepath.Join(dir, LedgerFile))
	if err != nil || rep.Charges != 0 || !rep.Ended {
		t.Fatalf("audit %+v, %v", rep, err)
	}
	for what, msg := range map[string]string{"the result": res.Err.Error(), "the stop reason": f.State().Stopped,
		"the ledger's end reason": rep.EndReason, "the log": logs.String()} {
		if leak := gradLeak.FindString(msg); leak != "" {
			t.Errorf("%s holds %q, part of an uncharged g̃: %s", what, leak, msg)
		}
	}
}
