package dataset

import (
	"testing"
)

// strLabel is a Parquet row with a string label.
type strLabel struct {
	Label string  `parquet:"label"`
	A     float32 `parquet:"a"`
}

// intLabel is a Parquet row with an integer label.
type intLabel struct {
	Label int32   `parquet:"label"`
	A     float32 `parquet:"a"`
}

// TestIntegerLabelsIndexNames: with class names that are not numbers,
// an integer label (NPY, NPZ, Parquet, or a CSV cell) is an index into
// them, so sites that store the label as a number and sites that store
// its name train on the same classes.
func TestIntegerLabelsIndexNames(t *testing.T) {
	dir := t.TempDir()
	names := []string{"alpha", "beta", "gamma"}
	o := FileOptions{Labels: names}

	path := writeFile(t, dir, "i.npy", npyFile(t, [][]float32{{2, 1}, {0, 2}, {1, 3}}))
	d, err := ReadFile(path, o)
	checkRead(t, d, err, []float32{1, 2, 3}, []int32{2, 0, 1}, nil, 3, names)

	path = npzFile(t, dir, "i.npz", map[string]any{"x": []float32{1, 2}, "y": []uint8{1, 0}})
	d, err = ReadFile(path, o)
	checkRead(t, d, err, []float32{1, 2}, []int32{1, 0}, nil, 3, names)

	path = parquetFile(t, dir, "i.parquet", []intLabel{{2, 1}, {0, 2}})
	d, err = ReadFile(path, o)
	checkRead(t, d, err, []float32{1, 2}, []int32{2, 0}, nil, 3, names)

	// A CSV cell may hold the name or the index, row by row.
	path = writeFile(t, dir, "h.csv", []byte("a,label\n1,gamma\n2,0\n3,1\n"))
	d, err = ReadFile(path, FileOptions{Labels: names, LabelColumn: "label"})
	checkRead(t, d, err, []float32{1, 2, 3}, []int32{2, 0, 1}, nil, 3, names)
	path = writeFile(t, dir, "l.csv", []byte("2,1\n0,2\n"))
	d, err = ReadFile(path, o)
	checkRead(t, d, err, []float32{1, 2}, []int32{2, 0}, nil, 3, names)

	// Out of range: the error names the names and the range.
	path = writeFile(t, dir, "o.npy", npyFile(t, [][]float32{{0, 1}, {3, 2}}))
	_, err = ReadFile(path, o)
	wantErr(t, err, ErrFormat, "label 3", `"alpha"`, "0..2")
	path = writeFile(t, dir, "o.csv", []byte("a,label\n1,delta\n"))
	_, err = ReadFile(path, FileOptions{Labels: names, LabelColumn: "label"})
	wantErr(t, err, ErrFormat, `label "delta"`, `"alpha"`)

	// Names that are numbers keep meaning themselves: the integer 1 is
	// the name "1", class 0.
	path = writeFile(t, dir, "n.npy", npyFile(t, [][]float32{{1, 1}, {0, 2}}))
	d, err = ReadFile(path, FileOptions{Labels: []string{"1", "0"}})
	checkRead(t, d, err, []float32{1, 2}, []int32{0, 1}, nil, 2, []string{"1", "0"})
}

// TestIndexLabels: FileOptions.IndexLabels reads every label as a class
// number, strings too (a Parquet string column, CSV names), so that a
// run that gives only its class count takes string labels "0".."K-1" as
// those classes whichever of them a file holds, and refuses names,
// saying how to give them.
func TestIndexLabels(t *testing.T) {
	dir := t.TempDir()
	o := FileOptions{Classes: 3, IndexLabels: true}

	// Only "0" and "2" appear: still classes 0 and 2 of 3, no names.
	path := parquetFile(t, dir, "s.parquet", []strLabel{{"2", 1}, {"0", 2}, {"2", 3}})
	d, err := ReadFile(path, o)
	checkRead(t, d, err, []float32{1, 2, 3}, []int32{2, 0, 2}, nil, 3, nil)

	path = writeFile(t, dir, "h.csv", []byte("a,label\n1,2\n2,0\n"))
	d, err = ReadFile(path, FileOptions{Classes: 3, IndexLabels: true, LabelColumn: "label"})
	checkRead(t, d, err, []float32{1, 2}, []int32{2, 0}, nil, 3, nil)

	for _, path := range []string{
		parquetFile(t, dir, "n.parquet", []strLabel{{"alpha", 1}}),
		writeFile(t, dir, "n.csv", []byte("a,label\n1,alpha\n")),
	} {
		fo := o
		fo.LabelColumn = "label"
		_, err = ReadFile(path, fo)
		wantErr(t, err, ErrFormat, `label "alpha"`, "0..2", "labels:")
	}
	path = parquetFile(t, dir, "r.parquet", []strLabel{{"3", 1}})
	_, err = ReadFile(path, o)
	wantErr(t, err, ErrFormat, "label 3", "3 classes")

	// Without IndexLabels a string label column still names its classes.
	path = parquetFile(t, dir, "p.parquet", []strLabel{{"b", 1}, {"a", 2}})
	d, err = ReadFile(path, FileOptions{Classes: 2})
	checkRead(t, d, err, []float32{1, 2}, []int32{1, 0}, nil, 2, []string{"a", "b"})
}
