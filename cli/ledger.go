package cli

import (
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/cli/ledgerreport"
	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/seed"
)

// errAuditFailed is returned by ledger audit when the ledger fails any
// check, after the report has been printed.
var errAuditFailed = errors.New("ledger audit failed")

func newLedgerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ledger",
		Short: "Inspect and audit a replica's privacy ledger (read-only)",
		Long: `Inspect and audit the hash-chained privacy ledger a coordinator replica keeps.
DIR is a replica's data directory (the ledger is DIR/` + coordinator.LedgerFile + `) or a ledger file.
These commands change nothing, also beside a running replica: a torn tail is reported, not
repaired, and a data directory's Raft state is replayed in a temporary directory.`,
	}
	cmd.AddCommand(newLedgerShowCmd(), newLedgerAuditCmd(), newLedgerBudgetCmd())
	return cmd
}

// showResult is the --json output of ledger show.
type showResult struct {
	Path          string      `json:"path"`
	Run           string      `json:"run"`
	TargetEpsilon float64     `json:"target_epsilon"`
	Delta         float64     `json:"delta"`
	Noise         seed.Policy `json:"noise"`
	Mechanism     string      `json:"mechanism"`
	// Accountant is the accountant the run enforces its budget with (rdp
	// for a run record from before the field).
	Accountant string `json:"accountant"`
	// History is the Raft history ID the run record binds the ledger to
	// ("" for a ledger written before history IDs).
	History string `json:"history"`
	// Admission is the dataset budget admission the run record states
	// (absent for a run admitted to none).
	Admission *ledger.Admission `json:"admission,omitempty"`
	// Epsilon is the ε recorded by the last charge (0 before any).
	Epsilon   float64 `json:"epsilon"`
	Count     int     `json:"count"`
	HeadHash  string  `json:"head_hash"`
	TornBytes int64   `json:"torn_bytes"`
	// Error is set when the file is corrupt; Records then holds the
	// records that verified before the damage.
	Error string `json:"error,omitempty"`
	// Live says a replica runs on the ledger's data dir; Damage is what
	// is wrong with the file (coordinator.LedgerRead.Damage), stated
	// first in the text output.
	Live    bool            `json:"live"`
	Damage  []string        `json:"damage"`
	Records []ledger.Record `json:"records"`
}

func newLedgerShowCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show DIR",
		Short: "Print a ledger's run and every record",
		Long: `Print a ledger's run and every record, its damage first: a corrupt record, a torn
tail, and, for a data directory, the records its Raft state holds and the ledger lacks (as
ledger audit finds them). A corrupt ledger prints the records that verified before the damage
and exits non-zero; the other damage is printed, and ledger audit fails on it.

With --json the output is ONE indented JSON object (not JSON lines):
  path, run, target_epsilon, delta, noise, mechanism, history  the run record's
  accountant  the accountant the run enforces (rdp for a run record without one)
  admission   the dataset budget admission the run record states: dataset, budget,
              id, file, epsilon, delta (absent for a run admitted to none)
  epsilon     ε recorded by the last charge (0 before any)
  count       number of records; head_hash: the last record's hash
  torn_bytes  bytes of a torn tail after the last complete record
  error       only when the file is corrupt
  live        a replica runs on the data directory (its ledger is read up to its
              last complete record; a torn tail is an append in progress)
  damage      what is wrong with the file, in words (empty when nothing is)
  records     array of every record, with the ledger file's own field names:
              format, seq, kind ("run", "charge" or "end"), prev_hash, hash; run
              records: run, target_epsilon, delta, noise, mechanism,
              accountant (absent in ledgers written before it), history,
              and for a run admitted to a dataset budget dataset, budget_id,
              admission_id, budget_file, budget_epsilon, budget_delta;
              charge records: history, step, event (kind, sample_rate,
              noise_multiplier, event), term, index, replay, epsilon;
              the end record: history, step (the last step applied),
              reason, term, index (the entry that ended the run).
              A field that is empty, zero or false is left out, as in the
              file (replay appears only when true).
These names are stable: they are the names the records' hashes cover.`,
		Example: `  coordinator ledger show /var/lib/dpcluster/coord-1
  coordinator ledger show /var/lib/dpcluster/coord-1/ledger.log --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rd, err := coordinator.ReadLedger(args[0])
			if err != nil {
				return err
			}
			recs, readErr := rd.Records, rd.Err
			res := showResult{Path: rd.Path, Count: len(recs), TornBytes: rd.TornBytes, Records: recs,
				Live: rd.Options.Live, Damage: rd.Damage()}
			if res.Damage == nil {
				res.Damage = []string{}
			}
			if res.Records == nil {
				res.Records = []ledger.Record{}
			}
			if len(recs) > 0 {
				res.HeadHash = recs[len(recs)-1].Hash
				if r := recs[0]; r.Kind == ledger.RecordRun {
					res.Run, res.TargetEpsilon, res.Delta, res.Noise, res.History = r.Run, r.TargetEpsilon, r.Delta, r.Noise, r.History
					if a, ok := r.DatasetAdmission(); ok {
						res.Admission = &a
					}
					res.Mechanism, res.Accountant = r.Mechanism, accountantName(r.Accountant)
				}
			}
			for _, r := range recs {
				if r.Kind == ledger.RecordCharge {
					res.Epsilon = r.Epsilon
				}
			}
			if readErr != nil {
				res.Error = readErr.Error()
			}
			if asJSON {
				err = writeJSON(cmd.OutOrStdout(), res)
			} else {
				err = printShow(cmd.OutOrStdout(), res)
			}
			if readErr != nil {
				return readErr
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the run and every record as one JSON object (see above)")
	return cmd
}

// printShow writes res for a human, its damage first; it builds the text
// first so that a write error is returned once.
func printShow(out io.Writer, res showResult) error {
	var b strings.Builder
	w := &b
	for _, d := range res.Damage {
		label := "DAMAGED"
		if d == res.Error {
			label = "CORRUPT"
		}
		fmt.Fprintf(w, "%s  %s\n", label, d)
	}
	if res.Live {
		fmt.Fprintf(w, "live     %s\n", liveLabel(res.Count, res.TornBytes))
	}
	fmt.Fprintf(w, "ledger   %s\n", res.Path)
	fmt.Fprintf(w, "run      %s (target ε = %g, δ = %g)\n", orDash(res.Run), res.TargetEpsilon, res.Delta)
	fmt.Fprintf(w, "noise    %s\n", noiseLabel(res.Noise))
	fmt.Fprintf(w, "sampler  %s\n", mechanismLabel(res.Mechanism))
	fmt.Fprintf(w, "history  %s\n", historyLabel(res.History))
	fmt.Fprintf(w, "budget   %s\n", admissionLabel(res.Admission))
	fmt.Fprintf(w, "records  %d, ε spent %.6g (%s accountant)\n", res.Count, res.Epsilon, orDash(res.Accountant))
	fmt.Fprintf(w, "head     %s\n", orDash(res.HeadHash))
	if res.TornBytes > 0 {
		fmt.Fprintf(w, "torn     %d bytes after the last complete record\n", res.TornBytes)
	}
	if len(res.Records) > 0 {
		fmt.Fprintln(w)
		printRecords(w, res.Records)
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// printRecords writes one aligned line per record.
func printRecords(w io.Writer, recs []ledger.Record) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tKIND\tSTEP\tQ\tσ\tTERM\tINDEX\tREPLAY\tε\tHASH")
	for _, r := range recs {
		if r.Kind == ledger.RecordEnd {
			fmt.Fprintf(tw, "%d\t%s\t%d\t-\t-\t%d\t%d\t-\t-\t%s  (%s)\n", r.Seq, r.Kind, r.Step, r.Term, r.Index, shortHash(r.Hash), r.Reason)
			continue
		}
		if r.Kind != ledger.RecordCharge {
			fmt.Fprintf(tw, "%d\t%s\t-\t-\t-\t-\t-\t-\t-\t%s\n", r.Seq, r.Kind, shortHash(r.Hash))
			continue
		}
		q, sigma := "-", "-"
		if r.Event != nil {
			q, sigma = eventParams(*r.Event)
		}
		replay := "-"
		if r.Replay {
			replay = "replay"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%d\t%d\t%s\t%.6g\t%s\n",
			r.Seq, r.Kind, r.Step, q, sigma, r.Term, r.Index, replay, r.Epsilon, shortHash(r.Hash))
	}
	tw.Flush() // cannot fail: w is a strings.Builder
}

// eventParams returns the sampling rate and noise multiplier of a
// (Poisson-subsampled) Gaussian or discrete Gaussian event, and the event
// kind in the σ column for any other event.
func eventParams(e accounting.Event) (q, sigma string) {
	gaussian := func(k accounting.Kind) bool {
		return k == accounting.KindGaussian || k == accounting.KindDiscreteGaussian
	}
	switch {
	case gaussian(e.Kind):
		return "1", strconv.FormatFloat(e.NoiseMultiplier, 'g', -1, 64)
	case e.Kind == accounting.KindPoissonSampled && e.Event != nil && gaussian(e.Event.Kind):
		return strconv.FormatFloat(e.SampleRate, 'g', -1, 64), strconv.FormatFloat(e.Event.NoiseMultiplier, 'g', -1, 64)
	}
	return "-", string(e.Kind)
}

func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newLedgerAuditCmd() *cobra.Command {
	var (
		asJSON      bool
		expectSteps int
		report      string
	)
	cmd := &cobra.Command{
		Use:   "audit DIR",
		Short: "Verify a ledger: CRCs, hash chain, recomputed ε, budget, step order, the Raft state",
		Long: `Verify a ledger without modifying anything: every record's CRC and the SHA-256
hash chain, one run record first, every recorded ε against the recomputation
by the accountant the run enforces (ε under the other one is reported too),
no ε past the target, strictly increasing Raft indexes, no step applied
twice, and no reuse across Raft histories (every charge from the run
record's history, Raft terms never decreasing).

A ledger must not state less than was spent. A torn tail (bytes after the
last complete record: the file was cut, or a crash interrupted an append)
fails. For a data directory, the audit also replays its Raft state (the
newest snapshot and every log entry after it) through a fresh state machine
in a temporary directory, and the ledger must hold every record the replay
writes, the same at each position: a ledger cut at a record boundary, or
without the end record its run wrote, fails, and the problem names what it
lacks and what may explain it. Without a Raft state (a ledger file, or a
directory with no Raft log) the ledger is audited alone, and says so.

A live run (a replica running on the data directory now, holding its Raft
log) is audited up to its last complete record: a torn tail is an append in
progress, and entries the replica has logged and not applied yet are not
missing records. The audit takes no lock and changes nothing.

Applied steps: a run that ended wrote an end record (why it ended, the last
step it applied), and the steps charged as applied up to it must be exactly
1…that step; a step charged after it (charged ahead of its noisy gradient,
never applied) is counted as charged and never applied, its ε counts like
every charge's. A stopped run without an end record (interrupted) takes the
last step applied from the Raft state's replay, the same way. A ledger read
alone without an end record cannot say whether its last step charged was
applied or charged ahead of its noisy gradient: it is counted as
unconfirmed, not applied, and --expect-steps fails on it.

With --report FILE it also draws ε over the steps against the target, with
the replays and the new Raft terms (a leader change or a restart: the ledger
records the term, not the leader) marked: FILE.html is a self-contained page
(inline SVG, the audit's figures and problems, no scripts), FILE.png the
chart alone. The format follows the extension (.html, .htm or .png; any
other is an error, checked before anything is read). The report is written
whether the audit passes or not.

The problems, when there are any, are printed first. Exits 0 exactly when
the audit passes; with --json the report is printed either way.`,
		Example: `  coordinator ledger audit /var/lib/dpcluster/coord-1
  coordinator ledger audit /var/lib/dpcluster/coord-1 --json --expect-steps 2343
  coordinator ledger audit /var/lib/dpcluster/coord-1 --report audit.html`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("expect-steps") && expectSteps < 0 {
				return fmt.Errorf("--expect-steps must be at least 0, not %d", expectSteps)
			}
			if report != "" {
				if _, err := ledgerreport.FormatOf(report); err != nil {
					return fmt.Errorf("--report: %w", err)
				}
			}
			rd, err := coordinator.ReadLedger(args[0])
			if err != nil {
				return err
			}
			path := rd.Path
			rep := rd.Audit()
			if cmd.Flags().Changed("expect-steps") {
				rep.ExpectSteps(expectSteps)
			}
			if report != "" {
				if err := writeAuditReport(report, path, rd.Records, rep); err != nil {
					return err
				}
			}
			if asJSON {
				err = writeJSON(cmd.OutOrStdout(), rep)
			} else {
				err = printAudit(cmd.OutOrStdout(), rep)
			}
			if err != nil {
				return err
			}
			if report != "" {
				// Where the report went: on stdout after the audit's text,
				// on stderr beside --json (whose stdout is one object).
				out := cmd.OutOrStdout()
				if asJSON {
					out = stderr(cmd)
				}
				abs, err := filepath.Abs(report)
				if err != nil {
					abs = report
				}
				fmt.Fprintf(out, "report   %s\n", abs)
			}
			if !rep.OK {
				return fmt.Errorf("%w: %s: %d problem(s)", errAuditFailed, path, len(rep.Problems))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the audit report as JSON")
	cmd.Flags().IntVar(&expectSteps, "expect-steps", 0, "also fail unless exactly this many steps were applied (see above)")
	cmd.Flags().StringVar(&report, "report", "", "also write a report drawing ε over steps to FILE (.html: page with inline SVG; .png: chart image)")
	return cmd
}

// writeAuditReport draws recs, the records of the ledger at path, whose
// audit is rep, into file. A ledger corrupt part-way is drawn up to the
// damage (the records that verified); one with no run record cannot be
// drawn.
func writeAuditReport(file, path string, recs []ledger.Record, rep ledger.AuditReport) error {
	tl, err := ledger.NewTimeline(recs)
	if err != nil {
		return fmt.Errorf("--report: cannot draw %s: %w", path, err)
	}
	return ledgerreport.WriteFile(file, tl, rep)
}

func printAudit(out io.Writer, rep ledger.AuditReport) error {
	var b strings.Builder
	w := &b
	verdict := "OK"
	if !rep.OK {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, "audit    %s: %s\n", verdict, rep.Path)
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "problem  %s\n", p)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "note     %s\n", n)
	}
	if rep.Live {
		fmt.Fprintf(w, "live     %s\n", liveLabel(rep.Records, rep.TornBytes))
	}
	fmt.Fprintf(w, "raft     %s\n", raftLabel(rep))
	fmt.Fprintf(w, "run      %s (target ε = %g, δ = %g)\n", orDash(rep.Run), rep.TargetEpsilon, rep.Delta)
	fmt.Fprintf(w, "noise    %s\n", noiseLabel(rep.Noise))
	fmt.Fprintf(w, "sampler  %s\n", mechanismLabel(rep.Mechanism))
	fmt.Fprintf(w, "history  %s\n", historyLabel(rep.History))
	fmt.Fprintf(w, "budget   %s\n", admissionLabel(rep.Admission))
	fmt.Fprintf(w, "records  %d: %d charges (%d replays, %d recharges, %d applied steps, %d charged and never applied, %d unconfirmed), last step charged %d\n",
		rep.Records, rep.Charges, rep.Replays, rep.Recharges, rep.Applied, rep.Unapplied, rep.Unconfirmed, rep.LastStep)
	switch {
	case rep.Ended:
		fmt.Fprintf(w, "ended    after step %d: %s\n", rep.EndStep, rep.EndReason)
	case rep.Live:
		fmt.Fprintf(w, "ended    - (no end record: the run runs)\n")
	case rep.Raft != nil && rep.Raft.Stopped != "":
		fmt.Fprintf(w, "ended    - (no end record, but the Raft state's run ended after step %d: %s)\n", rep.Raft.Applied, rep.Raft.Stopped)
	case rep.Raft != nil && rep.Raft.Unavailable == "" && rep.Raft.Failed == "":
		fmt.Fprintf(w, "ended    - (no end record: the run was interrupted after step %d, as the Raft state says)\n", rep.Raft.Applied)
	default:
		fmt.Fprintf(w, "ended    - (no end record: the run runs or was interrupted, or its ledger predates end records)\n")
	}
	if rep.Unconfirmed > 0 {
		fmt.Fprintf(w, "unsure   step %d, the last charged, is not counted as applied: without an end record, or a Raft state that agrees with the ledger, it cannot tell whether that step was applied or charged ahead of its noisy gradient and never applied\n", rep.LastStep)
	}
	printAuditEpsilon(w, rep)
	fmt.Fprintf(w, "head     %s\n", orDash(rep.HeadHash))
	fmt.Fprintf(w, "torn     %d bytes\n", rep.TornBytes)
	_, err := io.WriteString(out, b.String())
	return err
}

// liveLabel says what a live ledger of n records, with torn bytes after
// them, was read up to.
func liveLabel(n int, torn int64) string {
	s := fmt.Sprintf("a replica is running on this data dir: the ledger is read up to record %d, its last complete one", n)
	if torn > 0 {
		s += fmt.Sprintf("; the %d bytes after it are an append in progress", torn)
	}
	return s
}

// raftLabel says how the audit rep compared the ledger with the Raft
// state.
func raftLabel(rep ledger.AuditReport) string {
	r := rep.Raft
	switch {
	case r == nil:
		return "- (a ledger file, audited alone: give the replica's data dir to check it against its Raft state)"
	case r.Unavailable != "":
		return fmt.Sprintf("- (no Raft state to check the ledger against; audited alone: %s)", r.Unavailable)
	case r.Failed != "":
		return "replay failed (see the problems)"
	}
	s := fmt.Sprintf("%s, replayed: %d records, last step applied %d", r.Span(), r.Count, r.Applied)
	switch l := rep.Lacking; {
	case l != nil && rep.Live:
		return s + fmt.Sprintf("; the replica has yet to apply the entries of the last %d (%s)", l.Records, l)
	case l != nil:
		return s + fmt.Sprintf("; the ledger lacks the last %d", l.Records)
	case r.Count == rep.Records:
		return s + "; the ledger holds each of them"
	}
	return s
}

// printAuditEpsilon writes the audit's ε lines: ε spent, the one number
// every report of the run gives (the last charge record's, which the audit
// recomputed), and the other accountant's composition of the same
// charges for comparison, or, for a PLD run, the check that ε spent is
// the PLD ε of exactly these charges up to the count grid's rounding up.
func printAuditEpsilon(w io.Writer, rep ledger.AuditReport) {
	recomputed := "recomputed by the audit"
	switch {
	case math.IsInf(rep.RecomputedEpsilon, 1):
		recomputed = "which the audit could not recompute: its accountant failed (see the problems)"
	case rep.RecomputedEpsilon != rep.RecordedEpsilon:
		recomputed = fmt.Sprintf("the audit recomputes %.12g", rep.RecomputedEpsilon)
	}
	fmt.Fprintf(w, "ε spent  %.12g (%s accountant, enforced; target %g at δ = %g): the last charge's record, %s\n",
		rep.RecordedEpsilon, rep.Accountant, rep.TargetEpsilon, rep.Delta, recomputed)
	if rep.Accountant == ledger.AccountantPLD {
		if rep.PLDEpsilon != nil {
			fmt.Fprintf(w, "check    the pld accountant's ε of exactly these %d charges is %.12g; ε spent, on the ledger's count grid, is %.6g × that (at most %v)\n",
				rep.Charges, *rep.PLDEpsilon, rep.RecordedEpsilon / *rep.PLDEpsilon, ledger.PLDGridRatio)
		}
		fmt.Fprintf(w, "ε rdp    %.12g (the rdp accountant on the same charges, for comparison; not enforced)\n", rep.RDPEpsilon)
		return
	}
	if rep.PLDEpsilon != nil {
		fmt.Fprintf(w, "ε pld    %.12g (the pld accountant on the same charges, for comparison; not enforced)\n", *rep.PLDEpsilon)
	} else {
		fmt.Fprintf(w, "ε pld    - (%s)\n", rep.PLDNote)
	}
}

// mechanismLabel describes a run record's noise mechanism.
func mechanismLabel(m string) string {
	switch m {
	case ledger.MechanismDiscrete:
		return "discrete (exact discrete Gaussian on a grid)"
	case ledger.MechanismFloat:
		return "float (floating-point Gaussian: not protected against floating-point attacks)"
	case "":
		return "float (not recorded: the run predates the field; not protected against floating-point attacks)"
	}
	return m
}

// admissionLabel describes a run record's dataset budget admission.
func admissionLabel(a *ledger.Admission) string {
	if a == nil {
		return "- (admitted to no dataset budget)"
	}
	return fmt.Sprintf("admission %s to the lifetime budget %s of dataset %s (ε = %g at δ = %g), file %s",
		a.ID, shortHash(a.Budget), shortHash(a.Dataset), a.Epsilon, a.Delta, a.File)
}

// historyLabel describes a run record's Raft history ID.
func historyLabel(h string) string {
	if h == "" {
		return "- (not recorded: ledger written before history IDs)"
	}
	return h
}

// noiseLabel describes a run record's noise source.
func noiseLabel(noise seed.Policy) string {
	switch noise {
	case seed.Crypto:
		return "crypto (CSPRNG)"
	case seed.Seeded:
		return "SEEDED: reproducible, NOT differentially private"
	case "":
		return "- (not recorded)"
	}
	return string(noise)
}
