package dataset

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"codeberg.org/sbinet/npyio/npy"
	"codeberg.org/sbinet/npyio/npz"
)

// npyFile encodes v with npyio.
func npyFile(t testing.TB, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := npy.Write(&b, v); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// npyRaw builds a version 1.0 .npy file by hand, for headers npyio does
// not write.
func npyRaw(dict string, data []byte) []byte {
	dict += "\n"
	b := append([]byte("\x93NUMPY\x01\x00"), 0, 0)
	binary.LittleEndian.PutUint16(b[8:], uint16(len(dict)))
	return append(append(b, dict...), data...)
}

// npzFile writes the arrays with npyio's npz writer and returns the path.
func npzFile(t testing.TB, dir, name string, arrays map[string]any) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := npz.Write(path, arrays); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReadFileNPY(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "f.npy", npyFile(t, [][]float32{{2, 1.5, -3}, {0, 0, 1000}}))
	d, err := ReadFile(path, FileOptions{})
	checkRead(t, d, err, []float32{1.5, -3, 0, 1000}, []int32{2, 0}, nil, 3, nil)
	if d.Name != "f" {
		t.Errorf("Name = %q", d.Name)
	}

	path = writeFile(t, dir, "i.npy", npyFile(t, [][]int16{{1, 7, 8, 9, 10}, {0, -1, 2, 3, 4}}))
	d, err = ReadFile(path, FileOptions{Labels: []string{"1", "0"}, InputShape: []int{2, 2}})
	checkRead(t, d, err, []float32{7, 8, 9, 10, -1, 2, 3, 4}, []int32{0, 1}, []int{2, 2}, 2, []string{"1", "0"})

	path = writeFile(t, dir, "u.npy", npyFile(t, [][]uint8{{3, 255}, {1, 0}}))
	d, err = ReadFile(path, FileOptions{Classes: 4})
	checkRead(t, d, err, []float32{255, 0}, []int32{3, 1}, nil, 4, nil)

	// Column-major data (NumPy writes it for Fortran-ordered arrays): the
	// array [[1, 10, 20], [0, 30, 40]] stored column by column.
	data := make([]byte, 0, 48)
	for _, v := range []float64{1, 0, 10, 30, 20, 40} {
		data = binary.LittleEndian.AppendUint64(data, math.Float64bits(v))
	}
	path = writeFile(t, dir, "fortran.npy", npyRaw("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }", data))
	d, err = ReadFile(path, FileOptions{})
	checkRead(t, d, err, []float32{10, 20, 30, 40}, []int32{1, 0}, nil, 2, nil)

	// Big-endian int32, bools.
	data = nil
	for _, v := range []int32{1, 5, 0, -6} {
		data = binary.BigEndian.AppendUint32(data, uint32(v))
	}
	path = writeFile(t, dir, "be.npy", npyRaw("{'descr': '>i4', 'fortran_order': False, 'shape': (2, 2), }", data))
	d, err = ReadFile(path, FileOptions{})
	checkRead(t, d, err, []float32{5, -6}, []int32{1, 0}, nil, 2, nil)
	path = writeFile(t, dir, "bool.npy", npyFile(t, [][]bool{{true, false, true}}))
	d, err = ReadFile(path, FileOptions{})
	checkRead(t, d, err, []float32{0, 1}, []int32{1}, nil, 2, nil)
}

func TestReadFileNPZ(t *testing.T) {
	dir := t.TempDir()
	// Images (rows, 1, 2, 2): the shape beyond rows is the example shape.
	path := npzFile(t, dir, "img.npz", map[string]any{
		"x": [][][][]uint8{{{{0, 1}, {2, 3}}}, {{{4, 5}, {6, 7}}}, {{{8, 9}, {10, 11}}}},
		"y": []int64{2, 0, 2},
	})
	d, err := ReadFile(path, FileOptions{})
	checkRead(t, d, err, []float32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, []int32{2, 0, 2}, []int{1, 2, 2}, 3, nil)
	// InputShape overrides it, keeping the product.
	d, err = ReadFile(path, FileOptions{InputShape: []int{4}, Classes: 10})
	checkRead(t, d, err, []float32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, []int32{2, 0, 2}, []int{4}, 10, nil)

	// Alternative names (with numpy's ".npy" suffix), float labels holding
	// integers, a 2-D x (no Shape, as from a CSV file).
	path = npzFile(t, dir, "alt.npz", map[string]any{
		"features.npy": [][]float64{{0.5, 1}, {2, 3}},
		"labels.npy":   []float32{1, 0},
		"other.npy":    []int8{1, 2, 3},
	})
	d, err = ReadFile(path, FileOptions{Labels: []string{"0", "1", "2"}})
	checkRead(t, d, err, []float32{0.5, 1, 2, 3}, []int32{1, 0}, nil, 3, []string{"0", "1", "2"})

	// 1-D x: one feature per row; y of shape (rows, 1).
	path = npzFile(t, dir, "one.npz", map[string]any{"X": []float32{7, 8}, "y": [][]uint16{{0}, {1}}})
	d, err = ReadFile(path, FileOptions{})
	checkRead(t, d, err, []float32{7, 8}, []int32{0, 1}, nil, 2, nil)
}

func TestReadFileNPYErrors(t *testing.T) {
	dir := t.TempDir()
	good := npyFile(t, [][]float32{{1, 2}, {0, 3}})
	tests := []struct {
		name string
		data []byte
		o    FileOptions
		want string
	}{
		{"1-D", npyFile(t, []float32{1, 2}), FileOptions{}, "shape [2]: want a 2-D array"},
		{"one column", npyFile(t, [][]float32{{1}, {2}}), FileOptions{}, "shape [2 1]: want a 2-D array"},
		{"3-D", npyFile(t, [][][]float32{{{1, 2}}}), FileOptions{}, "want a 2-D array"},
		{"no rows", npyRaw("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", nil), FileOptions{}, "no rows"},
		{"nan", npyFile(t, [][]float64{{0, 1}, {1, math.NaN()}}), FileOptions{}, "[1, 1]: NaN is not a finite float32 number"},
		{"inf", npyFile(t, [][]float32{{0, float32(math.Inf(-1))}}), FileOptions{}, "[0, 1]: -Inf"},
		{"float32 overflow", npyFile(t, [][]float64{{0, 1e300}}), FileOptions{}, "[0, 1]: 1e+300"},
		{"negative label", npyFile(t, [][]int32{{0, 1}, {-1, 2}}), FileOptions{}, "[1, 0]: label -1 is not a non-negative integer"},
		{"fractional label", npyFile(t, [][]float32{{0.5, 1}}), FileOptions{}, "[0, 0]: label 0.5"},
		{"label ≥ classes", npyFile(t, [][]int8{{0, 1}, {5, 2}}), FileOptions{Classes: 3}, "[1, 0]: label 5 with only 3 classes"},
		{"label not in Labels", npyFile(t, [][]int8{{0, 1}, {5, 2}}), FileOptions{Labels: []string{"0"}}, `[1, 0]: label "5" is not one of the class names`},
		{"shape product", good, FileOptions{InputShape: []int{2}}, "1 features per row, but InputShape [2]"},
		{"truncated", good[:len(good)-1], FileOptions{}, "truncated"},
		{"trailing", append(append([]byte(nil), good...), 0), FileOptions{}, "data after"},
		{"magic", []byte("PK\x03\x04 not numpy at all"), FileOptions{}, "not a NumPy .npy array"},
		{"empty", nil, FileOptions{}, "not a NumPy .npy array"},
		{"version", append([]byte("\x93NUMPY\x04\x00"), good[8:]...), FileOptions{}, "version 4.0"},
		{"complex", npyFile(t, []complex64{1, 2}), FileOptions{}, "unsupported .npy header"},
		{"float16", npyRaw("{'descr': '<f2', 'fortran_order': False, 'shape': (1, 2), }", make([]byte, 4)), FileOptions{}, "dtype <f2 is not supported"},
		{"bad order", npyRaw("{'descr': '|f4', 'fortran_order': False, 'shape': (1, 2), }", make([]byte, 8)), FileOptions{}, "dtype |f4"},
		{"header", npyRaw("{'descr': '<f4', 'shape': (1, 2), 'fortran_order': False, }", make([]byte, 8)), FileOptions{}, "unsupported .npy header"},
		{"lying shape", npyRaw("{'descr': '<f8', 'fortran_order': False, 'shape': (100000, 2), }", make([]byte, 16)), FileOptions{}, "truncated"},
		{"huge shape", npyRaw("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", nil), FileOptions{}, "more than"},
		{"overflowing shape", npyRaw("{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999, 2), }", nil), FileOptions{}, "more than"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, dir, fmt.Sprintf("%d.npy", i), tt.data)
			_, err := ReadFile(path, tt.o)
			wantErr(t, err, ErrFormat, path+": ", tt.want)
		})
	}
}

func TestReadFileNPZErrors(t *testing.T) {
	dir := t.TempDir()
	x := [][]float32{{1, 2}, {3, 4}}
	tests := []struct {
		name   string
		arrays map[string]any
		o      FileOptions
		want   string
	}{
		{"no y", map[string]any{"x": x}, FileOptions{}, `no label array ["y", "labels"]; the archive has ["x"]`},
		{"no x", map[string]any{"y": []int8{0, 1}, "z": x}, FileOptions{}, `no feature array ["x", "X", "features"]`},
		{"x and X", map[string]any{"x": x, "X.npy": x, "y": []int8{0, 1}}, FileOptions{}, `both "X.npy" and "x"`},
		{"rows", map[string]any{"x": x, "y": []int8{0, 1, 1}}, FileOptions{}, `array "y" has shape [3]: want (2,)`},
		{"y 2-D", map[string]any{"x": x, "y": [][]int8{{0, 1}, {1, 0}}}, FileOptions{}, `array "y" has shape [2 2]`},
		{"scalar x", map[string]any{"x": float32(1), "y": []int8{0}}, FileOptions{}, `array "x" is a scalar`},
		{"nan", map[string]any{"x": [][][]float32{{{1, 2}}, {{3, float32(math.NaN())}}}, "y": []int8{0, 1}}, FileOptions{}, "x[1, 0, 1]: NaN"},
		{"negative label", map[string]any{"x": x, "y": []int64{0, -3}}, FileOptions{}, "y[1]: label -3"},
		{"fractional label", map[string]any{"x": x, "y": []float64{0, 1.25}}, FileOptions{}, "y[1]: label 1.25"},
		{"label not in Labels", map[string]any{"x": x, "y": []uint8{0, 2}}, FileOptions{Labels: []string{"0", "1"}}, `y[1]: label "2" is not one of the class names`},
		{"shape product", map[string]any{"x": x, "y": []uint8{0, 2}}, FileOptions{InputShape: []int{1, 3}}, "2 features per row, but InputShape [1 3] has 3"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := npzFile(t, dir, fmt.Sprintf("%d.npz", i), tt.arrays)
			_, err := ReadFile(path, tt.o)
			wantErr(t, err, ErrFormat, path+": ", tt.want)
		})
	}
	path := writeFile(t, dir, "notzip.npz", []byte("hello"))
	_, err := ReadFile(path, FileOptions{})
	wantErr(t, err, ErrFormat, path+": ", "not an .npz (zip) archive")

	// Arrays npyio does not write, in archives built by hand.
	empty := npyRaw("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 0), }", nil)
	noRows := npyRaw("{'descr': '|u1', 'fortran_order': False, 'shape': (0, 3), }", nil)
	yEmpty := npyRaw("{'descr': '|u1', 'fortran_order': False, 'shape': (0,), }", nil)
	y2 := npyRaw("{'descr': '|u1', 'fortran_order': False, 'shape': (2,), }", []byte{0, 1})
	bad := npyRaw("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }", make([]byte, 16))
	for _, tt := range []struct {
		name    string
		entries map[string][]byte
		want    string
	}{
		{"no features", map[string][]byte{"x.npy": empty, "y.npy": y2}, `array "x" has shape [2 0]: no features`},
		{"no rows", map[string][]byte{"x.npy": noRows, "y.npy": yEmpty}, "no rows"},
		{"truncated x", map[string][]byte{"x.npy": bad, "y.npy": y2}, `array "x" is truncated`},
		{"bad y", map[string][]byte{"x.npy": y2, "y.npy": []byte("junk")}, `not a NumPy .npy array`},
	} {
		path := writeFile(t, dir, tt.name+".npz", zipFile(t, tt.entries))
		_, err := ReadFile(path, FileOptions{})
		wantErr(t, err, ErrFormat, path+": ", tt.want)
	}
}

// zipFile returns a zip archive of the entries, stored uncompressed as
// numpy.savez writes them.
func zipFile(t testing.TB, entries map[string][]byte) []byte {
	var b bytes.Buffer
	zw := zip.NewWriter(&b)
	for name, data := range entries {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: name, Method: zip.Store})
		if err == nil {
			_, err = w.Write(data)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// FuzzReadFileNPY checks that arbitrary .npy and .npz files never panic
// ReadFile or make it allocate out of proportion, and that every accepted
// file gives a valid dataset.
func FuzzReadFileNPY(f *testing.F) {
	lowerReadLimit(f)
	f.Add(npyFile(f, [][]float32{{2, 1.5, -3}, {0, 0, 1000}}), false)
	f.Add(npyFile(f, [][]uint8{{3, 255}, {1, 0}}), false)
	f.Add(npyRaw("{'descr': '<f8', 'fortran_order': True, 'shape': (1, 2), }", make([]byte, 16)), false)
	dir := f.TempDir()
	for i, arrays := range []map[string]any{
		{"x": [][][]uint8{{{0, 1}, {2, 3}}, {{4, 5}, {6, 7}}}, "y": []int64{2, 0}},
		{"features": [][]float64{{0.5, 1}}, "labels": []float32{1}},
	} {
		raw, err := os.ReadFile(npzFile(f, dir, fmt.Sprintf("%d.npz", i), arrays))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw, true)
	}
	f.Add(zipFile(f, map[string][]byte{
		"x.npy": npyRaw("{'descr': '<f8', 'fortran_order': True, 'shape': (1, 2, 1), }", make([]byte, 16)),
		"y.npy": npyRaw("{'descr': '|u1', 'fortran_order': False, 'shape': (1,), }", []byte{1}),
	}), true)
	f.Fuzz(func(t *testing.T, data []byte, zip bool) {
		name := "f.npy"
		if zip {
			name = "f.npz"
		}
		fuzzReadFile(t, name, data, false, FileOptions{})
	})
}
