package dataset

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/parquet-go/parquet-go/format"
)

// parquet-go trusts the sizes a file declares: a footer length, thrift
// list lengths, page sizes and value counts are allocated before the data
// that would back them is read, and some corrupt pages make it panic or
// loop. The checks here run on the raw bytes before parquet-go sees them,
// so that a file can only make ReadFile allocate in proportion to its
// size or to the maxReadValues bound:
//
//   - checkThrift walks thrift compact-protocol data (the footer, each
//     page header) and rejects lists, maps and strings longer than the
//     bytes left, so the decoder allocates no more than the data holds;
//   - scanChunk walks a column chunk's page headers and checks each page's
//     sizes and value counts against the chunk, the row group and the
//     page's compression codec (and the codec's own header).

// errThriftShort is checkThrift's error when the data ends early (the
// caller may retry with more bytes).
var errThriftShort = errors.New("thrift data ends early")

// maxThriftDepth bounds the nesting of thrift structs, lists and maps.
const maxThriftDepth = 32

// thriftWalk checks thrift compact-protocol data and records the i32 and
// bool fields of the outer two struct levels by field-id path ("2",
// "5.1"; bools as 0 or 1), as parquet-go's decoder would see them: values
// of another type than i32 or bool are not recorded (the decoder skips
// them too).
type thriftWalk struct {
	b    []byte
	off  int
	ints map[string]int64
}

// checkThrift walks the thrift struct at the start of b and returns its
// length and recorded fields.
func checkThrift(b []byte) (n int, ints map[string]int64, err error) {
	w := &thriftWalk{b: b, ints: make(map[string]int64)}
	if err := w.structure("", 0); err != nil {
		return 0, nil, err
	}
	return w.off, w.ints, nil
}

func (w *thriftWalk) byte1() (byte, error) {
	if w.off >= len(w.b) {
		return 0, errThriftShort
	}
	w.off++
	return w.b[w.off-1], nil
}

func (w *thriftWalk) skip(n uint64) error {
	if n > uint64(len(w.b)-w.off) {
		return errThriftShort
	}
	w.off += int(n)
	return nil
}

func (w *thriftWalk) uvarint() (uint64, error) {
	v, n := binary.Uvarint(w.b[w.off:])
	switch {
	case n == 0:
		return 0, errThriftShort
	case n < 0:
		return 0, fmt.Errorf("thrift varint overflows")
	}
	w.off += n
	return v, nil
}

// elements skips the n elements of a container at depth, each a value of
// each of types (one type for a list or set, key and value for a map),
// after checking that the data can hold them: every value takes at least
// one byte.
func (w *thriftWalk) elements(n uint64, depth int, types ...byte) error {
	if n > uint64(len(w.b)-w.off)/uint64(len(types)) {
		return fmt.Errorf("thrift container of %d elements in %d bytes", n, len(w.b)-w.off)
	}
	if depth >= maxThriftDepth {
		return fmt.Errorf("thrift data nested more than %d deep", maxThriftDepth)
	}
	for range n {
		for _, typ := range types {
			if err := w.value(typ, "-", depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

func (w *thriftWalk) structure(path string, depth int) error {
	if depth > maxThriftDepth {
		return fmt.Errorf("thrift data nested more than %d deep", maxThriftDepth)
	}
	id := int64(0)
	for {
		b, err := w.byte1()
		if err != nil {
			return err
		}
		if b == 0 { // STOP
			return nil
		}
		typ := b & 0x0f
		if delta := b >> 4; delta != 0 {
			id += int64(delta)
		} else {
			v, err := w.uvarint()
			if err != nil {
				return err
			}
			id = int64(v>>1) ^ -int64(v&1)
		}
		field := strconv.FormatInt(id, 10)
		if path != "" {
			field = path + "." + field
		}
		if depth >= 2 || path == "-" {
			field = "-" // not recorded
		}
		switch typ {
		case 1, 2: // bool true, false: no payload
			w.record(field, int64(2-typ))
		case 5: // i32
			v, err := w.uvarint()
			if err != nil {
				return err
			}
			w.record(field, int64(v>>1)^-int64(v&1))
		default:
			if err := w.value(typ, field, depth); err != nil {
				return err
			}
		}
	}
}

func (w *thriftWalk) record(field string, v int64) {
	if field != "-" {
		w.ints[field] = v
	}
}

// value skips one value of the given compact type (not a bool field).
func (w *thriftWalk) value(typ byte, path string, depth int) error {
	switch typ {
	case 1, 2, 3: // bool (as a list element), byte
		return w.skip(1)
	case 4, 5, 6: // i16, i32, i64
		_, err := w.uvarint()
		return err
	case 7: // double
		return w.skip(8)
	case 8: // binary
		n, err := w.uvarint()
		if err != nil {
			return err
		}
		return w.skip(n)
	case 9, 10: // list, set
		b, err := w.byte1()
		if err != nil {
			return err
		}
		n := uint64(b >> 4)
		if n == 15 {
			if n, err = w.uvarint(); err != nil {
				return err
			}
		}
		return w.elements(n, depth, b&0x0f)
	case 11: // map
		n, err := w.uvarint()
		if err != nil || n == 0 {
			return err
		}
		kv, err := w.byte1()
		if err != nil {
			return err
		}
		return w.elements(n, depth, kv>>4, kv&0x0f)
	case 12: // struct
		return w.structure(path, depth+1)
	case 13: // uuid
		return w.skip(16)
	}
	return fmt.Errorf("bad thrift type %d", typ)
}

// Page types (format.PageType).
const (
	pageData       = 0
	pageDictionary = 2
	pageDataV2     = 3
)

// chunkLimits is what scanChunk checks a column chunk's pages against.
type chunkLimits struct {
	codec    format.CompressionCodec
	rows     int64 // rows of the row group: each page holds at most these values
	maxBytes int64 // bound on any page's uncompressed size
}

// maxPageHeader bounds a page header (statistics included).
const maxPageHeader = 1 << 20

// scanChunk walks the pages of the column chunk at [start, end) of r and
// checks them: headers valid thrift, pages inside the chunk, as many
// values as rows, and uncompressed sizes that the page's codec can produce
// from its compressed bytes.
func scanChunk(r io.ReaderAt, start, end int64, lim chunkLimits) error {
	var values int64
	buf := make([]byte, 0, 256)
	for pos := start; pos < end; {
		// Read the header, with more bytes until it fits.
		var hlen int
		var h map[string]int64
		for size := int64(256); ; size *= 4 {
			size = min(size, end-pos, maxPageHeader)
			buf = buf[:size]
			if _, err := r.ReadAt(buf, pos); err != nil {
				return fmt.Errorf("reading the page header at byte %d: %v", pos, err)
			}
			var err error
			if hlen, h, err = checkThrift(buf); err == nil {
				break
			} else if err != errThriftShort || size == min(end-pos, maxPageHeader) {
				return fmt.Errorf("bad page header at byte %d: %v", pos, err)
			}
		}
		comp, unc := h["3"], h["2"]
		dataStart := pos + int64(hlen)
		if comp < 0 || unc < 0 || comp > end-dataStart {
			return fmt.Errorf("page at byte %d of %d bytes does not fit its column chunk [%d, %d)", pos, comp, start, end)
		}
		if unc > lim.maxBytes {
			return fmt.Errorf("page at byte %d declares %d uncompressed bytes, more than %d", pos, unc, lim.maxBytes)
		}
		compressed := true
		switch h["1"] {
		case pageData:
			nv := h["5.1"]
			if nv < 0 || nv > lim.rows-values {
				return fmt.Errorf("page at byte %d declares %d values; the row group has %d rows", pos, nv, lim.rows)
			}
			values += nv
		case pageDataV2:
			nv, nulls, levels := h["8.1"], h["8.2"], h["8.5"]+h["8.6"]
			if nv < 0 || nv > lim.rows-values || nulls < 0 || nulls > nv || h["8.3"] < 0 || h["8.5"] < 0 || h["8.6"] < 0 || levels > comp {
				return fmt.Errorf("page at byte %d has inconsistent value, null or level counts", pos)
			}
			values += nv
			dataStart += levels
			comp -= levels
			if v, ok := h["8.7"]; ok && v == 0 {
				compressed = false
			}
		case pageDictionary:
			if nv := h["7.1"]; nv < 0 || nv > 8*unc+8 {
				return fmt.Errorf("dictionary page at byte %d declares %d values in %d bytes", pos, nv, unc)
			}
		}
		if compressed {
			if err := checkCompressed(r, dataStart, comp, unc, lim.codec); err != nil {
				return fmt.Errorf("page at byte %d: %v", pos, err)
			}
		}
		pos = dataStart + comp
	}
	if values != lim.rows {
		return fmt.Errorf("column chunk has %d values for %d rows", values, lim.rows)
	}
	return nil
}

// Codec expansion bounds: gzip (DEFLATE) expands at most about 1032:1,
// snappy about 21:1 (a 3-byte copy of 64 bytes).
const (
	maxGzipExpansion   = 1032
	maxSnappyExpansion = 22
	zstdMaxBlock       = 128 << 10
)

// checkCompressed checks a page's compressed bytes [off, off+comp) of r
// against its declared uncompressed size unc for codec, as far as the
// codec allows, so that decompressing allocates about unc bytes at most.
func checkCompressed(r io.ReaderAt, off, comp, unc int64, codec format.CompressionCodec) error {
	head := func(n int64) ([]byte, error) {
		b := make([]byte, min(n, comp))
		if _, err := r.ReadAt(b, off); err != nil {
			return nil, fmt.Errorf("reading page data: %v", err)
		}
		return b, nil
	}
	switch codec {
	case format.Uncompressed:
		return nil
	case format.Snappy:
		b, err := head(binary.MaxVarintLen64)
		if err != nil {
			return err
		}
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(unc) || unc > maxSnappyExpansion*comp+64 {
			return fmt.Errorf("snappy data does not match the page's %d uncompressed bytes", unc)
		}
	case format.Gzip:
		b, err := head(3)
		if err != nil {
			return err
		}
		if !bytes.Equal(b, []byte{0x1f, 0x8b, 8}) || unc > maxGzipExpansion*comp+1024 {
			return fmt.Errorf("gzip data does not match the page's %d uncompressed bytes", unc)
		}
	case format.Zstd:
		b, err := head(comp)
		if err != nil {
			return err
		}
		if out, err := zstdBound(b); err != nil {
			return err
		} else if out > 2*unc+2*zstdMaxBlock || unc > out+zstdMaxBlock {
			return fmt.Errorf("zstd data of up to %d bytes does not match the page's %d uncompressed bytes", out, unc)
		}
	case format.Brotli:
		return nil // only bounded by lim.maxBytes
	default:
		return fmt.Errorf("compression codec %v is not supported (use uncompressed, snappy, gzip, zstd or brotli)", codec)
	}
	return nil
}

// zstdBound walks the zstd frames in b (RFC 8878) and returns an upper
// bound of their decompressed size; it fails for a frame that declares a
// content size beyond that bound.
func zstdBound(b []byte) (int64, error) {
	var total int64
	for len(b) > 0 {
		if len(b) < 4 {
			return 0, fmt.Errorf("truncated zstd frame")
		}
		magic := binary.LittleEndian.Uint32(b)
		if magic&0xfffffff0 == 0x184d2a50 { // skippable frame
			if len(b) < 8 || uint64(binary.LittleEndian.Uint32(b[4:])) > uint64(len(b)-8) {
				return 0, fmt.Errorf("truncated zstd skippable frame")
			}
			b = b[8+binary.LittleEndian.Uint32(b[4:]):]
			continue
		}
		if magic != 0xfd2fb528 || len(b) < 5 {
			return 0, fmt.Errorf("not zstd data")
		}
		fhd := b[4]
		single := fhd&0x20 != 0
		fcsLen := [4]int{0, 2, 4, 8}[fhd>>6]
		if fcsLen == 0 && single {
			fcsLen = 1
		}
		hdr := 5 + [4]int{0, 1, 2, 4}[fhd&3] + fcsLen
		if !single {
			hdr++
		}
		if fhd&0x08 != 0 || len(b) < hdr {
			return 0, fmt.Errorf("bad zstd frame header")
		}
		var fcs uint64
		known := fcsLen > 0
		if known {
			var le [8]byte
			copy(le[:], b[hdr-fcsLen:hdr])
			fcs = binary.LittleEndian.Uint64(le[:])
			if fcsLen == 2 {
				fcs += 256
			}
		}
		b = b[hdr:]
		var frame int64
		for last := false; !last; {
			if len(b) < 3 {
				return 0, fmt.Errorf("truncated zstd block")
			}
			bh := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16
			last = bh&1 != 0
			size := int64(bh >> 3)
			b = b[3:]
			in := size
			switch (bh >> 1) & 3 {
			case 0: // raw
				frame += size
			case 1: // RLE: one byte repeated size times
				in = 1
				frame += size
			case 2: // compressed
				frame += zstdMaxBlock
			default:
				return 0, fmt.Errorf("reserved zstd block type")
			}
			if in > int64(len(b)) {
				return 0, fmt.Errorf("truncated zstd block")
			}
			b = b[in:]
		}
		if fhd&0x04 != 0 { // content checksum
			if len(b) < 4 {
				return 0, fmt.Errorf("truncated zstd checksum")
			}
			b = b[4:]
		}
		if known && fcs > uint64(frame) {
			return 0, fmt.Errorf("zstd frame declares %d bytes but holds at most %d", fcs, frame)
		}
		total += frame
	}
	return total, nil
}
