package dataset

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"
)

// maxParquetFooter bounds a Parquet footer (the file metadata).
const maxParquetFooter = 64 << 20

// parquetColumn is a column ReadFile reads from a Parquet file.
type parquetColumn struct {
	name     string
	leaf     int // index among the leaf columns
	kind     parquet.Kind
	unsigned bool // an unsigned integer logical type
}

// readParquetFile reads a Parquet file: the label column o.LabelColumn
// ("label" if "") and the feature columns o.FeatureColumns (nil: every
// other top-level column), or the string columns o.TextColumn (and
// o.TextPairColumn) tokenized by o's tokenizer, row group by row group. parquet-go can panic
// on some corrupt files (e.g. a gzip page with a bad header); such a
// panic is returned as an ErrFormat error.
func readParquetFile(path string, o FileOptions) (d *Dataset, err error) {
	f, size, err := openData(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := checkParquetFooter(f, size); err != nil {
		return nil, formatErr(path, err, "not a readable Parquet file: %v", err)
	}
	defer func() {
		if r := recover(); r != nil {
			d, err = nil, formatErr(path, nil, "malformed Parquet file: the decoder failed: %v", r)
		}
	}()
	pf, err := parquet.OpenFile(f, size, &parquet.FileConfig{
		SkipPageIndex:    true,
		SkipBloomFilters: true,
		ReadBufferSize:   64 << 10,
		ReadMode:         parquet.ReadModeSync,
	})
	if err != nil {
		return nil, formatErr(path, err, "not a readable Parquet file: %v", err)
	}
	label, features, err := parquetColumns(pf, o)
	if err != nil {
		return nil, formatErr(path, nil, "%v", err)
	}
	return readParquetRows(pf, path, size, o, label, features)
}

// checkParquetFooter checks the magic bytes and the footer of a Parquet
// file of the given size before parquet-go reads them.
func checkParquetFooter(r io.ReaderAt, size int64) error {
	if size < 12 {
		return fmt.Errorf("%d bytes is too short", size)
	}
	var head, tail [8]byte
	if _, err := r.ReadAt(head[:4], 0); err != nil {
		return err
	}
	if _, err := r.ReadAt(tail[:], size-8); err != nil {
		return err
	}
	if string(head[:4]) != "PAR1" || string(tail[4:]) != "PAR1" {
		return fmt.Errorf("no PAR1 magic bytes (an encrypted footer is not supported)")
	}
	n := int64(binary.LittleEndian.Uint32(tail[:4]))
	if n > size-12 || n > maxParquetFooter {
		return fmt.Errorf("footer of %d bytes does not fit the file's %d bytes", n, size)
	}
	footer := make([]byte, n)
	if _, err := r.ReadAt(footer, size-8-n); err != nil {
		return err
	}
	m, _, err := checkThrift(footer)
	if err != nil {
		return fmt.Errorf("bad footer: %v", err)
	}
	if m != len(footer) {
		return fmt.Errorf("bad footer: %d bytes after the metadata", len(footer)-m)
	}
	var md format.FileMetaData
	if err := thrift.Unmarshal(new(thrift.CompactProtocol), footer, &md); err != nil {
		return fmt.Errorf("bad footer: %v", err)
	}
	return checkParquetSchema(&md)
}

// maxSchemaDepth bounds the nesting of a Parquet schema.
const maxSchemaDepth = 64

// checkParquetSchema checks that the schema elements form a tree in
// depth-first order (each group followed by its num_children children),
// as parquet-go assumes, and that every row group has a chunk per leaf.
func checkParquetSchema(md *format.FileMetaData) error {
	var open []int32 // children still to come of each open group
	leaves := 0
	for i := range md.Schema {
		el := &md.Schema[i]
		if i > 0 {
			if len(open) == 0 {
				return fmt.Errorf("bad schema: element %d is outside the root", i)
			}
			open[len(open)-1]--
		}
		n := el.NumChildren.V
		if !el.NumChildren.Valid {
			n = 0
		}
		switch {
		case el.Type.Valid && n == 0 && i > 0:
			leaves++
		case !el.Type.Valid && n > 0 && len(open) < maxSchemaDepth:
			open = append(open, n)
		default:
			return fmt.Errorf("bad schema: element %d (%q) is neither a leaf nor a group with children", i, el.Name)
		}
		for len(open) > 0 && open[len(open)-1] == 0 {
			open = open[:len(open)-1]
		}
	}
	if len(open) > 0 || len(md.Schema) == 0 {
		return fmt.Errorf("bad schema: fewer elements than the groups' children")
	}
	for i, rg := range md.RowGroups {
		if len(rg.Columns) != leaves {
			return fmt.Errorf("row group %d has %d column chunks for %d columns", i, len(rg.Columns), leaves)
		}
	}
	return nil
}

// parquetColumns finds the label and feature columns by name among the
// top-level columns of the file's schema.
func parquetColumns(pf *parquet.File, o FileOptions) (label parquetColumn, features []parquetColumn, err error) {
	schema := pf.Schema()
	var names []string
	for _, fld := range schema.Fields() {
		names = append(names, fld.Name())
	}
	find := func(name string) (parquetColumn, error) {
		if !slices.Contains(names, name) {
			return parquetColumn{}, fmt.Errorf("no column %q; the file has columns %s", name, quoteList(names, 20))
		}
		lc, ok := schema.Lookup(name)
		if !ok || len(lc.Path) != 1 || !lc.Node.Leaf() || lc.MaxRepetitionLevel > 0 {
			return parquetColumn{}, fmt.Errorf("column %q is a group or repeated column: want plain numbers or strings", name)
		}
		c := parquetColumn{name: name, leaf: lc.ColumnIndex, kind: lc.Node.Type().Kind()}
		if lt := lc.Node.Type().LogicalType(); lt != nil {
			switch v := lt.Value.(type) {
			case *format.IntType:
				c.unsigned = !v.IsSigned
			case *format.DecimalType:
				return parquetColumn{}, fmt.Errorf("column %q is a DECIMAL column, which is not supported: store it as float or double", name)
			}
		}
		switch c.kind {
		case parquet.Boolean, parquet.Int32, parquet.Int64, parquet.Float, parquet.Double, parquet.ByteArray:
			return c, nil
		}
		return parquetColumn{}, fmt.Errorf("column %q has type %v: want boolean, int32, int64, float, double or (for labels) string", name, lc.Node.Type())
	}
	labelName := o.LabelColumn
	if labelName == "" {
		labelName = defaultParquetLabel
	}
	if label, err = find(labelName); err != nil {
		return parquetColumn{}, nil, err
	}
	if o.TextColumn != "" {
		// The text columns (one, or a pair) in place of the features.
		for _, n := range []string{o.TextColumn, o.TextPairColumn} {
			if n == "" {
				continue
			}
			if n == labelName {
				return parquetColumn{}, nil, fmt.Errorf("column %q is the label column; a text column must be another", n)
			}
			c, err := find(n)
			if err != nil {
				return parquetColumn{}, nil, err
			}
			if c.kind != parquet.ByteArray {
				return parquetColumn{}, nil, fmt.Errorf("text column %q has type %v: want strings", n, c.kind)
			}
			features = append(features, c)
		}
		return label, features, nil
	}
	want := o.FeatureColumns
	if want == nil {
		for _, n := range names {
			if n != labelName {
				want = append(want, n)
			}
		}
		if len(want) == 0 {
			return parquetColumn{}, nil, fmt.Errorf("no feature columns besides the label column %q", labelName)
		}
	}
	for _, n := range want {
		c, err := find(n)
		if err != nil {
			return parquetColumn{}, nil, err
		}
		if c.kind == parquet.ByteArray {
			return parquetColumn{}, nil, fmt.Errorf("feature column %q holds strings: want numbers", n)
		}
		features = append(features, c)
	}
	return label, features, nil
}

// readParquetRows reads the label and feature columns of every row group.
func readParquetRows(pf *parquet.File, path string, size int64, o FileOptions, label parquetColumn, features []parquetColumn) (*Dataset, error) {
	md := pf.Metadata()
	groups := pf.RowGroups()
	if len(groups) != len(md.RowGroups) {
		return nil, formatErr(path, nil, "malformed Parquet metadata: %d row groups, %d described", len(groups), len(md.RowGroups))
	}
	dim := len(features)
	var tok TextTokenizer
	var texts [][]string // each text column's values in the row group
	if o.TextColumn != "" {
		var err error
		if tok, err = textTokenizer(path, o); err != nil {
			return nil, err
		}
		texts = make([][]string, len(features))
		dim = tok.Len()
	}
	var total int64
	for _, rg := range md.RowGroups {
		if rg.NumRows < 0 || rg.NumRows > int64(maxReadValues/dim)-total {
			return nil, formatErr(path, nil, "row groups declare more than %d feature values", maxReadValues)
		}
		total += rg.NumRows
	}
	if total == 0 {
		return nil, formatErr(path, nil, "no rows")
	}
	codecs := make(map[int]format.CompressionCodec)
	d := &Dataset{Dim: dim}
	if tok != nil {
		d.Shape, d.Vocab = []int{dim}, tok.VocabSize()
	} else {
		for _, c := range features {
			d.FeatureNames = append(d.FeatureNames, c.name)
		}
	}
	lab := fileLabeler(o)
	deferNames := label.kind == parquet.ByteArray && lab.defers()
	cols := make([][]float32, len(features))
	var first int64 // index of the row group's first row
	for g, rg := range groups {
		rows := md.RowGroups[g].NumRows
		chunks := rg.ColumnChunks()
		if len(chunks) != len(md.RowGroups[g].Columns) {
			return nil, formatErr(path, nil, "malformed Parquet metadata: row group %d has %d column chunks, %d described", g, len(chunks), len(md.RowGroups[g].Columns))
		}
		for j := -1; j < len(features); j++ {
			c := label
			if j >= 0 {
				c = features[j]
				cols[j] = cols[j][:0]
				if texts != nil {
					texts[j] = texts[j][:0]
				}
			}
			if c.leaf >= len(chunks) {
				return nil, formatErr(path, nil, "malformed Parquet metadata: row group %d has no chunk for column %q", g, c.name)
			}
			cc := &md.RowGroups[g].Columns[c.leaf]
			if err := checkChunk(pf, cc, size, rows, codecs, c.leaf); err != nil {
				return nil, formatErr(path, nil, "row group %d, column %q: %v", g, c.name, err)
			}
			err := readParquetColumn(chunks[c.leaf], rows, func(i int64, v parquet.Value) error {
				row := first + i + 1
				if v.IsNull() {
					return formatErr(path, nil, "row %d, column %q: null value", row, c.name)
				}
				if j >= 0 && texts != nil {
					texts[j] = append(texts[j], string(v.ByteArray()))
					return nil
				}
				if j >= 0 {
					x, ok := npyFeature(parquetNumber(v, c))
					if !ok {
						return formatErr(path, nil, "row %d, column %q: %v is not a finite float32 number", row, c.name, parquetNumber(v, c))
					}
					cols[j] = append(cols[j], x)
					return nil
				}
				y, err := parquetLabel(lab, v, c, deferNames, int(row))
				if err != nil {
					return formatErr(path, nil, "row %d, column %q: %v", row, c.name, err)
				}
				d.Y = append(d.Y, y)
				return nil
			})
			if err != nil {
				var fe *fileError
				if errors.As(err, &fe) {
					return nil, err
				}
				return nil, formatErr(path, err, "row group %d, column %q: %v", g, c.name, err)
			}
		}
		for i := range rows {
			if texts != nil {
				n := len(d.X)
				d.X = append(d.X, make([]float32, dim)...)
				if len(texts) == 2 {
					tok.TokenizePair(texts[0][i], texts[1][i], d.X[n:])
				} else {
					tok.Tokenize(texts[0][i], d.X[n:])
				}
				continue
			}
			for j := range dim {
				d.X = append(d.X, cols[j][i])
			}
		}
		first += rows
	}
	if deferNames {
		if row, err := lab.resolve(d.Y, false); err != nil {
			if row > 0 {
				return nil, formatErr(path, nil, "row %d, column %q: %v", row, label.name, err)
			}
			return nil, formatErr(path, nil, "column %q: %v", label.name, err)
		}
	}
	var err error
	if d.Classes, d.LabelNames, err = lab.finish(d.Y); err != nil {
		return nil, formatErr(path, nil, "column %q: %v", label.name, err)
	}
	return d, nil
}

// checkChunk checks a column chunk's metadata and pages (scanChunk) before
// parquet-go reads it. codecs holds each leaf column's codec, which
// parquet-go takes from the first row group for all of them.
func checkChunk(pf *parquet.File, cc *format.ColumnChunk, size, rows int64, codecs map[int]format.CompressionCodec, leaf int) error {
	m := &cc.MetaData
	if cc.FilePath != "" {
		return fmt.Errorf("data in another file (%q) is not supported", cc.FilePath)
	}
	if codec, ok := codecs[leaf]; !ok {
		codecs[leaf] = m.Codec
	} else if codec != m.Codec {
		return fmt.Errorf("compression codec %v differs from the first row group's %v", m.Codec, codec)
	}
	start := m.DataPageOffset
	if m.DictionaryPageOffset != 0 {
		start = m.DictionaryPageOffset
	}
	if start < 4 || m.TotalCompressedSize < 0 || m.TotalCompressedSize > size-8-start {
		return fmt.Errorf("column chunk [%d, +%d) is outside the file", start, m.TotalCompressedSize)
	}
	if m.NumValues != rows {
		return fmt.Errorf("%d values for %d rows", m.NumValues, rows)
	}
	return scanChunk(pf, start, start+m.TotalCompressedSize, chunkLimits{
		codec:    codecs[leaf],
		rows:     rows,
		maxBytes: 8 * int64(maxReadValues),
	})
}

// readParquetColumn calls fn with each value of a column chunk of a
// non-repeated column and its index in the row group, which must have
// rows rows.
func readParquetColumn(chunk parquet.ColumnChunk, rows int64, fn func(i int64, v parquet.Value) error) error {
	pages := chunk.Pages()
	defer pages.Close()
	vals := make([]parquet.Value, 1024)
	var i int64
	for {
		p, err := pages.ReadPage()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		vr := p.Values()
		for {
			n, err := vr.ReadValues(vals)
			if int64(n) > rows-i {
				parquet.Release(p)
				return fmt.Errorf("more values than the row group's %d rows", rows)
			}
			for _, v := range vals[:n] {
				if err := fn(i, v); err != nil {
					parquet.Release(p)
					return err
				}
				i++
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				parquet.Release(p)
				return err
			}
		}
		parquet.Release(p)
	}
	if i != rows {
		return fmt.Errorf("%d values for the row group's %d rows", i, rows)
	}
	return nil
}

// parquetNumber returns a numeric value as a float64 (booleans as 0 or 1).
func parquetNumber(v parquet.Value, c parquetColumn) float64 {
	switch c.kind {
	case parquet.Boolean:
		if v.Boolean() {
			return 1
		}
		return 0
	case parquet.Int32:
		if c.unsigned {
			return float64(v.Uint32())
		}
		return float64(v.Int32())
	case parquet.Int64:
		if c.unsigned {
			return float64(v.Uint64())
		}
		return float64(v.Int64())
	case parquet.Float:
		return float64(v.Float())
	}
	return v.Double()
}

// parquetLabel returns the class of a label value: an integer, a float
// holding an integer, or a string (a name, deferred when deferNames).
func parquetLabel(lab *labeler, v parquet.Value, c parquetColumn, deferNames bool, row int) (int32, error) {
	switch c.kind {
	case parquet.ByteArray:
		s := string(v.ByteArray())
		if deferNames {
			return lab.deferName(s, row)
		}
		return lab.fromText(s)
	case parquet.Float, parquet.Double:
		return lab.fromFloat(parquetNumber(v, c))
	case parquet.Int64:
		if c.unsigned && v.Uint64() > 1<<62 {
			return 0, fmt.Errorf("label %d is too large", v.Uint64())
		}
	}
	return lab.fromInt(int64(parquetNumber(v, c)))
}
