package dataset

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"

	"codeberg.org/sbinet/npyio/npy"
	"codeberg.org/sbinet/npyio/npz"
)

// The NumPy .npy format (numpy.lib.format): the magic "\x93NUMPY", a
// major and minor version byte, the header length (uint16 little-endian
// for version 1, uint32 for version 2), then the header: a Python dict
// literal padded with spaces and ended by a newline, then the array data.
//
// The header is checked here before npyio sees it: npyio slices the header
// text by position and trusts the shape, so a malformed header could make
// it panic or allocate whatever the shape declares. Only the layout NumPy
// writes is accepted (keys in this order, one space after each colon, a
// trailing ", }"), with a bool, integer or float dtype.
var npyHeaderRE = regexp.MustCompile(`^\{'descr': '([<>|])([biuf])([1248])', 'fortran_order': (True|False), 'shape': \(((?:\d+, )*\d+,?)?\), \} *\n$`)

// maxNPYHeader bounds the header length: NumPy's headers for the dtypes
// read here are well under 1 KiB.
const maxNPYHeader = 1 << 16

// npyArray is a decoded NumPy array.
type npyArray struct {
	shape []int
	// at returns element i in C (row-major) order as a float64; integers
	// beyond 2^53 lose precision, which only matters for labels, and
	// those must be below 2^31.
	at func(i int) float64
}

// readNPY reads one .npy array from r, which holds size bytes (-1:
// unknown). name is the array's name in an .npz archive ("" for an .npy
// file), used in messages. Errors are plain (no file name); the data must
// end where the header says.
func readNPY(r io.Reader, size int64, name string) (*npyArray, error) {
	var prefix [12]byte
	if _, err := io.ReadFull(r, prefix[:10]); err != nil {
		return nil, fmt.Errorf("not a NumPy .npy array: %v", err)
	}
	if !bytes.Equal(prefix[:6], npy.Magic[:]) {
		return nil, fmt.Errorf("not a NumPy .npy array (no \\x93NUMPY magic)")
	}
	var hlen, plen int
	switch prefix[6] {
	case 1:
		hlen, plen = int(binary.LittleEndian.Uint16(prefix[8:10])), 10
	case 2:
		if _, err := io.ReadFull(r, prefix[10:12]); err != nil {
			return nil, fmt.Errorf("truncated .npy header: %v", err)
		}
		hlen, plen = int(binary.LittleEndian.Uint32(prefix[8:12])), 12
	default:
		return nil, fmt.Errorf(".npy format version %d.%d is not supported (want 1.0 or 2.0)", prefix[6], prefix[7])
	}
	if hlen > maxNPYHeader {
		return nil, fmt.Errorf(".npy header of %d bytes is too large", hlen)
	}
	head := make([]byte, plen+hlen)
	copy(head, prefix[:plen])
	if _, err := io.ReadFull(r, head[plen:]); err != nil {
		return nil, fmt.Errorf("truncated .npy header: %v", err)
	}
	m := npyHeaderRE.FindSubmatch(head[plen:])
	if m == nil {
		return nil, fmt.Errorf("unsupported .npy header %q: want a bool, integer or float dtype as NumPy writes it", head[plen:])
	}
	order, kind := m[1][0], m[2][0]
	esize := int(m[3][0] - '0')
	if !(kind == 'b' && esize == 1 || kind == 'f' && esize >= 4 || kind == 'i' || kind == 'u') || (order == '|') != (esize == 1) {
		return nil, fmt.Errorf("dtype %s%s%s is not supported: want bool, (u)int8-64, float32 or float64", m[1], m[2], m[3])
	}
	var shape []int
	n := 1
	for f := range strings.SplitSeq(string(m[5]), ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		s, err := strconv.Atoi(f)
		if err != nil || s > maxReadValues || (s > 0 && n > maxReadValues/s) {
			return nil, fmt.Errorf("%s shape (%s) has more than %d values", arrayName(name), m[5], maxReadValues)
		}
		shape = append(shape, s)
		n *= s
	}
	want := int64(n) * int64(esize)
	var data []byte
	var err error
	if size >= 0 && want <= size-int64(len(head)) {
		data = make([]byte, want, want+1) // the size is real: allocate it
		var k int
		k, err = io.ReadFull(r, data)
		data = data[:k]
		if err == nil { // look for trailing data
			k, _ = io.ReadFull(r, data[len(data):len(data)+1])
			data = data[:len(data)+k]
		} else if err == io.ErrUnexpectedEOF || err == io.EOF {
			err = nil
		}
	} else { // read what there is, up to want+1 bytes
		data, err = io.ReadAll(io.LimitReader(r, want+1))
	}
	switch {
	case err != nil:
		return nil, fmt.Errorf("reading %s: %v", arrayName(name), err)
	case int64(len(data)) < want:
		return nil, fmt.Errorf("%s is truncated: shape %v needs %d bytes of data, found %d", arrayName(name), shape, want, len(data))
	case int64(len(data)) > want:
		return nil, fmt.Errorf("%s has data after the %d bytes its shape %v needs", arrayName(name), want, shape)
	}
	nr, err := npy.NewReader(io.MultiReader(bytes.NewReader(head), bytes.NewReader(data)))
	if err != nil {
		return nil, fmt.Errorf("%s: %v", arrayName(name), err)
	}
	at, err := npyDecoders[string(m[2])+string(m[3])](nr, n)
	if err != nil {
		return nil, fmt.Errorf("decoding %s: %v", arrayName(name), err)
	}
	if string(m[4]) == "True" && len(shape) > 1 {
		at = fortranOrder(at, shape)
	}
	return &npyArray{shape: shape, at: at}, nil
}

// npyDecoders decode the dtypes readNPY accepts, by kind and size.
var npyDecoders = map[string]func(*npy.Reader, int) (func(int) float64, error){
	"b1": npyDecodeBool,
	"i1": npyDecode[int8], "i2": npyDecode[int16], "i4": npyDecode[int32], "i8": npyDecode[int64],
	"u1": npyDecode[uint8], "u2": npyDecode[uint16], "u4": npyDecode[uint32], "u8": npyDecode[uint64],
	"f4": npyDecode[float32], "f8": npyDecode[float64],
}

// npyNumber is a numeric element type npyio decodes.
type npyNumber interface {
	int8 | int16 | int32 | int64 | uint8 | uint16 | uint32 | uint64 | float32 | float64
}

// npyDecode reads n elements of type T with npyio and returns their
// accessor.
func npyDecode[T npyNumber](r *npy.Reader, n int) (func(int) float64, error) {
	vals, err := npyRead[T](r, n)
	return func(i int) float64 { return float64(vals[i]) }, err
}

// npyDecodeBool reads n bools with npyio and returns their accessor (1 for
// true, 0 for false).
func npyDecodeBool(r *npy.Reader, n int) (func(int) float64, error) {
	vals, err := npyRead[bool](r, n)
	return func(i int) float64 {
		if vals[i] {
			return 1
		}
		return 0
	}, err
}

// npyRead reads n elements of type T with npyio.
func npyRead[T npyNumber | bool](r *npy.Reader, n int) ([]T, error) {
	vals := make([]T, n)
	if err := r.Read(&vals); err != nil {
		return nil, err
	}
	if len(vals) != n {
		return nil, fmt.Errorf("decoded %d values, want %d", len(vals), n)
	}
	return vals, nil
}

// fortranOrder returns the C-order accessor of column-major (Fortran
// order) data of the given shape.
func fortranOrder(at func(int) float64, shape []int) func(int) float64 {
	strides := make([]int, len(shape)) // of the column-major layout
	s := 1
	for k, n := range shape {
		strides[k] = s
		s *= n
	}
	return func(i int) float64 {
		off := 0
		for k := len(shape) - 1; k >= 0; k-- { // C index digits, last fastest
			off += (i % shape[k]) * strides[k]
			i /= shape[k]
		}
		return at(off)
	}
}

// arrayName names an array in messages.
func arrayName(name string) string {
	if name == "" {
		return "the array"
	}
	return "array " + strconv.Quote(name)
}

// npyIndex formats the position of element flat (C order) of an array of
// the given shape as NumPy would index it: name[i, j, …].
func npyIndex(name string, shape []int, flat int) string {
	idx := make([]string, len(shape))
	for k := len(shape) - 1; k >= 0; k-- {
		idx[k] = strconv.Itoa(flat % shape[k])
		flat /= shape[k]
	}
	return name + "[" + strings.Join(idx, ", ") + "]"
}

// npyFeature converts a feature value to float32, reporting false for
// NaN, ±Inf and values beyond float32's range.
func npyFeature(v float64) (float32, bool) {
	f := float32(v)
	return f, !math.IsNaN(v) && !math.IsInf(float64(f), 0)
}

// readNPYFile reads an .npy file: one 2-D array (rows, 1+features) whose
// column 0 holds the labels.
func readNPYFile(path string, o FileOptions) (*Dataset, error) {
	f, size, err := openData(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	arr, err := readNPY(bufio.NewReader(f), size, "")
	if err != nil {
		return nil, formatErr(path, nil, "%v", err)
	}
	if len(arr.shape) != 2 || arr.shape[1] < 2 {
		return nil, formatErr(path, nil, "array of shape %v: want a 2-D array (rows, 1+features) with the label in column 0", arr.shape)
	}
	rows, cols := arr.shape[0], arr.shape[1]
	if rows == 0 {
		return nil, formatErr(path, nil, "no rows")
	}
	d := &Dataset{Dim: cols - 1, X: make([]float32, 0, rows*(cols-1)), Y: make([]int32, rows)}
	lab := fileLabeler(o)
	for i := range rows {
		if d.Y[i], err = lab.fromFloat(arr.at(i * cols)); err != nil {
			return nil, formatErr(path, nil, "%s: %v", npyIndex("", arr.shape, i*cols), err)
		}
		for j := 1; j < cols; j++ {
			v, ok := npyFeature(arr.at(i*cols + j))
			if !ok {
				return nil, formatErr(path, nil, "%s: %v is not a finite float32 number", npyIndex("", arr.shape, i*cols+j), arr.at(i*cols+j))
			}
			d.X = append(d.X, v)
		}
	}
	if d.Classes, d.LabelNames, err = lab.finish(d.Y); err != nil {
		return nil, formatErr(path, nil, "%v", err)
	}
	return d, nil
}

// The names ReadFile accepts for an .npz archive's arrays, preferred first.
var (
	npzFeatureNames = []string{"x", "X", "features"}
	npzLabelNames   = []string{"y", "labels"}
)

// readNPZFile reads an .npz archive: features "x" (rows, ...) and labels
// "y" (rows,), or their alternative names.
func readNPZFile(path string, o FileOptions) (*Dataset, error) {
	f, size, err := openData(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := npz.NewReader(f, size)
	if err != nil {
		return nil, formatErr(path, err, "not an .npz (zip) archive: %v", err)
	}
	read := func(names []string, what string) (*npyArray, string, error) {
		key, name, err := npzFind(zr.Keys(), names, what)
		if err != nil {
			return nil, "", formatErr(path, nil, "%v", err)
		}
		rc, err := zr.Open(key)
		if err != nil {
			return nil, "", formatErr(path, err, "%v", err)
		}
		defer rc.Close()
		arr, err := readNPY(bufio.NewReader(rc), -1, name)
		if err != nil {
			return nil, "", formatErr(path, nil, "%v", err)
		}
		return arr, name, nil
	}
	x, xn, err := read(npzFeatureNames, "feature")
	if err != nil {
		return nil, err
	}
	y, yn, err := read(npzLabelNames, "label")
	if err != nil {
		return nil, err
	}
	if len(x.shape) == 0 {
		return nil, formatErr(path, nil, "array %q is a scalar: want shape (rows, ...)", xn)
	}
	rows := x.shape[0]
	if !(len(y.shape) == 1 || len(y.shape) == 2 && y.shape[1] == 1) || y.shape[0] != rows {
		return nil, formatErr(path, nil, "array %q has shape %v: want (%d,), one label per row of %q %v", yn, y.shape, rows, xn, x.shape)
	}
	if rows == 0 {
		return nil, formatErr(path, nil, "no rows: array %q has shape %v", xn, x.shape)
	}
	dim := 1
	for _, s := range x.shape[1:] {
		dim *= s
	}
	if dim == 0 {
		return nil, formatErr(path, nil, "array %q has shape %v: no features", xn, x.shape)
	}
	d := &Dataset{Dim: dim, X: make([]float32, rows*dim), Y: make([]int32, rows)}
	if len(x.shape) > 2 {
		d.Shape = append([]int(nil), x.shape[1:]...)
	}
	lab := fileLabeler(o)
	for i := range rows {
		if d.Y[i], err = lab.fromFloat(y.at(i)); err != nil {
			return nil, formatErr(path, nil, "%s: %v", npyIndex(yn, y.shape, i), err)
		}
	}
	for j := range d.X {
		v, ok := npyFeature(x.at(j))
		if !ok {
			return nil, formatErr(path, nil, "%s: %v is not a finite float32 number", npyIndex(xn, x.shape, j), x.at(j))
		}
		d.X[j] = v
	}
	if d.Classes, d.LabelNames, err = lab.finish(d.Y); err != nil {
		return nil, formatErr(path, nil, "%v", err)
	}
	return d, nil
}

// npzFind returns the archive key and array name of the one array among
// keys named one of names (with or without the ".npy" suffix).
func npzFind(keys, names []string, what string) (key, name string, err error) {
	for _, k := range keys {
		n := strings.TrimSuffix(k, ".npy")
		for _, want := range names {
			if n != want {
				continue
			}
			if key != "" {
				return "", "", fmt.Errorf("both %q and %q hold the %s array: keep one", key, k, what)
			}
			key, name = k, n
		}
	}
	if key == "" {
		return "", "", fmt.Errorf("no %s array %s; the archive has %s", what, quoteList(names, len(names)), quoteList(keys, 20))
	}
	return key, name, nil
}
