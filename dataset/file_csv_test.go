package dataset

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestReadFileCSVHeader(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "pets.csv", []byte("w, species ,h\n1.5,dog,2\n# comment\n3,cat,-4\n5, dog,6e1\n"))
	d, err := ReadFile(path, FileOptions{LabelColumn: "species"})
	checkRead(t, d, err, []float32{1.5, 2, 3, -4, 5, 60}, []int32{1, 0, 1}, nil, 2, []string{"cat", "dog"})

	// Feature columns by name, in the order given; explicit class names.
	d, err = ReadFile(path, FileOptions{LabelColumn: "species", FeatureColumns: []string{"h"}, Labels: []string{"dog", "bird", "cat"}})
	checkRead(t, d, err, []float32{2, -4, 60}, []int32{0, 2, 0}, nil, 3, []string{"dog", "bird", "cat"})

	// Integer labels in a header file.
	path = writeFile(t, dir, "ints.csv", []byte("a,label\n1,2\n3,0\n"))
	d, err = ReadFile(path, FileOptions{LabelColumn: "label"})
	checkRead(t, d, err, []float32{1, 3}, []int32{2, 0}, nil, 3, nil)
	d, err = ReadFile(path, FileOptions{LabelColumn: "label", Classes: 5, InputShape: []int{1}})
	checkRead(t, d, err, []float32{1, 3}, []int32{2, 0}, []int{1}, 5, nil)
	// Integers written as text, mapped through Labels.
	d, err = ReadFile(path, FileOptions{LabelColumn: "label", Labels: []string{"2", "0"}})
	checkRead(t, d, err, []float32{1, 3}, []int32{0, 1}, nil, 2, []string{"2", "0"})

	// Mixed names and numbers are names, sorted as strings.
	path = writeFile(t, dir, "mixed.csv", []byte("label,a\n10,1\n9,2\nx,3\n"))
	d, err = ReadFile(path, FileOptions{LabelColumn: "label"})
	checkRead(t, d, err, []float32{1, 2, 3}, []int32{0, 1, 2}, nil, 3, []string{"10", "9", "x"})
}

func TestReadFileCSVLegacy(t *testing.T) {
	path := writeFile(t, t.TempDir(), "legacy.csv", []byte("2, 1.5,-3\n0,0,1e3\n"))
	d, err := ReadFile(path, FileOptions{})
	checkRead(t, d, err, []float32{1.5, -3, 0, 1000}, []int32{2, 0}, nil, 3, nil)
	// The same file through ReadCSV, the legacy reader it matches.
	d2, err := ReadCSV(strings.NewReader("2, 1.5,-3\n0,0,1e3\n"), DefaultCSVOptions())
	if err != nil || d2.ContentHash() != d.ContentHash() {
		t.Fatalf("ReadCSV gives a different dataset (%v)", err)
	}
	d, err = ReadFile(path, FileOptions{Labels: []string{"0", "1", "2"}})
	checkRead(t, d, err, []float32{1.5, -3, 0, 1000}, []int32{2, 0}, nil, 3, []string{"0", "1", "2"})
}

func TestReadFileCSVErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		name, data string
		o          FileOptions
		want       []string
	}{
		{"missing label column", "a,b\n1,2\n", FileOptions{LabelColumn: "y"}, []string{`:1: no column "y"`, `["a", "b"]`}},
		{"missing feature column", "a,y\n1,2\n", FileOptions{LabelColumn: "y", FeatureColumns: []string{"a", "c"}}, []string{`no column "c"`}},
		{"duplicate label column", "y,a,y\n1,2,3\n", FileOptions{LabelColumn: "y"}, []string{`column "y" appears more than once`}},
		{"label only", "y\n1\n", FileOptions{LabelColumn: "y"}, []string{"no feature columns"}},
		{"non-numeric", "a,y\n1,0\nabc,1\n", FileOptions{LabelColumn: "y"}, []string{`:3: column "a": "abc" is not a finite number`}},
		{"nan", "a,y\n1,0\nNaN,1\n", FileOptions{LabelColumn: "y"}, []string{`:3: column "a": "NaN"`}},
		{"inf", "y,a\n0,+Inf\n", FileOptions{LabelColumn: "y"}, []string{`:2: column "a": "+Inf"`}},
		{"float32 overflow", "y,a\n0,1e39\n", FileOptions{LabelColumn: "y"}, []string{`:2: column "a"`}},
		{"negative label", "y,a\n0,1\n-1,2\n", FileOptions{LabelColumn: "y"}, []string{`:3: column "y": label -1 is not a non-negative integer`}},
		{"fractional label", "y,a\n0,1\n# c\n1.5,2\n", FileOptions{LabelColumn: "y"}, []string{`:4: column "y": label "1.5"`}},
		{"label ≥ classes", "y,a\n0,1\n7,2\n", FileOptions{LabelColumn: "y", Classes: 3}, []string{`:3: column "y": label 7 with only 3 classes`}},
		{"duplicate header name", "a,b,a,y\n1,2,3,0\n", FileOptions{LabelColumn: "y"}, []string{`column "a" appears more than once in the header`}},
		{"outside float32", "a,y\n1e308,0\n", FileOptions{LabelColumn: "y"}, []string{`:2: column "a": "1e308" is outside float32's range`}},
		{"label not in Labels", "y,a\ncat,1\nemu,2\n", FileOptions{LabelColumn: "y", Labels: []string{"cat", "dog"}}, []string{`:3: column "y": label "emu" is not one of the class names ["cat", "dog"]`}},
		{"names vs classes", "y,a\ncat,1\nemu,2\n", FileOptions{LabelColumn: "y", Classes: 3}, []string{"2 distinct names but the number of classes (--classes) is 3", "(--labels)"}},
		{"short row", "y,a\n0,1\n1\n", FileOptions{LabelColumn: "y"}, []string{":3: 1 columns, want 2"}},
		{"quote", "y,a\n0,\"1\n", FileOptions{LabelColumn: "y"}, []string{":2:"}},
		{"header only", "y,a\n", FileOptions{LabelColumn: "y"}, []string{"no data rows"}},
		{"empty", "", FileOptions{}, []string{"no data rows"}},
		{"legacy non-numeric", "0,1\n1,x\n", FileOptions{}, []string{`:2: column 2: "x" is not a finite number`}},
		{"legacy string label", "cat,1\n", FileOptions{}, []string{`:1: column 1: label "cat" is not a non-negative integer`}},
		{"legacy one column", "1\n", FileOptions{}, []string{":1: 1 column(s)"}},
		{"huge label", "2000000000,1\n", FileOptions{}, []string{"set --classes"}},
		{"one outlier label", "y,a\n0,1\n# c\n1,2\n50000,3\n2,4\n", FileOptions{LabelColumn: "y"},
			[]string{"label 50000 in data row 3 would make 50001 classes", "only 4 distinct labels", "--classes", "--labels"}},
		{"empty label", "y,a\ncat,1\n,2\n", FileOptions{LabelColumn: "y"}, []string{`:3: column "y": label "" is empty`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, dir, strings.ReplaceAll(tt.name, " ", "_")+".csv", []byte(tt.data))
			_, err := ReadFile(path, tt.o)
			wantErr(t, err, ErrFormat, append([]string{path}, tt.want...)...)
			if !errors.Is(err, ErrCSV) {
				t.Errorf("error %q does not wrap ErrCSV", err)
			}
		})
	}
}

// FuzzReadFileCSV checks that arbitrary CSV files never panic ReadFile, in
// the legacy and the header format, and that every accepted file gives a
// valid dataset.
func FuzzReadFileCSV(f *testing.F) {
	lowerReadLimit(f)
	f.Add([]byte("w,species,h\n1.5,dog,2\n3,cat,-4\n"), "species", false)
	f.Add([]byte("a,label\n1,2\n3,0\n"), "label", true)
	f.Add([]byte("2, 1.5,-3\n0,0,1e3\n"), "", false)
	f.Add([]byte("0,\"1\n"), "", true)
	f.Fuzz(func(t *testing.T, data []byte, label string, labels bool) {
		o := FileOptions{LabelColumn: label}
		if labels {
			o.Labels = []string{"0", "1", "cat"}
		}
		fuzzReadFile(t, "f.csv", data, false, o)
	})
}

// TestReadFileCSVInferredClasses: integer labels infer max + 1 classes
// unless that is more than 100 classes and more than twice the distinct
// labels seen (one stray label); --classes (Classes) or --labels keep the
// count the user gives.
func TestReadFileCSVInferredClasses(t *testing.T) {
	dir := t.TempDir()
	rows := func(labels ...int) []byte {
		var b strings.Builder
		b.WriteString("y,a\n")
		for _, l := range labels {
			fmt.Fprintf(&b, "%d,1\n", l)
		}
		return []byte(b.String())
	}
	every := make([]int, 151) // 0…150: 151 classes, all seen
	for i := range every {
		every[i] = i
	}
	for _, tt := range []struct {
		name    string
		labels  []int
		o       FileOptions
		classes int // 0: refused
	}{
		{"small count, sparse", []int{0, 99}, FileOptions{}, 100},
		{"101 classes, 2 seen", []int{0, 100}, FileOptions{}, 0},
		{"every label seen", every, FileOptions{}, 151},
		{"half seen", every[:76:76], FileOptions{}, 76},
		{"151 classes, 75 seen", append(slices.Clone(every[:74]), 150), FileOptions{}, 0},
		{"151 classes, 76 seen", append(slices.Clone(every[:75]), 150), FileOptions{}, 151},
		{"outlier with Classes", []int{0, 1, 50000}, FileOptions{Classes: 50001}, 50001},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.o
			o.LabelColumn = "y"
			d, err := ReadFile(writeFile(t, dir, strings.ReplaceAll(tt.name, " ", "_")+".csv", rows(tt.labels...)), o)
			switch {
			case tt.classes == 0 && err == nil:
				t.Fatalf("accepted with %d classes; want the outlier refused", d.Classes)
			case tt.classes == 0:
				wantErr(t, err, ErrFormat, "would make", "--classes")
			case err != nil:
				t.Fatal(err)
			case d.Classes != tt.classes:
				t.Errorf("got %d classes, want %d", d.Classes, tt.classes)
			}
		})
	}
}

// TestReadFileCSVFeatureNamesAndOptionalLabel: a header file's Dataset
// names its features in feature order; with LabelOptional a file without
// the label column reads unlabeled (every label 0), and a file with it
// reads as usual.
func TestReadFileCSVFeatureNamesAndOptionalLabel(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "pets.csv", []byte("w,species,h\n1.5,dog,2\n3,cat,-4\n"))
	d, err := ReadFile(path, FileOptions{LabelColumn: "species", FeatureColumns: []string{"h", "w"}})
	if err != nil || !slices.Equal(d.FeatureNames, []string{"h", "w"}) || d.Unlabeled {
		t.Fatalf("feature names %q, unlabeled %v (%v)", d.FeatureNames, d != nil && d.Unlabeled, err)
	}
	d, err = ReadFile(path, FileOptions{LabelColumn: "species", LabelOptional: true, Labels: []string{"cat", "dog"}})
	checkRead(t, d, err, []float32{1.5, 2, 3, -4}, []int32{1, 0}, nil, 2, []string{"cat", "dog"})
	if !slices.Equal(d.FeatureNames, []string{"w", "h"}) || d.Unlabeled {
		t.Errorf("feature names %q, unlabeled %v", d.FeatureNames, d.Unlabeled)
	}

	path = writeFile(t, dir, "unlabeled.csv", []byte("h,w\n2,1.5\n-4,3\n"))
	d, err = ReadFile(path, FileOptions{LabelColumn: "species", LabelOptional: true, FeatureColumns: []string{"w", "h"}, Classes: 2})
	checkRead(t, d, err, []float32{1.5, 2, 3, -4}, []int32{0, 0}, nil, 2, nil)
	if !d.Unlabeled || !slices.Equal(d.FeatureNames, []string{"w", "h"}) {
		t.Errorf("unlabeled %v, feature names %q", d.Unlabeled, d.FeatureNames)
	}
	if _, err := ReadFile(path, FileOptions{LabelColumn: "species", Classes: 2}); err == nil || !strings.Contains(err.Error(), `no column "species"`) {
		t.Errorf("without LabelOptional: %v", err)
	}
}
