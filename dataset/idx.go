package dataset

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// The IDX format (LeCun et al., http://yann.lecun.com/exdb/mnist/, also used
// by Fashion-MNIST) is a big-endian header followed by the raw data:
//
//	bytes 0-1: 0x00 0x00
//	byte  2:   type code (0x08 unsigned byte, 0x09 signed byte, 0x0B int16,
//	           0x0C int32, 0x0D float32, 0x0E float64)
//	byte  3:   number of dimensions r
//	then r big-endian uint32 dimension sizes, then the data, row-major.
//
// Only unsigned-byte data (0x08) is supported: it is what every MNIST-family
// file uses.

// IDX limits. MaxIDXBytes caps the payload a header may declare, whatever the
// file size, so a malicious header cannot make the reader allocate more.
const (
	MaxIDXBytes = 1 << 30 // 1 GiB of payload
	MaxIDXDims  = 8
	// maxGzipRatio bounds how much a gzip stream can expand: DEFLATE's
	// maximum compression ratio is about 1032:1 (RFC 1951 length-258
	// matches at one bit each), so a payload larger than this times the
	// compressed size cannot be real.
	maxGzipRatio = 1032
)

// Errors returned (wrapped, with details) by the IDX reader.
var (
	// ErrIDXFormat is returned for a malformed IDX header: bad magic, an
	// unsupported type code, zero or too many dimensions, or a zero or
	// absurd dimension size.
	ErrIDXFormat = errors.New("dataset: malformed IDX data")
	// ErrIDXTruncated is returned when the data ends before the size the
	// header declares, or carries bytes after it.
	ErrIDXTruncated = errors.New("dataset: IDX data truncated or oversized")
	// ErrIDXMismatch is returned by LoadIDX when the images and labels files
	// do not describe the same number of examples, or labels exceed the
	// class count.
	ErrIDXMismatch = errors.New("dataset: IDX images and labels do not match")
)

// IDX is a decoded unsigned-byte IDX array.
type IDX struct {
	Dims []int // dimension sizes, outermost first; product == len(Data)
	Data []byte
}

// ReadIDX decodes one IDX array from r, which may be raw or gzip-compressed:
// compression is detected from the gzip magic bytes (0x1f 0x8b), never from
// a file name. size is the number of bytes r holds (e.g. the file size), or
// -1 if unknown; the header's declared payload must fit in size (raw) or in
// maxGzipRatio*size (gzip) and in MaxIDXBytes, checked before anything is
// allocated. Trailing bytes after the declared payload are an error.
func ReadIDX(r io.Reader, size int64) (*IDX, error) {
	br := bufio.NewReader(r)
	peek, _ := br.Peek(2)
	limit := int64(MaxIDXBytes)
	var src io.Reader = br
	if len(peek) == 2 && peek[0] == 0x1f && peek[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%w: bad gzip stream: %v", ErrIDXFormat, err)
		}
		defer zr.Close()
		zr.Multistream(false)
		src = zr
		if size >= 0 && size < limit/maxGzipRatio {
			limit = size * maxGzipRatio
		}
	} else if size >= 0 && size < limit {
		limit = size
	}

	var hdr [4]byte
	if _, err := io.ReadFull(src, hdr[:]); err != nil {
		return nil, fmt.Errorf("%w: reading header: %v", ErrIDXTruncated, err)
	}
	if hdr[0] != 0 || hdr[1] != 0 {
		return nil, fmt.Errorf("%w: bad magic %#02x%02x, want 0x0000", ErrIDXFormat, hdr[0], hdr[1])
	}
	if hdr[2] != 0x08 {
		return nil, fmt.Errorf("%w: type code %#02x not supported (want 0x08, unsigned byte)", ErrIDXFormat, hdr[2])
	}
	nd := int(hdr[3])
	if nd < 1 || nd > MaxIDXDims {
		return nil, fmt.Errorf("%w: %d dimensions, want 1..%d", ErrIDXFormat, nd, MaxIDXDims)
	}
	var dimBuf [4 * MaxIDXDims]byte
	if _, err := io.ReadFull(src, dimBuf[:4*nd]); err != nil {
		return nil, fmt.Errorf("%w: reading %d dimension sizes: %v", ErrIDXTruncated, nd, err)
	}
	dims := make([]int, nd)
	total := int64(1)
	for i := range dims {
		v := int64(binary.BigEndian.Uint32(dimBuf[4*i:]))
		if v == 0 {
			return nil, fmt.Errorf("%w: dimension %d is zero", ErrIDXFormat, i)
		}
		total *= v // total ≤ 2^30 and v < 2^32 here, so no int64 overflow
		if total > MaxIDXBytes {
			return nil, fmt.Errorf("%w: dimensions %v declare more than the %d-byte cap", ErrIDXFormat, dimsOf(dimBuf[:4*nd]), MaxIDXBytes)
		}
		dims[i] = int(v)
	}
	if avail := limit - 4 - 4*int64(nd); total > avail {
		return nil, fmt.Errorf("%w: dimensions %v declare %d bytes but the input can hold at most %d", ErrIDXTruncated, dims, total, max(avail, 0))
	}
	data := make([]byte, total)
	if n, err := io.ReadFull(src, data); err != nil {
		return nil, fmt.Errorf("%w: header declares %d bytes, got %d: %v", ErrIDXTruncated, total, n, err)
	}
	// Reading past the payload must hit EOF; for gzip this also verifies the
	// stream's CRC-32 and length trailer.
	var one [1]byte
	switch n, err := io.ReadFull(src, one[:]); {
	case n != 0:
		return nil, fmt.Errorf("%w: extra bytes after the %d declared", ErrIDXTruncated, total)
	case err != io.EOF:
		return nil, fmt.Errorf("%w: after payload: %v", ErrIDXFormat, err)
	}
	return &IDX{Dims: dims, Data: data}, nil
}

func dimsOf(b []byte) []uint32 {
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = binary.BigEndian.Uint32(b[4*i:])
	}
	return out
}

// ReadIDXFile reads one IDX file, raw or gzip-compressed (see ReadIDX), using
// the file size to bound what the header may declare.
func ReadIDXFile(path string) (*IDX, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("dataset: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("dataset: %w", err)
	}
	m, err := ReadIDX(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// FromIDX builds an image-classification Dataset from decoded IDX arrays:
// images must have 3 dimensions [N, H, W] and labels 1 dimension [N]. Pixel
// bytes are scaled to float32 in [0, 1] by dividing by 255; Shape is
// [1, H, W]. If classes is 0 it is inferred as max(label)+1; otherwise every
// label must be below it. Errors wrap ErrIDXFormat or ErrIDXMismatch.
func FromIDX(name string, images, labels *IDX, classes int) (*Dataset, error) {
	if len(images.Dims) != 3 {
		return nil, fmt.Errorf("%w: images have dimensions %v, want [N H W]", ErrIDXFormat, images.Dims)
	}
	if len(labels.Dims) != 1 {
		return nil, fmt.Errorf("%w: labels have dimensions %v, want [N]", ErrIDXFormat, labels.Dims)
	}
	n, h, w := images.Dims[0], images.Dims[1], images.Dims[2]
	if labels.Dims[0] != n {
		return nil, fmt.Errorf("%w: %d images but %d labels", ErrIDXMismatch, n, labels.Dims[0])
	}
	if classes < 0 || classes > 256 {
		return nil, fmt.Errorf("%w: classes %d outside [0, 256]", ErrIDXMismatch, classes)
	}
	maxLabel := 0
	for _, l := range labels.Data {
		maxLabel = max(maxLabel, int(l))
	}
	if classes == 0 {
		classes = maxLabel + 1
	} else if maxLabel >= classes {
		return nil, fmt.Errorf("%w: label %d with only %d classes", ErrIDXMismatch, maxLabel, classes)
	}
	d := &Dataset{
		Name:    name,
		X:       make([]float32, len(images.Data)),
		Y:       make([]int32, n),
		Dim:     h * w,
		Shape:   []int{1, h, w},
		Classes: classes,
	}
	for i, p := range images.Data {
		d.X[i] = float32(p) / 255
	}
	for i, l := range labels.Data {
		d.Y[i] = int32(l)
	}
	return d, nil
}

// LoadIDX reads an images file and a labels file (each raw or gzip) and
// returns them as one Dataset; see FromIDX for the conversion.
func LoadIDX(name, imagesPath, labelsPath string, classes int) (*Dataset, error) {
	images, err := ReadIDXFile(imagesPath)
	if err != nil {
		return nil, err
	}
	labels, err := ReadIDXFile(labelsPath)
	if err != nil {
		return nil, err
	}
	d, err := FromIDX(name, images, labels, classes)
	if err != nil {
		return nil, fmt.Errorf("%s, %s: %w", imagesPath, labelsPath, err)
	}
	return d, nil
}
