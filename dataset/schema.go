package dataset

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ErrSchema is returned (wrapped, naming what differs and both values) by
// Schema.Check for data that does not have the run's schema, and by
// Schema.Validate for a schema that describes no data.
var ErrSchema = errors.New("dataset: data does not have the run's schema")

// Schema is what the data of every node must look like in a run whose
// nodes bring their own data: the per-example shape, the number of
// classes, the token vocabulary (0 for numeric features) and the class
// names in class order (nil: integer labels 0..Classes-1). A run file
// states it; the model is shaped by it; every node's data is checked
// against it, and the node reports its own data's schema (String) when it
// joins, which the leader compares with the run's.
type Schema struct {
	Shape   []int
	Classes int
	Vocab   int
	Labels  []string
}

// SchemaOf returns d's schema: its Shape (or [Dim]), Classes, Vocab and
// LabelNames.
func SchemaOf(d *Dataset) Schema {
	shape := d.Shape
	if shape == nil {
		shape = []int{d.Dim}
	}
	return Schema{Shape: slices.Clone(shape), Classes: d.Classes, Vocab: d.Vocab, Labels: slices.Clone(d.LabelNames)}
}

// Validate checks that s describes data: a shape of positive sizes, at
// least one class, a vocabulary in [0, MaxTokenID], and, if Labels is set,
// one distinct, non-empty name per class.
func (s Schema) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrSchema, fmt.Sprintf(format, args...))
	}
	if len(s.Shape) == 0 {
		return bad("no input shape")
	}
	for _, n := range s.Shape {
		if n < 1 {
			return bad("input shape %v has a size below 1", s.Shape)
		}
	}
	if s.Classes < 1 {
		return bad("%d classes: need at least 1", s.Classes)
	}
	if s.Vocab < 0 || s.Vocab > MaxTokenID {
		return bad("vocabulary %d outside [0, %d]", s.Vocab, MaxTokenID)
	}
	if s.Labels != nil {
		if len(s.Labels) != s.Classes {
			return bad("%d label names for %d classes", len(s.Labels), s.Classes)
		}
		seen := make(map[string]bool, len(s.Labels))
		for _, l := range s.Labels {
			if l == "" || seen[l] {
				return bad("label names %q: each must be non-empty and distinct", s.Labels)
			}
			seen[l] = true
		}
	}
	return nil
}

// labelSetShown is how many label names String lists before "…"; the
// hash of all of them follows in any case.
const labelSetShown = 8

// String is the schema's canonical one-line form, which nodes report and
// the run configuration holds (RunConfig.DataSchema): two schemas are the
// same exactly when their Strings are. It names the shape, the classes
// and the label set: its first names and the first 16 hex digits of
// LabelSetHash, which covers every name and their order.
func (s Schema) String() string {
	var b strings.Builder
	b.WriteString("shape [")
	for i, n := range s.Shape {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(n))
	}
	fmt.Fprintf(&b, "], %d classes", s.Classes)
	if s.Vocab > 0 {
		fmt.Fprintf(&b, ", vocabulary %d", s.Vocab)
	}
	if s.Labels != nil {
		shown := s.Labels[:min(len(s.Labels), labelSetShown)]
		b.WriteString(" [")
		for i, l := range shown {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(strconv.Quote(l))
		}
		if len(shown) < len(s.Labels) {
			b.WriteString(" …")
		}
		b.WriteByte(']')
	}
	fmt.Fprintf(&b, ", label set %.16s", LabelSetHash(s.Labels, s.Classes))
	return b.String()
}

// Check returns nil if d has schema s, else an error wrapping ErrSchema
// that names what differs, with d's value and the schema's.
func (s Schema) Check(d *Dataset) error {
	got := SchemaOf(d)
	var diffs []string
	if !slices.Equal(got.Shape, s.Shape) {
		diffs = append(diffs, fmt.Sprintf("input shape %v, the run's is %v", got.Shape, s.Shape))
	}
	if got.Classes != s.Classes {
		diffs = append(diffs, fmt.Sprintf("%d classes, the run's has %d", got.Classes, s.Classes))
	}
	if got.Vocab != s.Vocab {
		diffs = append(diffs, fmt.Sprintf("vocabulary %d, the run's is %d", got.Vocab, s.Vocab))
	}
	if LabelSetHash(got.Labels, got.Classes) != LabelSetHash(s.Labels, s.Classes) {
		diffs = append(diffs, fmt.Sprintf("labels %s, the run's are %s", labelList(got), labelList(s)))
	}
	if diffs == nil {
		return nil
	}
	return fmt.Errorf("%w: %s has %s", ErrSchema, d.Name, strings.Join(diffs, "; "))
}

// labelList names s's labels for an error message.
func labelList(s Schema) string {
	if s.Labels == nil {
		return fmt.Sprintf("the integers 0..%d", s.Classes-1)
	}
	return fmt.Sprintf("%q", s.Labels)
}
