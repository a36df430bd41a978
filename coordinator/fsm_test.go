package coordinator

import (
	"bytes"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/seed"
)

const testDim = 64

// testInit is a deterministic θ₀ for tests: a seeded normal vector.
func testInit(c RunConfig) ([]float32, error) {
	r := rand.New(rand.NewPCG(c.InitSeed, 1))
	theta := make([]float32, c.Dim)
	for i := range theta {
		theta[i] = float32(r.NormFloat64() * 0.1)
	}
	return theta, nil
}

func testRunConfig() RunConfig {
	opt := dpadam.DefaultConfig()
	opt.NoiseMultiplier, opt.ClipNorm, opt.ExpectedBatchSize = 1.0, 1.0, 100
	return RunConfig{
		Run: "test", Dim: testDim, InitSeed: 7, TotalExamples: 10000, SampleRate: 0.01,
		Optimizer: opt, TargetEpsilon: 5, Delta: 1e-5, SeedPolicy: seed.Seeded,
		ModelHash: "test-model", NoiseMode: NoiseDiscrete,
	}
}

// noisyGrads returns a seeded sequence of fake privatized gradients.
func noisyGrads(n int, seed uint64) [][]float32 {
	r := rand.New(rand.NewPCG(seed, 2))
	out := make([][]float32, n)
	for i := range out {
		g := make([]float32, testDim)
		for j := range g {
			g[j] = float32(r.NormFloat64() * 0.01)
		}
		out[i] = g
	}
	return out
}

// logEntry wraps an encoded entry as Raft would deliver it.
func logEntry(t testing.TB, index uint64, typ entryType, body any) *raft.Log {
	t.Helper()
	data, err := encodeEntry(typ, body)
	if err != nil {
		t.Fatal(err)
	}
	return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}
}

func stepLog(t *testing.T, index uint64, step int64, c RunConfig, g []float32) *raft.Log {
	t.Helper()
	b := make([]byte, 4*len(g))
	putFloats(b, g)
	return logEntry(t, index, entryStep, stepEntry{Step: step, Event: c.Event(), Grad: b, Round: "r"})
}

func newTestFSM(t *testing.T, dir string, opts ...ledger.Option) *FSM {
	t.Helper()
	f, err := NewFSM(dir, testInit, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func mustApply(t *testing.T, f *FSM, l *raft.Log) ApplyResult {
	t.Helper()
	res, _ := f.Apply(l).(ApplyResult)
	return res
}

// reference runs the optimizer directly over the same g̃ sequence.
func reference(t *testing.T, c RunConfig, grads [][]float32) []float32 {
	t.Helper()
	theta, _ := testInit(c)
	opt, err := dpadam.New(c.Optimizer, c.Dim)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range grads {
		if _, err := opt.Step(theta, g); err != nil {
			t.Fatal(err)
		}
	}
	return theta
}

func bitsEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

func TestFSMAppliesSteps(t *testing.T) {
	dir := t.TempDir()
	f := newTestFSM(t, dir)
	c := testRunConfig()
	if res := mustApply(t, f, logEntry(t, 1, entryConfig, c)); res.Err != nil {
		t.Fatal(res.Err)
	}
	grads := noisyGrads(10, 1)
	for i, g := range grads {
		res := mustApply(t, f, stepLog(t, uint64(i+2), int64(i+1), c, g))
		if res.Err != nil || !res.Applied || !res.Charged {
			t.Fatalf("step %d: %+v", i+1, res)
		}
	}
	got, step := f.Params(nil)
	if step != 10 || !bitsEqual(got, reference(t, c, grads)) {
		t.Errorf("θ after 10 steps differs from the optimizer run directly (step %d)", step)
	}
	// The ledger audited alone, without an end record: its last step
	// is unconfirmed (it may have been charged ahead of its g̃).
	rep, err := ledger.Audit(filepath.Join(dir, LedgerFile))
	if err != nil || !rep.OK || rep.Charges != 10 || rep.Applied != 9 || rep.Unconfirmed != 1 {
		t.Errorf("audit: %+v, %v", rep, err)
	}
	want, _, _ := accounting.RDP{}.EpsilonOrder(c.Event(), 10, c.Delta)
	if s := f.State(); math.Abs(s.Epsilon-want) > 1e-12 {
		t.Errorf("ε = %v, want %v", s.Epsilon, want)
	}
}

// TestFSMReplayChargedNotApplied: a step entry for an already-applied step
// (a late duplicate after failover) changes nothing but is still charged.
func TestFSMReplayChargedNotApplied(t *testing.T) {
	dir := t.TempDir()
	f := newTestFSM(t, dir)
	c := testRunConfig()
	mustApply(t, f, logEntry(t, 1, entryConfig, c))
	grads := noisyGrads(3, 2)
	for i, g := range grads {
		mustApply(t, f, stepLog(t, uint64(i+2), int64(i+1), c, g))
	}
	before, _ := f.Params(nil)
	charges := f.State().Charges
	res := mustApply(t, f, stepLog(t, 5, 2, c, noisyGrads(1, 99)[0]))
	if res.Applied || !res.Charged {
		t.Errorf("duplicate step 2: %+v, want charged and not applied", res)
	}
	after, step := f.Params(nil)
	if step != 3 || !bitsEqual(before, after) {
		t.Errorf("duplicate step changed θ (step %d)", step)
	}
	if got := f.State().Charges; got != charges+1 {
		t.Errorf("charges = %d, want %d", got, charges+1)
	}
	// The ledger audited alone, without an end record: its last step
	// is unconfirmed (it may have been charged ahead of its g̃).
	rep, _ := ledger.Audit(filepath.Join(dir, LedgerFile))
	if !rep.OK || rep.Replays != 1 || rep.Applied != 2 || rep.Unconfirmed != 1 {
		t.Errorf("audit: %+v", rep)
	}
	// A gap (step 5 after 3) is also charged, not applied. (An invalid g̃
	// is refused before the charge: TestFSMRefusesInvalidGradient.)
	res = mustApply(t, f, stepLog(t, 6, 5, c, grads[0]))
	if res.Applied || !res.Charged || res.Err == nil {
		t.Errorf("gap step: %+v", res)
	}
	if _, step := f.Params(nil); step != 3 {
		t.Errorf("step = %d after refused entries, want 3", step)
	}
}

func TestFSMBudgetRefusal(t *testing.T) {
	dir := t.TempDir()
	f := newTestFSM(t, dir)
	c := testRunConfig()
	eps5, _, _ := accounting.RDP{}.EpsilonOrder(c.Event(), 5, c.Delta)
	c.TargetEpsilon = eps5 * (1 + 1e-9)
	mustApply(t, f, logEntry(t, 1, entryConfig, c))
	grads := noisyGrads(6, 3)
	for i := range 5 {
		if res := mustApply(t, f, stepLog(t, uint64(i+2), int64(i+1), c, grads[i])); !res.Applied {
			t.Fatalf("step %d refused: %+v", i+1, res)
		}
	}
	if over, _ := f.WouldExceed(); !over {
		t.Error("WouldExceed = false with the budget spent")
	}
	before, _ := f.Params(nil)
	res := mustApply(t, f, stepLog(t, 7, 6, c, grads[5]))
	if !errors.Is(res.Err, ledger.ErrBudgetExceeded) || res.Applied || res.Charged {
		t.Fatalf("step 6: %+v, want refused with ErrBudgetExceeded", res)
	}
	after, step := f.Params(nil)
	if step != 5 || !bitsEqual(before, after) {
		t.Error("refused step changed θ")
	}
	if s := f.State(); s.Stopped == "" || s.Charges != 5 {
		t.Errorf("state after refusal: %+v", s)
	}
	rep, _ := ledger.Audit(filepath.Join(dir, LedgerFile))
	if !rep.OK || rep.Charges != 5 {
		t.Errorf("audit: %+v", rep)
	}
}

// TestFSMBudgetRefusalPLD: a run whose configuration names the PLD
// accountant is held to PLD's ε: with the target at the PLD ε of 5 steps
// (which RDP puts above it), the state machine applies exactly 5, refuses
// the sixth, and its ledger names PLD; its reported ε is PLD's.
func TestFSMBudgetRefusalPLD(t *testing.T) {
	dir := t.TempDir()
	f := newTestFSM(t, dir)
	c := testRunConfig()
	c.NoiseMode, c.Accountant = NoiseFloat, AccountantPLD
	q, sigma := c.SampleRate, c.Optimizer.NoiseMultiplier
	pld5, err := accounting.PLD{}.Epsilon(accounting.SubsampledGaussian(q, sigma), 5, c.Delta)
	if err != nil {
		t.Fatal(err)
	}
	rdp5, _, _ := accounting.RDP{}.EpsilonOrder(accounting.SubsampledGaussian(q, sigma), 5, c.Delta)
	if !(rdp5 > pld5) {
		t.Fatalf("precondition: RDP ε %v not above PLD ε %v", rdp5, pld5)
	}
	c.TargetEpsilon = pld5
	mustApply(t, f, logEntry(t, 1, entryConfig, c))
	grads := noisyGrads(6, 3)
	for i := range 5 {
		if over, err := f.WouldExceed(); over || err != nil {
			t.Fatalf("before step %d: WouldExceed = %v, %v", i+1, over, err)
		}
		if res := mustApply(t, f, stepLog(t, uint64(i+2), int64(i+1), c, grads[i])); !res.Applied {
			t.Fatalf("step %d refused: %+v", i+1, res)
		}
	}
	if over, _ := f.WouldExceed(); !over {
		t.Error("WouldExceed = false with the budget spent")
	}
	res := mustApply(t, f, stepLog(t, 7, 6, c, grads[5]))
	if !errors.Is(res.Err, ledger.ErrBudgetExceeded) || res.Applied || res.Charged {
		t.Fatalf("step 6: %+v, want refused with ErrBudgetExceeded", res)
	}
	if s := f.State(); s.Charges != 5 || s.Epsilon != pld5 {
		t.Errorf("state: %+v, want 5 charges and ε = PLD's %v", s, pld5)
	}
	rep, _ := ledger.Audit(filepath.Join(dir, LedgerFile))
	if !rep.OK || rep.Charges != 5 || rep.Accountant != AccountantPLD || rep.RDPEpsilon != rdp5 {
		t.Errorf("audit: %+v", rep)
	}
}

// TestFSMPLDLedgerAudits: a PLD run, float or discrete noise, that spends
// exactly its budget over its MaxSteps leaves a ledger whose audit
// recomputes every recorded ε bit for bit. (The state machine used to
// start the PLD budget's one-time step-limit search at MaxSteps, which the
// ledger file does not record: intermediate records then held the PLD ε
// at counts the auditor's search never evaluated, and the audit of every
// such run failed.)
func TestFSMPLDLedgerAudits(t *testing.T) {
	const steps = 12
	for _, mode := range []string{NoiseFloat, NoiseDiscrete} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			f := newTestFSM(t, dir)
			c := testRunConfig()
			c.NoiseMode, c.Accountant, c.MaxSteps = mode, AccountantPLD, steps
			target, err := accounting.PLD{}.Epsilon(c.Event(), steps, c.Delta)
			if err != nil {
				t.Fatal(err)
			}
			c.TargetEpsilon = target
			mustApply(t, f, logEntry(t, 1, entryConfig, c))
			grads := noisyGrads(steps, 5)
			for i := range steps {
				if over, err := f.WouldExceed(); over || err != nil {
					t.Fatalf("before step %d: WouldExceed = %v, %v", i+1, over, err)
				}
				if res := mustApply(t, f, stepLog(t, uint64(i+2), int64(i+1), c, grads[i])); !res.Applied {
					t.Fatalf("step %d refused: %+v", i+1, res)
				}
			}
			if over, _ := f.WouldExceed(); !over {
				t.Error("WouldExceed = false with the budget spent")
			}
			rep, err := ledger.Audit(filepath.Join(dir, LedgerFile))
			if err != nil || !rep.OK || rep.Charges != steps || rep.Accountant != AccountantPLD || rep.RecordedEpsilon != target {
				t.Errorf("audit: %v; OK %v, %d charges, accountant %q, last ε %v (want %v), problems %q",
					err, rep.OK, rep.Charges, rep.Accountant, rep.RecordedEpsilon, target, rep.Problems)
			}
		})
	}
}

func TestFSMLedgerFailureFailsClosed(t *testing.T) {
	dir := t.TempDir()
	fail := false
	f := newTestFSM(t, dir, ledger.WithSyncHook(func(fh *os.File) error {
		if fail {
			return syscall.ENOSPC
		}
		return fh.Sync()
	}))
	c := testRunConfig()
	mustApply(t, f, logEntry(t, 1, entryConfig, c))
	grads := noisyGrads(3, 4)
	mustApply(t, f, stepLog(t, 2, 1, c, grads[0]))
	before, _ := f.Params(nil)
	fail = true
	res := mustApply(t, f, stepLog(t, 3, 2, c, grads[1]))
	if !errors.Is(res.Err, ErrFatal) || !errors.Is(res.Err, ledger.ErrBroken) || res.Applied {
		t.Fatalf("step with a failing ledger: %+v", res)
	}
	fail = false
	res = mustApply(t, f, stepLog(t, 4, 2, c, grads[1]))
	if !errors.Is(res.Err, ErrFatal) || res.Applied {
		t.Errorf("replica kept applying after a ledger failure: %+v", res)
	}
	after, step := f.Params(nil)
	if step != 1 || !bitsEqual(before, after) {
		t.Error("θ changed after the ledger failed")
	}
	if f.State().Fatal == nil {
		t.Error("State().Fatal is nil")
	}
	if _, err := f.Snapshot(); err == nil {
		t.Error("a failed replica took a snapshot")
	}
}

func TestFSMRejectsBadEntries(t *testing.T) {
	f := newTestFSM(t, t.TempDir())
	c := testRunConfig()
	// A step before the configuration is refused and charges nothing.
	if res := mustApply(t, f, stepLog(t, 1, 1, c, noisyGrads(1, 5)[0])); !errors.Is(res.Err, ErrNotConfigured) {
		t.Errorf("step before config: %+v", res)
	}
	bad := c
	bad.Optimizer.ExpectedBatchSize = 99
	if res := mustApply(t, f, logEntry(t, 2, entryConfig, bad)); !errors.Is(res.Err, ErrInvalidRunConfig) {
		t.Errorf("inconsistent config: %+v", res)
	}
	mustApply(t, f, logEntry(t, 3, entryConfig, c))
	other := c
	other.Run = "other"
	if res := mustApply(t, f, logEntry(t, 4, entryConfig, other)); res.Err == nil {
		t.Error("a second, different configuration was accepted")
	}
	if res := mustApply(t, f, logEntry(t, 5, entryConfig, c)); res.Err != nil {
		t.Errorf("re-proposed identical configuration: %v", res.Err)
	}
	// A g̃ of the wrong length is refused without a charge.
	if res := mustApply(t, f, stepLog(t, 6, 1, c, make([]float32, testDim-1))); res.Err == nil || res.Charged {
		t.Errorf("short g̃: %+v", res)
	}
	if s := f.State(); s.Charges != 0 || s.Fatal != nil {
		t.Errorf("state: %+v", s)
	}
	// An undecodable entry is fatal: the replica cannot follow the log.
	res := mustApply(t, f, &raft.Log{Index: 7, Type: raft.LogCommand, Data: []byte{byte(entryStep), 9, 1}})
	if !errors.Is(res.Err, ErrFatal) {
		t.Errorf("entry of unknown version: %+v", res)
	}
}

// memSink is a raft.SnapshotSink over a buffer.
type memSink struct{ bytes.Buffer }

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { return nil }
func (s *memSink) Close() error  { return nil }

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

// TestFSMSnapshotRestore: restore into a fresh replica (whose ledger is
// empty) and continue; the result equals the uninterrupted run, and both
// ledgers audit clean with one record per step.
func TestFSMSnapshotRestore(t *testing.T) {
	c := testRunConfig()
	grads := noisyGrads(12, 6)
	dirA := t.TempDir()
	a := newTestFSM(t, dirA)
	mustApply(t, a, logEntry(t, 1, entryConfig, c))
	for i := range 7 {
		mustApply(t, a, stepLog(t, uint64(i+2), int64(i+1), c, grads[i]))
	}
	snap := persistSnapshot(t, a)
	dirB := t.TempDir()
	b := newTestFSM(t, dirB)
	if err := b.Restore(readCloser{bytes.NewReader(snap)}); err != nil {
		t.Fatal(err)
	}
	for i := 7; i < 12; i++ {
		for _, f := range []*FSM{a, b} {
			if res := mustApply(t, f, stepLog(t, uint64(i+2), int64(i+1), c, grads[i])); !res.Applied {
				t.Fatalf("step %d: %+v", i+1, res)
			}
		}
	}
	ta, _ := a.Params(nil)
	tb, _ := b.Params(nil)
	if !bitsEqual(ta, tb) || !bitsEqual(ta, reference(t, c, grads)) {
		t.Error("restored replica diverged from the uninterrupted run")
	}
	la, _ := os.ReadFile(filepath.Join(dirA, LedgerFile))
	lb, _ := os.ReadFile(filepath.Join(dirB, LedgerFile))
	if !bytes.Equal(la, lb) {
		t.Error("ledgers differ after restore")
	}
	// Restoring an older snapshot over a ledger that is ahead keeps the
	// ledger, and replayed entries are not charged twice.
	if err := a.Restore(readCloser{bytes.NewReader(snap)}); err != nil {
		t.Fatal(err)
	}
	for i := 7; i < 12; i++ {
		res := mustApply(t, a, stepLog(t, uint64(i+2), int64(i+1), c, grads[i]))
		if !res.Applied || res.Charged {
			t.Fatalf("replayed step %d: %+v, want applied without a new charge", i+1, res)
		}
	}
	if ta2, _ := a.Params(nil); !bitsEqual(ta2, ta) {
		t.Error("replay after restore diverged")
	}
	if rep, _ := ledger.Audit(filepath.Join(dirA, LedgerFile)); !rep.OK || rep.Charges != 12 {
		t.Errorf("audit after replay: %+v", rep)
	}
	// Corrupt snapshots are refused.
	bad := bytes.Clone(snap)
	bad[len(bad)/2] ^= 1
	if err := b.Restore(readCloser{bytes.NewReader(bad)}); !errors.Is(err, ErrBadSnapshot) {
		t.Errorf("corrupt snapshot: %v", err)
	}
}

// TestFSMRestoreExtendsALaggingLedger: a replica behind the snapshot
// (its ledger a prefix of the snapshot's) keeps its ledger file and
// appends what it lacks (ledger.Extend) instead of replacing the file, and
// ends with the snapshot's ledger byte for byte and the same state.
func TestFSMRestoreExtendsALaggingLedger(t *testing.T) {
	c := testRunConfig()
	grads := noisyGrads(9, 13)
	dirA, dirB := t.TempDir(), t.TempDir()
	a, b := newTestFSM(t, dirA), newTestFSM(t, dirB)
	for _, f := range []*FSM{a, b} {
		mustApply(t, f, logEntry(t, 1, entryConfig, c))
	}
	for i := range grads {
		fs := []*FSM{a}
		if i < 3 {
			fs = append(fs, b) // b lags from step 4 on
		}
		for _, f := range fs {
			mustApply(t, f, stepLog(t, uint64(i+2), int64(i+1), c, grads[i]))
		}
	}
	before, err := os.Stat(filepath.Join(dirB, LedgerFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Restore(readCloser{bytes.NewReader(persistSnapshot(t, a))}); err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(filepath.Join(dirB, LedgerFile))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) {
		t.Error("the lagging replica's ledger file was replaced, not extended")
	}
	la, _ := os.ReadFile(filepath.Join(dirA, LedgerFile))
	lb, _ := os.ReadFile(filepath.Join(dirB, LedgerFile))
	if !bytes.Equal(la, lb) {
		t.Error("ledgers differ after restore")
	}
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db || a.State().Epsilon != b.State().Epsilon {
		t.Errorf("after restore: digests %s / %s, ε %v / %v", da, db, a.State().Epsilon, b.State().Epsilon)
	}
	if rep, _ := ledger.Audit(filepath.Join(dirB, LedgerFile)); !rep.OK || rep.Charges != len(grads) {
		t.Errorf("audit after restore: %+v", rep)
	}
}

// TestFSMDigest: replicas that applied the same log have equal digests;
// one more step, or a restore from a snapshot, keeps that true.
func TestFSMDigest(t *testing.T) {
	c := testRunConfig()
	grads := noisyGrads(4, 11)
	a, b := newTestFSM(t, t.TempDir()), newTestFSM(t, t.TempDir())
	for _, f := range []*FSM{a, b} {
		mustApply(t, f, logEntry(t, 1, entryConfig, c))
		for i, g := range grads[:3] {
			mustApply(t, f, stepLog(t, uint64(i+2), int64(i+1), c, g))
		}
	}
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db || len(da) != 64 {
		t.Fatalf("digests %q and %q differ after the same log", da, db)
	}
	mustApply(t, a, stepLog(t, 5, 4, c, grads[3]))
	if da2, _ := a.Digest(); da2 == db {
		t.Fatal("digest unchanged by a step")
	}
	snap, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := snap.(*fsmSnapshot).write(&buf); err != nil {
		t.Fatal(err)
	}
	r := newTestFSM(t, t.TempDir())
	if err := r.Restore(io.NopCloser(&buf)); err != nil {
		t.Fatal(err)
	}
	da2, _ := a.Digest()
	if dr, _ := r.Digest(); dr != da2 {
		t.Error("restored replica's digest differs")
	}
}

// TestConfigDiff: a changed setting is named with both values, nested
// fields dotted; the model spec only as differing; equal configurations
// have no difference.
func TestConfigDiff(t *testing.T) {
	a := testRunConfig()
	if d := ConfigDiff(a, a); len(d) != 0 {
		t.Errorf("equal configurations differ: %v", d)
	}
	b := a
	b.Optimizer.LearningRate, b.MaxSteps, b.ModelSpec = 0.5, 7, []byte("{}")
	d := ConfigDiff(a, b)
	want := []string{"model_spec differs", "optimizer.LearningRate is 0.001 in the log, 0.5 given", "max_steps is 0 in the log, 7 given"}
	if !slices.Equal(d, want) {
		t.Errorf("ConfigDiff = %q, want %q", d, want)
	}
	err := runMismatch(a, b)
	if !errors.Is(err, ErrRunMismatch) || !strings.Contains(err.Error(), "optimizer.LearningRate is 0.001 in the log, 0.5 given") ||
		!strings.Contains(err.Error(), "new data directory") {
		t.Errorf("runMismatch: %v", err)
	}
}

// TestFSMWouldExceedLeavesStateFree: the first budget question of a PLD
// run is the accountant's step-limit search (about a second here); the
// state machine answers State meanwhile, where it used to hold its lock
// through the search, stalling Raft's applies and every report behind it
// (issue 27's 16–21 s replica restarts; issue 28).
func TestFSMWouldExceedLeavesStateFree(t *testing.T) {
	accounting.ResetCaches()
	f := newTestFSM(t, t.TempDir())
	c := testRunConfig()
	c.Accountant, c.NoiseMode, c.TargetEpsilon = AccountantPLD, NoiseFloat, 8
	mustApply(t, f, logEntry(t, 1, entryConfig, c))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := f.WouldExceed(); err != nil {
			t.Error(err)
		}
	}()
	time.Sleep(20 * time.Millisecond)
	st := f.State()
	select {
	case <-done:
		t.Fatal("State returned only after the budget search (or the search took under 20 ms)")
	default:
	}
	if !st.Configured {
		t.Errorf("State: %+v", st)
	}
	<-done
}

// TestSnapshotBuffersReused: a released snapshot's copies of θ and the
// optimizer state are the next snapshot's buffers (no model-sized
// allocation per snapshot), a snapshot still held never shares them, and
// every snapshot restores to the state it was taken of.
func TestSnapshotBuffersReused(t *testing.T) {
	c := testRunConfig()
	grads := noisyGrads(3, 7)
	a := newTestFSM(t, t.TempDir())
	mustApply(t, a, logEntry(t, 1, entryConfig, c))
	take := func() (*fsmSnapshot, []byte) { return takeSnapshot(t, a) }
	restored := func(snap []byte) []float32 {
		t.Helper()
		b := newTestFSM(t, t.TempDir())
		if err := b.Restore(readCloser{bytes.NewReader(snap)}); err != nil {
			t.Fatal(err)
		}
		th, _ := b.Params(nil)
		return th
	}
	mustApply(t, a, stepLog(t, 2, 1, c, grads[0]))
	s1, snap1 := take()
	theta1, opt1 := &s1.body.Theta[0], &s1.body.Optimizer[0]
	want1, _ := a.Params(nil)

	mustApply(t, a, stepLog(t, 3, 2, c, grads[1]))
	s2, snap2 := take() // s1 still held: buffers of its own
	if &s2.body.Theta[0] == theta1 || &s2.body.Optimizer[0] == opt1 {
		t.Fatal("a snapshot shares its buffers with one still held")
	}
	want2, _ := a.Params(nil)
	s1.Release()
	s1.Release() // a second Release is harmless

	mustApply(t, a, stepLog(t, 4, 3, c, grads[2]))
	s3, snap3 := take()
	if &s3.body.Theta[0] != theta1 || &s3.body.Optimizer[0] != opt1 {
		t.Error("the released snapshot's buffers were not reused")
	}
	want3, _ := a.Params(nil)
	s2.Release()
	s3.Release()
	for i, c := range []struct {
		snap []byte
		want []float32
	}{{snap1, want1}, {snap2, want2}, {snap3, want3}} {
		if got := restored(c.snap); !bitsEqual(got, c.want) {
			t.Errorf("snapshot %d does not restore the θ it was taken of", i+1)
		}
	}
	if bitsEqual(want1, want3) {
		t.Fatal("the steps did not change θ: the test shows nothing")
	}
}

// TestFSMNamesOfOldRuns: a configuration logged without names (as every
// run's was before RunConfig.Names existed) accepts the same run given
// with names, so such a run resumes; one logged with names refuses other
// names, and none.
func TestFSMNamesOfOldRuns(t *testing.T) {
	c := testRunConfig()
	named := c
	named.Names = &DataNames{Classes: []string{"cat", "dog"}, Features: []string{"w", "h"}, LabelColumn: "species"}
	f := newTestFSM(t, t.TempDir())
	mustApply(t, f, logEntry(t, 1, entryConfig, c))
	if res := mustApply(t, f, logEntry(t, 2, entryConfig, named)); res.Err != nil {
		t.Errorf("a run logged without names, given with names: %v", res.Err)
	}
	if !sameRun(c, named) || sameRun(named, c) {
		t.Errorf("sameRun(without, with) = %v, sameRun(with, without) = %v", sameRun(c, named), sameRun(named, c))
	}
	g := newTestFSM(t, t.TempDir())
	mustApply(t, g, logEntry(t, 1, entryConfig, named))
	other := named
	other.Names = &DataNames{Classes: []string{"dog", "cat"}, Features: []string{"w", "h"}, LabelColumn: "species"}
	for _, given := range []RunConfig{other, c} {
		if res := mustApply(t, g, logEntry(t, 2, entryConfig, given)); res.Err == nil {
			t.Errorf("a run logged with names %+v accepted names %+v", named.Names, given.Names)
		}
	}
	if got, ok := g.Config(); !ok || !reflect.DeepEqual(got.Names, named.Names) {
		t.Errorf("logged names %+v, want %+v", got.Names, named.Names)
	}
}
