package cli

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/internal/durable"
	"github.com/dpcluster/dpcluster/model"
)

// predictFlags are predict's own flags; the data flags mean what the run
// flags of the same names mean (runSpec).
type predictFlags struct {
	out, initFrom  string
	probabilities  bool
	labelColumn    string
	featureColumns []string
	textColumn     string
	textPairColumn string
	tokenizer      string
}

func newPredictCmd() *cobra.Command {
	var f predictFlags
	cmd := &cobra.Command{
		Use:   "predict MODEL DATA",
		Short: "Classify a data file with a trained model; with labels, print accuracy, precision and recall",
		Long: `predict reads MODEL, a model.safetensors file written by a run or by export (or a replica's
data dir, read as export reads it), and classifies every example of DATA, a data file in any
format the training data can be in (.csv, .npy, .npz, .parquet, a folder of images or of .txt
documents per class), read as training reads it.

The model's metadata names its classes ("classes") and the feature columns it reads, in
order ("features"), when the training data named them: DATA's columns are then chosen by
name, whatever their order in the file, and its labels are mapped to classes by name. A
model without class names has the classes 0..K-1, and labels are those integers. The label,
text and feature columns default to the training data's (metadata "label_column",
"text_column", "text_pair_column", "features"); the flags choose others. Text is tokenized
to the model's sequence length and vocabulary (--tokenizer for a pretrained checkpoint's
tokenizer, as in training).

When DATA has labels (a CSV file may lack the label column), predict prints the accuracy
and each class's precision and recall. --out FILE writes one CSV row per example: its row
index (from 0, in DATA's order), the predicted class's name and, with --probabilities, each
class's softmax probability (columns p_<class>).`,
		Example: `  coordinator predict /tmp/run1/model.safetensors examples/data/patients-test.csv --out predictions.csv`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runPredict(cmd.OutOrStdout(), args[0], args[1], f)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.out, "out", "", "write the predictions to this CSV file (row, predicted, and with --probabilities p_<class> per class)")
	fs.BoolVar(&f.probabilities, "probabilities", false, "with --out: add each class's probability")
	fs.StringVar(&f.labelColumn, "label-column", "", "CSV (with a header) or Parquet: the label column (default: the training data's; a CSV file without it is classified without accuracy)")
	fs.StringSliceVar(&f.featureColumns, "feature-columns", nil, "CSV or Parquet: the feature columns in the model's input order (default: the model's feature names, else every column but the label)")
	fs.StringVar(&f.textColumn, "text-column", "", "CSV or Parquet: the text column (default: the training data's)")
	fs.StringVar(&f.textPairColumn, "text-pair-column", "", "with --text-column: the second text column (default: the training data's)")
	fs.StringVar(&f.tokenizer, "tokenizer", "", "text: the pretrained checkpoint's folder whose tokenizer the model was trained with")
	fs.StringVar(&f.initFrom, "init-from", "", "MODEL a data dir of a run fine-tuned from a checkpoint that has no snapshot yet: the checkpoint's folder")
	return cmd
}

// trainedModel is a trained model with its parameters and metadata.
type trainedModel struct {
	m     *model.Model
	theta []float32
	meta  map[string]string
}

// loadTrainedModel reads path: a safetensors file with the model's spec in
// its metadata (as exportModel writes it), or a replica's data dir, read
// as export reads it (coordinator.ReadCommitted).
func loadTrainedModel(path, initFrom string) (trainedModel, error) {
	st, err := os.Stat(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return trainedModel{}, fmt.Errorf("model %s: %w", path, err)
	}
	if st.IsDir() {
		c, err := coordinator.ReadCommitted(path, initFunc(initFrom, nil, nil))
		if err != nil {
			return trainedModel{}, fmt.Errorf("model %s: %w", path, err)
		}
		// A run that trained part of its model: the whole model, its
		// frozen layers read from the checkpoint (--init-from).
		if c, _, err = mergeFrozen(c, initFrom, nil); err != nil {
			return trainedModel{}, fmt.Errorf("model %s: %w", path, err)
		}
		spec, err := model.ParseSpec(c.Config.ModelSpec)
		if err != nil {
			return trainedModel{}, fmt.Errorf("model %s: the run's model spec: %w", path, err)
		}
		m, err := model.New(spec)
		if err != nil {
			return trainedModel{}, err
		}
		meta, err := exportMeta(c)
		if err != nil {
			return trainedModel{}, err
		}
		return trainedModel{m: m, theta: c.Theta, meta: meta}, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return trainedModel{}, fmt.Errorf("model %s: %w", path, err)
	}
	tm, err := parseTrainedModel(b)
	if err != nil {
		return trainedModel{}, fmt.Errorf("model %s: %w", path, err)
	}
	return tm, nil
}

// parseTrainedModel reads a safetensors file's bytes: the spec from its
// metadata, then θ through model.ReadSafetensors, which checks every
// tensor against that spec.
func parseTrainedModel(b []byte) (trainedModel, error) {
	if len(b) < 8 {
		return trainedModel{}, fmt.Errorf("%w: %d bytes", model.ErrSafetensors, len(b))
	}
	hl := binary.LittleEndian.Uint64(b)
	if hl > uint64(len(b)-8) {
		return trainedModel{}, fmt.Errorf("%w: a header of %d bytes in a file of %d", model.ErrSafetensors, hl, len(b))
	}
	var header struct {
		Meta map[string]string `json:"__metadata__"`
	}
	if err := json.Unmarshal(b[8:8+hl], &header); err != nil {
		return trainedModel{}, fmt.Errorf("%w: header: %v", model.ErrSafetensors, err)
	}
	raw, ok := header.Meta["spec"]
	if !ok {
		return trainedModel{}, fmt.Errorf("%w: no model spec in its metadata (not written by coordinator export?)", model.ErrSafetensors)
	}
	spec, err := model.ParseSpec([]byte(raw))
	if err != nil {
		return trainedModel{}, fmt.Errorf("the spec in its metadata: %w", err)
	}
	m, err := model.New(spec)
	if err != nil {
		return trainedModel{}, err
	}
	theta, meta, err := m.ReadSafetensors(bytes.NewReader(b))
	if err != nil {
		return trainedModel{}, err
	}
	return trainedModel{m: m, theta: theta, meta: meta}, nil
}

// names returns the metadata's JSON list of strings under key (nil if
// absent).
func (tm trainedModel) names(key string) ([]string, error) {
	raw, ok := tm.meta[key]
	if !ok {
		return nil, nil
	}
	var out []string
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		return nil, fmt.Errorf("the model's metadata %q is not a JSON list of strings: %v", key, err)
	}
	return out, nil
}

// classNames are the model's class names: its metadata's, else the
// integers 0..K-1.
func (tm trainedModel) classNames() ([]string, bool, error) {
	names, err := tm.names("classes")
	if err != nil {
		return nil, false, err
	}
	if names != nil {
		if len(names) != tm.m.Classes() {
			return nil, false, fmt.Errorf("the model's metadata names %d classes, its spec has %d", len(names), tm.m.Classes())
		}
		return names, true, nil
	}
	out := make([]string, tm.m.Classes())
	for i := range out {
		out[i] = strconv.Itoa(i)
	}
	return out, false, nil
}

// vocab is the vocabulary of the model's first layer (an embedding or an
// embedding bag), or 0.
func vocabOf(m *model.Model) int {
	if ls := m.Spec().Layers; len(ls) > 0 && (ls[0].Type == model.EmbeddingBag || ls[0].Type == model.Embedding) {
		return ls[0].Vocab
	}
	return 0
}

// readPredictData reads the data file path for the model tm as training
// reads a file (runSpec.fileOptions, dataset.ReadFile), with the model's
// class names, columns, input shape and vocabulary, and a label column
// that may be missing.
func readPredictData(path string, tm trainedModel, f predictFlags) (*dataset.Dataset, error) {
	classes, named, err := tm.classNames()
	if err != nil {
		return nil, err
	}
	features, err := tm.names("features")
	if err != nil {
		return nil, err
	}
	or := func(flag, key string) string {
		if flag != "" {
			return flag
		}
		return tm.meta[key]
	}
	s := runSpec{LabelColumn: or(f.labelColumn, "label_column"), FeatureColumns: f.featureColumns,
		TextColumn: or(f.textColumn, "text_column"), TextPairColumn: or(f.textPairColumn, "text_pair_column"), Tokenizer: f.tokenizer}
	if s.FeatureColumns == nil && s.TextColumn == "" && s.LabelColumn != "" {
		s.FeatureColumns = features
	}
	if named {
		s.Labels = classes
	} else {
		s.Classes = tm.m.Classes()
	}
	shape := tm.m.InputShape()
	format, err := dataset.FormatOf(path)
	if err != nil {
		return nil, err
	}
	if v := vocabOf(tm.m); v > 0 {
		s.Vocab, s.SeqLen = v, shape[0]
	}
	if format != dataset.FormatTextFolder || len(shape) == 3 {
		s.InputShape = shape // images are resized to it; other data must have its size
	}
	fo := s.fileOptions()
	fo.LabelOptional = true
	if s.Tokenizer != "" {
		fo.Vocab = 0 // the tokenizer's; the model check below compares it
	}
	d, err := dataset.ReadFile(path, fo)
	if err != nil {
		if errors.Is(err, dataset.ErrFormat) && fo.InputShape != nil && strings.Contains(err.Error(), "features per row, but InputShape") {
			err = fmt.Errorf("%w (the model reads %d features: %s)", err, tm.m.InputSize(), featureList(features, shape))
		}
		return nil, err
	}
	if err := tm.m.CheckDataset(d); err != nil {
		return nil, fmt.Errorf("%s does not fit the model: %w", path, err)
	}
	return d, nil
}

// featureList describes the model's input for an error message: its
// feature names, or its shape.
func featureList(features []string, shape []int) string {
	if features == nil {
		return fmt.Sprintf("input shape %v", shape)
	}
	if len(features) > 12 {
		return strings.Join(features[:12], ", ") + fmt.Sprintf(", … (%d in all)", len(features))
	}
	return strings.Join(features, ", ")
}

// prediction is the model's output on a data set: each example's class
// probabilities (softmax of its logits, in float64) and arg-max class.
type prediction struct {
	classes []string
	probs   [][]float64
	pred    []int
}

// predict runs the model on every example of d (Workspace.Logits, the
// forward pass the run's evaluation makes).
func predict(tm trainedModel, d *dataset.Dataset) (prediction, error) {
	m := tm.m
	classes, _, err := tm.classNames()
	if err != nil {
		return prediction{}, err
	}
	const batch = 256
	ws, err := m.NewWorkspace(min(batch, d.Len()))
	if err != nil {
		return prediction{}, err
	}
	K := m.Classes()
	p := prediction{classes: classes, probs: make([][]float64, d.Len()), pred: make([]int, d.Len())}
	logits := make([]float32, batch*K)
	for lo := 0; lo < d.Len(); lo += batch {
		hi := min(lo+batch, d.Len())
		out := logits[:(hi-lo)*K]
		if err := ws.Logits(out, tm.theta, d.X[lo*d.Dim:hi*d.Dim]); err != nil {
			return prediction{}, err
		}
		for i := lo; i < hi; i++ {
			p.probs[i], p.pred[i] = softmax(out[(i-lo)*K : (i-lo+1)*K])
		}
	}
	return p, nil
}

// softmax returns the probabilities of logits z (in float64) and the
// first arg-max, as the run's evaluation counts it.
func softmax(z []float32) ([]float64, int) {
	best := 0
	for j, v := range z {
		if v > z[best] {
			best = j
		}
	}
	out := make([]float64, len(z))
	var sum float64
	for j, v := range z {
		out[j] = math.Exp(float64(v) - float64(z[best]))
		sum += out[j]
	}
	for j := range out {
		out[j] /= sum
	}
	return out, best
}

// report writes the accuracy and each class's precision and recall on
// d's labels.
func (p prediction) report(w io.Writer, y []int32) {
	K := len(p.classes)
	tp, predicted, actual := make([]int, K), make([]int, K), make([]int, K)
	correct := 0
	for i, c := range p.pred {
		predicted[c]++
		actual[y[i]]++
		if int32(c) == y[i] {
			tp[c]++
			correct++
		}
	}
	fmt.Fprintf(w, "accuracy %.2f%% (%d of %d)\n", 100*float64(correct)/float64(len(y)), correct, len(y))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CLASS\tPRECISION\tRECALL\tPREDICTED\tACTUAL")
	ratio := func(a, b int) string {
		if b == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f%%", 100*float64(a)/float64(b))
	}
	for c, name := range p.classes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", name, ratio(tp[c], predicted[c]), ratio(tp[c], actual[c]), predicted[c], actual[c])
	}
	tw.Flush()
}

// writeCSV writes one row per example: row index, predicted class and,
// with probs, each class's probability.
func (p prediction) writeCSV(w io.Writer, probs bool) error {
	cw := csv.NewWriter(w)
	header := []string{"row", "predicted"}
	if probs {
		for _, c := range p.classes {
			header = append(header, "p_"+c)
		}
	}
	if err := cw.Write(header); err != nil {
		return err
	}
	rec := make([]string, 0, len(header))
	for i, c := range p.pred {
		rec = append(rec[:0], strconv.Itoa(i), p.classes[c])
		if probs {
			for _, v := range p.probs[i] {
				rec = append(rec, strconv.FormatFloat(v, 'g', 8, 64))
			}
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

func runPredict(w io.Writer, modelPath, dataPath string, f predictFlags) error {
	if f.probabilities && f.out == "" {
		return errors.New("--probabilities needs --out FILE")
	}
	tm, err := loadTrainedModel(modelPath, f.initFrom)
	if err != nil {
		return err
	}
	if tm.m.Spec().Loss == model.NextToken {
		return fmt.Errorf("model %s is a next-token model (loss %s): predict classifies examples; use the Python package (python/) for its per-position logits", modelPath, model.NextToken)
	}
	d, err := readPredictData(dataPath, tm, f)
	if err != nil {
		return err
	}
	p, err := predict(tm, d)
	if err != nil {
		return err
	}
	out := bufio.NewWriter(w)
	eps, _ := strconv.ParseFloat(tm.meta["epsilon"], 64)
	fmt.Fprintf(out, "model %s: run %s, step %s, ε = %.4f at δ = %s; %d examples from %s\n",
		modelPath, tm.meta["run"], tm.meta["step"], eps, tm.meta["delta"], d.Len(), dataPath)
	if d.Unlabeled {
		fmt.Fprintf(out, "no labels (no column %q): no accuracy\n", tm.labelColumn(f))
	} else {
		p.report(out, d.Y)
	}
	if f.out != "" {
		err := durable.Replace(f.out, 0o644, func(file *os.File) error {
			bw := bufio.NewWriter(file)
			if err := p.writeCSV(bw, f.probabilities); err != nil {
				return err
			}
			return bw.Flush()
		})
		if err != nil {
			return fmt.Errorf("--out %s: %w", f.out, err)
		}
		fmt.Fprintf(out, "wrote %s: %d predictions\n", f.out, d.Len())
	}
	return out.Flush()
}

// labelColumn is the label column predict looked for.
func (tm trainedModel) labelColumn(f predictFlags) string {
	if f.labelColumn != "" {
		return f.labelColumn
	}
	return tm.meta["label_column"]
}
