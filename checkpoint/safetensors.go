package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/bits"
	"os"
	"slices"
	"strings"
	"unicode/utf8"
)

var (
	// ErrFormat is returned, wrapped with the reason, by Open and NewFile
	// for a file that is not a well-formed safetensors file: a header
	// that does not parse, a tensor whose shape, type or byte range is
	// wrong, byte ranges that overlap or leave a gap, a truncated file.
	ErrFormat = errors.New("checkpoint: bad safetensors file")
	// ErrDType is returned, wrapped, by ReadFloat32 for a tensor whose
	// element type it does not convert, and by Check for an expected
	// tensor of such a type.
	ErrDType = errors.New("checkpoint: unsupported tensor type")
	// ErrNoTensor is returned, wrapped, by ReadFloat32 for a name the file
	// does not hold.
	ErrNoTensor = errors.New("checkpoint: no such tensor")
)

// MaxHeader bounds the JSON header Open accepts, in bytes: the limit of
// the format's reference implementation (MAX_HEADER_SIZE in
// huggingface/safetensors safetensors/src/tensor.rs), which it sets
// against files built to exhaust a parser.
const MaxHeader = 100_000_000

// chunkBytes is the most file bytes ReadFloat32 holds at once.
const chunkBytes = 1 << 20

// TensorInfo describes one tensor of a File.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int
}

// Len returns the number of elements of the tensor: the product of its
// shape, 1 for a scalar (shape []).
func (t TensorInfo) Len() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// tensor is a TensorInfo with its byte range in the data section.
type tensor struct {
	TensorInfo
	begin, end int64
}

// File is an open safetensors file whose header has been read and
// checked. Its methods are safe for concurrent use: ReadFloat32 reads
// through io.ReaderAt and holds no state between calls.
type File struct {
	r       io.ReaderAt
	closer  io.Closer
	data    int64 // offset of the data section in r
	tensors map[string]tensor
	meta    map[string]string
}

// Open opens the safetensors file at path and checks its header and
// layout (NewFile lists the checks); no tensor data is read. The caller
// must Close the File.
func Open(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, err
	}
	f, err := NewFile(fh, st.Size())
	if err != nil {
		fh.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.closer = fh
	return f, nil
}

// NewFile reads the header of the safetensors file of size bytes that r
// holds and checks it, before any tensor is read, against the format
// (https://github.com/huggingface/safetensors, "Format", and its reference
// implementation's checks in safetensors/src/tensor.rs, read at commit
// 24b0b2857fef49be734b9ab72ce97c09bb25f5b9):
//
//  1. The first 8 bytes are the header's length N, little-endian, with
//     N ≤ MaxHeader and 8+N ≤ size.
//  2. The N header bytes are UTF-8 JSON: an object, starting with '{',
//     that may be padded with trailing whitespace, with no key twice.
//  3. The key "__metadata__", if present, maps strings to strings.
//  4. Every other key names a tensor: {"dtype", "shape", "data_offsets"},
//     the type one of the format's whole-byte types, every dimension
//     non-negative, and data_offsets [BEGIN, END] with BEGIN ≤ END and
//     END − BEGIN = product(shape) × the type's size, with no overflow.
//  5. The byte ranges, relative to the data section after the header, are
//     inside it (a file shorter than its header says is "truncated", with
//     the number of bytes missing), do not overlap, and cover it exactly:
//     the format requires the buffer to be "entirely indexed" with no
//     holes, so that no bytes hide between tensors (no polyglot files).
//
// Any failure is one line wrapping ErrFormat. NewFile does not close r.
func NewFile(r io.ReaderAt, size int64) (*File, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrFormat, fmt.Sprintf(format, args...))
	}
	if size < 8 {
		return nil, bad("%d bytes, shorter than the 8-byte header length", size)
	}
	var nb [8]byte
	if err := readAt(r, nb[:], 0); err != nil {
		return nil, bad("reading the header length: %v", err)
	}
	n := binary.LittleEndian.Uint64(nb[:])
	if n > MaxHeader {
		return nil, bad("header length %d is over the %d-byte limit", n, MaxHeader)
	}
	if int64(n) > size-8 {
		return nil, bad("header length %d runs past the end of the file (%d bytes after the length)", n, size-8)
	}
	hb := make([]byte, n)
	if err := readAt(r, hb, 8); err != nil {
		return nil, bad("reading the header: %v", err)
	}
	f := &File{r: r, data: 8 + int64(n)}
	if err := f.parseHeader(hb); err != nil {
		return nil, bad("header: %v", err)
	}
	if err := f.checkLayout(size - f.data); err != nil {
		return nil, bad("%v", err)
	}
	return f, nil
}

// parseHeader decodes the JSON header into f.tensors and f.meta and checks
// each entry on its own (steps 2–4 of NewFile).
func (f *File) parseHeader(hb []byte) error {
	if !utf8.Valid(hb) {
		return errors.New("not UTF-8")
	}
	if len(hb) == 0 || hb[0] != '{' {
		return errors.New("does not start with '{'")
	}
	if err := checkDuplicateKeys(hb); err != nil {
		return err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hb, &raw); err != nil {
		return err
	}
	if m, ok := raw["__metadata__"]; ok {
		if err := json.Unmarshal(m, &f.meta); err != nil {
			return fmt.Errorf("__metadata__ is not a map of strings to strings: %v", err)
		}
		delete(raw, "__metadata__")
	}
	f.tensors = make(map[string]tensor, len(raw))
	for name, v := range raw {
		t, err := parseEntry(name, v)
		if err != nil {
			return err
		}
		f.tensors[name] = t
	}
	return nil
}

// parseEntry decodes and checks one tensor's header entry.
func parseEntry(name string, v json.RawMessage) (tensor, error) {
	var e struct {
		DType   *DType   `json:"dtype"`
		Shape   *[]int64 `json:"shape"`
		Offsets []int64  `json:"data_offsets"`
	}
	if err := json.Unmarshal(v, &e); err != nil {
		return tensor{}, fmt.Errorf("tensor %q: %v", name, err)
	}
	switch {
	case e.DType == nil:
		return tensor{}, fmt.Errorf("tensor %q has no dtype", name)
	case e.Shape == nil:
		return tensor{}, fmt.Errorf("tensor %q has no shape", name)
	case len(e.Offsets) != 2:
		return tensor{}, fmt.Errorf("tensor %q: data_offsets %v is not [BEGIN, END]", name, e.Offsets)
	}
	size := e.DType.Size()
	if size == 0 {
		return tensor{}, fmt.Errorf("tensor %q has dtype %q, not one of the format's whole-byte types (%s)", name, *e.DType, dtypeList())
	}
	shape := *e.Shape
	t := tensor{TensorInfo: TensorInfo{Name: name, DType: *e.DType, Shape: make([]int, len(shape))}, begin: e.Offsets[0], end: e.Offsets[1]}
	nbytes := uint64(size)
	for i, d := range shape {
		if d < 0 {
			return tensor{}, fmt.Errorf("tensor %q has shape %v, with a negative dimension", name, shape)
		}
		hi, lo := bits.Mul64(nbytes, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return tensor{}, fmt.Errorf("tensor %q: shape %v overflows a 64-bit size", name, shape)
		}
		nbytes = lo
		t.Shape[i] = int(d)
	}
	if t.begin < 0 || t.end < t.begin {
		return tensor{}, fmt.Errorf("tensor %q: data_offsets %v is not [BEGIN, END] with 0 ≤ BEGIN ≤ END", name, e.Offsets)
	}
	if uint64(t.end-t.begin) != nbytes {
		return tensor{}, fmt.Errorf("tensor %q: %s %v needs %d bytes, data_offsets %v hold %d", name, t.DType, t.Shape, nbytes, e.Offsets, t.end-t.begin)
	}
	return t, nil
}

// dtypeList lists the accepted types, sorted, for error messages.
func dtypeList() string {
	names := make([]string, 0, len(dtypeSizes))
	for d := range dtypeSizes {
		names = append(names, string(d))
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// checkLayout checks the tensors' byte ranges against the data section of
// dataLen bytes (step 5 of NewFile). Ranges are compared in order of
// (BEGIN, END), as the reference implementation sorts them, so that empty
// tensors sharing an offset are accepted.
func (f *File) checkLayout(dataLen int64) error {
	ts := slices.SortedFunc(maps.Values(f.tensors), func(a, b tensor) int {
		if a.begin != b.begin {
			return cmpInt64(a.begin, b.begin)
		}
		if a.end != b.end {
			return cmpInt64(a.end, b.end)
		}
		return strings.Compare(a.Name, b.Name)
	})
	var last int64
	for _, t := range ts {
		last = max(last, t.end)
	}
	if last > dataLen {
		return fmt.Errorf("truncated: the tensors end at byte %d of the data section, the file holds %d (%d bytes missing)", last, dataLen, last-dataLen)
	}
	var at int64
	prev := ""
	for _, t := range ts {
		switch {
		case t.begin < at:
			return fmt.Errorf("tensors %q and %q overlap: %q starts at byte %d, before %q ends at %d", prev, t.Name, t.Name, t.begin, prev, at)
		case t.begin > at:
			return fmt.Errorf("bytes [%d, %d) of the data section are in no tensor; the format requires the tensors to cover it exactly", at, t.begin)
		}
		at, prev = t.end, t.Name
	}
	if at != dataLen {
		return fmt.Errorf("bytes [%d, %d) of the data section are in no tensor; the format requires the tensors to cover it exactly", at, dataLen)
	}
	return nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// checkDuplicateKeys walks the JSON text b and fails on an object that
// holds a key twice, which the format disallows and encoding/json would
// resolve silently (the last value wins).
func checkDuplicateKeys(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	type frame struct {
		keys   map[string]bool
		object bool
		key    bool // the next token of an object is a key
	}
	var stack []frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		top := len(stack) - 1
		if top >= 0 && stack[top].object && stack[top].key {
			if k, ok := tok.(string); ok {
				if stack[top].keys[k] {
					return fmt.Errorf("key %q appears twice in one object", k)
				}
				stack[top].keys[k] = true
				stack[top].key = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, frame{keys: map[string]bool{}, object: true, key: true})
			continue
		case json.Delim('['):
			stack = append(stack, frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:top]
		}
		// A value (or a closed container) ends; in an object, a key
		// comes next.
		if n := len(stack) - 1; n >= 0 && stack[n].object {
			stack[n].key = true
		}
	}
}

// Tensors returns the file's tensors sorted by name. The slices are the
// caller's.
func (f *File) Tensors() []TensorInfo {
	out := make([]TensorInfo, 0, len(f.tensors))
	for _, name := range slices.Sorted(maps.Keys(f.tensors)) {
		t := f.tensors[name].TensorInfo
		t.Shape = slices.Clone(t.Shape)
		out = append(out, t)
	}
	return out
}

// Tensor returns the named tensor's description and whether the file holds
// it.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	t, ok := f.tensors[name]
	t.Shape = slices.Clone(t.Shape)
	return t.TensorInfo, ok
}

// Metadata returns a copy of the header's "__metadata__" map (nil when the
// header has none).
func (f *File) Metadata() map[string]string { return maps.Clone(f.meta) }

// ReadFloat32 reads the named tensor into dst, converting each element to
// float32 (F32, F16, BF16 exactly; F64 rounded to nearest, ties to even).
// len(dst) must be the tensor's element count. It reads the file in chunks
// of at most 1 MiB through io.ReaderAt, so a checkpoint is never held
// whole in memory beside dst: for a model's θ, dst is a view of θ and θ is
// the only copy. Errors: ErrNoTensor for a name the file lacks, ErrDType
// for a tensor of another type (both wrapped with the name), a length
// mismatch, or the reader's error.
func (f *File) ReadFloat32(name string, dst []float32) error {
	t, ok := f.tensors[name]
	if !ok {
		return fmt.Errorf("%w: %q", ErrNoTensor, name)
	}
	if !t.DType.Float() {
		return fmt.Errorf("%w: tensor %q is %s; ReadFloat32 converts F32, F16, BF16 and F64", ErrDType, name, t.DType)
	}
	if n := t.Len(); len(dst) != n {
		return fmt.Errorf("checkpoint: tensor %q %v has %d elements, dst has %d", name, t.Shape, n, len(dst))
	}
	size := t.DType.Size()
	per := chunkBytes / size // elements a chunk holds
	buf := make([]byte, min(len(dst), per)*size)
	for off := 0; off < len(dst); off += per {
		k := min(per, len(dst)-off)
		b := buf[:k*size]
		if err := readAt(f.r, b, f.data+t.begin+int64(off*size)); err != nil {
			return fmt.Errorf("checkpoint: reading tensor %q: %w", name, err)
		}
		decode(dst[off:off+k], b, t.DType)
	}
	return nil
}

// readAt fills b from r at off. It accepts io.EOF with a full read, which
// io.ReaderAt allows at the end of the input.
func readAt(r io.ReaderAt, b []byte, off int64) error {
	n, err := r.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// Close closes the file Open opened; for a File from NewFile it does
// nothing.
func (f *File) Close() error {
	if f.closer == nil {
		return nil
	}
	return f.closer.Close()
}
