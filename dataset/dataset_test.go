package dataset

import (
	"errors"
	"math"
	"slices"
	"testing"
)

func tiny() *Dataset {
	return &Dataset{
		Name:    "tiny",
		X:       []float32{0, 1, 2, 3, 4, 5, 6, 7},
		Y:       []int32{0, 1, 2, 1},
		Dim:     2,
		Classes: 3,
	}
}

func TestRowAliases(t *testing.T) {
	d := tiny()
	r := d.Row(2)
	if got, want := r, []float32{4, 5}; !slices.Equal(got, want) {
		t.Fatalf("Row(2) = %v, want %v", got, want)
	}
	r[0] = 40
	if d.X[4] != 40 {
		t.Fatalf("Row does not alias X")
	}
	if cap(r) != 2 {
		t.Fatalf("cap(Row) = %d, want 2 (append must not clobber the next row)", cap(r))
	}
}

func TestSubsetCopies(t *testing.T) {
	d := tiny()
	d.Shape = []int{2}
	s := d.Subset([]int{3, 0, 3})
	if got, want := s.X, []float32{6, 7, 0, 1, 6, 7}; !slices.Equal(got, want) {
		t.Fatalf("Subset X = %v, want %v", got, want)
	}
	if got, want := s.Y, []int32{1, 0, 1}; !slices.Equal(got, want) {
		t.Fatalf("Subset Y = %v, want %v", got, want)
	}
	s.X[0], s.Shape[0] = 99, 7
	if d.X[6] != 6 || d.Shape[0] != 2 {
		t.Fatalf("Subset aliases its source")
	}
	if err := d.Subset(nil).Validate(); err != nil {
		t.Fatalf("empty subset invalid: %v", err)
	}
}

func TestGatherNoAlloc(t *testing.T) {
	d := tiny()
	x := make([]float32, 4)
	y := make([]int32, 2)
	idx := []int{1, 2}
	allocs := testing.AllocsPerRun(100, func() { d.Gather(x, y, idx) })
	if allocs != 0 {
		t.Fatalf("Gather allocates %v times", allocs)
	}
	if got, want := x, []float32{2, 3, 4, 5}; !slices.Equal(got, want) {
		t.Fatalf("Gather X = %v, want %v", got, want)
	}
	if got, want := y, []int32{1, 2}; !slices.Equal(got, want) {
		t.Fatalf("Gather Y = %v, want %v", got, want)
	}
	d.Gather(x[:2], nil, []int{3})
	if got, want := x[:2], []float32{6, 7}; !slices.Equal(got, want) {
		t.Fatalf("Gather without labels X = %v, want %v", got, want)
	}
}

func TestGatherPanicsOnShortBuffer(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	tiny().Gather(make([]float32, 3), nil, []int{0, 1})
}

func TestValidate(t *testing.T) {
	nan := float32(math.NaN())
	tests := []struct {
		name string
		mod  func(d *Dataset)
		ok   bool
	}{
		{"ok", func(d *Dataset) {}, true},
		{"shape ok", func(d *Dataset) { d.Shape = []int{1, 2} }, true},
		{"nil shape means dim", func(d *Dataset) { d.Shape = nil }, true},
		{"dim 0", func(d *Dataset) { d.Dim = 0; d.X = nil }, false},
		{"len mismatch", func(d *Dataset) { d.X = d.X[:7] }, false},
		{"label too big", func(d *Dataset) { d.Y[3] = 3 }, false},
		{"label negative", func(d *Dataset) { d.Y[0] = -1 }, false},
		{"no classes", func(d *Dataset) { d.Classes = 0 }, false},
		{"nan", func(d *Dataset) { d.X[5] = nan }, false},
		{"inf", func(d *Dataset) { d.X[0] = float32(math.Inf(-1)) }, false},
		{"shape product", func(d *Dataset) { d.Shape = []int{3} }, false},
		{"shape zero", func(d *Dataset) { d.Shape = []int{0, 2} }, false},
		{"shape overflow", func(d *Dataset) { d.Shape = []int{1 << 40, 1 << 40, 2} }, false},
		{"tokens ok", func(d *Dataset) { d.Vocab = 8; d.X[0] = -1 }, true},
		{"token too big", func(d *Dataset) { d.Vocab = 7 }, false},
		{"token fractional", func(d *Dataset) { d.Vocab = 8; d.X[1] = 0.5 }, false},
		{"token below pad", func(d *Dataset) { d.Vocab = 8; d.X[1] = -2 }, false},
		{"vocab too big", func(d *Dataset) { d.Vocab = MaxTokenID + 1 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := tiny()
			tt.mod(d)
			err := d.Validate()
			if got := err == nil; got != tt.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
		})
	}
	var nilD *Dataset
	if nilD.Validate() == nil {
		t.Fatal("nil dataset validated")
	}
}

// TestContentHash: the hash depends on every feature, label and the shape,
// not on the name, and is the same for the same content.
func TestContentHash(t *testing.T) {
	mk := func() *Dataset {
		return &Dataset{Name: "a", X: []float32{1, 2, 3, 4, 5, 6}, Y: []int32{0, 1, 1}, Dim: 2, Classes: 2}
	}
	base := mk().ContentHash()
	if len(base) != 64 {
		t.Fatalf("hash %q", base)
	}
	renamed := mk()
	renamed.Name = "b"
	if renamed.ContentHash() != base {
		t.Error("the name changed the hash")
	}
	for name, change := range map[string]func(*Dataset){
		"feature": func(d *Dataset) { d.X[4] = 5.0000005 },
		"label":   func(d *Dataset) { d.Y[2] = 0 },
		"shape":   func(d *Dataset) { d.Dim, d.Y = 3, d.Y[:2] },
		"classes": func(d *Dataset) { d.Classes = 3 },
	} {
		d := mk()
		change(d)
		if d.ContentHash() == base {
			t.Errorf("changing the %s kept the hash", name)
		}
	}
}
