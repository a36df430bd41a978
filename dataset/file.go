package dataset

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// FileOptions says how ReadFile turns a data file into a Dataset.
type FileOptions struct {
	// Name is the Dataset's name ("" → the file's base name without
	// extension).
	Name string
	// LabelColumn names the label column of a CSV file with a header, or
	// of a Parquet file. "" means: CSV is headerless with the label in the
	// first column (the legacy format, ReadCSV with DefaultCSVOptions),
	// Parquet uses the column "label".
	LabelColumn string
	// LabelOptional lets a CSV file with a header lack LabelColumn (data to
	// classify rather than to train on): every label is then 0 and the
	// Dataset's Unlabeled is set.
	LabelOptional bool
	// FeatureColumns names the feature columns, in this order (CSV with
	// header, Parquet); nil means every column except the label, in file
	// order.
	FeatureColumns []string
	// Labels, if not nil, are the class names in class order: a label
	// written as text that is one of them is mapped to its index in
	// Labels. An integer label (NPY, NPZ, a Parquet number, or a CSV cell
	// that is a decimal integer and no name) is itself that index, 0 for
	// Labels[0], and must be below len(Labels), so that a site storing
	// the label as a number and one storing its name agree; except when
	// some name is itself a decimal integer ("0", "7"): then an integer
	// label is read as the name written so. Any other value is an error
	// naming the file, row and column. If nil: labels must be
	// non-negative integers (class = the integer), except for an image
	// folder (class = index of the sub-folder name in sorted order) and,
	// unless IndexLabels, for CSV/Parquet string label columns (class =
	// index in the sorted distinct values).
	Labels []string
	// Classes, if > 0, is the number of classes: every integer label must
	// be below it (names without Labels: as many distinct names as it; with
	// Labels: len(Labels)). 0 infers max+1 (or len(Labels), or the number
	// of distinct names).
	Classes int
	// IndexLabels, without Labels, reads every label as a class number,
	// also the strings of a CSV or Parquet label column (which must then
	// be the decimal integers 0..Classes-1), instead of taking string
	// labels as class names: the data of a run that gives only its class
	// count (a node-local run file with classes and no labels), where a
	// site holding the labels "0" and "2" has classes 0 and 2, not two
	// names. A name is refused, naming the fix: the run's class names.
	IndexLabels bool
	// InputShape is the per-example shape: required for an image folder
	// ([C,H,W], C = 1 for grayscale or 3 for RGB; images are resized to
	// H×W with bilinear interpolation and scaled to [0,1]); for other
	// formats, if set, the features are checked to have its product and
	// the Dataset's Shape is set to it. For a text folder it is [SeqLen].
	InputShape []int
	// SeqLen and Vocab configure the HashTokenizer of a text folder or a
	// CSV text column: the tokens kept per document (0: InputShape's one
	// entry, else DefaultSeqLen) and the number of token ids (0:
	// DefaultTextVocab).
	SeqLen, Vocab int
	// TextColumn, if set, names a CSV file's text column (the file needs a
	// header: LabelColumn) or a Parquet file's string column: each row's
	// example is its text, tokenized into
	// SeqLen token ids, instead of numeric features (FeatureColumns must
	// be nil). TextPairColumn, if set too, names a second text column:
	// the example is the pair, each text's tokens in turn, the longer cut
	// first to fit SeqLen (HashTokenizer.TokenizePair).
	TextColumn, TextPairColumn string
	// Tokenizer, if set, is a pretrained checkpoint's folder whose own
	// tokenizer (LoadPretrainedTokenizer: vocab.txt, or vocab.json and
	// merges.txt) tokenizes a text folder, a text column or the fortunes,
	// instead of the HashTokenizer; the ids are then the checkpoint's, and
	// Vocab, if set, must be its vocabulary size.
	Tokenizer string
}

// Format names, what FormatOf returns.
const (
	FormatCSV         = "csv"
	FormatNPY         = "npy"
	FormatNPZ         = "npz"
	FormatParquet     = "parquet"
	FormatImageFolder = "images"
	FormatTextFolder  = "text"
	FormatTokens      = "tokens"
)

// ErrFormat is wrapped by every ReadFile error about the content of a file.
var ErrFormat = errors.New("dataset: bad data file")

// ErrFileOptions is wrapped by ReadFile errors about FileOptions that no
// file could satisfy (a negative Classes, duplicate Labels, a bad
// InputShape, …).
var ErrFileOptions = errors.New("dataset: invalid file options")

// maxReadValues bounds the feature values (rows × features) ReadFile reads
// from one file: 2^28 float32 values, 1 GiB. Declared sizes are checked
// against it before anything is allocated for them. A variable so that the
// fuzz tests can lower it.
var maxReadValues = 1 << 28

// defaultParquetLabel is the Parquet label column when
// FileOptions.LabelColumn is "".
const defaultParquetLabel = "label"

// fileError is a ReadFile error: one line that names the file and, where
// it applies, the row and column. It wraps its kind (ErrFormat or
// ErrFileOptions) and the underlying cause, if any.
type fileError struct {
	msg   string
	kind  error
	cause error
}

func (e *fileError) Error() string { return e.msg }

func (e *fileError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.kind}
	}
	return []error{e.kind, e.cause}
}

// oneLine makes s a single line, for messages that quote library errors
// or file content.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\x00", " ")), " ")
}

// formatErr returns an ErrFormat error reading "path: msg" (the message
// made one line), wrapping cause (which may be nil).
func formatErr(path string, cause error, format string, args ...any) error {
	return &fileError{msg: path + ": " + oneLine(fmt.Sprintf(format, args...)), kind: ErrFormat, cause: cause}
}

// optionsErr returns an ErrFileOptions error reading "path: invalid file
// options: msg".
func optionsErr(path, format string, args ...any) error {
	return &fileError{msg: path + ": invalid file options: " + fmt.Sprintf(format, args...), kind: ErrFileOptions}
}

// fileOpenErr reports that path could not be opened or listed, as "data
// file PATH: REASON", wrapping the system error (errors.Is(err,
// fs.ErrNotExist) holds for a missing file).
func fileOpenErr(path string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return fmt.Errorf("data file %s: %w", path, err)
}

// openData opens the data file path and returns it with its size; errors
// are fileOpenErr's.
func openData(path string) (*os.File, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, fileOpenErr(path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fileOpenErr(path, err)
	}
	return f, st.Size(), nil
}

// FormatOf says how ReadFile reads path: by extension (.csv, .npy, .npz,
// .parquet, .tokens, in any case); a directory is an image folder; anything else is
// an error that lists the formats. A path that does not exist but has a
// known extension gets its format (ReadFile then reports the missing
// file).
func FormatOf(path string) (string, error) {
	st, statErr := os.Stat(path)
	if statErr == nil && st.IsDir() {
		if isTextFolder(path) {
			return FormatTextFolder, nil
		}
		return FormatImageFolder, nil
	}
	ext := strings.ToLower(filepath.Ext(path))
	switch ext {
	case ".csv":
		return FormatCSV, nil
	case ".npy":
		return FormatNPY, nil
	case ".npz":
		return FormatNPZ, nil
	case ".parquet":
		return FormatParquet, nil
	case ".tokens":
		return FormatTokens, nil
	}
	if statErr != nil {
		return "", fileOpenErr(path, statErr)
	}
	return "", formatErr(path, nil, "unknown data file format %q: want .csv, .npy, .npz, .parquet, .tokens or a directory of images or .txt documents (one sub-folder per class)", ext)
}

// ReadFile reads path in its format (FormatOf) into a Dataset that passes
// Validate:
//
//   - .csv: without o.LabelColumn, the headerless format of ReadCSV
//     (label in the first column); with it, the first record is a header
//     and columns are chosen by name.
//   - .npy: one 2-D array (rows, 1+features) of a numeric dtype whose
//     column 0 holds the labels (exact non-negative integers).
//   - .npz: arrays "x" (or "X", "features"), shape (rows, ...), and "y"
//     (or "labels"), shape (rows,); x's shape beyond the first axis is the
//     example Shape when o.InputShape is not set.
//   - .parquet: numeric feature columns and an integer, float (holding
//     integers) or string label column, chosen by name; nulls are errors.
//   - a directory: an image folder DIR/<class>/*.png|*.jpg|*.jpeg, read as
//     o.InputShape [C,H,W]; or, if its first class sub-folder holds .txt
//     files, a text folder DIR/<class>/*.txt, one document per file,
//     tokenized by a HashTokenizer (o.SeqLen, o.Vocab) into token ids.
//   - .tokens: a token file (WriteTokensFile) of next-token windows: its
//     header gives Vocab and the row width; every label is 0, Classes is
//     o.Classes or 1; o.Vocab and o.SeqLen, if set, must match the file.
//
// Labels follow o.Labels and o.Classes; the Dataset's LabelNames is set
// when the labels came from names. Errors about the file's content wrap
// ErrFormat (and, for CSV, ErrCSV), errors about o wrap ErrFileOptions, a
// missing file's wraps fs.ErrNotExist; each is one line that names the
// file and, where it applies, the row and the column: CSV rows are line
// numbers ("FILE:LINE: column "NAME": …"), Parquet rows count from 1
// ("row 3"), NumPy positions are array indices from 0 ("x[2, 5]"). At
// most 2^28 feature values are read from one file, and sizes a file
// declares are checked before they are allocated.
func ReadFile(path string, o FileOptions) (*Dataset, error) {
	if err := o.check(path); err != nil {
		return nil, err
	}
	format, err := FormatOf(path)
	if err != nil {
		return nil, err
	}
	if o.Tokenizer != "" && format != FormatCSV && format != FormatParquet && format != FormatTextFolder {
		return nil, optionsErr(path, "a tokenizer is for text (a text folder, or a CSV or Parquet text column); this is a %s file", format)
	}
	if (o.TextColumn != "" || o.TextPairColumn != "") && format != FormatCSV && format != FormatParquet {
		return nil, optionsErr(path, "a text column is read from a CSV file with a header or a Parquet file; this is a %s file", format)
	}
	if format == FormatParquet {
		switch {
		case o.TextPairColumn != "" && o.TextColumn == "":
			return nil, optionsErr(path, "TextPairColumn %q needs TextColumn, the pair's first text", o.TextPairColumn)
		case o.TextColumn != "" && o.FeatureColumns != nil:
			return nil, optionsErr(path, "a text column's example is its text: FeatureColumns must not be set")
		case o.Tokenizer != "" && o.TextColumn == "":
			return nil, optionsErr(path, "Tokenizer %s tokenizes a text column: set TextColumn", o.Tokenizer)
		}
	}
	var d *Dataset
	switch format {
	case FormatCSV:
		d, err = readCSVData(path, o)
	case FormatNPY:
		d, err = readNPYFile(path, o)
	case FormatNPZ:
		d, err = readNPZFile(path, o)
	case FormatParquet:
		d, err = readParquetFile(path, o)
	case FormatTokens:
		d, err = readTokensFile(path, o)
	case FormatImageFolder:
		d, err = readImageFolder(path, o)
	case FormatTextFolder:
		if len(o.InputShape) == 3 { // [C,H,W]: the caller wants images
			d, err = readImageFolder(path, o)
		} else {
			d, err = readTextFolder(path, o)
		}
	}
	if err != nil {
		return nil, err
	}
	d.Name = o.Name
	if d.Name == "" {
		d.Name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	}
	if o.InputShape != nil {
		if p := shapeProduct(o.InputShape); p != d.Dim {
			return nil, formatErr(path, nil, "%d features per row, but InputShape %v has %d", d.Dim, o.InputShape, p)
		}
		d.Shape = append([]int(nil), o.InputShape...)
	}
	if err := d.Validate(); err != nil { // a reader bug, but say so clearly
		return nil, formatErr(path, err, "%v", err)
	}
	return d, nil
}

// check validates the options that do not depend on the file.
func (o FileOptions) check(path string) error {
	if o.Classes < 0 {
		return optionsErr(path, "--classes %d: the number of classes must be ≥ 0 (0: from the labels)", o.Classes)
	}
	if o.Labels != nil {
		if len(o.Labels) == 0 {
			return optionsErr(path, "--labels is empty: give the class names in class order, or leave it out")
		}
		if o.Classes > 0 && o.Classes != len(o.Labels) {
			return optionsErr(path, "--classes %d but %d class names (--labels, labels: in the run file): give the names, or their number, or both agreeing", o.Classes, len(o.Labels))
		}
		if len(o.Labels) > maxInferredClasses {
			return optionsErr(path, "%d class names (--labels), more than %d", len(o.Labels), maxInferredClasses)
		}
		seen := make(map[string]bool, len(o.Labels))
		for _, l := range o.Labels {
			if l == "" || strings.ContainsRune(l, 0) {
				return optionsErr(path, "class name %q in --labels is empty or contains a NUL byte", l)
			}
			if seen[l] {
				return optionsErr(path, "class name %q appears twice in --labels", l)
			}
			seen[l] = true
		}
	}
	if o.InputShape != nil {
		if len(o.InputShape) == 0 {
			return optionsErr(path, "InputShape is empty")
		}
		if shapeProduct(o.InputShape) < 1 {
			return optionsErr(path, "InputShape %v has a non-positive entry or more than %d values", o.InputShape, maxReadValues)
		}
	}
	if o.FeatureColumns != nil {
		if len(o.FeatureColumns) == 0 {
			return optionsErr(path, "FeatureColumns is empty")
		}
		label := o.LabelColumn
		if label == "" {
			label = defaultParquetLabel
		}
		seen := make(map[string]bool, len(o.FeatureColumns))
		for _, c := range o.FeatureColumns {
			if c == label {
				return optionsErr(path, "FeatureColumns contains the label column %q", c)
			}
			if seen[c] {
				return optionsErr(path, "column %q appears twice in FeatureColumns", c)
			}
			seen[c] = true
		}
	}
	return nil
}

// shapeProduct returns the product of shape's entries, or -1 if an entry
// is below 1 or the product exceeds maxReadValues.
func shapeProduct(shape []int) int {
	p := 1
	for _, s := range shape {
		if s < 1 || s > maxReadValues/p {
			return -1
		}
		p *= s
	}
	return p
}

// LabelSetHash returns the identity of a dataset's label set: the
// lower-case hex SHA-256 of the class names in class order, each followed
// by a 0 byte. For integer labels (names nil) the names are "0", "1", …,
// classes-1, so integer labels and the names "0", "1", … hash the same.
// When names is not nil, classes is not used.
func LabelSetHash(names []string, classes int) string {
	h := sha256.New()
	if names != nil {
		for _, n := range names {
			h.Write([]byte(n))
			h.Write([]byte{0})
		}
	} else {
		var buf []byte
		for i := range classes {
			buf = strconv.AppendInt(buf[:0], int64(i), 10)
			h.Write(append(buf, 0))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}
