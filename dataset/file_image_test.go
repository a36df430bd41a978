package dataset

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// pngBytes encodes img as PNG.
func pngBytes(t testing.TB, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// jpegBytes encodes img as JPEG at the best quality.
func jpegBytes(t testing.TB, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := jpeg.Encode(&b, img, &jpeg.Options{Quality: 100}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// grayImage returns a w×h 8-bit grayscale image with the given pixels,
// row by row.
func grayImage(w, h int, px ...uint8) *image.Gray {
	img := image.NewGray(image.Rect(0, 0, w, h))
	copy(img.Pix, px)
	return img
}

// putImage writes an image file under dir, creating its class folder.
func putImage(t testing.TB, dir, name string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, name, data)
}

// u8 is an 8-bit value scaled to [0,1] as ReadFile does it.
func u8(v uint8) float32 { return float32(float64(v) / 255) }

func TestReadFileImageFolder(t *testing.T) {
	dir := t.TempDir()
	putImage(t, dir, "dog/b.png", pngBytes(t, grayImage(2, 2, 10, 20, 30, 40)))
	putImage(t, dir, "dog/A.PNG", pngBytes(t, grayImage(2, 2, 0, 255, 128, 1)))
	putImage(t, dir, "cat/x.png", pngBytes(t, grayImage(2, 2, 5, 6, 7, 8)))
	putImage(t, dir, "bird/.hidden.png", []byte("not an image"))
	putImage(t, dir, "bird/readme.txt", []byte("not an image"))
	putImage(t, dir, "bird/sub/deep.png", []byte("not an image"))
	putImage(t, dir, ".git/x.png", []byte("not an image"))
	putImage(t, dir, "root.png", []byte("not an image"))

	want := []float32{
		u8(5), u8(6), u8(7), u8(8), // cat/x.png
		u8(0), u8(255), u8(128), u8(1), // dog/A.PNG
		u8(10), u8(20), u8(30), u8(40), // dog/b.png
	}
	d, err := ReadFile(dir, FileOptions{InputShape: []int{1, 2, 2}})
	checkRead(t, d, err, want, []int32{1, 2, 2}, []int{1, 2, 2}, 3, []string{"bird", "cat", "dog"})
	if d.Name != filepath.Base(dir) {
		t.Errorf("Name = %q, want the folder's name", d.Name)
	}

	d, err = ReadFile(dir, FileOptions{InputShape: []int{1, 2, 2}, Labels: []string{"dog", "fish", "cat", "bird"}, Name: "pets"})
	checkRead(t, d, err, want, []int32{2, 0, 0}, []int{1, 2, 2}, 4, []string{"dog", "fish", "cat", "bird"})
	d, err = ReadFile(dir, FileOptions{InputShape: []int{1, 2, 2}, Classes: 3})
	checkRead(t, d, err, want, []int32{1, 2, 2}, []int{1, 2, 2}, 3, []string{"bird", "cat", "dog"})
}

func TestReadFileImageColor(t *testing.T) {
	dir := t.TempDir()
	rgb := image.NewNRGBA(image.Rect(0, 0, 2, 1))
	rgb.SetNRGBA(0, 0, color.NRGBA{255, 0, 0, 255})
	rgb.SetNRGBA(1, 0, color.NRGBA{10, 20, 30, 255})
	putImage(t, dir, "a/rgb.png", pngBytes(t, rgb))
	g16 := image.NewGray16(image.Rect(0, 0, 2, 1))
	g16.SetGray16(0, 0, color.Gray16{1000})
	g16.SetGray16(1, 0, color.Gray16{65535})
	putImage(t, dir, "b/g16.png", pngBytes(t, g16))

	// RGB, C-major: the red plane, then green, then blue.
	d, err := ReadFile(dir, FileOptions{InputShape: []int{3, 1, 2}})
	checkRead(t, d, err, []float32{
		1, u8(10), 0, u8(20), 0, u8(30),
		float32(1000.0 / 65535), 1, float32(1000.0 / 65535), 1, float32(1000.0 / 65535), 1,
	}, []int32{0, 1}, []int{3, 1, 2}, 2, []string{"a", "b"})

	// Grayscale: luminance 0.299 R + 0.587 G + 0.114 B; 16-bit values kept.
	d, err = ReadFile(dir, FileOptions{InputShape: []int{1, 1, 2}})
	if err != nil {
		t.Fatal(err)
	}
	lum := (0.299*10 + 0.587*20 + 0.114*30) / 255
	for i, want := range []float64{0.299, lum, 1000.0 / 65535, 1} {
		if math.Abs(float64(d.X[i])-want) > 1e-3 {
			t.Errorf("gray X[%d] = %v, want %v", i, d.X[i], want)
		}
	}
}

func TestReadFileImageResizeAndJPEG(t *testing.T) {
	dir := t.TempDir()
	// A horizontal ramp 0..255 over 8 pixels, 2 rows, as JPEG.
	ramp := image.NewGray(image.Rect(0, 0, 8, 2))
	for y := range 2 {
		for x := range 8 {
			ramp.SetGray(x, y, color.Gray{uint8(x * 255 / 7)})
		}
	}
	putImage(t, dir, "ramp/r.jpg", jpegBytes(t, ramp))
	putImage(t, dir, "ramp/r.png", pngBytes(t, ramp))
	// A constant 5×3 image.
	flat := image.NewRGBA(image.Rect(0, 0, 5, 3))
	for i := range flat.Pix {
		flat.Pix[i] = 200
	}
	putImage(t, dir, "zflat/f.jpeg", jpegBytes(t, flat))

	// Same size: the JPEG approximately, the PNG exactly.
	d, err := ReadFile(dir, FileOptions{InputShape: []int{1, 2, 8}})
	if err != nil {
		t.Fatal(err)
	}
	for x := range 8 {
		want := float64(x*255/7) / 255
		if got := d.Row(0)[x]; math.Abs(float64(got)-want) > 0.02 {
			t.Errorf("jpeg pixel %d = %v, want ≈ %v", x, got, want)
		}
		if got := d.Row(1)[8+x]; got != u8(uint8(x*255/7)) {
			t.Errorf("png pixel %d = %v, want %v", x, got, u8(uint8(x*255/7)))
		}
	}
	// Resized to 4×1: bilinear samples of the ramp, increasing, in [0,1];
	// the constant image stays constant.
	d, err = ReadFile(dir, FileOptions{InputShape: []int{1, 1, 4}})
	if err != nil {
		t.Fatal(err)
	}
	png := d.Row(1)
	for x := 1; x < 4; x++ {
		if !(png[x] > png[x-1]) || png[x] > 1 || png[0] < 0 {
			t.Errorf("resized ramp %v is not increasing in [0,1]", png)
		}
	}
	if png[0] > 0.2 || png[3] < 0.8 {
		t.Errorf("resized ramp %v does not span the ramp", png)
	}
	for _, v := range d.Row(2) {
		if math.Abs(float64(v)-200.0/255) > 0.01 {
			t.Errorf("resized constant image %v, want ≈ %v", d.Row(2), 200.0/255)
		}
	}
}

func TestReadFileImageErrors(t *testing.T) {
	shape := []int{1, 2, 2}
	good := pngBytes(t, grayImage(2, 2, 1, 2, 3, 4))
	// A PNG header claiming 100000×100000 pixels.
	huge := append([]byte(nil), good...)
	binary.BigEndian.PutUint32(huge[16:], 100000)
	binary.BigEndian.PutUint32(huge[20:], 100000)
	binary.BigEndian.PutUint32(huge[29:], crc32.ChecksumIEEE(huge[12:29])) // IHDR's
	for _, tt := range []struct {
		name  string
		files map[string][]byte
		o     FileOptions
		err   error
		want  string
	}{
		{"no shape", map[string][]byte{"a/x.png": good}, FileOptions{}, ErrFileOptions, "needs InputShape [C,H,W]"},
		{"two channels", map[string][]byte{"a/x.png": good}, FileOptions{InputShape: []int{2, 2, 2}}, ErrFileOptions, "[2 2 2]"},
		{"empty folder", map[string][]byte{"x.png": good}, FileOptions{InputShape: shape}, ErrFormat, "no class sub-folders"},
		{"no images", map[string][]byte{"a/x.txt": good, "b/.y.png": good}, FileOptions{InputShape: shape}, ErrFormat, `no .png, .jpg or .jpeg images in its class sub-folders ["a", "b"]`},
		{"corrupt", map[string][]byte{"a/x.png": good, "b/bad.png": good[:30]}, FileOptions{InputShape: shape}, ErrFormat, "b/bad.png: cannot decode PNG image"},
		{"jpeg named png", map[string][]byte{"a/x.png": jpegBytes(t, grayImage(2, 2))}, FileOptions{InputShape: shape}, ErrFormat, "a/x.png: cannot decode PNG image"},
		{"garbage jpeg", map[string][]byte{"a/x.jpg": []byte("hello")}, FileOptions{InputShape: shape}, ErrFormat, "a/x.jpg: cannot decode JPEG image"},
		{"huge", map[string][]byte{"a/x.png": huge}, FileOptions{InputShape: shape}, ErrFormat, "a/x.png: PNG image of 100000×100000 pixels is empty or too large"},
		{"not in Labels", map[string][]byte{"a/x.png": good, "b/x.png": good}, FileOptions{InputShape: shape, Labels: []string{"a"}}, ErrFormat, `/b: class sub-folder: label "b" is not one of the class names ["a"]`},
		{"classes", map[string][]byte{"a/x.png": good, "b/x.png": good}, FileOptions{InputShape: shape, Classes: 3}, ErrFormat, "2 distinct names but the number of classes (--classes) is 3"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, data := range tt.files {
				putImage(t, dir, name, data)
			}
			_, err := ReadFile(dir, tt.o)
			wantErr(t, err, tt.err, dir, tt.want)
		})
	}
}

// FuzzReadFileImage checks that arbitrary image files never panic ReadFile
// or make it allocate out of proportion, and that every accepted folder
// gives a valid dataset.
func FuzzReadFileImage(f *testing.F) {
	lowerReadLimit(f)
	rgb := image.NewRGBA(image.Rect(0, 0, 3, 2))
	for i := range rgb.Pix {
		rgb.Pix[i] = uint8(i * 7)
	}
	f.Add(pngBytes(f, grayImage(2, 2, 1, 2, 3, 4)), false, false)
	f.Add(pngBytes(f, rgb), false, true)
	f.Add(jpegBytes(f, rgb), true, true)
	f.Add(jpegBytes(f, grayImage(8, 8)), true, false)
	f.Fuzz(func(t *testing.T, data []byte, isJPEG, color bool) {
		name, shape := "c/x.png", []int{1, 3, 2}
		if isJPEG {
			name = "c/x.jpg"
		}
		if color {
			shape[0] = 3
		}
		fuzzReadFile(t, name, data, true, FileOptions{InputShape: shape})
	})
}

// TestImageFolderShape: the default input shape is the first image's, gray
// or RGB, with a large image scaled to a longer side of 64.
func TestImageFolderShape(t *testing.T) {
	dir := t.TempDir()
	write := func(class, name string, img image.Image) {
		if err := os.MkdirAll(filepath.Join(dir, class), 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(filepath.Join(dir, class, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := png.Encode(f, img); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	write("b", "0.png", image.NewRGBA(image.Rect(0, 0, 10, 10)))
	write("a", "0.png", image.NewGray(image.Rect(0, 0, 20, 12)))
	if got, err := ImageFolderShape(dir); err != nil || !slices.Equal(got, []int{1, 12, 20}) {
		t.Fatalf("ImageFolderShape = %v, %v; want [1 12 20] (the first class's gray image)", got, err)
	}
	os.RemoveAll(filepath.Join(dir, "a"))
	write("c", "0.png", image.NewRGBA(image.Rect(0, 0, 200, 100)))
	write("b", "0.png", image.NewRGBA(image.Rect(0, 0, 200, 100)))
	if got, err := ImageFolderShape(dir); err != nil || !slices.Equal(got, []int{3, 32, 64}) {
		t.Fatalf("ImageFolderShape = %v, %v; want [3 32 64]", got, err)
	}
	if _, err := ImageFolderShape(t.TempDir()); err == nil {
		t.Error("an empty folder has a shape")
	}
}
