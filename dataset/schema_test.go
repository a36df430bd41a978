package dataset

import (
	"errors"
	"strings"
	"testing"
)

// TestSchema: a schema's String is canonical (it names the shape, the
// classes and the label set, whose hash covers every name and its order),
// Check names what differs with both values, and Validate refuses a schema
// that describes no data.
func TestSchema(t *testing.T) {
	d := &Dataset{Name: "site-a", Dim: 3, X: make([]float32, 6), Y: []int32{0, 2}, Classes: 3}
	ints := Schema{Shape: []int{3}, Classes: 3}
	if got := SchemaOf(d).String(); got != ints.String() || !strings.HasPrefix(got, "shape [3], 3 classes, label set ") {
		t.Fatalf("SchemaOf = %q, want %q", got, ints.String())
	}
	if err := ints.Check(d); err != nil {
		t.Fatal(err)
	}
	named := Schema{Shape: []int{3}, Classes: 3, Labels: []string{"low", "mid", "high"}}
	swapped := Schema{Shape: []int{3}, Classes: 3, Labels: []string{"mid", "low", "high"}}
	for _, s := range []Schema{named, swapped, {Shape: []int{1, 3}, Classes: 3}, {Shape: []int{3}, Classes: 4}, {Shape: []int{3}, Classes: 3, Vocab: 9}} {
		if s.String() == ints.String() {
			t.Errorf("%+v has the String of %+v", s, ints)
		}
	}
	if named.String() == swapped.String() {
		t.Error("the label order does not change the schema's String")
	}
	if !strings.Contains(named.String(), `["low" "mid" "high"]`) {
		t.Errorf("String %q does not list the label names", named.String())
	}
	long := Schema{Shape: []int{1}, Classes: 10, Labels: strings.Fields("a b c d e f g h i j")}
	if !strings.Contains(long.String(), `"h" …]`) {
		t.Errorf("String %q does not shorten a long label list", long.String())
	}

	for _, tc := range []struct {
		s    Schema
		want string
	}{
		{Schema{Shape: []int{4}, Classes: 3}, "input shape [3], the run's is [4]"},
		{Schema{Shape: []int{3}, Classes: 2}, "3 classes, the run's has 2"},
		{named, `labels the integers 0..2, the run's are ["low" "mid" "high"]`},
	} {
		err := tc.s.Check(d)
		if !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "site-a") {
			t.Errorf("Check against %v: %v, want ErrSchema naming site-a and %q", tc.s, err, tc.want)
		}
	}
	d.LabelNames = []string{"mid", "low", "high"}
	if err := named.Check(d); err == nil || !strings.Contains(err.Error(), `labels ["mid" "low" "high"], the run's are ["low" "mid" "high"]`) {
		t.Errorf("permuted labels: %v", err)
	}

	for _, bad := range []Schema{
		{Classes: 3}, {Shape: []int{0}, Classes: 3}, {Shape: []int{3}}, {Shape: []int{3}, Classes: 2, Labels: []string{"a"}},
		{Shape: []int{3}, Classes: 2, Labels: []string{"a", "a"}}, {Shape: []int{3}, Classes: 2, Labels: []string{"a", ""}},
		{Shape: []int{3}, Classes: 2, Vocab: -1},
	} {
		if err := bad.Validate(); !errors.Is(err, ErrSchema) {
			t.Errorf("Validate(%+v) = %v, want ErrSchema", bad, err)
		}
	}
	if err := named.Validate(); err != nil {
		t.Errorf("Validate(%+v) = %v", named, err)
	}
}
