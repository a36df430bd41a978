package dataset

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestReadCSV(t *testing.T) {
	in := "label,a,b\n# comment\n2, 1.5,-3\n0,0,1e3\n"
	o := DefaultCSVOptions()
	o.Header = true
	d, err := ReadCSV(strings.NewReader(in), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := d.X, []float32{1.5, -3, 0, 1000}; !slices.Equal(got, want) {
		t.Fatalf("X = %v, want %v", got, want)
	}
	if got, want := d.Y, []int32{2, 0}; !slices.Equal(got, want) {
		t.Fatalf("Y = %v, want %v", got, want)
	}
	if d.Dim != 2 || d.Classes != 3 || d.Name != "csv" {
		t.Fatalf("dim %d classes %d name %q", d.Dim, d.Classes, d.Name)
	}

	o = CSVOptions{LabelColumn: -1, Comma: ';', Classes: 5}
	d, err = ReadCSV(strings.NewReader("1;2;4\n3;4;0\n"), o)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := d.X, []float32{1, 2, 3, 4}; !slices.Equal(got, want) {
		t.Fatalf("last-column label: X = %v, want %v", got, want)
	}
	if got, want := d.Y, []int32{4, 0}; !slices.Equal(got, want) || d.Classes != 5 {
		t.Fatalf("last-column label: Y = %v, classes %d", got, d.Classes)
	}
}

func TestReadCSVErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		opts CSVOptions
		want string // substring of the error
	}{
		{"empty", "", CSVOptions{}, "no data rows"},
		{"header only", "a,b\n", CSVOptions{Header: true}, "no data rows"},
		{"non-numeric", "0,1\n1,x\n", CSVOptions{}, "line 2, column 2"},
		{"nan", "0,1\n1,NaN\n", CSVOptions{}, "line 2, column 2"},
		{"inf", "0,inf\n", CSVOptions{}, "line 1, column 2"},
		{"float32 overflow", "0,1e39\n", CSVOptions{}, "line 1, column 2"},
		{"fractional label", "0.5,1\n", CSVOptions{}, "line 1, column 1"},
		{"negative label", "-1,1\n", CSVOptions{}, "line 1, column 1"},
		{"label ≥ classes", "3,1\n", CSVOptions{Classes: 3}, "line 1, column 1"},
		{"short row", "0,1,2\n1,2\n", CSVOptions{}, "line 2: 2 columns, want 3"},
		{"row vs header", "a,b\n0,1,2\n", CSVOptions{Header: true}, "line 2: 3 columns, want 2"},
		{"one column", "1\n2\n", CSVOptions{}, "line 1: 1 column"},
		{"label column", "0,1\n", CSVOptions{LabelColumn: 2}, "label column 2"},
		{"label column negative", "0,1\n", CSVOptions{LabelColumn: -3}, "label column -3"},
		{"quote", "0,\"1\n", CSVOptions{}, "line"},
		{"huge label", "2000000000,1\n", CSVOptions{}, "set CSVOptions.Classes"},
		{"negative classes", "0,1\n", CSVOptions{Classes: -1}, "Classes -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadCSV(strings.NewReader(tt.in), tt.opts)
			if !errors.Is(err, ErrCSV) {
				t.Fatalf("error = %v, want ErrCSV", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not mention %q", err, tt.want)
			}
		})
	}
}

// FuzzReadCSV checks that arbitrary input never panics ReadCSV and that
// every accepted dataset is valid.
func FuzzReadCSV(f *testing.F) {
	f.Add("label,a,b\n2, 1.5,-3\n0,0,1e3\n", true, int8(0))
	f.Add("1;2;4\n3;4;0\n", false, int8(-1))
	f.Add("0,\"1\n", false, int8(1))
	f.Add("0,1\n1,NaN\n", false, int8(0))
	f.Fuzz(func(t *testing.T, in string, header bool, col int8) {
		d, err := ReadCSV(strings.NewReader(in), CSVOptions{Header: header, LabelColumn: int(col)})
		if err != nil {
			if !errors.Is(err, ErrCSV) {
				t.Fatalf("error %v does not wrap ErrCSV", err)
			}
			return
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("accepted input gives an invalid dataset: %v", err)
		}
	})
}
