package cli

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/raftlog"
)

// The audit of a ledger that states less than was spent, through the real
// commands: `coordinator local` trains and leaves a data dir, the test
// damages it as an operator or a crash might, and `coordinator ledger
// audit` (and `ledger show`) read it.

// finishedRun trains a small run to its step limit (localArgs: 40 steps)
// and returns its data dir.
func finishedRun(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	if out, err := run(t, localArgs(dir)...); err != nil {
		t.Fatalf("local: %v\n%s", err, out)
	}
	return dir
}

// copyDataDir copies the data dir src (files and directories) to a fresh
// one, so that each case damages its own.
func copyDataDir(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "copy")
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// recordEnds returns the offset just past each whole record of a ledger
// file (its frames: a 4-byte little-endian length, a CRC, the payload).
func recordEnds(b []byte) []int {
	var ends []int
	for off := 0; off+8 <= len(b); {
		off += 8 + int(binary.LittleEndian.Uint32(b[off:]))
		if off > len(b) {
			break
		}
		ends = append(ends, off)
	}
	return ends
}

// cutLedger truncates the ledger of dir to n bytes.
func cutLedger(t *testing.T, dir string, n int) {
	t.Helper()
	path := filepath.Join(dir, coordinator.LedgerFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b[:n], 0o644); err != nil {
		t.Fatal(err)
	}
}

// auditJSON runs `ledger audit ARGS --json` and returns its report, the
// report as a map (for the fields by name) and the command's error.
func auditJSON(t *testing.T, args ...string) (ledger.AuditReport, map[string]any, error) {
	t.Helper()
	out, err := run(t, append([]string{"ledger", "audit"}, append(args, "--json")...)...)
	var rep ledger.AuditReport
	var m map[string]any
	if jerr := json.Unmarshal([]byte(out), &rep); jerr != nil {
		t.Fatalf("audit %v: not JSON: %v\n%s", args, jerr, out)
	}
	json.Unmarshal([]byte(out), &m)
	return rep, m, err
}

// TestLedgerAuditCutLedger: a finished run's ledger cut short (the last
// tenth of its bytes, or whole records at its end, so that no torn bytes
// remain and every record left verifies) fails the audit of its data dir,
// whose Raft state holds the records cut: the problem names the charges
// and the end record it lacks and the ε they bring. `ledger show` states
// the damage before the records. The untouched data dir passes.
func TestLedgerAuditCutLedger(t *testing.T) {
	done := finishedRun(t)
	full, err := os.ReadFile(filepath.Join(done, coordinator.LedgerFile))
	if err != nil {
		t.Fatal(err)
	}
	ends := recordEnds(full)
	if len(ends) != 42 || ends[41] != len(full) {
		t.Fatalf("the finished run's ledger has %d records (want the run record, 40 charges, the end)", len(ends))
	}

	t.Run("untouched", func(t *testing.T) {
		rep, _, err := auditJSON(t, done, "--expect-steps", "40")
		if err != nil || !rep.OK || rep.Applied != 40 || !rep.Ended {
			t.Fatalf("audit: %v, %+v", err, rep)
		}
		out, err := run(t, "ledger", "audit", done)
		if err != nil || !strings.Contains(out, "42 records, last step applied 40; the ledger holds each of them") {
			t.Errorf("audit: %v, the Raft check not stated:\n%s", err, out)
		}
	})

	for _, tc := range []struct {
		name   string
		cut    int
		torn   bool
		lacks  string
		charge bool
	}{
		{"last tenth of the bytes", len(full) * 9 / 10, true, "", true},
		{"at a record boundary", ends[36], false, "lacks 5 record(s)", true},
		{"the end record", ends[40], false, "lacks 1 record(s)", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyDataDir(t, done)
			cutLedger(t, dir, tc.cut)
			rep, _, err := auditJSON(t, dir)
			if !errors.Is(err, errAuditFailed) || rep.OK {
				t.Fatalf("audit of the cut ledger: err %v, OK %v, problems %q", err, rep.OK, rep.Problems)
			}
			problems := strings.Join(rep.Problems, "\n")
			for _, want := range []string{tc.lacks, "the end record (max steps reached)", "The ledger under-states what was spent", "the file was cut"} {
				if !strings.Contains(problems, want) {
					t.Errorf("problems lack %q:\n%s", want, problems)
				}
			}
			if tc.charge && !regexp.MustCompile(`charge\(s\), for steps \d+–40, after which ε spent is [0-9.]+, not the [0-9.]+ the ledger states`).MatchString(problems) {
				t.Errorf("problems do not name the charges lacking and their ε:\n%s", problems)
			}
			if got := strings.Contains(problems, "torn tail"); got != tc.torn || (rep.TornBytes > 0) != tc.torn {
				t.Errorf("torn tail reported %v (%d bytes), want %v:\n%s", got, rep.TornBytes, tc.torn, problems)
			}
			// The text states the problems first; show, the damage.
			out, _ := run(t, "ledger", "audit", dir)
			if lines := strings.Split(out, "\n"); !strings.HasPrefix(lines[0], "audit    FAILED") || !strings.HasPrefix(lines[1], "problem  ") {
				t.Errorf("audit does not state its problems first:\n%s", out)
			}
			out, err = run(t, "ledger", "show", dir)
			if err != nil || !strings.HasPrefix(out, "DAMAGED  ") || !strings.Contains(out, "under-states") || !strings.Contains(out, " charge ") {
				t.Errorf("show: %v; it does not state the damage first, then the records:\n%s", err, out)
			}
		})
	}
}

// TestLedgerAuditTornTail: bytes after the last whole record of a
// finished run's ledger (a crash in an append, or a cut) fail the audit,
// also with every record the Raft state holds present. While a replica
// holds the data dir (its Raft log open, as a running one does) the same
// tail is an append in progress: the audit passes up to the last complete
// record and says so.
func TestLedgerAuditTornTail(t *testing.T) {
	dir := finishedRun(t)
	path := filepath.Join(dir, coordinator.LedgerFile)
	full, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ends := recordEnds(full)
	// The first 30 bytes of a copy of the last record: a torn append.
	torn := append(full, full[ends[40]:ends[40]+30]...)
	if err := os.WriteFile(path, torn, 0o644); err != nil {
		t.Fatal(err)
	}
	mustNotChange(t, path)

	rep, _, err := auditJSON(t, dir)
	if !errors.Is(err, errAuditFailed) || rep.OK || rep.TornBytes != 30 || len(rep.Problems) != 1 || !strings.HasPrefix(rep.Problems[0], "torn tail: 30 byte(s) after record 42") {
		t.Fatalf("audit of a torn tail: err %v, OK %v, torn %d, problems %q", err, rep.OK, rep.TornBytes, rep.Problems)
	}
	out, _ := run(t, "ledger", "show", dir)
	if !strings.HasPrefix(out, "DAMAGED  torn tail") {
		t.Errorf("show does not state the torn tail first:\n%s", out)
	}

	// A replica holds the dir: the tail is an append in progress.
	logs, err := raftlog.Open(filepath.Join(dir, "raft"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	rep, m, err := auditJSON(t, dir, "--expect-steps", "40")
	if err != nil || !rep.OK || rep.TornBytes != 30 || m["live"] != true {
		t.Fatalf("audit beside a replica: err %v, %+v", err, rep)
	}
	out, err = run(t, "ledger", "audit", dir)
	if err != nil || !strings.Contains(out, "live     a replica is running on this data dir: the ledger is read up to record 42, its last complete one; the 30 bytes after it are an append in progress") {
		t.Errorf("audit beside a replica: %v\n%s", err, out)
	}
}

// interruptedRun trains until step 5 is released and step 6 charged ahead
// of its noisy gradient (the leader charges the next step as soon as it
// releases θ), interrupts the run there, as Ctrl-C does, and returns the
// data dir and the command's output. The leader's loop waits in OnStep
// (for step 5) until the ledger holds step 6's charge, so step 6's round
// cannot close before the interruption.
func interruptedRun(t *testing.T) (dir, out string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "run")
	path := filepath.Join(dir, coordinator.LedgerFile)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	charged := func(step int64) bool {
		recs, _, _ := ledger.ReadFile(path)
		return len(recs) > 0 && recs[len(recs)-1].Kind == ledger.RecordCharge && recs[len(recs)-1].Step == step
	}
	hooks := LocalHooks{OnStep: func(p coordinator.Progress) {
		if p.Step < 5 {
			return
		}
		once.Do(func() {
			for deadline := time.Now().Add(30 * time.Second); !charged(p.Step+1) && time.Now().Before(deadline); {
				time.Sleep(2 * time.Millisecond)
			}
			cancel()
		})
	}}
	var stdout strings.Builder
	args := []string{"--dataset", "gaussian", "--model", "logreg", "--batch-size", "100", "--max-steps", "0", "--sigma", "5",
		"--eval-every", "0", "--data-dir", dir, "--progress", "off", "--round-timeout", "20s", "--run", "t-interrupted"}
	if err := RunLocal(ctx, args, &stdout, io.Discard, hooks); err != nil {
		t.Fatalf("interrupted run: %v\n%s", err, stdout.String())
	}
	return dir, stdout.String()
}

// TestLedgerAuditInterruptedRun: an interrupted run whose last step was
// charged ahead of its noisy gradient and never applied. The audit of its
// data dir takes the applied steps from the Raft state (the run wrote no
// end record) and counts that step as charged and never applied; the
// audit of the ledger file alone says it cannot tell, and counts the step
// as unconfirmed, not applied.
func TestLedgerAuditInterruptedRun(t *testing.T) {
	dir, out := interruptedRun(t)
	m := regexp.MustCompile(`interrupted after (\d+) steps \(ε = [0-9.]+, charged through step (\d+)\)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the run does not report a step charged ahead:\n%s", out)
	}
	applied, _ := strconv.Atoi(m[1])
	if charged, _ := strconv.Atoi(m[2]); applied < 5 || charged != applied+1 {
		t.Fatalf("interrupted after %d steps, charged through %d", applied, charged)
	}

	rep, _, err := auditJSON(t, dir, "--expect-steps", strconv.Itoa(applied))
	if err != nil || !rep.OK || rep.Applied != applied || rep.Unapplied != 1 || rep.Charges != applied+1 || rep.LastStep != int64(applied+1) || rep.Ended {
		t.Fatalf("audit of the data dir: %v, %+v; want %d applied steps and step %d charged and never applied", err, rep, applied, applied+1)
	}
	text, err := run(t, "ledger", "audit", dir)
	if err != nil || !strings.Contains(text, "the run was interrupted after step "+strconv.Itoa(applied)+", as the Raft state says") {
		t.Errorf("audit of the data dir: %v\n%s", err, text)
	}

	file := filepath.Join(dir, coordinator.LedgerFile)
	rep, fields, err := auditJSON(t, file)
	if err != nil || !rep.OK || rep.Applied != applied || fields["unconfirmed_steps"] != 1.0 || rep.Unapplied != 0 {
		t.Fatalf("audit of the ledger file: %v, %+v", err, rep)
	}
	text, _ = run(t, "ledger", "audit", file)
	if !strings.Contains(text, "unsure   step "+strconv.Itoa(applied+1)+", the last charged, is not counted as applied") ||
		!strings.Contains(text, "charged ahead of its noisy gradient") {
		t.Errorf("audit of the ledger file does not say the last step is unconfirmed:\n%s", text)
	}
	if rep, _, err := auditJSON(t, file, "--expect-steps", strconv.Itoa(applied)); !errors.Is(err, errAuditFailed) ||
		len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0], "unconfirmed") {
		t.Errorf("--expect-steps on the ledger file alone: %v, %q", err, rep.Problems)
	}
}

// TestLedgerAuditRaftAhead: the Raft log of an interrupted run (no
// snapshot: the run is short) holds entries whose charges its ledger,
// restored from a copy taken earlier (cut at a record boundary), lacks:
// the audit fails, naming the steps lacking. The same holds when only the
// snapshot holds them (a finished run's, its log emptied): see
// TestLedgerAuditCutLedger, whose records come from the final snapshot.
func TestLedgerAuditRaftAhead(t *testing.T) {
	dir, _ := interruptedRun(t)
	if ents, _ := os.ReadDir(filepath.Join(dir, "snapshots")); len(ents) != 0 {
		t.Fatalf("the short run took %d snapshot(s); the test wants its records in the log alone", len(ents))
	}
	path := filepath.Join(dir, coordinator.LedgerFile)
	full, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ends := recordEnds(full)
	cutLedger(t, dir, ends[3]) // the run record and steps 1–3
	rep, _, err := auditJSON(t, dir)
	if !errors.Is(err, errAuditFailed) || rep.OK || rep.TornBytes != 0 {
		t.Fatalf("audit: err %v, %+v", err, rep)
	}
	problems := strings.Join(rep.Problems, "\n")
	want := regexp.MustCompile(`the ledger lacks \d+ record\(s\) that the data dir's Raft state \(its log to index \d+, no snapshot, replayed\) holds: \d+ charge\(s\), for steps 4–\d+`)
	if !want.MatchString(problems) || !strings.Contains(problems, "or the replica stopped before applying entries it had logged (start it again") {
		t.Errorf("problems do not name the charges lacking and their possible causes:\n%s", problems)
	}
}

// TestLedgerAuditLiveRun: the audit of a run in progress (the replica
// holds its data dir) passes, says the run is live, and takes the entries
// the replica logged and has not applied yet for what they are.
func TestLedgerAuditLiveRun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	path := filepath.Join(dir, coordinator.LedgerFile)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		args := []string{"--dataset", "gaussian", "--model", "logreg", "--batch-size", "100", "--max-steps", "0", "--sigma", "5",
			"--eval-every", "0", "--data-dir", dir, "--progress", "off", "--round-timeout", "20s"}
		done <- RunLocal(ctx, args, io.Discard, io.Discard, LocalHooks{})
	}()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if recs, _, err := ledger.ReadFile(path); err == nil && len(recs) > 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the run made no progress")
		}
	}
	for range 3 {
		rep, m, err := auditJSON(t, dir)
		if err != nil || !rep.OK || m["live"] != true || rep.Ended {
			t.Errorf("audit of the live run: %v, %+v", err, rep)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("interrupted run: %v", err)
	}
	if rep, m, err := auditJSON(t, dir); err != nil || !rep.OK || m["live"] != false {
		t.Errorf("audit after the run: %v, %+v", err, rep)
	}
}
