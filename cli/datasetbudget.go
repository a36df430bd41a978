package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/ledger"
)

// datasetAdmission is a run admitted to its training set's lifetime
// budget (ledger.DatasetBudget): settle records, when the run stops, the
// charges its ledger made.
type datasetAdmission struct {
	budget     *ledger.DatasetBudget
	run        string
	ledgerPath string
}

// admitToDataset admits the run rc, whose ledger is in dataDir, to the
// lifetime budget of train kept in dir (the file named by train's content
// hash), creating that budget with lifetime ε = lifetime and the run's δ
// if the dataset has none yet and lifetime is set. The run reserves its
// step limit (accounting.PLD.StepLimit): all its ledger can ever charge. A plan
// the budget cannot take is an error naming the dataset, its budget and
// the steps left (ledger.ErrDatasetBudget), before anything is released.
func admitToDataset(dir string, lifetime float64, train *dataset.Dataset, label string, rc coordinator.RunConfig, dataDir string, log *slog.Logger) (*datasetAdmission, error) {
	if rc.AccountantName() != coordinator.AccountantPLD {
		return nil, fmt.Errorf("--budget-dir: a dataset's budget composes its runs with the PLD accountant; this run uses %s (use --accountant pld)", rc.AccountantName())
	}
	hash := train.ContentHash()
	path := ledger.DatasetBudgetFile(dir, hash)
	_, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) && lifetime > 0:
		if path, err = ledger.CreateDatasetBudget(dir, hash, label, lifetime, rc.Delta); err != nil {
			return nil, err
		}
		log.Info("dataset budget created", "dataset", hash, "label", label, "lifetime_epsilon", lifetime, "delta", rc.Delta, "file", path)
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("--budget-dir: dataset %s (sha256 %s) has no budget in %s: set its lifetime ε once with --dataset-epsilon", label, hash, dir)
	case err != nil:
		return nil, err
	}
	b, err := ledger.OpenDatasetBudget(path)
	if err != nil {
		return nil, err
	}
	if set := b.Budget().TargetEpsilon; lifetime > 0 && lifetime != set {
		b.Close()
		return nil, fmt.Errorf("--dataset-epsilon %g: dataset %s (sha256 %s) already has a lifetime budget of ε = %g (%s); it is set once", lifetime, label, hash[:12], set, path)
	}
	limit, err := accounting.PLD{}.StepLimit(rc.Event(), rc.TargetEpsilon, rc.Delta, rc.MaxSteps)
	if err != nil {
		b.Close()
		return nil, err
	}
	ledgerPath, err := filepath.Abs(filepath.Join(dataDir, coordinator.LedgerFile))
	if err != nil {
		b.Close()
		return nil, err
	}
	if _, err := b.Admit(rc.Run, ledgerPath, rc.Event(), limit); err != nil {
		b.Close()
		return nil, err
	}
	log.Info("run admitted to its dataset's budget", "dataset", hash[:12], "lifetime_epsilon", b.Budget().TargetEpsilon,
		"reserved_steps", limit, "dataset_epsilon_with_this_run", b.Spent(), "file", path)
	return &datasetAdmission{budget: b, run: rc.Run, ledgerPath: ledgerPath}, nil
}

// settle records the charges the run's ledger holds now, and closes the
// budget. A ledger that cannot be read leaves the run admitted: it keeps
// counting for its whole reservation.
func (a *datasetAdmission) settle(log *slog.Logger) {
	defer a.budget.Close()
	recs, _, err := ledger.ReadFile(a.ledgerPath)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		log.Warn("dataset budget: the run's ledger cannot be read; the run keeps its whole reservation", "err", err)
		return
	}
	var charges int64
	head := ""
	for _, r := range recs {
		if r.Kind == ledger.RecordCharge {
			charges++
		}
		head = r.Hash
	}
	if _, err := a.budget.Settle(a.run, a.ledgerPath, charges, head); err != nil {
		log.Warn("dataset budget: settling the run failed; it keeps its whole reservation", "err", err)
		return
	}
	log.Info("dataset budget settled", "charges", charges, "dataset_epsilon", a.budget.Spent(), "file", a.budget.Path())
}

// datasetLabel is what a dataset budget created for the spec's training
// set is labelled: the dataset and where it was read from.
func (s *runSpec) datasetLabel() string {
	if s.Data != "" {
		return s.Dataset + " training set from " + s.Data
	}
	return s.Dataset + " training set"
}

func newLedgerBudgetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "budget",
		Short: "Inspect and audit a dataset's lifetime privacy budget (read-only)",
		Long: `A dataset budget (local --budget-dir DIR) is the privacy odometer of one training set:
DIR/<sha256 of its content>.budget holds its lifetime (ε, δ) and every run admitted to it,
composed by the PLD accountant. FILE is a .budget file, or DIR with --dataset SHA256.`,
	}
	var dsHash string
	var asJSON bool
	// report audits the budget FILE (or DIR with --dataset) names and
	// prints the result; with failOnProblem a failed audit is an error.
	report := func(cmd *cobra.Command, arg string, failOnProblem bool) error {
		path := arg
		if fi, err := os.Stat(arg); err != nil {
			return err
		} else if fi.IsDir() {
			if dsHash == "" {
				return fmt.Errorf("%s is a directory: name the dataset with --dataset SHA256", arg)
			}
			path = ledger.DatasetBudgetFile(arg, dsHash)
		}
		rep, err := ledger.AuditDatasetBudget(path)
		if err != nil {
			return err
		}
		if asJSON {
			err = writeJSON(cmd.OutOrStdout(), rep)
		} else {
			err = printDatasetAudit(cmd.OutOrStdout(), rep)
		}
		if err == nil && failOnProblem && !rep.OK {
			err = fmt.Errorf("%w: %s: %d problem(s)", errAuditFailed, path, len(rep.Problems))
		}
		return err
	}
	audit := &cobra.Command{
		Use:   "audit FILE",
		Short: "Verify a dataset budget: CRCs, hash chain, every run's admission and settling, recomputed ε",
		Args:  cobra.ExactArgs(1),
		RunE:  func(cmd *cobra.Command, args []string) error { return report(cmd, args[0], true) },
	}
	show := &cobra.Command{
		Use:   "show FILE",
		Short: "Print a dataset budget: its lifetime (ε, δ), ε spent and every run (what audit prints, without failing on a problem)",
		Args:  cobra.ExactArgs(1),
		RunE:  func(cmd *cobra.Command, args []string) error { return report(cmd, args[0], false) },
	}
	for _, c := range []*cobra.Command{audit, show} {
		c.Flags().StringVar(&dsHash, "dataset", "", "the dataset's content hash, when FILE is a budget directory")
		c.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	}
	cmd.AddCommand(show, audit)
	return cmd
}

// printDatasetAudit writes a dataset budget's audit for a human.
func printDatasetAudit(out io.Writer, rep ledger.DatasetAudit) error {
	var b strings.Builder
	verdict := "OK"
	if !rep.OK {
		verdict = "FAILED"
	}
	fmt.Fprintf(&b, "audit    %s: %s\n", verdict, rep.Path)
	fmt.Fprintf(&b, "dataset  %s (%s)\n", orDash(rep.Dataset), orDash(rep.Label))
	fmt.Fprintf(&b, "budget   lifetime ε = %g at δ = %g (pld accountant)\n", rep.LifetimeEpsilon, rep.Delta)
	fmt.Fprintf(&b, "ε spent  %.12g: the last record's, recomputed %.12g (every run's counted charges, composed)\n", rep.RecordedEpsilon, rep.RecomputedEpsilon)
	fmt.Fprintf(&b, "records  %d, %d runs\n", rep.Records, len(rep.Runs))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tLEDGER\tQ\tσ\tRESERVED\tCHARGES\tCOUNTS FOR")
	for _, r := range rep.Runs {
		q, sigma := eventParams(r.Event)
		counts := fmt.Sprintf("%d (settled)", r.Charges)
		if r.Open {
			counts = fmt.Sprintf("%d (admitted, not settled: its whole reservation)", r.Reserved)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", r.Run, r.Ledger, q, sigma, r.Reserved, r.Charges, counts)
	}
	tw.Flush()
	fmt.Fprintf(&b, "head     %s\n", orDash(rep.HeadHash))
	for _, p := range rep.Problems {
		fmt.Fprintf(&b, "problem  %s\n", p)
	}
	_, err := io.WriteString(out, b.String())
	return err
}
