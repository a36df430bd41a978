package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

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
	admission  ledger.Admission
	ledgerPath string
}

// budgetOptions are the dataset budget flags of a command that trains.
type budgetOptions struct {
	// dir holds the data owner's dataset budgets; lifetime sets the
	// training set's lifetime ε there when it has none yet; forceNew
	// creates one even where run ledgers show the dataset has (or had)
	// another.
	dir      string
	lifetime float64
	forceNew bool
}

// bind registers the flags on fs.
func (o *budgetOptions) bind(fs *pflag.FlagSet) {
	fs.StringVar(&o.dir, "budget-dir", "", "directory of dataset budgets: the run is admitted against its training set's lifetime (ε, δ), composed with every earlier run on that data, before its first release (docs/PRIVACY.md)")
	fs.Float64Var(&o.lifetime, "dataset-epsilon", 0, "with --budget-dir: the training set's lifetime ε at the run's δ, set once when the set has no budget yet")
	fs.BoolVar(&o.forceNew, "force-new-dataset-budget", false, "with --dataset-epsilon: create the budget even though run ledgers show this dataset was admitted to another budget, whose runs the new one will NOT count")
}

// check refuses flags that mean nothing without --budget-dir.
func (o budgetOptions) check() error {
	if o.dir == "" && (o.lifetime != 0 || o.forceNew) {
		return errors.New("--dataset-epsilon and --force-new-dataset-budget need --budget-dir")
	}
	return nil
}

// admitToDataset admits the run rc, whose ledger is in dataDir, to the
// lifetime budget of train kept in o.dir (the file named by train's content
// hash), creating that budget with lifetime ε = o.lifetime and the run's δ
// if the dataset has none yet, and sets rc.Admission to the admission, which
// the run's ledger will state. The run reserves its step limit
// (accounting.PLD.StepLimit): all its ledger can ever charge. A plan the
// budget cannot take is an error naming the dataset, its budget and the
// steps left (ledger.ErrDatasetBudget); a resumed run's ledger that is not
// its admission's is ledger.ErrAdmission; both before anything is
// released.
//
// A budget is created only where nothing says the dataset has one: not
// when the run's own ledger names a budget, nor when a ledger in a
// directory beside dataDir names a budget of this dataset (its file lost,
// or kept in another --budget-dir), unless o.forceNew says to, with a
// warning of what it means.
func admitToDataset(o budgetOptions, train *dataset.Dataset, label string, rc *coordinator.RunConfig, dataDir string, log *slog.Logger) (*datasetAdmission, error) {
	if rc.AccountantName() != coordinator.AccountantPLD {
		return nil, fmt.Errorf("--budget-dir: a dataset's budget composes its runs with the PLD accountant; this run uses %s (use --accountant pld)", rc.AccountantName())
	}
	hash := train.ContentHash()
	ledgerPath, err := filepath.Abs(filepath.Join(dataDir, coordinator.LedgerFile))
	if err != nil {
		return nil, err
	}
	rl, err := ledger.ReadRunLedger(ledgerPath)
	if err != nil {
		return nil, err
	}
	path := ledger.DatasetBudgetFile(o.dir, hash)
	_, err = os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := checkNoOtherBudget(o, hash, rl, dataDir, log); err != nil {
			return nil, err
		}
		if o.lifetime <= 0 {
			return nil, fmt.Errorf("--budget-dir: dataset %s (sha256 %s) has no budget in %s: set its lifetime ε once with --dataset-epsilon", label, hash, o.dir)
		}
		if path, err = ledger.CreateDatasetBudget(o.dir, hash, label, o.lifetime, rc.Delta); err != nil {
			return nil, err
		}
		log.Info("dataset budget created", "dataset", hash, "label", label, "lifetime_epsilon", o.lifetime, "delta", rc.Delta, "file", path)
	case err != nil:
		return nil, err
	}
	b, err := ledger.OpenDatasetBudget(path)
	if err != nil {
		return nil, err
	}
	if set := b.Budget().TargetEpsilon; o.lifetime > 0 && o.lifetime != set {
		b.Close()
		return nil, fmt.Errorf("--dataset-epsilon %g: dataset %s (sha256 %s) already has a lifetime budget of ε = %g (%s); it is set once", o.lifetime, label, hash[:12], set, path)
	}
	limit, err := accounting.PLD{}.StepLimit(rc.Event(), rc.TargetEpsilon, rc.Delta, rc.MaxSteps)
	if err != nil {
		b.Close()
		return nil, err
	}
	adm, err := b.Admit(rc.Run, rl, rc.Event(), limit)
	if err != nil {
		b.Close()
		return nil, err
	}
	rc.Admission = &adm
	log.Info("run admitted to its dataset's budget", "dataset", hash[:12], "lifetime_epsilon", b.Budget().TargetEpsilon,
		"admission", adm.ID, "reserved_steps", limit, "dataset_epsilon_with_this_run", b.Spent(), "file", path)
	return &datasetAdmission{budget: b, admission: adm, ledgerPath: ledgerPath}, nil
}

// checkNoOtherBudget returns an error, unless o.forceNew, when something
// says dataset (a content hash with no budget file in o.dir) has a budget
// already: the run's own ledger rl names one (it was admitted, and its
// budget's file is gone or elsewhere), or a ledger beside dataDir (the run
// ledgers of the directory that holds dataDir) names one of this dataset.
// With o.forceNew it logs a warning instead.
func checkNoOtherBudget(o budgetOptions, dataset string, rl ledger.RunLedger, dataDir string, log *slog.Logger) error {
	if rl.Run != nil {
		if a, ok := rl.Run.DatasetAdmission(); ok {
			// Not forceable: the run must resume under its own budget.
			return fmt.Errorf("%w: the run in %s was admitted to budget %s of dataset %s (lifetime ε = %g) kept in %s, and %s has no budget of this dataset: resume it with the --budget-dir that holds that file, or rebuild the budget from its runs' ledgers (coordinator ledger budget rebuild)",
				ledger.ErrAdmission, dataDir, shortHash(a.Budget), shortHash(a.Dataset), a.Epsilon, a.File, o.dir)
		}
	}
	runs := budgetEvidence(dataset, filepath.Dir(filepath.Clean(dataDir)))
	if len(runs) == 0 {
		return nil
	}
	a, _ := runs[0].Run.DatasetAdmission()
	where := "its file is gone: rebuild it from its runs' ledgers (coordinator ledger budget rebuild)"
	if _, err := os.Stat(a.File); err == nil {
		where = "its file is " + a.File + ": use --budget-dir " + filepath.Dir(a.File)
	}
	var paths []string
	for _, r := range runs {
		paths = append(paths, r.Path)
	}
	if o.forceNew {
		log.Warn("creating a NEW lifetime budget for a dataset that run ledgers show was admitted to another budget: the runs that budget counted are NOT counted by the new one, so the new lifetime ε does not bound what this data has spent; add theirs yourself",
			"dataset", dataset, "other_budget", a.Budget, "other_lifetime_epsilon", a.Epsilon, "other_budget_file", a.File, "ledgers", paths)
		return nil
	}
	return fmt.Errorf("%w: dataset %s has no budget in %s, but %d run ledger(s) beside %s (%s) were admitted to its budget %s (lifetime ε = %g): %s. Creating a new budget would not count what those runs spent; to do so anyway, add --force-new-dataset-budget",
		ledger.ErrAdmission, shortHash(dataset), o.dir, len(runs), dataDir, strings.Join(paths, ", "), shortHash(a.Budget), a.Epsilon, where)
}

// budgetEvidence returns the run ledgers in root and in the directories
// directly inside it whose run records name an admission to a budget of
// dataset. It reads only each ledger's first record; unreadable ones are
// skipped.
func budgetEvidence(dataset, root string) []ledger.RunLedger {
	var out []ledger.RunLedger
	for _, p := range runLedgerFiles(root, 1) {
		r, ok, err := ledger.ReadRunRecord(p)
		if err != nil || !ok {
			continue
		}
		if a, ok := r.DatasetAdmission(); ok && a.Dataset == dataset {
			out = append(out, ledger.RunLedger{Path: p, Run: &r})
		}
	}
	return out
}

// runLedgerFiles returns the paths of the files named
// coordinator.LedgerFile in root and in the directories below it, at
// most depth levels down (depth < 0: any), sorted. Only the directories
// above the deepest level are listed (the deepest are only asked for
// their ledger), and those that cannot be read are skipped.
func runLedgerFiles(root string, depth int) []string {
	var out []string
	var walk func(dir string, left int)
	walk = func(dir string, left int) {
		p := filepath.Join(dir, coordinator.LedgerFile)
		if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
			out = append(out, p)
		}
		if left == 0 {
			return
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range ents {
			if e.IsDir() {
				walk(filepath.Join(dir, e.Name()), left-1)
			}
		}
	}
	walk(root, depth)
	sort.Strings(out)
	return out
}

// settle records what the run's ledger holds now, and closes the budget.
// A run whose replica never applied its configuration (configured false)
// and whose ledger holds no run record never started: its admission is
// withdrawn. Otherwise a ledger that cannot be read, or holds no run
// record of this admission, leaves the run admitted: it keeps counting for
// its whole reservation.
func (a *datasetAdmission) settle(configured bool, log *slog.Logger) {
	defer a.budget.Close()
	rl, err := ledger.ReadRunLedger(a.ledgerPath)
	if err != nil {
		log.Warn("dataset budget: the run's ledger cannot be read; the run keeps its whole reservation", "err", err)
		return
	}
	if rl.Run == nil && !configured {
		if _, err := a.budget.Withdraw(a.admission.ID, rl); err != nil {
			log.Warn("dataset budget: withdrawing the admission of a run that never started failed; it keeps its whole reservation", "err", err)
			return
		}
		log.Info("dataset budget: the run never started; its admission is withdrawn", "admission", a.admission.ID, "dataset_epsilon", a.budget.Spent())
		return
	}
	if _, err := a.budget.Settle(a.admission.ID, rl); err != nil {
		log.Warn("dataset budget: settling the run failed; it keeps its whole reservation", "err", err)
		return
	}
	log.Info("dataset budget settled", "charges", rl.Charges, "dataset_epsilon", a.budget.Spent(), "file", a.budget.Path())
}

// checkResumeAdmission refuses to resume, without a dataset budget, a run
// whose ledger in dataDir says it was admitted to one: its charges would
// go unsettled, and its configuration carries the admission.
func checkResumeAdmission(o budgetOptions, dataDir string) error {
	if o.dir != "" {
		return nil
	}
	r, ok, err := ledger.ReadRunRecord(filepath.Join(dataDir, coordinator.LedgerFile))
	if err != nil || !ok {
		return nil // a damaged ledger is the replica's to refuse
	}
	if a, ok := r.DatasetAdmission(); ok {
		return fmt.Errorf("the run %q in %s was admitted to the lifetime budget of dataset %s (file %s): resume it with --budget-dir %s",
			r.Run, dataDir, shortHash(a.Dataset), a.File, filepath.Dir(a.File))
	}
	return nil
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
		Short: "Inspect, audit and rebuild a dataset's lifetime privacy budget",
		Long: `A dataset budget (local --budget-dir DIR) is the privacy odometer of one training set:
DIR/<sha256 of its content>.budget holds its lifetime (ε, δ) and every run admitted to it,
composed by the PLD accountant. FILE is a .budget file, or DIR with --dataset SHA256.
Every run's ledger also states the budget that admitted it, so with --ledgers the audit checks
the budget against the run ledgers it finds, and rebuild makes a lost budget again from them.`,
	}
	var (
		dsHash  string
		asJSON  bool
		ledgers []string
	)
	// report audits the budget FILE (or DIR with --dataset) names, checks
	// it against the run ledgers under --ledgers, and prints the result;
	// with failOnProblem a failed audit is an error.
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
		if len(ledgers) > 0 && rep.Dataset != "" {
			rls, err := readRunLedgers(ledgers)
			if err != nil {
				return err
			}
			n := ledger.CheckRuns(&rep, rls)
			fmt.Fprintf(stderr(cmd), "checked against %d run ledger(s) of this dataset under %s\n", n, strings.Join(ledgers, ", "))
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
		Short: "Verify a dataset budget: CRCs, hash chain, every run's admission and settling, recomputed ε; with --ledgers, that it counts every run ledger of its dataset",
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
		c.Flags().StringSliceVar(&ledgers, "ledgers", nil, "directories to search (all the way down) for run ledgers ("+coordinator.LedgerFile+") to check the budget against: a run of its dataset it does not count in full is a problem")
	}
	cmd.AddCommand(show, audit, newLedgerBudgetRebuildCmd())
	return cmd
}

// readRunLedgers reads every run ledger under dirs (runLedgerFiles, all
// the way down).
func readRunLedgers(dirs []string) ([]ledger.RunLedger, error) {
	var out []ledger.RunLedger
	for _, d := range dirs {
		if _, err := os.Stat(d); err != nil {
			return nil, err
		}
		for _, p := range runLedgerFiles(d, -1) {
			rl, err := ledger.ReadRunLedger(p)
			if err != nil {
				return nil, fmt.Errorf("run ledger %s: %w", p, err)
			}
			out = append(out, rl)
		}
	}
	return out, nil
}

func newLedgerBudgetRebuildCmd() *cobra.Command {
	var dir, dsHash string
	cmd := &cobra.Command{
		Use:   "rebuild --budget-dir DIR [--dataset SHA256] LEDGER_DIR...",
		Short: "Write a lost dataset budget again from the ledgers of the runs it admitted",
		Long: `rebuild searches LEDGER_DIR... (all the way down) for run ledgers whose run records state an
admission to a budget of one dataset (--dataset, when they hold several), and writes that
budget's file into --budget-dir under its old identity, so its runs resume under it: each run
admitted and, if its ledger ended, settled at the charges it holds; a run that has not ended
counts for its whole step limit. It counts only the runs whose ledgers it finds: give it every
directory that holds one. It refuses to replace an existing budget file.`,
		Example: `  coordinator ledger budget rebuild --budget-dir /srv/budgets dpcluster-data/`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				return errors.New("--budget-dir: where to write the budget")
			}
			rls, err := readRunLedgers(args)
			if err != nil {
				return err
			}
			groups := map[string][]ledger.RunLedger{}
			var keys []string
			for _, rl := range rls {
				if rl.Run == nil {
					continue
				}
				a, ok := rl.Run.DatasetAdmission()
				if !ok || dsHash != "" && a.Dataset != dsHash {
					continue
				}
				k := a.Dataset + " budget " + a.Budget
				if _, seen := groups[k]; !seen {
					keys = append(keys, k)
				}
				groups[k] = append(groups[k], rl)
			}
			switch {
			case len(keys) == 0 && dsHash != "":
				return fmt.Errorf("no run ledger under %s states an admission to a budget of dataset %s", strings.Join(args, ", "), dsHash)
			case len(keys) == 0:
				return fmt.Errorf("no run ledger under %s states an admission to a dataset budget", strings.Join(args, ", "))
			case len(keys) > 1:
				return fmt.Errorf("the run ledgers under %s were admitted to %d budgets (dataset budget: %s): name one dataset with --dataset, or search fewer directories",
					strings.Join(args, ", "), len(keys), strings.Join(keys, "; "))
			}
			path, err := ledger.RebuildDatasetBudget(dir, groups[keys[0]])
			if err != nil {
				return err
			}
			rep, err := ledger.AuditDatasetBudget(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "rebuilt %s from %d run ledger(s)\n", path, len(groups[keys[0]]))
			return printDatasetAudit(cmd.OutOrStdout(), rep)
		},
	}
	cmd.Flags().StringVar(&dir, "budget-dir", "", "directory to write the budget file into")
	cmd.Flags().StringVar(&dsHash, "dataset", "", "the dataset's content hash, when the ledgers hold runs of several")
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
	fmt.Fprintf(&b, "budget   lifetime ε = %g at δ = %g (pld accountant), id %s\n", rep.LifetimeEpsilon, rep.Delta, orDash(rep.BudgetID))
	fmt.Fprintf(&b, "ε spent  %.12g: the last record's, recomputed %.12g (every run's counted charges, composed)\n", rep.RecordedEpsilon, rep.RecomputedEpsilon)
	fmt.Fprintf(&b, "records  %d, %d runs\n", rep.Records, len(rep.Runs))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tADMISSION\tLEDGER\tQ\tσ\tRESERVED\tCHARGES\tCOUNTS FOR")
	for _, r := range rep.Runs {
		q, sigma := eventParams(r.Event)
		counts := fmt.Sprintf("%d (settled)", r.Charges)
		if r.Open {
			counts = fmt.Sprintf("%d (admitted, not settled: its whole reservation)", r.Reserved)
		}
		if !r.Open && r.Head == "" && r.Admission != "" {
			counts = "0 (withdrawn: the run never started)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", r.Run, orDash(shortHash(r.Admission)), r.Ledger, q, sigma, r.Reserved, r.Charges, counts)
	}
	tw.Flush()
	fmt.Fprintf(&b, "head     %s\n", orDash(rep.HeadHash))
	for _, p := range rep.Problems {
		fmt.Fprintf(&b, "problem  %s\n", p)
	}
	_, err := io.WriteString(out, b.String())
	return err
}
