package dataset

import (
	"bufio"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/image/draw"
)

// Image limits: an image may have at most maxImagePixels pixels, and at
// most maxImagePixelsPerByte per byte of its file (plus 64 Ki), checked on
// its header before it is decoded. DEFLATE expands at most about 1032:1,
// so even a 1-bit PNG stays under 8300 pixels per byte; JPEG needs at
// least 2 bits per 8×8 block.
const (
	maxImagePixels        = 1 << 25
	maxImagePixelsPerByte = 8300
)

// imageCodecs maps the image extensions ReadFile reads (lower case) to
// their header and image decoders.
var imageCodecs = map[string]struct {
	name   string
	config func(io.Reader) (image.Config, error)
	decode func(io.Reader) (image.Image, error)
}{
	".png":  {"PNG", png.DecodeConfig, png.Decode},
	".jpg":  {"JPEG", jpeg.DecodeConfig, jpeg.Decode},
	".jpeg": {"JPEG", jpeg.DecodeConfig, jpeg.Decode},
}

// readImageFolder reads an image folder: DIR/<class>/*.png|*.jpg|*.jpeg,
// classes in sorted sub-folder order (or by o.Labels), each image turned
// into o.InputShape [C,H,W] values in [0,1], C-major.
func readImageFolder(dir string, o FileOptions) (*Dataset, error) {
	shape := o.InputShape
	if len(shape) != 3 || (shape[0] != 1 && shape[0] != 3) {
		return nil, optionsErr(dir, "an image folder needs InputShape [C,H,W] with C 1 (grayscale) or 3 (RGB), not %v", shape)
	}
	classDirs, classes, lab, err := classFolders(dir, o, "*.png|*.jpg|*.jpeg")
	if err != nil {
		return nil, err
	}
	d := &Dataset{Dim: shape[0] * shape[1] * shape[2]}
	for k, name := range classDirs {
		sub := filepath.Join(dir, name)
		files, err := imageFiles(sub)
		if err != nil {
			return nil, err
		}
		for _, file := range files {
			codec := imageCodecs[strings.ToLower(filepath.Ext(file))]
			if len(d.X) > maxReadValues-d.Dim {
				return nil, formatErr(file, nil, "more than %d feature values in the folder", maxReadValues)
			}
			img, err := decodeImage(file, codec.name, codec.config, codec.decode)
			if err != nil {
				return nil, err
			}
			d.X = appendImage(d.X, img, shape)
			d.Y = append(d.Y, classes[k])
		}
	}
	if d.Len() == 0 {
		return nil, formatErr(dir, nil, "no .png, .jpg or .jpeg images in its class sub-folders %s", quoteList(classDirs, 8))
	}
	if d.Classes, d.LabelNames, err = lab.finish(d.Y); err != nil {
		return nil, formatErr(dir, nil, "%v", err)
	}
	return d, nil
}

// classFolders lists the class sub-folders of a folder of examples per
// class (images or text): their names in sorted order and each one's
// class, provisional (labeler.deferName) unless o.Labels names them; the
// labeler finishes the classes once the examples are read. want says
// what a sub-folder holds, for the error when there is none.
func classFolders(dir string, o FileOptions, want string) ([]string, []int32, *labeler, error) {
	names, err := classFoldersOnly(dir)
	if err != nil {
		return nil, nil, nil, err
	}
	lab := fileLabeler(o)
	classes := make([]int32, len(names))
	for i, name := range names {
		if !lab.defers() {
			classes[i], err = lab.fromText(name)
		} else {
			classes[i], err = lab.deferName(name, 0)
		}
		if err != nil {
			return nil, nil, nil, formatErr(filepath.Join(dir, name), nil, "class sub-folder: %v", err)
		}
	}
	if len(names) == 0 {
		return nil, nil, nil, formatErr(dir, nil, "no class sub-folders: want DIR/<class>/%s", want)
	}
	if _, err := lab.resolve(classes, false); err != nil {
		return nil, nil, nil, formatErr(dir, nil, "%v", err)
	}
	return names, classes, lab, nil
}

// classFoldersOnly returns the names of dir's visible sub-folders, in
// sorted order.
func classFoldersOnly(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fileOpenErr(dir, err)
	}
	var names []string
	for _, e := range entries {
		if visible(dir, e, fs.ModeDir) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// imageFiles returns the paths of the images in the class folder sub, in
// sorted order: its visible regular files with an extension ReadFile
// reads.
func imageFiles(sub string) ([]string, error) {
	return classFiles(sub, func(ext string) bool { _, ok := imageCodecs[ext]; return ok })
}

// classFiles returns the paths of the visible regular files of the class
// folder sub whose lower-case extension keep accepts, in sorted order.
func classFiles(sub string, keep func(ext string) bool) ([]string, error) {
	entries, err := os.ReadDir(sub)
	if err != nil {
		return nil, fileOpenErr(sub, err)
	}
	var files []string
	for _, e := range entries {
		if keep(strings.ToLower(filepath.Ext(e.Name()))) && visible(sub, e, 0) {
			files = append(files, filepath.Join(sub, e.Name()))
		}
	}
	return files, nil
}

// visible reports whether the directory entry e of dir is not hidden (no
// leading '.') and, following a symbolic link, a directory (want
// fs.ModeDir) or a regular file (want 0).
func visible(dir string, e fs.DirEntry, want fs.FileMode) bool {
	if strings.HasPrefix(e.Name(), ".") {
		return false
	}
	mode := e.Type()
	if mode&fs.ModeSymlink != 0 {
		st, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil {
			return false
		}
		mode = st.Mode()
	}
	return mode.Type() == want
}

// decodeImage decodes the image file after checking its header's size.
func decodeImage(file, format string, config func(io.Reader) (image.Config, error), decode func(io.Reader) (image.Image, error)) (image.Image, error) {
	f, size, err := openData(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cfg, err := config(bufio.NewReader(f))
	if err != nil {
		return nil, formatErr(file, err, "cannot decode %s image: %v", format, err)
	}
	px := int64(cfg.Width) * int64(cfg.Height)
	if cfg.Width < 1 || cfg.Height < 1 || px > maxImagePixels || px > maxImagePixelsPerByte*size+1<<16 {
		return nil, formatErr(file, nil, "%s image of %d×%d pixels is empty or too large for its %d bytes", format, cfg.Width, cfg.Height, size)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fileOpenErr(file, err)
	}
	img, err := decode(bufio.NewReader(f))
	if err != nil {
		return nil, formatErr(file, err, "cannot decode %s image: %v", format, err)
	}
	return img, nil
}

// appendImage appends img to x as shape [C,H,W] values in [0,1], C-major:
// resized to H×W with bilinear interpolation (unless it has that size),
// then grayscale (C = 1, luminance as color.Gray16Model) or RGB (C = 3),
// at 16-bit precision (an 8-bit value v becomes v/255 exactly). A
// transparent image is composited onto black.
func appendImage(x []float32, img image.Image, shape []int) []float32 {
	c, h, w := shape[0], shape[1], shape[2]
	dst := image.NewRGBA64(image.Rect(0, 0, w, h))
	if b := img.Bounds(); b.Dx() == w && b.Dy() == h {
		draw.Draw(dst, dst.Bounds(), img, b.Min, draw.Src)
	} else {
		draw.BiLinear.Scale(dst, dst.Bounds(), img, b, draw.Src, nil)
	}
	n := len(x)
	x = append(x, make([]float32, c*h*w)...) // extends x without a temporary
	plane := x[n:]
	for y := range h {
		for i := range w {
			p := dst.RGBA64At(i, y)
			if c == 1 {
				plane[y*w+i] = unit16(color.Gray16Model.Convert(p).(color.Gray16).Y)
				continue
			}
			plane[y*w+i] = unit16(p.R)
			plane[h*w+y*w+i] = unit16(p.G)
			plane[2*h*w+y*w+i] = unit16(p.B)
		}
	}
	return x
}

// unit16 scales a 16-bit channel value to [0,1].
func unit16(v uint16) float32 { return float32(float64(v) / 0xffff) }

// maxDefaultImageSide is the largest side ImageFolderShape gives: a
// larger first image is scaled down, keeping its aspect, so that a folder
// of photos does not make a model of millions of inputs by default.
const maxDefaultImageSide = 64

// ImageFolderShape returns the input shape an image folder's images are
// read at when none is given: the first image's (its first class
// sub-folder's first image, in sorted order), [1,H,W] if its colour
// model is gray and [3,H,W] otherwise, with the longer side at most 64
// pixels. It reads that image's header only.
func ImageFolderShape(dir string) ([]int, error) {
	subs, err := classFoldersOnly(dir)
	if err != nil {
		return nil, err
	}
	for _, s := range subs {
		files, err := imageFiles(filepath.Join(dir, s))
		if err != nil {
			return nil, err
		}
		for _, file := range files {
			codec := imageCodecs[strings.ToLower(filepath.Ext(file))]
			f, _, err := openData(file)
			if err != nil {
				return nil, err
			}
			cfg, err := codec.config(bufio.NewReader(f))
			f.Close()
			if err != nil || cfg.Width < 1 || cfg.Height < 1 {
				return nil, formatErr(file, err, "cannot decode %s image header: %v", codec.name, err)
			}
			c := 3
			if cfg.ColorModel == color.GrayModel || cfg.ColorModel == color.Gray16Model {
				c = 1
			}
			h, w := cfg.Height, cfg.Width
			if side := max(h, w); side > maxDefaultImageSide {
				h = max(1, h*maxDefaultImageSide/side)
				w = max(1, w*maxDefaultImageSide/side)
			}
			return []int{c, h, w}, nil
		}
	}
	return nil, formatErr(dir, nil, "no .png, .jpg or .jpeg image in a class sub-folder: want DIR/<class>/*.png|*.jpg|*.jpeg")
}
