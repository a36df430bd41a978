package dataset

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// idxBytes encodes an unsigned-byte IDX array.
func idxBytes(dims []int, data []byte) []byte {
	var b bytes.Buffer
	b.Write([]byte{0, 0, 0x08, byte(len(dims))})
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, uint32(d))
	}
	b.Write(data)
	return b.Bytes()
}

func gzipBytes(t testing.TB, raw []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	if _, err := w.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func writeFile(t testing.TB, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// smallImages returns n 2×3 images with pixel values i*6+j (mod 256) and
// labels i mod classes.
func smallImages(n, classes int) (images, labels []byte) {
	px := make([]byte, n*6)
	for i := range px {
		px[i] = byte(i * 37)
	}
	lb := make([]byte, n)
	for i := range lb {
		lb[i] = byte(i % classes)
	}
	return idxBytes([]int{n, 2, 3}, px), idxBytes([]int{n}, lb)
}

func TestLoadIDXRawAndGzip(t *testing.T) {
	dir := t.TempDir()
	img, lab := smallImages(5, 3)
	for _, gz := range []bool{false, true} {
		ip, lp := img, lab
		name := "raw"
		if gz {
			ip, lp, name = gzipBytes(t, img), gzipBytes(t, lab), "gz"
		}
		// Names deliberately lie about compression: detection is by magic.
		d, err := LoadIDX("small", writeFile(t, dir, name+"-img.gz", ip), writeFile(t, dir, name+"-lab", lp), 0)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got, want := d.Len(), 5; got != want {
			t.Fatalf("%s: Len = %d, want %d", name, got, want)
		}
		if got, want := d.Shape, []int{1, 2, 3}; !slices.Equal(got, want) {
			t.Fatalf("%s: Shape = %v, want %v", name, got, want)
		}
		if got, want := d.Classes, 3; got != want {
			t.Fatalf("%s: Classes = %d, want %d", name, got, want)
		}
		for i, v := range d.X {
			if want := float32(byte(i*37)) / 255; v != want {
				t.Fatalf("%s: X[%d] = %v, want %v", name, i, v, want)
			}
			if v < 0 || v > 1 {
				t.Fatalf("%s: X[%d] = %v outside [0,1]", name, i, v)
			}
		}
		if got, want := d.Y, []int32{0, 1, 2, 0, 1}; !slices.Equal(got, want) {
			t.Fatalf("%s: Y = %v, want %v", name, got, want)
		}
	}
}

func TestReadIDXErrors(t *testing.T) {
	good := idxBytes([]int{2, 2}, []byte{1, 2, 3, 4})
	huge := idxBytes([]int{60000, 28, 28}, []byte{1, 2, 3})
	tests := []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrIDXTruncated},
		{"bad magic", append([]byte{1, 0}, good[2:]...), ErrIDXFormat},
		{"int32 type", append([]byte{0, 0, 0x0c}, good[3:]...), ErrIDXFormat},
		{"float type", append([]byte{0, 0, 0x0d}, good[3:]...), ErrIDXFormat},
		{"zero dims", []byte{0, 0, 8, 0}, ErrIDXFormat},
		{"too many dims", []byte{0, 0, 8, 200}, ErrIDXFormat},
		{"zero size", idxBytes([]int{0, 2}, nil), ErrIDXFormat},
		{"short dims", good[:6], ErrIDXTruncated},
		{"huge header small file", huge, ErrIDXTruncated},
		{"max dims", idxBytes([]int{1 << 31, 1 << 31, 1 << 31, 1 << 31}, nil), ErrIDXFormat},
		{"truncated payload", good[:len(good)-1], ErrIDXTruncated},
		{"trailing bytes", append(slices.Clone(good), 9), ErrIDXTruncated},
		{"truncated gzip", gzipBytes(t, good)[:20], ErrIDXTruncated},
		{"bad gzip header", []byte{0x1f, 0x8b, 0, 0}, ErrIDXFormat},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadIDX(bytes.NewReader(tt.data), int64(len(tt.data)))
			if !errors.Is(err, tt.want) {
				t.Fatalf("ReadIDX error = %v, want %v", err, tt.want)
			}
		})
	}
	// With an unknown size the 1 GiB cap still applies.
	if _, err := ReadIDX(bytes.NewReader(idxBytes([]int{1 << 16, 1 << 15}, nil)), -1); !errors.Is(err, ErrIDXFormat) {
		t.Fatalf("uncapped header accepted: %v", err)
	}
	// A gzip stream whose CRC is corrupted is rejected.
	gz := gzipBytes(t, good)
	gz[len(gz)-6] ^= 0xff
	if _, err := ReadIDX(bytes.NewReader(gz), int64(len(gz))); err == nil {
		t.Fatal("corrupt gzip CRC accepted")
	}
	// A header declaring far more than the gzip stream could expand to is
	// refused before allocation.
	bomb := gzipBytes(t, huge)
	if _, err := ReadIDX(bytes.NewReader(bomb), int64(len(bomb))); !errors.Is(err, ErrIDXTruncated) {
		t.Fatalf("gzip bomb header error = %v, want ErrIDXTruncated", err)
	}
}

func TestFromIDXMismatch(t *testing.T) {
	img, lab := smallImages(4, 3)
	mi, _ := ReadIDX(bytes.NewReader(img), -1)
	ml, _ := ReadIDX(bytes.NewReader(lab), -1)
	_, lab5 := smallImages(5, 3)
	ml5, _ := ReadIDX(bytes.NewReader(lab5), -1)
	if _, err := FromIDX("x", mi, ml5, 0); !errors.Is(err, ErrIDXMismatch) {
		t.Fatalf("count mismatch error = %v, want ErrIDXMismatch", err)
	}
	if _, err := FromIDX("x", mi, ml, 2); !errors.Is(err, ErrIDXMismatch) {
		t.Fatalf("label ≥ classes error = %v, want ErrIDXMismatch", err)
	}
	if _, err := FromIDX("x", ml, ml, 0); !errors.Is(err, ErrIDXFormat) {
		t.Fatalf("1-D images error = %v, want ErrIDXFormat", err)
	}
	if _, err := FromIDX("x", mi, mi, 0); !errors.Is(err, ErrIDXFormat) {
		t.Fatalf("3-D labels error = %v, want ErrIDXFormat", err)
	}
	dir := t.TempDir()
	if _, err := LoadIDX("x", writeFile(t, dir, "i", img), writeFile(t, dir, "l", lab5), 0); !errors.Is(err, ErrIDXMismatch) {
		t.Fatalf("LoadIDX count mismatch error = %v", err)
	}
	if _, err := LoadIDX("x", filepath.Join(dir, "missing"), writeFile(t, dir, "l", lab5), 0); err == nil {
		t.Fatal("missing file accepted")
	}
}

// FuzzReadIDX checks that arbitrary bytes never panic the decoder, that
// accepted arrays are self-consistent, and that re-encoding them reads back
// identically.
func FuzzReadIDX(f *testing.F) {
	img, lab := smallImages(3, 2)
	f.Add(img)
	f.Add(lab)
	f.Add(gzipBytes(f, img))
	f.Add(idxBytes([]int{1 << 20, 1 << 20}, []byte{1}))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ReadIDX(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return
		}
		total := 1
		for _, d := range m.Dims {
			total *= d
		}
		if total != len(m.Data) {
			t.Fatalf("dims %v but %d bytes", m.Dims, len(m.Data))
		}
		enc := idxBytes(m.Dims, m.Data)
		m2, err := ReadIDX(bytes.NewReader(enc), int64(len(enc)))
		if err != nil {
			t.Fatalf("re-encoded array rejected: %v", err)
		}
		if !slices.Equal(m.Dims, m2.Dims) || !bytes.Equal(m.Data, m2.Data) {
			t.Fatal("round trip changed the array")
		}
		if len(m.Dims) == 3 {
			labels := &IDX{Dims: m.Dims[:1], Data: make([]byte, m.Dims[0])}
			d, err := FromIDX("fuzz", m, labels, 0)
			if err != nil {
				t.Fatalf("FromIDX: %v", err)
			}
			if err := d.Validate(); err != nil {
				t.Fatalf("FromIDX result invalid: %v", err)
			}
		}
	})
}
