package dataset

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// labeler maps label values to classes by FileOptions' rules (Labels and
// Classes, see FileOptions). Its errors carry no position: callers add the
// file, row and column.
//
// Labels come in three kinds: integers (class = the integer), names looked
// up in a given list (Labels), and names without a list, which are
// deferred: Y holds provisional ids (distinct names in first-seen order)
// until resolve sorts the names and rewrites Y with the final classes.
type labeler struct {
	names      []string         // the class names (FileOptions.Labels); nil if none
	index      map[string]int32 // names → class
	byIndex    bool             // integer labels index names (no name is an integer)
	numbers    bool             // without names, strings are class numbers too (FileOptions.IndexLabels)
	classes    int              // the class count to enforce; 0 infers it
	classesOpt string           // the option that sets classes, for messages
	maxInt     int64            // largest integer label so far; -1 if none

	texts    []string         // deferred names, first-seen order
	textID   map[string]int32 // texts → provisional id
	firstRow []int            // row where each deferred name first appears
	resolved []string         // the class names after resolve
}

// newLabeler returns a labeler for the class names (nil: none) and class
// count (0: infer) that the option classesOpt sets.
func newLabeler(names []string, classes int, classesOpt string) *labeler {
	l := &labeler{names: names, classes: classes, classesOpt: classesOpt, maxInt: -1}
	if names != nil {
		l.index = make(map[string]int32, len(names))
		l.byIndex = true
		for i, n := range names {
			l.index[n] = int32(i)
			if _, err := strconv.ParseInt(n, 10, 64); err == nil {
				// A name such as "7" would make the integer 7 mean two
				// classes; such names keep meaning themselves.
				l.byIndex = false
			}
		}
	}
	return l
}

// fileLabeler returns the labeler of a data file read with o.
func fileLabeler(o FileOptions) *labeler {
	l := newLabeler(o.Labels, o.Classes, "--classes")
	l.numbers = o.IndexLabels && o.Labels == nil
	return l
}

// defers says whether string labels are names whose classes are known
// only once every label is read (labeler.deferName): no class names are
// given, and strings are not class numbers.
func (l *labeler) defers() bool { return l.names == nil && !l.numbers }

// lookup returns the class of the name s in the given list, or, when
// integer labels index the names, of s read as such an integer.
func (l *labeler) lookup(s string) (int32, error) {
	c, ok := l.index[s]
	if ok {
		return c, nil
	}
	if l.byIndex {
		if v, err := strconv.ParseInt(s, 10, 64); err == nil {
			return l.fromInt(v)
		}
		return 0, fmt.Errorf("label %q is not one of the class names %s (nor a class number 0..%d)", s, quoteList(l.names, 8), len(l.names)-1)
	}
	return 0, fmt.Errorf("label %q is not one of the class names %s", s, quoteList(l.names, 8))
}

// fromInt returns the class of the integer label v: v itself, or with
// Labels the index v into them (byIndex), or the name v written in
// decimal.
func (l *labeler) fromInt(v int64) (int32, error) {
	if l.names != nil {
		if !l.byIndex {
			return l.lookup(strconv.FormatInt(v, 10))
		}
		if v < 0 || v >= int64(len(l.names)) {
			return 0, fmt.Errorf("label %d is not a class number 0..%d of the class names %s (an integer label indexes them: 0 is %q)",
				v, len(l.names)-1, quoteList(l.names, 8), l.names[0])
		}
		return int32(v), nil
	}
	switch {
	case v < 0:
		return 0, fmt.Errorf("label %d is not a non-negative integer", v)
	case l.classes > 0 && v >= int64(l.classes):
		return 0, fmt.Errorf("label %d with only %d classes", v, l.classes)
	case v > math.MaxInt32:
		return 0, fmt.Errorf("label %d is too large", v)
	}
	l.maxInt = max(l.maxInt, v)
	return int32(v), nil
}

// fromFloat returns the class of a label stored as a float, which must be
// an exact integer.
func (l *labeler) fromFloat(v float64) (int32, error) {
	if v != math.Trunc(v) || math.Abs(v) > 1<<62 { // also NaN and ±Inf
		return 0, fmt.Errorf("label %v is not a non-negative integer", v)
	}
	return l.fromInt(int64(v))
}

// fromText returns the class of a label written as text: a name in Labels,
// or without Labels a non-negative integer.
func (l *labeler) fromText(s string) (int32, error) {
	if l.names != nil {
		return l.lookup(s)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil && l.numbers && l.classes > 0 {
		return 0, fmt.Errorf("label %q is not a class number 0..%d: the run gives only the number of classes, so labels must be those numbers; "+
			"to train on named labels, give the class names in class order (labels: in the run file, or --labels)", s, l.classes-1)
	}
	if err != nil {
		return 0, fmt.Errorf("label %q is not a non-negative integer", s)
	}
	return l.fromInt(v)
}

// deferName returns the provisional id of the name s, first seen at row.
func (l *labeler) deferName(s string, row int) (int32, error) {
	if id, ok := l.textID[s]; ok {
		return id, nil
	}
	if len(l.texts) >= maxInferredClasses {
		return 0, fmt.Errorf("more than %d distinct labels; give the class names in class order (--labels)", maxInferredClasses)
	}
	if s == "" || strings.ContainsRune(s, 0) {
		return 0, fmt.Errorf("label %q is empty or contains a NUL byte", s)
	}
	if l.textID == nil {
		l.textID = make(map[string]int32)
	}
	id := int32(len(l.texts))
	l.textID[s] = id
	l.texts = append(l.texts, s)
	l.firstRow = append(l.firstRow, row)
	return id, nil
}

// resolve turns the provisional ids in y into classes. With sniff (CSV,
// whose cells have no type), names that are all numbers are read as
// integer labels; otherwise the classes are the distinct names in sorted
// order. An error comes with the row of the offending label (0 if none).
func (l *labeler) resolve(y []int32, sniff bool) (row int, err error) {
	if len(l.texts) == 0 {
		return 0, nil
	}
	class := make([]int32, len(l.texts))
	numeric := sniff
	for _, t := range l.texts {
		if _, err := strconv.ParseFloat(t, 64); err != nil {
			numeric = false
			break
		}
	}
	if numeric {
		for id, t := range l.texts { // first-seen order: the first error is at the lowest row
			if class[id], err = l.fromText(t); err != nil {
				return l.firstRow[id], err
			}
		}
	} else {
		l.resolved = slices.Clone(l.texts)
		slices.Sort(l.resolved)
		if l.classes > 0 && len(l.resolved) != l.classes {
			return 0, fmt.Errorf("the label column has %d distinct names but the number of classes (--classes) is %d; give the class names in class order instead (--labels)", len(l.resolved), l.classes)
		}
		for id, t := range l.texts {
			c, _ := slices.BinarySearch(l.resolved, t)
			class[id] = int32(c)
		}
	}
	for i, id := range y {
		y[i] = class[id]
	}
	return 0, nil
}

// Integer labels infer max + 1 classes, unless that count is driven by a
// stray label: more than sparseClassesMin classes and more than
// sparseClassesRatio times the distinct labels seen. A typo (50000 among
// labels 0…9) would otherwise build a 50,001-class model that trains and
// evaluates as if nothing were wrong. Up to sparseClassesMin classes cost
// little, so sparse small label sets (0 and 99) stay accepted.
const (
	sparseClassesMin   = 100
	sparseClassesRatio = 2
)

// finish returns the number of classes and the class names (nil for
// integer labels); y is the data's labels, to find an outlier that
// infers the class count (the rule at sparseClassesMin).
func (l *labeler) finish(y []int32) (classes int, names []string, err error) {
	switch {
	case l.names != nil:
		return len(l.names), slices.Clone(l.names), nil
	case l.resolved != nil:
		return len(l.resolved), l.resolved, nil
	case l.classes > 0:
		return l.classes, nil, nil
	case l.maxInt >= maxInferredClasses:
		return 0, nil, fmt.Errorf("label %d would infer more than %d classes; set %s", l.maxInt, maxInferredClasses, l.classesOpt)
	}
	classes = int(l.maxInt) + 1
	if classes > sparseClassesMin {
		seen, distinct, row := make([]bool, classes), 0, 0
		for i, c := range y {
			if !seen[c] {
				seen[c], distinct = true, distinct+1
			}
			if row == 0 && int64(c) == l.maxInt {
				row = i + 1
			}
		}
		if classes > sparseClassesRatio*distinct {
			return 0, nil, fmt.Errorf("label %d in data row %d would make %d classes but only %d distinct labels appear "+
				"(more than %d classes are inferred only when at least 1/%d of them appear): correct the label, "+
				"or set %s (or the class names, --labels) if it is right",
				l.maxInt, row, classes, distinct, sparseClassesMin, sparseClassesRatio, l.classesOpt)
		}
	}
	return classes, nil, nil
}

// quoteList formats names as a list of quoted strings, eliding all but
// the first most.
func quoteList(names []string, most int) string {
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		if i == most {
			fmt.Fprintf(&b, "… (%d in all)", len(names))
			break
		}
		b.WriteString(strconv.Quote(n))
	}
	return "[" + b.String() + "]"
}
