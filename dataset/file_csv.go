package dataset

import (
	"errors"
	"fmt"
	"slices"
)

// readCSVData reads a CSV file for ReadFile: headerless with the label in
// the first column when o.LabelColumn is "" (ReadCSV's format), otherwise
// with a header naming the label and feature columns. Its errors about
// the content wrap ErrCSV as well as ErrFormat.
func readCSVData(path string, o FileOptions) (*Dataset, error) {
	spec := csvSpec{
		comma:     ',',
		labels:    fileLabeler(o),
		maxValues: maxReadValues,
	}
	var header, names []string
	var unlabeled bool
	var textCols []string
	var tok TextTokenizer
	if o.Tokenizer != "" && o.TextColumn == "" {
		return nil, optionsErr(path, "Tokenizer %s tokenizes a CSV file's text column: set TextColumn", o.Tokenizer)
	}
	if o.TextColumn != "" || o.TextPairColumn != "" {
		switch {
		case o.TextColumn == "":
			return nil, optionsErr(path, "TextPairColumn %q needs TextColumn, the pair's first text", o.TextPairColumn)
		case o.LabelColumn == "":
			return nil, optionsErr(path, "a text column needs a CSV header: set LabelColumn")
		case o.FeatureColumns != nil:
			return nil, optionsErr(path, "a text column's example is its text: FeatureColumns must not be set")
		}
		var err error
		if tok, err = textTokenizer(path, o); err != nil {
			return nil, err
		}
		textCols = []string{o.TextColumn}
		if o.TextPairColumn != "" {
			textCols = append(textCols, o.TextPairColumn)
		}
		spec.textDim = tok.Len()
		spec.text = func(fields []string, dst []float32) {
			if len(fields) == 2 {
				tok.TokenizePair(fields[0], fields[1], dst)
			} else {
				tok.Tokenize(fields[0], dst)
			}
		}
	}
	if o.LabelColumn == "" {
		if o.FeatureColumns != nil {
			return nil, optionsErr(path, "FeatureColumns needs a CSV header: set LabelColumn")
		}
		spec.layout = func(_ []string, width, line int) (csvLayout, error) {
			return positionalLayout(0, width, line)
		}
	} else {
		spec.header = true
		spec.deferLabels = spec.labels.defers()
		spec.layout = func(h []string, _, line int) (csvLayout, error) {
			header = slices.Clone(h) // the reader reuses h
			label := o.LabelColumn
			if o.LabelOptional && !slices.Contains(header, label) {
				label, unlabeled = "", true
			}
			if textCols != nil {
				return textLayout(header, label, textCols, line)
			}
			l, err := namedLayout(header, label, o.FeatureColumns, line)
			for _, j := range l.features {
				names = append(names, header[j])
			}
			return l, err
		}
	}
	f, _, err := openData(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d, err := readCSV(f, spec)
	if err != nil {
		var ce *csvError
		if !errors.As(err, &ce) { // not expected: readCSV returns *csvError
			return nil, formatErr(path, errors.Join(ErrCSV, err), "%v", err)
		}
		pos := path
		if ce.line > 0 {
			pos = fmt.Sprintf("%s:%d", path, ce.line)
		}
		if ce.field >= 0 {
			if ce.field < len(header) {
				pos = fmt.Sprintf("%s: column %q", pos, header[ce.field])
			} else {
				pos = fmt.Sprintf("%s: column %d", pos, ce.field+1)
			}
		}
		return nil, formatErr(pos, errors.Join(ErrCSV, ce.cause), "%s", ce.msg)
	}
	if textCols != nil {
		d.Shape, d.Vocab = []int{tok.Len()}, tok.VocabSize()
	} else {
		d.FeatureNames = names
	}
	d.Unlabeled = unlabeled
	return d, nil
}

// textLayout finds the label column and the text columns by name in a CSV
// header read at line.
func textLayout(header []string, label string, texts []string, line int) (csvLayout, error) {
	l, err := namedLayout(header, label, texts, line)
	if err != nil {
		return l, err
	}
	l.texts, l.features = l.features, nil
	for _, j := range l.texts {
		if j == l.label {
			return csvLayout{}, &csvError{line: line, field: -1, msg: fmt.Sprintf("column %q is the label column; a text column must be another", header[j])}
		}
	}
	return l, nil
}

// namedLayout finds the label column and the feature columns (nil: every
// other column) by name in a CSV header read at line.
func namedLayout(header []string, label string, features []string, line int) (csvLayout, error) {
	fail := func(format string, args ...any) (csvLayout, error) {
		return csvLayout{}, &csvError{line: line, field: -1, msg: fmt.Sprintf(format, args...)}
	}
	index := make(map[string]int, len(header))
	dup := make(map[string]bool)
	for j, name := range header {
		if _, ok := index[name]; ok {
			dup[name] = true
		}
		index[name] = j
	}
	find := func(name string) (int, error) {
		j, ok := index[name]
		switch {
		case !ok:
			return 0, &csvError{line: line, field: -1, msg: fmt.Sprintf("no column %q; the header has columns %s", name, quoteList(header, 20))}
		case dup[name]:
			return 0, &csvError{line: line, field: -1, msg: fmt.Sprintf("column %q appears more than once in the header", name)}
		}
		return j, nil
	}
	l := csvLayout{label: -1} // "": no label column
	var err error
	if label != "" {
		if l.label, err = find(label); err != nil {
			return csvLayout{}, err
		}
	}
	for _, name := range header { // the first repeated name, in header order
		if dup[name] {
			return csvLayout{}, &csvError{line: line, field: -1, msg: fmt.Sprintf("column %q appears more than once in the header", name)}
		}
	}
	if features == nil {
		for j := range header {
			if j != l.label {
				l.features = append(l.features, j)
			}
		}
		if len(l.features) == 0 {
			return fail("no feature columns besides the label column %q", label)
		}
		return l, nil
	}
	for _, name := range features {
		j, err := find(name)
		if err != nil {
			return csvLayout{}, err
		}
		l.features = append(l.features, j)
	}
	return l, nil
}
