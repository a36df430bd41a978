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
	cr := csv.NewReader(r)
	if opts.Comma != 0 {
		cr.Comma = opts.Comma
	}
	cr.Comment = '#'
	cr.ReuseRecord = true
	cr.FieldsPerRecord = -1 // checked here, for a clearer message
	d := &Dataset{Name: opts.Name}
	cols, labelCol := 0, 0
	maxLabel := int64(-1)
	first := true // only to skip the header
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCSV, err)
		}
		line, _ := cr.FieldPos(0)
		if first && opts.Header {
			first = false
			cols = len(rec)
			continue
		}
		if cols == 0 {
			cols = len(rec)
		}
		if len(rec) != cols {
			return nil, fmt.Errorf("%w: line %d: %d columns, want %d", ErrCSV, line, len(rec), cols)
		}
		if d.Dim == 0 { // first data row
			if cols < 2 {
				return nil, fmt.Errorf("%w: line %d: %d column(s), need a label and at least one feature", ErrCSV, line, cols)
			}
			labelCol = opts.LabelColumn
			if labelCol < 0 {
				labelCol += cols
			}
			if labelCol < 0 || labelCol >= cols {
				return nil, fmt.Errorf("%w: label column %d outside the %d columns", ErrCSV, opts.LabelColumn, cols)
			}
			d.Dim = cols - 1
		}
		for j, f := range rec {
			f = strings.TrimSpace(f)
			if j == labelCol {
				l, err := strconv.ParseInt(f, 10, 32)
				if err != nil || l < 0 {
					return nil, fmt.Errorf("%w: line %d, column %d: label %q is not a non-negative integer", ErrCSV, line, j+1, f)
				}
				if opts.Classes > 0 && l >= int64(opts.Classes) {
					return nil, fmt.Errorf("%w: line %d, column %d: label %d with only %d classes", ErrCSV, line, j+1, l, opts.Classes)
				}
				maxLabel = max(maxLabel, l)
				d.Y = append(d.Y, int32(l))
				continue
			}
			v, err := strconv.ParseFloat(f, 32)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("%w: line %d, column %d: %q is not a finite number", ErrCSV, line, j+1, f)
			}
			d.X = append(d.X, float32(v))
		}
	}
	if d.Len() == 0 {
		return nil, fmt.Errorf("%w: no data rows", ErrCSV)
	}
	d.Classes = opts.Classes
	if d.Classes == 0 {
		if maxLabel >= maxInferredClasses {
			return nil, fmt.Errorf("%w: label %d would infer more than %d classes; set CSVOptions.Classes", ErrCSV, maxLabel, maxInferredClasses)
		}
		d.Classes = int(maxLabel) + 1
	}
	return d, nil
}
