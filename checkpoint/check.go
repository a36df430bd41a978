package checkpoint

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// ErrMismatch is returned, wrapped with a one-line summary, by Check for a
// checkpoint that lacks a required tensor, holds one of the wrong shape, or
// holds one of a type ReadFloat32 does not convert.
var ErrMismatch = errors.New("checkpoint: the checkpoint does not fit the model")

// Source says where Check found an expected parameter.
type Source struct {
	Name  string // the Expected name
	File  string // the file's name for it: Name, without the base prefix, or a tied tensor's name
	DType DType
}

// Mismatch is a tensor whose shape is not the expected one.
type Mismatch struct {
	Name  string // the file's name
	Shape []int  // the file's shape
	Want  []int
}

// Report is what Check found, each list in the order of the Expected
// list given to it, except Unexpected, which is sorted.
type Report struct {
	// Present are the expected parameters the file holds, with the right
	// shape and a float type: what to read, and from where.
	Present []Source
	// Missing are required parameters the file lacks (an error).
	Missing []string
	// Fresh are optional parameters the file lacks: a head or a pooler
	// the model initializes afresh.
	Fresh []string
	// Tied are the expected tensors that share another's values
	// (Expected.TiedTo), whether or not the file holds them.
	Tied []string
	// Mismatched are tensors of the wrong shape (an error).
	Mismatched []Mismatch
	// WrongType are expected parameters the file holds in a type
	// ReadFloat32 does not convert (an error).
	WrongType []TensorInfo
	// Buffers are the known non-parameters the file holds (Expected.Buffer),
	// by the file's names; nothing reads them.
	Buffers []string
	// Unexpected are the file's tensors that no Expected names: another
	// head's (BertForPreTraining's cls.*, say). Nothing reads them.
	Unexpected []string
	// Stripped is the base-model prefix the file's names lack ("" when
	// they carry it, or none applies; comma-separated should a list give
	// several).
	Stripped string
}

// Check compares the tensors of f with want (typically cfg.Expected(head))
// and reports, without reading any tensor, where each expected parameter
// is, which are missing or initialized afresh, which shapes differ, and
// which file tensors are known buffers or unexpected.
//
// Names: a file whose tensor names carry none of the base prefix of want
// (Expected.Prefix) but hold the names without it, as a bare base model's
// checkpoint does, is matched without the prefix. A tied tensor
// (Expected.TiedTo) found under its own name supplies the tensor it is
// tied to when that one is absent.
//
// The Report is complete whatever the outcome; the error, when the file
// lacks a required parameter or holds one of the wrong shape or type, is
// one line wrapping ErrMismatch.
func Check(f *File, want []Expected) (Report, error) {
	var r Report
	stripped := stripPrefixes(f, want)
	fileName := func(e Expected) string {
		if e.Prefix != "" && stripped[e.Prefix] {
			return strings.TrimPrefix(e.Name, e.Prefix)
		}
		return e.Name
	}
	r.Stripped = strings.Join(slices.Sorted(maps.Keys(stripped)), ", ")
	used := map[string]bool{}
	// shape checks a file tensor against e: it reports a mismatch and
	// says whether the shapes agree.
	shape := func(ti TensorInfo, e Expected) bool {
		used[ti.Name] = true
		if !slices.Equal(ti.Shape, e.Shape) {
			r.Mismatched = append(r.Mismatched, Mismatch{Name: ti.Name, Shape: ti.Shape, Want: e.Shape})
			return false
		}
		return true
	}
	tiedFrom := map[string]TensorInfo{} // a tied tensor found in the file, by the name it is tied to
	for _, e := range want {
		if e.TiedTo == "" || e.Buffer {
			continue
		}
		r.Tied = append(r.Tied, e.Name)
		if ti, ok := f.Tensor(fileName(e)); ok && shape(ti, e) {
			tiedFrom[e.TiedTo] = ti
		}
	}
	for _, e := range want {
		if e.TiedTo != "" {
			continue
		}
		ti, ok := f.Tensor(fileName(e))
		switch {
		case e.Buffer:
			if ok {
				used[ti.Name] = true
				r.Buffers = append(r.Buffers, ti.Name)
			}
			continue
		case !ok:
			ti, ok = tiedFrom[e.Name]
		}
		switch {
		case !ok && e.Optional:
			r.Fresh = append(r.Fresh, e.Name)
		case !ok:
			r.Missing = append(r.Missing, e.Name)
		case !shape(ti, e):
		case !ti.DType.Float():
			r.WrongType = append(r.WrongType, ti)
		default:
			r.Present = append(r.Present, Source{Name: e.Name, File: ti.Name, DType: ti.DType})
		}
	}
	for _, ti := range f.Tensors() {
		if !used[ti.Name] {
			r.Unexpected = append(r.Unexpected, ti.Name)
		}
	}
	return r, r.Err()
}

// stripPrefixes returns the base prefixes of want that f's names leave
// out: those no file tensor starts with, while some expected tensor's name
// without the prefix is in the file.
func stripPrefixes(f *File, want []Expected) map[string]bool {
	out := map[string]bool{}
	for _, e := range want {
		p := e.Prefix
		if p == "" || out[p] || e.Buffer {
			continue
		}
		if _, ok := f.Tensor(strings.TrimPrefix(e.Name, p)); !ok {
			continue
		}
		carried := false
		for name := range f.tensors {
			if strings.HasPrefix(name, p) {
				carried = true
				break
			}
		}
		if !carried {
			out[p] = true
		}
	}
	return out
}

// Err returns the Report's verdict: nil when every required parameter is
// present with the right shape and a float type, else one line wrapping
// ErrMismatch that counts and names the problems (the first few of each
// kind).
func (r Report) Err() error {
	var parts []string
	if n := len(r.Missing); n > 0 {
		parts = append(parts, fmt.Sprintf("%d required %s missing (%s)", n, plural(n, "tensor", "tensors"), firstFew(r.Missing)))
	}
	if n := len(r.Mismatched); n > 0 {
		s := make([]string, n)
		for i, m := range r.Mismatched {
			s[i] = fmt.Sprintf("%s is %v, want %v", m.Name, m.Shape, m.Want)
		}
		parts = append(parts, fmt.Sprintf("%d of the wrong shape (%s)", n, firstFew(s)))
	}
	if n := len(r.WrongType); n > 0 {
		s := make([]string, n)
		for i, t := range r.WrongType {
			s[i] = fmt.Sprintf("%s is %s", t.Name, t.DType)
		}
		parts = append(parts, fmt.Sprintf("%d of a type other than F32, F16, BF16, F64 (%s)", n, firstFew(s)))
	}
	if parts == nil {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrMismatch, strings.Join(parts, "; "))
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// firstFew joins the first items of s, saying how many more there are.
func firstFew(s []string) string {
	const few = 4
	if len(s) <= few {
		return strings.Join(s, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(s[:few], ", "), len(s)-few)
}
