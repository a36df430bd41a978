package cli

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/seed"
)

// testLedger is a ledger written through the real ledger package.
type testLedger struct {
	dir, path string
	spent     float64 // Ledger.Spent after the last charge
	head      ledger.Record
	records   int
}

// cliHistory is the Raft history ID of the test ledger.
const cliHistory = "c11c11c11c11c11c11c11c11c11c11c1"

// newTestLedger writes a run record and six charges, the fifth a replay of
// step 4, into DIR/ledger.log of a fresh data directory.
func newTestLedger(t *testing.T) testLedger {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, coordinator.LedgerFile)
	l, err := ledger.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Start("cli-test", 10, 1e-5, seed.Crypto, ledger.MechanismFloat, "", cliHistory); err != nil {
		t.Fatal(err)
	}
	e := accounting.SubsampledGaussian(0.01, 1.1)
	for _, c := range []struct {
		step   int64
		index  uint64
		replay bool
	}{{1, 3, false}, {2, 4, false}, {3, 5, false}, {4, 6, false}, {4, 7, true}, {5, 9, false}} {
		if _, err := l.Charge(c.step, e, ledger.Position{History: cliHistory, Term: 2, Index: c.index}, c.replay); err != nil {
			t.Fatalf("Charge(step %d): %v", c.step, err)
		}
	}
	head, n := l.Head()
	return testLedger{dir: dir, path: path, spent: l.Spent(), head: head, records: int(n)}
}

// runJSON runs the command and decodes its stdout into v.
func runJSON(t *testing.T, v any, args ...string) error {
	t.Helper()
	out, err := run(t, args...)
	if jerr := json.Unmarshal([]byte(out), v); jerr != nil {
		t.Fatalf("%v: output is not JSON: %v\n%s", args, jerr, out)
	}
	return err
}

// mustNotChange fails the test if the file at path changes before the test
// ends: show and audit are read-only.
func mustNotChange(t *testing.T, path string) {
	t.Helper()
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
			t.Errorf("%s was modified", path)
		}
	})
}

func TestLedgerShow(t *testing.T) {
	tl := newTestLedger(t)
	mustNotChange(t, tl.path)
	for _, arg := range []string{tl.dir, tl.path} {
		out, err := run(t, "ledger", "show", arg)
		if err != nil {
			t.Fatalf("show %s: %v", arg, err)
		}
		for _, want := range []string{"cli-test", "target ε = 10", "δ = 1e-05", "records  7", tl.head.Hash, "0.01", "1.1", "replay", tl.head.Hash[:12], "history  " + cliHistory} {
			if !strings.Contains(out, want) {
				t.Errorf("show %s: output lacks %q:\n%s", arg, want, out)
			}
		}
		if got := strings.Count(out, " charge "); got != 6 {
			t.Errorf("show %s: %d charge lines, want 6:\n%s", arg, got, out)
		}

		var got showResult
		if err := runJSON(t, &got, "ledger", "show", arg, "--json"); err != nil {
			t.Fatalf("show %s --json: %v", arg, err)
		}
		if got.Path != tl.path || got.Run != "cli-test" || got.TargetEpsilon != 10 || got.Delta != 1e-5 || got.History != cliHistory {
			t.Errorf("show %s --json: run fields %+v", arg, got)
		}
		if got.Count != tl.records || len(got.Records) != tl.records || got.HeadHash != tl.head.Hash || got.TornBytes != 0 || got.Error != "" {
			t.Errorf("show %s --json: count %d, %d records, head %s, torn %d, error %q; want %d records, head %s",
				arg, got.Count, len(got.Records), got.HeadHash, got.TornBytes, got.Error, tl.records, tl.head.Hash)
		}
		if got.Epsilon != tl.spent {
			t.Errorf("show %s --json: ε = %v, want Spent() = %v", arg, got.Epsilon, tl.spent)
		}
		if r := got.Records[5]; r.Kind != ledger.RecordCharge || r.Step != 4 || r.Index != 7 || !r.Replay || r.Event.SampleRate != 0.01 {
			t.Errorf("show %s --json: record 6 = %+v, want the replay of step 4 at index 7", arg, r)
		}
	}
}

func TestLedgerAudit(t *testing.T) {
	tl := newTestLedger(t)
	mustNotChange(t, tl.path)
	for _, arg := range []string{tl.dir, tl.path} {
		out, err := run(t, "ledger", "audit", arg)
		if err != nil {
			t.Fatalf("audit %s: %v\n%s", arg, err, out)
		}
		if !strings.Contains(out, "audit    OK") || strings.Contains(out, "problem") || !strings.Contains(out, "history  "+cliHistory) {
			t.Errorf("audit %s: output does not pass:\n%s", arg, out)
		}

		// The test ledger has no end record and its dir no Raft state:
		// step 5, the last charged, may have been charged ahead of its g̃,
		// so it is unconfirmed, not applied.
		if !strings.Contains(out, "audited alone") || !strings.Contains(out, "unsure   step 5") {
			t.Errorf("audit %s: output does not say it read the ledger alone, its last step unconfirmed:\n%s", arg, out)
		}
		var rep ledger.AuditReport
		if err := runJSON(t, &rep, "ledger", "audit", arg, "--json"); err != nil {
			t.Fatalf("audit %s --json: %v", arg, err)
		}
		if !rep.OK || len(rep.Problems) != 0 || rep.Records != 7 || rep.Charges != 6 || rep.Replays != 1 || rep.Applied != 4 || rep.Unconfirmed != 1 ||
			rep.LastStep != 5 || rep.TornBytes != 0 || rep.HeadHash != tl.head.Hash || rep.Run != "cli-test" || rep.History != cliHistory {
			t.Errorf("audit %s --json: %+v", arg, rep)
		}
		if rep.RecordedEpsilon != tl.spent || rep.RecomputedEpsilon != tl.spent {
			t.Errorf("audit %s --json: recorded ε %v, recomputed %v, want Spent() = %v", arg, rep.RecordedEpsilon, rep.RecomputedEpsilon, tl.spent)
		}
		// A run record from before accountants were recorded enforced RDP;
		// the audit also reports PLD's (tighter) ε of the same charges.
		if rep.Accountant != ledger.AccountantRDP || rep.RDPEpsilon != tl.spent || rep.PLDEpsilon == nil || !(*rep.PLDEpsilon < rep.RDPEpsilon) {
			t.Errorf("audit %s --json: accountant %q, RDP ε %v (want %v), PLD ε %v (want below RDP)", arg, rep.Accountant, rep.RDPEpsilon, tl.spent, rep.PLDEpsilon)
		}
		if !strings.Contains(out, "rdp accountant, enforced") || !strings.Contains(out, "ε spent") || !strings.Contains(out, "ε pld") {
			t.Errorf("audit %s: output does not report both accountants:\n%s", arg, out)
		}
	}
}

// TestLedgerAuditPLD: the audit of a run that enforced PLD names it, flags
// its line, and reports RDP's ε of the same charges beside it; for a
// discrete-noise run, which PLD cannot charge, it says so instead of a
// number.
func TestLedgerAuditPLD(t *testing.T) {
	for _, tc := range []struct {
		mechanism, accountant string
		event                 accounting.Event
	}{
		{ledger.MechanismFloat, ledger.AccountantPLD, accounting.SubsampledGaussian(0.01, 1.1)},
		{ledger.MechanismDiscrete, ledger.AccountantRDP, accounting.SubsampledDiscreteGaussian(0.01, 1.1)},
	} {
		dir := t.TempDir()
		l, err := ledger.Open(filepath.Join(dir, coordinator.LedgerFile))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Start("cli-pld", 10, 1e-5, seed.Crypto, tc.mechanism, tc.accountant, cliHistory); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if _, err := l.Charge(int64(i+1), tc.event, ledger.Position{History: cliHistory, Term: 1, Index: uint64(i + 3)}, false); err != nil {
				t.Fatal(err)
			}
		}
		spent := l.Spent()
		l.Close()
		out, err := run(t, "ledger", "audit", dir)
		if err != nil {
			t.Fatalf("audit: %v\n%s", err, out)
		}
		var rep ledger.AuditReport
		if err := runJSON(t, &rep, "ledger", "audit", dir, "--json"); err != nil {
			t.Fatal(err)
		}
		if !rep.OK || rep.Accountant != tc.accountant || rep.RecomputedEpsilon != spent {
			t.Errorf("%s: %+v, want OK, accountant %s, ε %v", tc.mechanism, rep, tc.accountant, spent)
		}
		switch tc.accountant {
		case ledger.AccountantPLD:
			// The enforced budget records the PLD ε of the charges taken,
			// up to its count grid's rounding up (every count is a grid
			// count here), below RDP's.
			if rep.PLDEpsilon == nil || *rep.PLDEpsilon != spent || rep.RDPEpsilon < spent || !(rep.RDPEpsilon > *rep.PLDEpsilon) ||
				!strings.Contains(out, "pld accountant, enforced") || !regexp.MustCompile(`ε spent +[0-9.]+ \(pld accountant, enforced`).MatchString(out) ||
				!regexp.MustCompile(`check +the pld accountant's ε of exactly these 3 charges is [0-9.]+; ε spent, on the ledger's count grid, is 1 ×`).MatchString(out) {
				t.Errorf("PLD run: PLD ε %v, RDP ε %v, spent %v; output:\n%s", rep.PLDEpsilon, rep.RDPEpsilon, spent, out)
			}
		default:
			if rep.PLDEpsilon != nil || rep.PLDNote == "" || !strings.Contains(out, "ε pld    - (") ||
				!regexp.MustCompile(`ε spent +[0-9.]+ \(rdp accountant, enforced`).MatchString(out) {
				t.Errorf("discrete run: PLD ε %v (%q); output:\n%s", rep.PLDEpsilon, rep.PLDNote, out)
			}
		}
	}
}

func TestLedgerAuditExpectSteps(t *testing.T) {
	tl := newTestLedger(t)
	// Its last step is unconfirmed (no end record, no Raft state): no
	// count is confirmed, not even 4 or 5.
	for _, n := range []string{"0", "4", "5", "6"} {
		var rep ledger.AuditReport
		err := runJSON(t, &rep, "ledger", "audit", tl.dir, "--json", "--expect-steps", n)
		if !errors.Is(err, errAuditFailed) {
			t.Errorf("--expect-steps %s: err = %v, want errAuditFailed", n, err)
		}
		if rep.OK || len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0], "--expect-steps "+n) || !strings.Contains(rep.Problems[0], "step 5 unconfirmed") {
			t.Errorf("--expect-steps %s: report %+v", n, rep)
		}
	}
	if _, err := run(t, "ledger", "audit", tl.dir, "--expect-steps", "-1"); err == nil || !strings.Contains(err.Error(), "--expect-steps") {
		t.Errorf("--expect-steps -1: err = %v, want a flag error", err)
	}
}

// TestLedgerTornTail: bytes after the last whole record (a crash inside
// an append, or a file cut short) are reported by both commands, first,
// without repairing them; show prints the records before them and exits
// 0, the audit fails (no replica runs on the dir).
func TestLedgerTornTail(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mutate  func([]byte) []byte
		records int
	}{
		{"garbage header", func(b []byte) []byte { return append(b, 0x2a, 0x01, 0x00) }, 7},
		{"cut payload", func(b []byte) []byte { return b[:len(b)-20] }, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := newTestLedger(t)
			full, err := os.ReadFile(tl.path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(tl.path, tc.mutate(full), 0o644); err != nil {
				t.Fatal(err)
			}
			mustNotChange(t, tl.path)

			var rep ledger.AuditReport
			if err := runJSON(t, &rep, "ledger", "audit", tl.dir, "--json"); !errors.Is(err, errAuditFailed) {
				t.Fatalf("audit: err = %v, want errAuditFailed", err)
			}
			if rep.OK || rep.TornBytes <= 0 || rep.Records != tc.records || len(rep.Problems) != 1 || !strings.HasPrefix(rep.Problems[0], "torn tail") {
				t.Errorf("audit: %+v, want a failure for the torn tail after %d records", rep, tc.records)
			}
			var got showResult
			if err := runJSON(t, &got, "ledger", "show", tl.dir, "--json"); err != nil {
				t.Fatalf("show: %v", err)
			}
			if got.TornBytes != rep.TornBytes || got.Count != tc.records {
				t.Errorf("show: torn %d, %d records; want torn %d, %d records", got.TornBytes, got.Count, rep.TornBytes, tc.records)
			}
			out, err := run(t, "ledger", "show", tl.dir)
			if err != nil || !strings.HasPrefix(out, "DAMAGED  torn tail") || strings.Count(out, " charge ") != tc.records-1 {
				t.Errorf("show: err %v, output does not report the torn tail first, then the records:\n%s", err, out)
			}
		})
	}
}

func TestLedgerCorrupt(t *testing.T) {
	tl := newTestLedger(t)
	b, err := os.ReadFile(tl.path)
	if err != nil {
		t.Fatal(err)
	}
	// Flip a byte inside the payload of the fourth record, well clear of
	// its frame header.
	off := nthIndex(b, []byte(`{"format"`), 4) + 20
	b[off] ^= 0x01
	if err := os.WriteFile(tl.path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	mustNotChange(t, tl.path)

	var rep ledger.AuditReport
	err = runJSON(t, &rep, "ledger", "audit", tl.dir, "--json")
	if !errors.Is(err, errAuditFailed) {
		t.Errorf("audit --json: err = %v, want errAuditFailed", err)
	}
	if rep.OK || rep.Records != 3 || len(rep.Problems) == 0 || !strings.Contains(rep.Problems[0], "CRC mismatch in record 4") {
		t.Errorf("audit --json: %+v, want a CRC problem in record 4 after 3 good records", rep)
	}
	out, err := run(t, "ledger", "audit", tl.dir)
	if !errors.Is(err, errAuditFailed) || !strings.Contains(out, "FAILED") || !strings.Contains(out, "problem  ") {
		t.Errorf("audit: err %v, output:\n%s", err, out)
	}

	out, err = run(t, "ledger", "show", tl.dir)
	if !errors.Is(err, ledger.ErrCorrupt) {
		t.Errorf("show: err = %v, want ErrCorrupt", err)
	}
	if !strings.Contains(out, "CORRUPT") || strings.Count(out, " charge ") != 2 {
		t.Errorf("show does not print the 3 verified records and the damage:\n%s", out)
	}
	var got showResult
	if err := runJSON(t, &got, "ledger", "show", tl.dir, "--json"); !errors.Is(err, ledger.ErrCorrupt) {
		t.Errorf("show --json: err = %v, want ErrCorrupt", err)
	}
	if got.Count != 3 || got.Error == "" {
		t.Errorf("show --json: %d records, error %q; want 3 and the damage", got.Count, got.Error)
	}
}

// nthIndex returns the offset of the n-th (1-based) occurrence of sep in b.
func nthIndex(b, sep []byte, n int) int {
	off := -len(sep)
	for range n {
		i := bytes.Index(b[off+len(sep):], sep)
		if i < 0 {
			panic("nthIndex: too few occurrences")
		}
		off += len(sep) + i
	}
	return off
}

// TestLedgerForgedEpsilon rewrites the ledger with an under-reported ε in
// its last charge, re-chained and re-framed so that only the auditor's
// recomputation of ε can catch it.
func TestLedgerForgedEpsilon(t *testing.T) {
	tl := newTestLedger(t)
	full, err := os.ReadFile(tl.path)
	if err != nil {
		t.Fatal(err)
	}
	recs, _, err := ledger.ReadFile(tl.path)
	if err != nil {
		t.Fatal(err)
	}
	if got := forgeLedger(t, recs); !bytes.Equal(got, full) {
		t.Fatal("forgeLedger does not reproduce an untouched ledger byte for byte")
	}
	recs[len(recs)-1].Epsilon /= 2
	if err := os.WriteFile(tl.path, forgeLedger(t, recs), 0o644); err != nil {
		t.Fatal(err)
	}

	var rep ledger.AuditReport
	if err := runJSON(t, &rep, "ledger", "audit", tl.path, "--json"); !errors.Is(err, errAuditFailed) {
		t.Errorf("audit: err = %v, want errAuditFailed", err)
	}
	if rep.OK || len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0], "record 7 (step 5): recorded ε=") {
		t.Errorf("forged ε not caught: %+v", rep)
	}
	if rep.RecordedEpsilon != tl.spent/2 || rep.RecomputedEpsilon != tl.spent {
		t.Errorf("recorded ε %v, recomputed %v; want %v and %v", rep.RecordedEpsilon, rep.RecomputedEpsilon, tl.spent/2, tl.spent)
	}

	// The report of a failed audit is written, and says so.
	report := filepath.Join(t.TempDir(), "forged.html")
	if _, err := run(t, "ledger", "audit", tl.path, "--report", report); !errors.Is(err, errAuditFailed) {
		t.Errorf("audit --report: err = %v, want errAuditFailed", err)
	}
	if page, err := os.ReadFile(report); err != nil || !strings.Contains(string(page), "FAILED") || !strings.Contains(string(page), "record 7 (step 5): recorded ε=") {
		t.Errorf("report of the failed audit: %v, want the verdict and the problem:\n%s", err, page)
	}
}

// TestLedgerAuditHistoryReuse: the test ledger (history cliHistory, steps
// 1-5 at Raft indexes 3-9) continued by another Raft history whose steps
// 6-8 sit past its last index, re-chained: what a coordinator that reused
// a ledger across histories without checking would leave. Every record
// verifies and the steps and indexes look continuous, but the audit fails
// and names the reuse.
func TestLedgerAuditHistoryReuse(t *testing.T) {
	tl := newTestLedger(t)
	recs, _, err := ledger.ReadFile(tl.path)
	if err != nil {
		t.Fatal(err)
	}
	const other = "0ff0ff0ff0ff0ff0ff0ff0ff0ff0ff0"
	acc := accounting.RDP{}.NewComposition()
	e := accounting.SubsampledGaussian(0.01, 1.1)
	for range recs[1:] {
		acc.Compose(e, 1)
	}
	for step := int64(6); step <= 8; step++ {
		acc.Compose(e, 1)
		eps, _, _ := acc.Epsilon(1e-5)
		recs = append(recs, ledger.Record{Format: ledger.FileFormat, Kind: ledger.RecordCharge, Step: step, Event: &e,
			History: other, Term: 2, Index: uint64(step + 4), Epsilon: eps})
	}
	if err := os.WriteFile(tl.path, forgeLedger(t, recs), 0o644); err != nil {
		t.Fatal(err)
	}
	var rep ledger.AuditReport
	if err := runJSON(t, &rep, "ledger", "audit", tl.dir, "--json"); !errors.Is(err, errAuditFailed) {
		t.Errorf("audit: err = %v, want errAuditFailed", err)
	}
	problems := strings.Join(rep.Problems, "\n")
	if rep.OK || len(rep.Problems) != 3 || !strings.Contains(problems, "record 8 (step 6): charge from Raft history "+other) ||
		!strings.Contains(problems, "reused across Raft histories") {
		t.Errorf("reuse across histories not caught: %+v", rep)
	}
	out, err := run(t, "ledger", "audit", tl.dir)
	if !errors.Is(err, errAuditFailed) || !strings.Contains(out, "FAILED") || !strings.Contains(out, "reused across Raft histories") {
		t.Errorf("audit: err %v, output:\n%s", err, out)
	}
}

// forgeLedger encodes recs as a ledger file the way ledger.File.Append
// does (see ledger/file.go): each record re-chained (seq, prev_hash, and
// hash = SHA-256 of its JSON with hash empty) and framed as a little-endian
// length, the payload's CRC32C and the JSON payload.
func forgeLedger(t *testing.T, recs []ledger.Record) []byte {
	t.Helper()
	var buf bytes.Buffer
	prev := strings.Repeat("0", 2*sha256.Size)
	for i, r := range recs {
		r.Seq, r.PrevHash, r.Hash = uint64(i+1), prev, ""
		unhashed, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(unhashed)
		r.Hash = hex.EncodeToString(sum[:])
		payload, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(payload))))
		buf.Write(binary.LittleEndian.AppendUint32(nil, crc32.Checksum(payload, crc32.MakeTable(crc32.Castagnoli))))
		buf.Write(payload)
		prev = r.Hash
	}
	return buf.Bytes()
}

func TestLedgerMissing(t *testing.T) {
	empty := t.TempDir()
	for _, tc := range []struct {
		arg, want string
	}{
		{filepath.Join(empty, "nope"), filepath.Join(empty, "nope")},
		{empty, filepath.Join(empty, coordinator.LedgerFile)},
	} {
		for _, sub := range []string{"show", "audit"} {
			_, err := run(t, "ledger", sub, tc.arg, "--json")
			if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s %s: err = %v, want a not-exist error naming %s", sub, tc.arg, err, tc.want)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(empty, coordinator.LedgerFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a ledger was created in %s: %v", empty, err)
	}
}
