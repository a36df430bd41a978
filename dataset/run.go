package dataset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// Names of the datasets a run can train on (RunOptions.Dataset, a run
// file's dataset key).
const (
	NameFashionMNIST = "fashion-mnist"
	NameGaussian     = "gaussian"
	NameCSV          = "csv"
)

// The synthetic "gaussian" dataset: a fixed draw, so every process of a run
// generates the same rows.
const (
	gaussianExamples   = 12000
	gaussianSeparation = 3
	gaussianDataSeed   = 1
	gaussianTestShare  = 1.0 / 6 // 10000 training rows, 2000 test rows
	csvSplitSeed       = 1       // the rows EvalHoldout holds out
)

// ErrRunOptions is returned (wrapped, naming the option by its run-file
// key) by RunOptions.Validate and LoadRun for options that do not describe
// a run's data.
var ErrRunOptions = errors.New("dataset: invalid run data options")

// Shaper is what LoadRun needs of the run's model: its input shape and
// number of classes, to shape the gaussian data and a CSV's labels, and a
// check that a dataset fits it. *model.Model implements it.
type Shaper interface {
	InputShape() []int
	InputSize() int
	Classes() int
	CheckDataset(d *Dataset) error
}

// RunOptions selects a run's data. The coordinator and every node of a
// run must use the same options, so that the nodes' shards partition the
// training set the coordinator counts as N.
type RunOptions struct {
	// Dataset is NameFashionMNIST, NameGaussian or NameCSV.
	Dataset string
	// Dir is searched first for the Fashion-MNIST files (LoadOptions.Dir;
	// then $DPCLUSTER_DATA, the user cache, the Debian package's
	// directory).
	Dir string
	// Path is the CSV training file: no header, the label in the first
	// column (ReadCSV). Its rows are private training data: all of them are
	// the training set unless EvalHoldout is set.
	Path string
	// EvalPath is, for NameCSV, a separate CSV file of public evaluation
	// data (same format). It must not be the training file. Without it
	// (and without EvalHoldout) a CSV run evaluates nothing.
	EvalPath string
	// EvalHoldout, if not 0, is for NameCSV the fraction in (0, 1) of
	// Path's rows (chosen with a fixed seed) held out of the training set
	// as evaluation data. Those rows are private: evaluations on them are
	// NOT differentially private (EvalSet.Holdout).
	EvalHoldout float64
	// Model, if not nil, shapes the gaussian data (its input shape and
	// classes; 12000 rows of which 2000 are the evaluation split, a fixed
	// draw), sets the CSV's number of classes, and is checked against the
	// data. LoadRun requires it for NameGaussian.
	Model Shaper
	// Log receives progress messages (nil: discard).
	Log *slog.Logger
}

// EvalSet is a run's evaluation data and where it comes from.
type EvalSet struct {
	// Data is nil when the run evaluates nothing.
	Data *Dataset
	// Holdout says Data is rows held out of the private training data
	// (RunOptions.EvalHoldout): evaluations on it are NOT differentially
	// private. Otherwise Data is public (Fashion-MNIST's t10k files, public
	// synthetic data, or a separate CSV file).
	Holdout bool
}

// Validate checks the options without touching the data.
func (o RunOptions) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrRunOptions, fmt.Sprintf(format, args...))
	}
	switch o.Dataset {
	case NameFashionMNIST:
		if o.Path != "" {
			return bad("data_path is for dataset csv; Fashion-MNIST is found in the data directory")
		}
	case NameGaussian:
		if o.Path != "" || o.Dir != "" {
			return bad("dataset gaussian is generated: it takes neither data nor data_path")
		}
	case NameCSV:
		if o.Path == "" {
			return bad("dataset csv needs data_path FILE")
		}
		if o.Dir != "" {
			return bad("data is the Fashion-MNIST directory; give data_path FILE for csv")
		}
		if o.EvalPath != "" && o.EvalHoldout != 0 {
			return bad("give eval_path (public evaluation data) or eval_split_from_train (NON-PRIVATE), not both")
		}
		if o.EvalHoldout != 0 && !(o.EvalHoldout > 0 && o.EvalHoldout < 1) {
			return bad("eval_split_from_train %v must be a fraction in (0, 1)", o.EvalHoldout)
		}
	default:
		return bad("dataset must be %s, %s or %s, not %q", NameFashionMNIST, NameGaussian, NameCSV, o.Dataset)
	}
	if o.Dataset != NameCSV && (o.EvalPath != "" || o.EvalHoldout != 0) {
		return bad("eval_path and eval_split_from_train are for dataset csv: %s evaluates on its own public test split", o.Dataset)
	}
	return nil
}

// LoadRun loads the training set o names and its evaluation set. It is the
// one place that decides which rows are trained on and which are evaluated
// on, for the coordinator and for every node:
//
//   - fashion-mnist: the 60000 training images; evaluation on the separate
//     public t10k files.
//   - gaussian: a fixed public synthetic draw, split 10000/2000; the
//     evaluation split is public synthetic data.
//   - csv: every row of o.Path is training data. Evaluation is on the
//     separate file o.EvalPath (public), or, only with o.EvalHoldout, on
//     rows held out of o.Path (EvalSet.Holdout, NON-PRIVATE); with
//     neither, nothing is evaluated.
//
// With o.Model set, both sets are checked against the model.
func LoadRun(ctx context.Context, o RunOptions) (train *Dataset, eval EvalSet, err error) {
	if err := o.Validate(); err != nil {
		return nil, EvalSet{}, err
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.Dataset == NameGaussian && o.Model == nil {
		return nil, EvalSet{}, fmt.Errorf("%w: the gaussian dataset needs a model to shape it", ErrRunOptions)
	}
	switch o.Dataset {
	case NameFashionMNIST:
		lo := DefaultLoadOptions()
		lo.Dir = o.Dir
		lo.Logger = log
		train, eval.Data, err = LoadFashionMNIST(ctx, lo)
	case NameGaussian:
		var all *Dataset
		all, err = GaussianMixture(gaussianExamples, o.Model.InputSize(), o.Model.Classes(), gaussianSeparation, gaussianDataSeed)
		if err == nil {
			all.Shape = o.Model.InputShape()
			train, eval.Data, err = Split(all, gaussianTestShare, gaussianDataSeed)
		}
	case NameCSV:
		train, eval, err = loadRunCSV(o)
	}
	if err != nil {
		return nil, EvalSet{}, err
	}
	if o.Model != nil {
		if err := o.Model.CheckDataset(train); err != nil {
			return nil, EvalSet{}, fmt.Errorf("the %s data does not fit the model: %w", o.Dataset, err)
		}
		if eval.Data != nil {
			if err := o.Model.CheckDataset(eval.Data); err != nil {
				what := "the " + o.Dataset + " evaluation data"
				if o.EvalPath != "" {
					what = "eval_path " + o.EvalPath
				}
				return nil, EvalSet{}, fmt.Errorf("%s does not fit the model: %w", what, err)
			}
		}
	}
	return train, eval, nil
}

// loadRunCSV reads the training file and the evaluation data of a CSV run
// (see LoadRun).
func loadRunCSV(o RunOptions) (train *Dataset, eval EvalSet, err error) {
	if train, err = readCSVFile(o.Path, o.Model); err != nil {
		return nil, EvalSet{}, err
	}
	switch {
	case o.EvalHoldout != 0:
		eval.Holdout = true
		if train, eval.Data, err = Split(train, o.EvalHoldout, csvSplitSeed); err != nil {
			return nil, EvalSet{}, fmt.Errorf("eval_split_from_train %v of %s: %w", o.EvalHoldout, o.Path, err)
		}
	case o.EvalPath != "":
		if same, err := sameFile(o.Path, o.EvalPath); err != nil {
			return nil, EvalSet{}, fmt.Errorf("eval_path: %w", err)
		} else if same {
			return nil, EvalSet{}, fmt.Errorf("%w: eval_path %s is the training file %s: evaluation data must be separate, public data", ErrRunOptions, o.EvalPath, o.Path)
		}
		if eval.Data, err = readCSVFile(o.EvalPath, o.Model); err != nil {
			return nil, EvalSet{}, fmt.Errorf("eval_path: %w", err)
		}
	}
	return train, eval, nil
}

// readCSVFile reads a CSV file in the run's csv format, with the model's
// number of classes when m is set.
func readCSVFile(path string, m Shaper) (*Dataset, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	co := DefaultCSVOptions()
	co.Name = strings.TrimSuffix(filepath.Base(path), ".csv")
	if m != nil {
		co.Classes = m.Classes()
	}
	d, err := ReadCSV(f, co)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// sameFile reports whether paths a and b name the same file (through links
// too).
func sameFile(a, b string) (bool, error) {
	sa, err := os.Stat(a)
	if err != nil {
		return false, err
	}
	sb, err := os.Stat(b)
	if err != nil {
		return false, err
	}
	return os.SameFile(sa, sb), nil
}
