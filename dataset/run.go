package dataset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
)

// Names of the datasets a run can train on (RunOptions.Dataset, a run
// file's dataset key).
const (
	NameFashionMNIST = "fashion-mnist"
	NameGaussian     = "gaussian"
	// NameFile is a data file in any format ReadFile reads; NameCSV is
	// the same (its older name).
	NameFile = "file"
	NameCSV  = "csv"
	// NameLocal is a run whose nodes each bring their own data file: the
	// replicas load no training data, and each node reads its own with
	// ReadFile; the run's Schema says what every node's data looks like.
	// LoadRun does not load it.
	NameLocal = "local"
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

// KnownTrainSize returns the number of training examples of the dataset
// name before it is loaded, where that is fixed: 60000 for Fashion-MNIST,
// 10000 for the gaussian data; 0 for a file, whose size only reading it
// tells.
func KnownTrainSize(name string) int64 {
	switch name {
	case NameFashionMNIST:
		return 60000
	case NameGaussian:
		return int64(math.Round(gaussianExamples * (1 - gaussianTestShare)))
	}
	return 0
}

// ErrRunOptions is returned (wrapped, naming the option by its run-file
// key) by RunOptions.Validate and LoadRun for options that do not describe
// a run's data.
var ErrRunOptions = errors.New("dataset: invalid run data options")

// ErrEvalOverlap is returned (wrapped, with how many rows) by LoadRun when
// a run's separate evaluation data (RunOptions.EvalPath) holds rows of its
// training data.
var ErrEvalOverlap = errors.New("dataset: evaluation data overlaps the training data")

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
	// Dataset is NameFashionMNIST, NameGaussian, NameFortunesSeq,
	// NameFortunesCategory, NameFile or NameCSV.
	Dataset string
	// Dir is searched first for the Fashion-MNIST files (LoadOptions.Dir;
	// then $DPCLUSTER_DATA, the user cache, the Debian package's
	// directory). For NameFortunesSeq and NameFortunesCategory it is the
	// fortune files' directory ("" → FortunesDir).
	Dir string
	// Path is the training file (NameFile, NameCSV), read with ReadFile
	// and File. Its rows are private training data: all of them are the
	// training set unless EvalHoldout is set.
	Path string
	// File says how Path and EvalPath are read (ReadFile). Its Classes, if
	// 0, is the Model's.
	File FileOptions
	// EvalPath is, for NameFile, a separate file of public evaluation
	// data, read like Path with the training data's classes and label
	// names. It must share no row with the training data, compared by
	// content (SharedRows): a copy of the training file is refused like
	// the file itself (ErrEvalOverlap). Without it (and without
	// EvalHoldout) a file run evaluates nothing.
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
	case NameFile, NameCSV:
		if o.Path == "" {
			return bad("dataset %s needs data_path FILE", o.Dataset)
		}
		if o.Dir != "" {
			return bad("data is the Fashion-MNIST directory; give data_path FILE for %s", o.Dataset)
		}
		if o.EvalPath != "" && o.EvalHoldout != 0 {
			return bad("give eval_path (public evaluation data) or eval_split_from_train (NON-PRIVATE), not both")
		}
		if o.EvalHoldout != 0 && !(o.EvalHoldout > 0 && o.EvalHoldout < 1) {
			return bad("eval_split_from_train %v must be a fraction in (0, 1)", o.EvalHoldout)
		}
	case NameFortunesSeq, NameFortunesCategory:
		if o.Path != "" {
			return bad("dataset %s reads the fortune files in the data directory (default %s); it takes no data_path", o.Dataset, FortunesDir)
		}
	case NameLocal:
		return bad("dataset local: each node loads its own file (ReadFile); LoadRun loads no shared training set")
	default:
		return bad("dataset must be %s, %s, %s, %s or %s, not %q", NameFashionMNIST, NameGaussian, NameFortunesSeq, NameFortunesCategory, NameFile, o.Dataset)
	}
	if o.Dataset != NameCSV && o.Dataset != NameFile && (o.EvalPath != "" || o.EvalHoldout != 0) {
		return bad("eval_path and eval_split_from_train are for dataset file: %s evaluates on its own public test split", o.Dataset)
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
//   - fortunes-seq: the fortunes in o.Dir (default FortunesDir), split
//     by document 80/10/10 with a public seed (LoadFortunesSequences);
//     training on the training split's windows, evaluation on the
//     validation split's (documents never trained on; the corpus is
//     public Debian text standing in for private text). The test split
//     is left for final reports (experiments).
//   - fortunes-category: the fortunes in o.Dir (default FortunesDir),
//     each labelled by its category (LoadFortuneCategories), tokenized
//     by o.File's HashTokenizer; training on 90% of the documents,
//     evaluation on the other 10% (a public split, documents never
//     trained on).
//   - csv: every row of o.Path is training data. Evaluation is on the
//     separate file o.EvalPath (public; refused if any of its rows is a
//     training row), or, only with o.EvalHoldout, on rows held out of
//     o.Path (EvalSet.Holdout, NON-PRIVATE); with neither, nothing is
//     evaluated.
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
	case NameFile, NameCSV:
		train, eval, err = loadRunFile(o)
	case NameFortunesSeq:
		train, eval.Data, err = loadRunFortunes(o)
	case NameFortunesCategory:
		train, eval.Data, err = LoadFortuneCategories(o.Dir, o.File)
		if err == nil {
			log.Info("fortunes-category loaded", "classes", train.Classes, "train_documents", train.Len(), "eval_documents", eval.Data.Len())
		}
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

// loadRunFile reads the training file and the evaluation data of a file
// run (see LoadRun).
func loadRunFile(o RunOptions) (train *Dataset, eval EvalSet, err error) {
	fo := o.File
	if fo.Classes == 0 && fo.Labels == nil && o.Model != nil {
		fo.Classes = o.Model.Classes()
	}
	if train, err = ReadFile(o.Path, fo); err != nil {
		return nil, EvalSet{}, err
	}
	switch {
	case o.EvalHoldout != 0:
		eval.Holdout = true
		if train, eval.Data, err = Split(train, o.EvalHoldout, csvSplitSeed); err != nil {
			return nil, EvalSet{}, fmt.Errorf("eval_split_from_train %v of %s: %w", o.EvalHoldout, o.Path, err)
		}
	case o.EvalPath != "":
		// The evaluation data is read with the training data's classes, so
		// that a class name means the same class in both.
		fo.Labels, fo.Classes = train.LabelNames, train.Classes
		if len(fo.InputShape) == 0 {
			fo.InputShape = train.Shape
		}
		if eval.Data, err = ReadFile(o.EvalPath, fo); err != nil {
			return nil, EvalSet{}, fmt.Errorf("eval_path: %w", err)
		}
		if err := checkSeparate(train, eval.Data, o.Path, o.EvalPath); err != nil {
			return nil, EvalSet{}, err
		}
	}
	return train, eval, nil
}

// checkSeparate refuses evaluation data (read from evalPath) that holds
// any row of the training data (read from trainPath), compared by content
// (SharedRows): the training file itself, a copy of it, or other rows
// with training rows among them. Evaluations on a file given as eval_path
// are reported as held-out test results, differentially private as
// post-processing of θ; on a training row they are neither, so such a
// file is an error (ErrEvalOverlap), not a label.
func checkSeparate(train, eval *Dataset, trainPath, evalPath string) error {
	n := SharedRows(train, eval)
	switch {
	case n == 0:
		return nil
	case n == eval.Len():
		return fmt.Errorf("%w: eval_path %s: all %d of its %d rows are rows of the training file %s: "+
			"evaluation data must be separate, public data (an accuracy on training rows is neither held-out nor differentially private)",
			ErrEvalOverlap, evalPath, n, eval.Len(), trainPath)
	default:
		return fmt.Errorf("%w: eval_path %s: %d of its %d rows are rows of the training file %s: "+
			"remove them from the evaluation file (an accuracy on training rows is neither held-out nor differentially private)",
			ErrEvalOverlap, evalPath, n, eval.Len(), trainPath)
	}
}

// loadRunFortunes loads the fortunes-seq training and validation splits
// (see LoadRun): windows of the model's input length [T+1] (without a
// model, DefaultContext+1), labelled with the model's classes (all labels
// are 0).
func loadRunFortunes(o RunOptions) (train, validation *Dataset, err error) {
	c := DefaultSequenceConfig()
	if o.Model != nil {
		in := o.Model.InputShape()
		if len(in) != 1 || in[0] < 2 || in[0]-1 > MaxContext {
			return nil, nil, fmt.Errorf("%w: dataset %s is token windows [T+1] with 1 ≤ T ≤ %d; the model takes input %v",
				ErrRunOptions, NameFortunesSeq, MaxContext, in)
		}
		c.Context = in[0] - 1
	}
	corpus, err := LoadFortunesSequences(o.Dir, c)
	if err != nil {
		return nil, nil, err
	}
	if o.Model != nil {
		corpus.Train.Classes = o.Model.Classes()
		corpus.Validation.Classes = o.Model.Classes()
	}
	if log := o.Log; log != nil {
		log.Info("fortunes-seq loaded", "context", c.Context, "train_windows", corpus.Train.Len(),
			"validation_windows", corpus.Validation.Len(), "train_documents", len(corpus.TrainDocs),
			"validation_documents", len(corpus.ValidationDocs))
	}
	return corpus.Train, corpus.Validation, nil
}
