package dataset

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// ErrCSV is returned (wrapped, with the line number) for malformed CSV
// input: a non-numeric or non-finite feature, a non-integer or negative
// label, a wrong number of columns, or no data rows.
var ErrCSV = errors.New("dataset: malformed CSV")

// maxInferredClasses bounds the class count ReadCSV infers from labels, so
// one stray large label cannot make a model allocate a huge output layer.
const maxInferredClasses = 1 << 20

// CSVOptions configures ReadCSV.
type CSVOptions struct {
	// Name is the Dataset's name.
	Name string
	// LabelColumn is the index of the label column; negative values count
	// from the end (-1 is the last column). Default 0.
	LabelColumn int
	// Header says the first record is a header and is skipped.
	Header bool
	// Comma is the field separator (default ',').
	Comma rune
	// Classes is the number of classes; 0 infers max(label)+1, otherwise
	// every label must be below it.
	Classes int
}

// DefaultCSVOptions returns options for a headerless, comma-separated file
// with the label in the first column.
func DefaultCSVOptions() CSVOptions {
	return CSVOptions{Name: "csv", Comma: ','}
}

// ReadCSV reads tabular data: one example per record, a label column (a
// non-negative integer) and numeric feature columns (parsed as float32;
// NaN, ±Inf and values overflowing float32 are rejected). Every record
// must have the same number of columns, at least two. Leading and trailing
// spaces around fields are ignored; lines starting with '#' are comments.
// Errors wrap ErrCSV and give the 1-based line number (and column).
func ReadCSV(r io.Reader, opts CSVOptions) (*Dataset, error) {
	if opts.Classes < 0 {
		return nil, fmt.Errorf("%w: Classes %d < 0", ErrCSV, opts.Classes)
	}
	d, err := readCSV(r, csvSpec{
		comma:  opts.Comma,
		header: opts.Header,
		layout: func(_ []string, width, line int) (csvLayout, error) {
			return positionalLayout(opts.LabelColumn, width, line)
		},
		labels: newLabeler(nil, opts.Classes, "CSVOptions.Classes"),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCSV, err)
	}
	d.Name = opts.Name
	return d, nil
}

// csvSpec says how readCSV reads a CSV table.
type csvSpec struct {
	comma  rune // field separator; 0 means ','
	header bool // the first record is a header
	// layout chooses the label and feature fields. It is called once:
	// with the header at the header record, or else with a nil header at
	// the first data record, of width fields at line.
	layout func(header []string, width, line int) (csvLayout, error)
	labels *labeler
	// deferLabels reads labels as names resolved at the end (labeler.
	// resolve with sniffing) instead of integers or names in Labels.
	deferLabels bool
	// maxValues, if > 0, bounds rows × features.
	maxValues int
	// text, if not nil, makes the example of a record the text of the
	// layout's text fields (one, or a pair) written into dst as textDim
	// token ids, instead of numeric features.
	text    func(fields []string, dst []float32)
	textDim int
}

// csvLayout is which fields of a record are the label and the features
// (or, for a text column, the text).
type csvLayout struct {
	label    int
	features []int
	texts    []int
}

// csvError is an error at a CSV line (1-based; 0: the whole input) and
// field (0-based; -1: the whole record). ReadCSV and ReadFile format the
// position their own way.
type csvError struct {
	line, field int
	msg         string
	cause       error
}

// Error formats the error the way ReadCSV reports it.
func (e *csvError) Error() string {
	switch {
	case e.line > 0 && e.field >= 0:
		return fmt.Sprintf("line %d, column %d: %s", e.line, e.field+1, e.msg)
	case e.line > 0:
		return fmt.Sprintf("line %d: %s", e.line, e.msg)
	}
	return e.msg
}

func (e *csvError) Unwrap() error { return e.cause }

// positionalLayout is ReadCSV's layout: the label at index label
// (negative counts from the end), every other field a feature.
func positionalLayout(label, width, line int) (csvLayout, error) {
	if width < 2 {
		return csvLayout{}, &csvError{line: line, field: -1, msg: fmt.Sprintf("%d column(s), need a label and at least one feature", width)}
	}
	col := label
	if col < 0 {
		col += width
	}
	if col < 0 || col >= width {
		return csvLayout{}, &csvError{field: -1, msg: fmt.Sprintf("label column %d outside the %d columns", label, width)}
	}
	l := csvLayout{label: col}
	for j := range width {
		if j != col {
			l.features = append(l.features, j)
		}
	}
	return l, nil
}

// readCSV reads a CSV table by spec: every record as wide as the first,
// fields trimmed of spaces, lines starting with '#' comments, features
// finite float32 numbers. Errors are *csvError. The result has no Name.
func readCSV(r io.Reader, spec csvSpec) (*Dataset, error) {
	cr := csv.NewReader(r)
	if spec.comma != 0 {
		cr.Comma = spec.comma
	}
	cr.Comment = '#'
	cr.ReuseRecord = true
	cr.FieldsPerRecord = -1 // checked here, for a clearer message
	d := &Dataset{}
	var layout csvLayout
	width := 0 // of every record; 0 until the first
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				return nil, &csvError{line: pe.Line, field: -1, msg: pe.Err.Error(), cause: err}
			}
			return nil, &csvError{field: -1, msg: err.Error(), cause: err}
		}
		line, _ := cr.FieldPos(0)
		for j := range rec {
			rec[j] = strings.TrimSpace(rec[j])
		}
		if width == 0 {
			width = len(rec)
			var header []string
			if spec.header {
				header = rec
			}
			if layout, err = spec.layout(header, width, line); err != nil {
				return nil, err
			}
			d.Dim = len(layout.features)
			if spec.text != nil {
				d.Dim = spec.textDim
			}
			if spec.header {
				continue
			}
		}
		if len(rec) != width {
			return nil, &csvError{line: line, field: -1, msg: fmt.Sprintf("%d columns, want %d", len(rec), width)}
		}
		if spec.maxValues > 0 && len(d.X) > spec.maxValues-d.Dim {
			return nil, &csvError{line: line, field: -1, msg: fmt.Sprintf("more than %d feature values", spec.maxValues)}
		}
		var y int32 // 0 without a label column (FileOptions.LabelOptional)
		switch {
		case layout.label >= 0 && spec.deferLabels:
			y, err = spec.labels.deferName(rec[layout.label], line)
		case layout.label >= 0:
			y, err = spec.labels.fromText(rec[layout.label])
		}
		if err != nil {
			return nil, &csvError{line: line, field: layout.label, msg: err.Error()}
		}
		d.Y = append(d.Y, y)
		if spec.text != nil {
			texts := make([]string, len(layout.texts))
			for i, j := range layout.texts {
				texts[i] = rec[j]
			}
			n := len(d.X)
			d.X = append(d.X, make([]float32, d.Dim)...)
			spec.text(texts, d.X[n:])
			continue
		}
		for _, j := range layout.features {
			v, err := strconv.ParseFloat(rec[j], 32)
			if errors.Is(err, strconv.ErrRange) && !math.IsInf(v, 0) {
				err = nil // too small for float32: it reads as 0 (or the nearest subnormal)
			}
			switch {
			case errors.Is(err, strconv.ErrRange):
				return nil, &csvError{line: line, field: j, msg: fmt.Sprintf("%q is outside float32's range (±3.4e38)", rec[j])}
			case err != nil || math.IsNaN(v) || math.IsInf(v, 0):
				return nil, &csvError{line: line, field: j, msg: fmt.Sprintf("%q is not a finite number", rec[j])}
			}
			d.X = append(d.X, float32(v))
		}
	}
	if d.Len() == 0 {
		return nil, &csvError{field: -1, msg: "no data rows"}
	}
	if spec.deferLabels && layout.label >= 0 {
		if line, err := spec.labels.resolve(d.Y, true); err != nil {
			field := layout.label
			if line == 0 {
				field = -1
			}
			return nil, &csvError{line: line, field: field, msg: err.Error()}
		}
	}
	var err error
	if d.Classes, d.LabelNames, err = spec.labels.finish(d.Y); err != nil {
		return nil, &csvError{field: -1, msg: err.Error()}
	}
	return d, nil
}
