package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/dpcluster/dpcluster/internal/f32le"
)

// The envelope of every frame is a msgpack array of three elements:
//
//	[version uint, type uint, body]
//
// For public messages body is the message struct as a msgpack map keyed by
// the field tags; for chunks and NACKs it is a fixed-order array. See
// docs/PROTOCOL.md.
const envelopeLen = 3

// castagnoli is the CRC32C table used for chunks and whole transfers.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Vector is a float32 tensor. On the wire it is a msgpack bin holding a pad
// byte p (0–3), p zero bytes, then the values as IEEE-754 little-endian
// float32, 4 bytes each; an empty Vector is an empty bin. The padding puts
// the values at an offset from the start of the message that is a multiple
// of 4, so a receiver can use them in place (msgpack float arrays measured
// 10–20× slower).
type Vector []float32

// EncodeMsgpack implements msgpack.CustomEncoder.
func (v Vector) EncodeMsgpack(e *msgpack.Encoder) error {
	if len(v) == 0 {
		return e.EncodeBytesLen(0)
	}
	w := e.Writer()
	pad := 0
	// Encode's buffer, plain or through a chunkHasher: offsets are from the
	// message start.
	var buf *bytes.Buffer
	switch w := w.(type) {
	case *bytes.Buffer:
		buf = w
	case *chunkHasher:
		buf = w.buf
	}
	if buf != nil {
		n := 1 + 3 + 4*len(v)
		hdr := 5 // bin32
		switch {
		case n <= math.MaxUint8:
			hdr = 2
		case n <= math.MaxUint16:
			hdr = 3
		}
		pad = (4 - (buf.Len()+hdr+1)%4) % 4
		// The header size depends on the padded length only at the
		// bin8/16/32 boundaries; recompute once with the exact length.
		n = 1 + pad + 4*len(v)
		h2 := 5
		switch {
		case n <= math.MaxUint8:
			h2 = 2
		case n <= math.MaxUint16:
			h2 = 3
		}
		if h2 != hdr {
			pad = (4 - (buf.Len()+h2+1)%4) % 4
		}
	}
	if err := e.EncodeBytesLen(1 + pad + 4*len(v)); err != nil {
		return err
	}
	var zero [4]byte
	zero[0] = byte(pad)
	if _, err := w.Write(zero[:1+pad]); err != nil {
		return err
	}
	if b, ok := f32le.View(v); ok {
		_, err := w.Write(b)
		return err
	}
	var b [4096]byte
	for len(v) > 0 {
		n := min(len(v), len(b)/4)
		f32le.Put(b[:], v[:n])
		if _, err := w.Write(b[:4*n]); err != nil {
			return err
		}
		v = v[n:]
	}
	return nil
}

// frameReader is the reader the codec decodes from. When owned, buf belongs
// to the decoder (a frame received from a Link, or a reassembled message) and
// tensors may alias it instead of being copied.
type frameReader struct {
	bytes.Reader
	buf   []byte
	owned bool
}

func newFrameReader(buf []byte, owned bool) *frameReader {
	r := &frameReader{buf: buf, owned: owned}
	r.Reset(buf)
	return r
}

// DecodeMsgpack implements msgpack.CustomDecoder. It checks the declared
// length against the bytes left before allocating, so a short corrupt frame
// cannot make it allocate a large tensor. On little-endian hosts, decoding a
// frame the Client owns aliases the frame's bytes when they are 4-byte
// aligned (they are, when the sender padded them).
func (v *Vector) DecodeMsgpack(d *msgpack.Decoder) error {
	n, err := d.DecodeBytesLen()
	if err != nil {
		return err
	}
	switch {
	case n < 0: // msgpack nil, what a nil Vector encodes to
		*v = nil
		return nil
	case n == 0: // an empty bin, what an empty Vector encodes to
		*v = Vector{}
		return nil
	}
	fr, _ := d.Buffered().(*frameReader)
	if fr != nil && fr.Len() < n {
		return fmt.Errorf("%w: tensor declares %d bytes, %d left", ErrTruncated, n, fr.Len())
	}
	var head [4]byte
	if err := d.ReadFull(head[:1]); err != nil {
		return err
	}
	pad := int(head[0])
	if pad > 3 || (n-1-pad)%4 != 0 || n-1-pad < 0 {
		return fmt.Errorf("%w: tensor of %d bytes with %d pad bytes", ErrCorrupt, n, pad)
	}
	if err := d.ReadFull(head[:pad]); err != nil {
		return err
	}
	for _, b := range head[:pad] {
		if b != 0 {
			return fmt.Errorf("%w: nonzero tensor padding", ErrCorrupt)
		}
	}
	m := (n - 1 - pad) / 4
	if m == 0 {
		*v = Vector{}
		return nil
	}
	if fr != nil && fr.owned {
		pos := len(fr.buf) - fr.Len()
		if f, ok := f32le.Floats(fr.buf[pos : pos+4*m]); ok {
			*v = f
			_, err := fr.Seek(int64(4*m), io.SeekCurrent)
			return err
		}
	}
	out := make([]float32, m)
	if b, ok := f32le.View(out); ok {
		if err := d.ReadFull(b); err != nil {
			return err
		}
	} else {
		b := make([]byte, 4*m)
		if err := d.ReadFull(b); err != nil {
			return err
		}
		f32le.Get(out, b)
	}
	*v = out
	return nil
}

// Encode returns the envelope encoding of m. It fails with ErrUnknownType if
// m is not one of this package's message values.
func Encode(m Message) ([]byte, error) {
	data, _, err := encodeInto(nil, m, 0)
	return data, err
}

// encodeInto returns the envelope encoding of m, written over dst's memory
// (from dst[:0]) when it has room for it. With chunkSize > 0 it also
// returns the CRC32C of each chunkSize-byte piece of the encoding (see
// chunkCRCs), computed as the bytes are written.
func encodeInto(dst []byte, m Message, chunkSize int) ([]byte, []uint32, error) {
	if m == nil || newBody(m.Type()) == nil || deref(ptrTo(m)) == nil {
		return nil, nil, fmt.Errorf("%w: %T", ErrUnknownType, m)
	}
	hint := sizeHint(m)
	buf := bytes.NewBuffer(dst[:0])
	buf.Grow(hint)
	var w io.Writer = buf
	var h *chunkHasher
	if chunkSize > 0 {
		h = &chunkHasher{buf: buf, size: chunkSize, crcs: make([]uint32, 0, hint/chunkSize+1)}
		w = h
	}
	e := msgpack.GetEncoder()
	defer msgpack.PutEncoder(e)
	e.Reset(w)
	e.UseCompactInts(true)
	if err := encodeHeader(e, m.Type()); err != nil {
		return nil, nil, err
	}
	if err := e.Encode(m); err != nil {
		return nil, nil, fmt.Errorf("transport: encode %v: %w", m.Type(), err)
	}
	if h == nil {
		return buf.Bytes(), nil, nil
	}
	return buf.Bytes(), h.crcs, nil
}

// chunkHasher is the writer a message to be chunked is encoded through. It
// appends to buf and hashes what it appends, a piece at a time while the
// piece is in cache, into the CRC32C of the size-byte chunk it falls in: a
// separate pass over a model-sized encoding would read it back from
// memory.
type chunkHasher struct {
	buf  *bytes.Buffer
	size int
	crcs []uint32 // of chunks [0, len(crcs)); the last one may be partial
}

// hashPiece is how many bytes chunkHasher copies before it hashes them.
const hashPiece = 64 << 10

func (h *chunkHasher) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), hashPiece)
		h.buf.Write(p[:k])
		h.hashTail(k)
		p = p[k:]
	}
	return n, nil
}

func (h *chunkHasher) WriteByte(c byte) error {
	h.buf.WriteByte(c)
	h.hashTail(1)
	return nil
}

// hashTail hashes the last k bytes of buf.
func (h *chunkHasher) hashTail(k int) {
	b := h.buf.Bytes()
	for off := len(b) - k; off < len(b); {
		i := off / h.size
		if i == len(h.crcs) {
			h.crcs = append(h.crcs, 0) // the CRC32C of no bytes
		}
		end := min((i+1)*h.size, len(b))
		h.crcs[i] = crc32.Update(h.crcs[i], castagnoli, b[off:end])
		off = end
	}
}

// ptrTo returns a pointer to a copy of m, used only to check that m's
// dynamic type is one of ours (a value, not a pointer).
func ptrTo(m Message) any {
	switch v := m.(type) {
	case Join:
		return &v
	case Leave:
		return &v
	case Heartbeat:
		return &v
	case RoundStart:
		return &v
	case Contribution:
		return &v
	case Params:
		return &v
	case Leader:
		return &v
	case Status:
		return &v
	case Control:
		return &v
	case NeedParams:
		return &v
	}
	return nil
}

func encodeHeader(e *msgpack.Encoder, t Type) error {
	if err := e.EncodeArrayLen(envelopeLen); err != nil {
		return err
	}
	if err := e.EncodeUint(Version); err != nil {
		return err
	}
	return e.EncodeUint(uint64(t))
}

// Decode decodes one public message from data. Errors wrap
// ErrUnknownVersion, ErrUnknownType, ErrTruncated or ErrCorrupt. Internal
// frames (chunks, NACKs) are rejected with ErrUnknownType: use a Client to
// receive chunked messages. Decode does not retain data.
func Decode(data []byte) (Message, error) {
	return decode(data, false)
}

// decode decodes a public message; owned says whether its tensors may alias
// data.
func decode(data []byte, owned bool) (Message, error) {
	r := newFrameReader(data, owned)
	d := newDecoder(r)
	defer msgpack.PutDecoder(d)
	t, err := decodeHeader(d)
	if err != nil {
		return nil, err
	}
	return decodeBody(d, r, t)
}

// DecodeAs decodes data as a message body of type t with no envelope. It
// exists for fuzzing each body decoder on its own.
func DecodeAs(t Type, body []byte) (Message, error) {
	r := newFrameReader(body, false)
	d := newDecoder(r)
	defer msgpack.PutDecoder(d)
	return decodeBody(d, r, t)
}

func newDecoder(r io.Reader) *msgpack.Decoder {
	d := msgpack.GetDecoder()
	d.Reset(r)
	return d
}

func decodeBody(d *msgpack.Decoder, r *frameReader, t Type) (Message, error) {
	p := newBody(t)
	if p == nil {
		return nil, fmt.Errorf("%w: %v", ErrUnknownType, t)
	}
	if err := d.Decode(p); err != nil {
		return nil, classify(err, t)
	}
	if r.Len() != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes after %v", ErrCorrupt, r.Len(), t)
	}
	return deref(p), nil
}

// decodeHeader reads the envelope array header, version and type.
func decodeHeader(d *msgpack.Decoder) (Type, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return 0, classify(err, 0)
	}
	if n != envelopeLen {
		return 0, fmt.Errorf("%w: envelope has %d elements, want %d", ErrCorrupt, n, envelopeLen)
	}
	v, err := d.DecodeUint64()
	if err != nil {
		return 0, classify(err, 0)
	}
	if v != Version {
		return 0, fmt.Errorf("%w: %d (this build speaks %d)", ErrUnknownVersion, v, Version)
	}
	t, err := d.DecodeUint64()
	if err != nil {
		return 0, classify(err, 0)
	}
	if t > math.MaxUint8 {
		return 0, fmt.Errorf("%w: %d", ErrUnknownType, t)
	}
	return Type(t), nil
}

// classify maps a msgpack error to the package's sentinels.
func classify(err error, t Type) error {
	switch {
	case errors.Is(err, ErrTruncated), errors.Is(err, ErrCorrupt), errors.Is(err, ErrTooLarge):
		return err
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w: %v", ErrTruncated, t)
	}
	return fmt.Errorf("%w: %v: %v", ErrCorrupt, t, err)
}

// chunk is one piece of a chunked transfer. Chunk i of a transfer of Len
// bytes cut into Size-byte pieces covers [i·Size, min((i+1)·Size, Len)).
type chunk struct {
	Sender   string // client ID of the sender (ClientID); NACKs go to its nack subject
	Transfer uint64 // sender-local transfer sequence number
	Topic    Topic  // topic of the reassembled message
	Index    uint32
	Total    uint32 // number of chunks
	Size     uint32 // chunk size (all but the last chunk)
	Offset   uint64 // Index·Size
	Len      uint64 // length of the whole message
	WholeCRC uint32 // CRC32C of the whole message
	CRC      uint32 // CRC32C of the header fields above and Data (chunkCRC)
	Data     []byte // aliases the frame it was decoded from

	// dataCRC is the CRC32C of Data alone (not on the wire): set by
	// check, and by retained.chunk, so that Data is hashed once.
	dataCRC uint32
}

const chunkFields = 11

// chunkOverhead bounds the bytes a chunk frame adds to its data: envelope
// (≤ 1+9+9), array header (1), a sender client ID of ≤ maxClientID (90)
// bytes (2+90), nine integers (≤ 9 each), bin header (5).
const chunkOverhead = 19 + 1 + 2 + maxClientID + 9*9 + 5

// appendChunk appends the frame of c to dst. It allocates nothing when dst
// has room.
func appendChunk(dst []byte, c *chunk) []byte {
	dst = append(dst, 0x93) // fixarray 3
	dst = appendUint(dst, Version)
	dst = appendUint(dst, uint64(typeChunk))
	dst = append(dst, 0x90|chunkFields) // fixarray 11
	dst = appendStr(dst, c.Sender)
	dst = appendUint(dst, c.Transfer)
	dst = appendUint(dst, uint64(c.Topic))
	dst = appendUint(dst, uint64(c.Index))
	dst = appendUint(dst, uint64(c.Total))
	dst = appendUint(dst, uint64(c.Size))
	dst = appendUint(dst, c.Offset)
	dst = appendUint(dst, c.Len)
	dst = appendUint(dst, uint64(c.WholeCRC))
	dst = appendUint(dst, uint64(c.CRC))
	dst = append(dst, 0xc6) // bin32
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(c.Data)))
	return append(dst, c.Data...)
}

// appendUint appends v as a msgpack uint64 (fixed width keeps the code
// simple; the decoder accepts every integer width).
func appendUint(dst []byte, v uint64) []byte {
	if v < 128 {
		return append(dst, byte(v))
	}
	dst = append(dst, 0xcf)
	return binary.BigEndian.AppendUint64(dst, v)
}

func appendStr(dst []byte, s string) []byte {
	if len(s) < 32 {
		dst = append(dst, 0xa0|byte(len(s)))
	} else {
		dst = append(dst, 0xd9, byte(len(s))) // str8; sender IDs are < 256 bytes
	}
	return append(dst, s...)
}

// decodeChunk decodes the body of a chunk frame (after the envelope header)
// and checks it on its own: field ranges, layout and data CRC. The returned
// chunk's Data aliases data.
func decodeChunk(d *msgpack.Decoder, r *frameReader, data []byte) (chunk, error) {
	var c chunk
	n, err := d.DecodeArrayLen()
	if err != nil {
		return c, classify(err, typeChunk)
	}
	if n != chunkFields {
		return c, fmt.Errorf("%w: chunk has %d fields, want %d", ErrCorrupt, n, chunkFields)
	}
	if c.Sender, err = d.DecodeString(); err != nil {
		return c, classify(err, typeChunk)
	}
	var u [9]uint64
	for i := range u {
		if u[i], err = d.DecodeUint64(); err != nil {
			return c, classify(err, typeChunk)
		}
	}
	for _, x := range []uint64{u[1], u[2], u[3], u[4], u[7], u[8]} {
		if x > math.MaxUint32 {
			return c, fmt.Errorf("%w: chunk field out of range", ErrCorrupt)
		}
	}
	if u[1] > math.MaxUint8 {
		return c, fmt.Errorf("%w: chunk topic out of range", ErrCorrupt)
	}
	c.Transfer, c.Topic, c.Index, c.Total, c.Size = u[0], Topic(u[1]), uint32(u[2]), uint32(u[3]), uint32(u[4])
	c.Offset, c.Len, c.WholeCRC, c.CRC = u[5], u[6], uint32(u[7]), uint32(u[8])
	dl, err := d.DecodeBytesLen()
	if err != nil {
		return c, classify(err, typeChunk)
	}
	if dl < 0 || dl > r.Len() {
		return c, fmt.Errorf("%w: chunk data declares %d bytes, %d left", ErrTruncated, dl, r.Len())
	}
	if dl != r.Len() {
		return c, fmt.Errorf("%w: %d trailing bytes after chunk", ErrCorrupt, r.Len()-dl)
	}
	c.Data = data[len(data)-dl:]
	if err := c.check(); err != nil {
		return c, err
	}
	return c, nil
}

// crc returns the chunk's CRC32C: over its header fields (sender, transfer,
// topic, index, total, size, offset, length, whole-message CRC, fixed-width
// little-endian, after the sender's length byte) and then its data, so a
// corrupted header cannot pass as a chunk of another transfer.
func (c *chunk) crc() uint32 {
	return c.crcWith(crc32.Checksum(c.Data, castagnoli))
}

// crcWith returns crc() given dataCRC, the CRC32C of c.Data, without
// hashing Data again.
func (c *chunk) crcWith(dataCRC uint32) uint32 {
	return crc32cCombine(c.headerCRC(), dataCRC, uint64(len(c.Data)))
}

// headerCRC returns the CRC32C of the header fields that crc covers.
func (c *chunk) headerCRC() uint32 {
	var h [1 + maxClientID + 8 + 1 + 4*3 + 8*2 + 4]byte
	b := append(h[:0], byte(len(c.Sender)))
	b = append(b, c.Sender...)
	b = binary.LittleEndian.AppendUint64(b, c.Transfer)
	b = append(b, byte(c.Topic))
	b = binary.LittleEndian.AppendUint32(b, c.Index)
	b = binary.LittleEndian.AppendUint32(b, c.Total)
	b = binary.LittleEndian.AppendUint32(b, c.Size)
	b = binary.LittleEndian.AppendUint64(b, c.Offset)
	b = binary.LittleEndian.AppendUint64(b, c.Len)
	b = binary.LittleEndian.AppendUint32(b, c.WholeCRC)
	return crc32.Checksum(b, castagnoli)
}

// check validates a chunk on its own. It sets c.dataCRC.
func (c *chunk) check() error {
	switch {
	case !validClientID(c.Sender):
		return fmt.Errorf("%w: chunk sender %q is not a client ID", ErrCorrupt, c.Sender)
	case !c.Topic.valid():
		return fmt.Errorf("%w: chunk topic %d", ErrCorrupt, c.Topic)
	case c.Size == 0 || c.Total == 0 || c.Len == 0:
		return fmt.Errorf("%w: empty chunked transfer", ErrCorrupt)
	case c.Index >= c.Total:
		return fmt.Errorf("%w: chunk index %d of %d", ErrCorrupt, c.Index, c.Total)
	case (c.Len+uint64(c.Size)-1)/uint64(c.Size) != uint64(c.Total):
		return fmt.Errorf("%w: %d chunks of %d bytes cannot hold %d bytes", ErrCorrupt, c.Total, c.Size, c.Len)
	case c.Offset != uint64(c.Index)*uint64(c.Size):
		return fmt.Errorf("%w: chunk %d at offset %d, want %d", ErrCorrupt, c.Index, c.Offset, uint64(c.Index)*uint64(c.Size))
	case uint64(len(c.Data)) != min(uint64(c.Size), c.Len-c.Offset):
		return fmt.Errorf("%w: chunk %d holds %d bytes", ErrCorrupt, c.Index, len(c.Data))
	}
	c.dataCRC = crc32.Checksum(c.Data, castagnoli)
	if c.crcWith(c.dataCRC) != c.CRC {
		return fmt.Errorf("%w: chunk %d CRC32C mismatch", ErrCorrupt, c.Index)
	}
	return nil
}

// nack asks the sender of a transfer to resend chunks to the receiver's
// inbox. Receiver must be the receiver the NACK subject names.
type nack struct {
	Receiver string   `msgpack:"rcv"`
	Transfer uint64   `msgpack:"xfer"`
	Missing  []uint32 `msgpack:"missing"`
}

// maxNackIndices bounds the indices one NACK may carry.
const maxNackIndices = 1 << 16

func encodeNack(n nack) ([]byte, error) {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	if err := encodeHeader(e, typeNack); err != nil {
		return nil, err
	}
	if err := e.Encode(&n); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func decodeNack(d *msgpack.Decoder, r *frameReader) (nack, error) {
	var n nack
	// Bound the list before msgpack allocates it.
	if err := d.Decode(&n); err != nil {
		return n, classify(err, typeNack)
	}
	if r.Len() != 0 {
		return n, fmt.Errorf("%w: trailing bytes after nack", ErrCorrupt)
	}
	if !validClientID(n.Receiver) || len(n.Missing) > maxNackIndices {
		return n, fmt.Errorf("%w: bad nack", ErrCorrupt)
	}
	return n, nil
}

// frame is a decoded wire frame: exactly one of msg, chunk or nack is set,
// according to typ.
type frame struct {
	typ   Type
	msg   Message
	chunk chunk
	nack  nack
}

// decodeFrame decodes any frame. A chunk's Data aliases data; so do the
// tensors of a public message if owned.
func decodeFrame(data []byte, owned bool) (frame, error) {
	r := newFrameReader(data, owned)
	d := newDecoder(r)
	defer msgpack.PutDecoder(d)
	t, err := decodeHeader(d)
	if err != nil {
		return frame{}, err
	}
	f := frame{typ: t}
	switch t {
	case typeChunk:
		f.chunk, err = decodeChunk(d, r, data)
	case typeNack:
		f.nack, err = decodeNack(d, r)
	default:
		f.msg, err = decodeBody(d, r, t)
	}
	return f, err
}

// SplitFrames returns the chunk frames Publish would send for m over a link
// whose max payload is maxPayload, as transfer number transfer of sender (a
// client ID, see ClientID). It is exported for tests and tools that need to inject,
// drop or corrupt individual chunks; a message that fits one frame still
// yields chunk frames.
func SplitFrames(m Message, sender string, transfer uint64, maxPayload int) ([][]byte, error) {
	if !validClientID(sender) {
		return nil, fmt.Errorf("%w: sender %q", ErrInvalidConfig, sender)
	}
	if maxPayload <= chunkOverhead {
		return nil, fmt.Errorf("%w: max payload %d", ErrInvalidConfig, maxPayload)
	}
	data, err := Encode(m)
	if err != nil {
		return nil, err
	}
	size := uint32(maxPayload - chunkOverhead)
	t := newRetained(transfer, "", m.Type().Topic(), data, size, chunkCRCs(data, size))
	frames := make([][]byte, t.total)
	for i := range frames {
		c := t.chunk(sender, uint32(i))
		frames[i] = appendChunk(make([]byte, 0, len(c.Data)+chunkOverhead), &c)
	}
	return frames, nil
}
