package dataset

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"
)

// parquetFile writes rows with parquet-go's generic writer and returns the
// path.
func parquetFile[T any](t testing.TB, dir, name string, rows []T, opts ...parquet.WriterOption) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := parquet.WriteFile(path, rows, opts...); err != nil {
		t.Fatal(err)
	}
	return path
}

// pet is a Parquet row with a string label and numeric features of every
// supported type.
type pet struct {
	W       float64 `parquet:"w"`
	Species string  `parquet:"species,dict"`
	H       int32   `parquet:"h"`
	Big     int64   `parquet:"big"`
	Small   float32 `parquet:"small"`
	OK      bool    `parquet:"ok"`
	U       uint32  `parquet:"u"`
}

var pets = []pet{
	{W: 1.5, Species: "dog", H: -2, Big: 1 << 40, Small: 0.25, OK: true, U: 4e9},
	{W: 3, Species: "cat", H: 4, Big: -5, Small: -1, OK: false, U: 1},
	{W: -0.5, Species: "dog", H: 0, Big: 7, Small: 2, OK: true, U: 0},
}

var petsX = []float32{
	1.5, -2, 1 << 40, 0.25, 1, 4e9,
	3, 4, -5, -1, 0, 1,
	-0.5, 0, 7, 2, 1, 0,
}

// numbered is a Parquet row with an integer label and an optional feature.
type numbered struct {
	Label int64    `parquet:"label"`
	A     float32  `parquet:"a"`
	B     *float64 `parquet:"b,optional"`
}

func ptr[T any](v T) *T { return &v }

func TestReadFileParquet(t *testing.T) {
	dir := t.TempDir()
	codecs := map[string]parquet.WriterOption{
		"uncompressed": parquet.Compression(&parquet.Uncompressed),
		"snappy":       parquet.Compression(&parquet.Snappy),
		"gzip":         parquet.Compression(&parquet.Gzip),
		"zstd":         parquet.Compression(&parquet.Zstd),
		"brotli":       parquet.Compression(&parquet.Brotli),
	}
	for name, codec := range codecs {
		for _, v := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s-v%d", name, v), func(t *testing.T) {
				// One row per row group, to read several.
				path := parquetFile(t, dir, fmt.Sprintf("pets-%s-%d.parquet", name, v), pets, codec, parquet.DataPageVersion(v), parquet.MaxRowsPerRowGroup(2))
				d, err := ReadFile(path, FileOptions{LabelColumn: "species"})
				checkRead(t, d, err, petsX, []int32{1, 0, 1}, nil, 2, []string{"cat", "dog"})
				if d.Name != fmt.Sprintf("pets-%s-%d", name, v) {
					t.Errorf("Name = %q", d.Name)
				}
			})
		}
	}
	path := parquetFile(t, dir, "pets.parquet", pets)
	d, err := ReadFile(path, FileOptions{LabelColumn: "species", FeatureColumns: []string{"ok", "w"}, Labels: []string{"emu", "dog", "cat"}})
	checkRead(t, d, err, []float32{1, 1.5, 0, 3, 1, -0.5}, []int32{1, 2, 1}, nil, 3, []string{"emu", "dog", "cat"})

	// Integer labels in the default column "label"; a present optional value.
	path = parquetFile(t, dir, "num.parquet", []numbered{{Label: 2, A: 1, B: ptr(0.5)}, {Label: 0, A: -1, B: ptr(8.0)}})
	d, err = ReadFile(path, FileOptions{})
	checkRead(t, d, err, []float32{1, 0.5, -1, 8}, []int32{2, 0}, nil, 3, nil)
	d, err = ReadFile(path, FileOptions{Classes: 4, InputShape: []int{2, 1}})
	checkRead(t, d, err, []float32{1, 0.5, -1, 8}, []int32{2, 0}, []int{2, 1}, 4, nil)
	d, err = ReadFile(path, FileOptions{Labels: []string{"0", "1", "2"}, FeatureColumns: []string{"b"}})
	checkRead(t, d, err, []float32{0.5, 8}, []int32{2, 0}, nil, 3, []string{"0", "1", "2"})

	// Float labels holding integers.
	type floatLabel struct {
		Y float64 `parquet:"y"`
		A int32   `parquet:"a"`
	}
	path = parquetFile(t, dir, "fl.parquet", []floatLabel{{1, 5}, {0, 6}})
	d, err = ReadFile(path, FileOptions{LabelColumn: "y"})
	checkRead(t, d, err, []float32{5, 6}, []int32{1, 0}, nil, 2, nil)
}

func TestReadFileParquetErrors(t *testing.T) {
	dir := t.TempDir()
	type strFeature struct {
		Label int32  `parquet:"label"`
		S     string `parquet:"s"`
	}
	type listFeature struct {
		Label int32     `parquet:"label"`
		L     []float32 `parquet:"l,list"`
	}
	type floatLabel struct {
		Label float32 `parquet:"label"`
		A     float32 `parquet:"a"`
	}
	type optLabel struct {
		Label *int32  `parquet:"label,optional"`
		A     float32 `parquet:"a"`
	}
	tests := []struct {
		name string
		path string
		o    FileOptions
		want string
	}{
		{"missing label", parquetFile(t, dir, "a.parquet", pets), FileOptions{}, `no column "label"; the file has columns ["w", "species", "h", "big", "small", "ok", "u"]`},
		{"missing feature", parquetFile(t, dir, "b.parquet", pets), FileOptions{LabelColumn: "species", FeatureColumns: []string{"w", "z"}}, `no column "z"`},
		{"string feature", parquetFile(t, dir, "c.parquet", []strFeature{{1, "x"}}), FileOptions{}, `feature column "s" holds strings`},
		{"list feature", parquetFile(t, dir, "d.parquet", []listFeature{{1, []float32{1}}}), FileOptions{}, `column "l" is a group or repeated column`},
		{"null feature", parquetFile(t, dir, "e.parquet", []numbered{{0, 1, ptr(1.0)}, {1, 2, nil}}), FileOptions{}, `row 2, column "b": null value`},
		{"null label", parquetFile(t, dir, "f.parquet", []optLabel{{ptr(int32(1)), 1}, {nil, 2}}), FileOptions{}, `row 2, column "label": null value`},
		{"nan feature", parquetFile(t, dir, "g.parquet", []numbered{{0, 1, ptr(1.0)}, {1, 2, ptr(math.NaN())}}), FileOptions{}, `row 2, column "b": NaN is not a finite float32 number`},
		{"float32 overflow", parquetFile(t, dir, "h.parquet", []numbered{{0, 1, ptr(1e300)}}), FileOptions{}, `row 1, column "b": 1e+300`},
		{"negative label", parquetFile(t, dir, "i.parquet", []numbered{{0, 1, ptr(1.0)}, {1, 2, ptr(1.0)}, {-1, 2, ptr(1.0)}}, parquet.MaxRowsPerRowGroup(2)), FileOptions{}, `row 3, column "label": label -1 is not a non-negative integer`},
		{"label ≥ classes", parquetFile(t, dir, "j.parquet", []numbered{{5, 1, ptr(1.0)}}), FileOptions{Classes: 2}, `row 1, column "label": label 5 with only 2 classes`},
		{"fractional label", parquetFile(t, dir, "k.parquet", []floatLabel{{0, 1}, {1.5, 2}}), FileOptions{}, `row 2, column "label": label 1.5`},
		{"label not in Labels", parquetFile(t, dir, "l.parquet", pets), FileOptions{LabelColumn: "species", Labels: []string{"dog"}}, `row 2, column "species": label "cat" is not one of the class names ["dog"]`},
		{"int label not in Labels", parquetFile(t, dir, "m.parquet", []numbered{{5, 1, ptr(1.0)}}), FileOptions{Labels: []string{"0"}}, `row 1, column "label": label "5" is not one of the class names`},
		{"names vs classes", parquetFile(t, dir, "n.parquet", pets), FileOptions{LabelColumn: "species", Classes: 3}, `column "species": the label column has 2 distinct names but the number of classes (--classes) is 3`},
		{"shape product", parquetFile(t, dir, "o.parquet", pets), FileOptions{LabelColumn: "species", InputShape: []int{5}}, "6 features per row, but InputShape [5] has 5"},
		{"no rows", parquetFile(t, dir, "p.parquet", []numbered{}), FileOptions{}, "no rows"},
		{"lz4", parquetFile(t, dir, "q.parquet", []numbered{{1, 2, nil}}, parquet.Compression(&parquet.Lz4Raw)), FileOptions{FeatureColumns: []string{"a"}}, "LZ4_RAW is not supported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadFile(tt.path, tt.o)
			wantErr(t, err, ErrFormat, tt.path+": ", tt.want)
		})
	}

	good, err := os.ReadFile(parquetFile(t, dir, "good.parquet", pets))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "too short"},
		{"magic only", []byte("PAR1PAR1PAR1"), "not a readable Parquet file"},
		{"truncated", good[:len(good)-10], "no PAR1 magic"},
		{"csv", []byte("label,a\n1,2\n3,4\n"), "no PAR1 magic"},
		{"footer length", append(append([]byte("PAR1"), good[4:len(good)-8]...), 0xff, 0xff, 0xff, 0x7f, 'P', 'A', 'R', '1'), "footer of 2147483647 bytes"},
		{"pages", append(append([]byte("PAR1"), bytes.Repeat([]byte{0xee}, 200)...), good[204:]...), "column"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, dir, tt.name+".parquet", tt.data)
			_, err := ReadFile(path, FileOptions{LabelColumn: "species"})
			wantErr(t, err, ErrFormat, path+": ", tt.want)
		})
	}
}

// FuzzReadFileParquet checks that arbitrary Parquet files never panic
// ReadFile or make it allocate out of proportion, and that every accepted
// file gives a valid dataset.
func FuzzReadFileParquet(f *testing.F) {
	lowerReadLimit(f)
	dir := f.TempDir()
	seeds := []string{
		parquetFile(f, dir, "a.parquet", []numbered{{2, 1, ptr(0.5)}, {0, -1, nil}}),
		parquetFile(f, dir, "b.parquet", []numbered{{2, 1, ptr(0.5)}, {0, -1, ptr(2.0)}}, parquet.Compression(&parquet.Snappy), parquet.DataPageVersion(1)),
		parquetFile(f, dir, "c.parquet", pets, parquet.Compression(&parquet.Gzip), parquet.MaxRowsPerRowGroup(2)),
		parquetFile(f, dir, "d.parquet", pets, parquet.Compression(&parquet.Zstd)),
	}
	for _, path := range seeds {
		raw, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw, path != seeds[0])
	}
	f.Fuzz(func(t *testing.T, data []byte, names bool) {
		o := FileOptions{}
		if names {
			o.LabelColumn = "species"
		}
		fuzzReadFile(t, "f.parquet", data, false, o)
	})
}

// review is a Parquet row with text columns.
type review struct {
	ID     int64  `parquet:"id"`
	Text   string `parquet:"text"`
	Reply  string `parquet:"reply"`
	Rating string `parquet:"rating,dict"`
}

// TestReadParquetTextColumn: a Parquet file's string column is a text
// column as a CSV file's is (the same ids, pairs included), across row
// groups; a numeric text column, a missing one and the label as text are
// one-line errors.
func TestReadParquetTextColumn(t *testing.T) {
	dir := t.TempDir()
	rows := []review{
		{1, "A fine, fine film.", "Agreed entirely", "good"},
		{2, "Dull and far too long", "No, it was great", "bad"},
		{3, "Great", "one two three four five six seven", "good"},
	}
	path := parquetFile(t, dir, "reviews.parquet", rows, parquet.MaxRowsPerRowGroup(2))
	var csv strings.Builder
	csv.WriteString("id,text,reply,rating\n")
	for _, r := range rows {
		fmt.Fprintf(&csv, "%d,%q,%q,%s\n", r.ID, r.Text, r.Reply, r.Rating)
	}
	csvPath := filepath.Join(dir, "reviews.csv")
	if err := os.WriteFile(csvPath, []byte(csv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, pair := range []string{"", "reply"} {
		o := FileOptions{LabelColumn: "rating", TextColumn: "text", TextPairColumn: pair, SeqLen: 6}
		got, err := ReadFile(path, o)
		if err != nil {
			t.Fatal(err)
		}
		want, err := ReadFile(csvPath, o)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.X, want.X) || !slices.Equal(got.Y, want.Y) || !slices.Equal(got.Shape, []int{6}) || got.Vocab != DefaultTextVocab {
			t.Errorf("pair %q: Parquet %v %v (shape %v, vocab %d), CSV %v %v", pair, got.X, got.Y, got.Shape, got.Vocab, want.X, want.Y)
		}
	}
	for name, tc := range map[string]struct {
		o    FileOptions
		want string
	}{
		"numeric":   {FileOptions{LabelColumn: "rating", TextColumn: "id"}, `text column "id" has type`},
		"missing":   {FileOptions{LabelColumn: "rating", TextColumn: "body"}, `no column "body"`},
		"label":     {FileOptions{LabelColumn: "rating", TextColumn: "rating"}, "is the label column"},
		"pair only": {FileOptions{LabelColumn: "rating", TextPairColumn: "reply"}, "needs TextColumn"},
	} {
		_, err := ReadFile(path, tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want a one-line error saying %q", name, err, tc.want)
		}
	}
}
