package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// isSentinel reports whether err wraps one of the decoding sentinels.
func isSentinel(err error) bool {
	for _, s := range []error{ErrUnknownVersion, ErrUnknownType, ErrTruncated, ErrCorrupt, ErrTooLarge} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// checkMessage re-encodes a decoded message and checks the encoding is
// stable (decode(encode(m)) encodes to the same bytes).
func checkMessage(t *testing.T, m Message) {
	b1, err := Encode(m)
	if err != nil {
		t.Fatalf("re-encode %v: %v", m.Type(), err)
	}
	m2, err := Decode(b1)
	if err != nil {
		t.Fatalf("decode of re-encoded %v: %v", m.Type(), err)
	}
	b2, err := Encode(m2)
	if err != nil || !bytes.Equal(b1, b2) {
		t.Fatalf("%v: encoding not stable (%v)", m.Type(), err)
	}
}

// FuzzDecode fuzzes the envelope and every public message decoder.
func FuzzDecode(f *testing.F) {
	for _, s := range seedEnvelopes(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Decode(data)
		if err != nil {
			if !isSentinel(err) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		checkMessage(t, m)
	})
}

// FuzzDecodeFrame fuzzes the decoder of every frame a Client receives,
// including chunks and NACKs.
func FuzzDecodeFrame(f *testing.F) {
	for _, s := range seedEnvelopes(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := decodeFrame(data, true) // tensors alias data
		if err != nil {
			if !isSentinel(err) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		switch fr.typ {
		case typeChunk:
			if err := fr.chunk.check(); err != nil {
				t.Fatalf("decoded chunk fails check: %v", err)
			}
		case typeNack:
		default:
			checkMessage(t, fr.msg)
		}
	})
}

func fuzzBody(f *testing.F, typ Type) {
	for _, m := range samples() {
		if m.Type() == typ {
			b, err := Encode(m)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b[3:]) // body after the 3-byte envelope header
		}
	}
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := DecodeAs(typ, body)
		if err != nil {
			if !isSentinel(err) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		if m.Type() != typ {
			t.Fatalf("decoded %v, want %v", m.Type(), typ)
		}
		checkMessage(t, m)
	})
}

func FuzzDecodeJoin(f *testing.F)         { fuzzBody(f, TypeJoin) }
func FuzzDecodeLeave(f *testing.F)        { fuzzBody(f, TypeLeave) }
func FuzzDecodeHeartbeat(f *testing.F)    { fuzzBody(f, TypeHeartbeat) }
func FuzzDecodeRoundStart(f *testing.F)   { fuzzBody(f, TypeRoundStart) }
func FuzzDecodeContribution(f *testing.F) { fuzzBody(f, TypeContribution) }
func FuzzDecodeParams(f *testing.F)       { fuzzBody(f, TypeParams) }
func FuzzDecodeLeader(f *testing.F)       { fuzzBody(f, TypeLeader) }
func FuzzDecodeStatus(f *testing.F)       { fuzzBody(f, TypeStatus) }

// FuzzDecodeChunk fuzzes the chunk frame decoder and feeds valid chunks to a
// reassembler.
func FuzzDecodeChunk(f *testing.F) {
	_, frames := testFrames(f, 300, 512, 1)
	for _, fr := range frames {
		f.Add(fr)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := decodeFrame(data, false)
		if err != nil {
			if !isSentinel(err) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		if fr.typ != typeChunk {
			return
		}
		r := newReassembler(1<<16, 1<<16)
		whole, _, err := r.add(&fr.chunk, "", false, time.Now())
		if err != nil && !isSentinel(err) {
			t.Fatalf("add: %v", err)
		}
		if whole != nil && fr.chunk.Total != 1 {
			t.Fatalf("one chunk of %d completed a transfer", fr.chunk.Total)
		}
	})
}

// FuzzDecodeNack fuzzes the NACK decoder.
func FuzzDecodeNack(f *testing.F) {
	for _, n := range []nack{{Receiver: "r", Transfer: 1, Missing: []uint32{0, 5}}, {Receiver: "x-1", Transfer: 1 << 40}} {
		b, err := encodeNack(n)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := decodeFrame(data, false)
		if err != nil {
			if !isSentinel(err) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		if fr.typ == typeNack && (len(fr.nack.Missing) > maxNackIndices || !validClientID(fr.nack.Receiver)) {
			t.Fatalf("accepted bad nack %+v", fr.nack)
		}
	})
}

// FuzzReassemble feeds a sequence of frames (each prefixed by a 2-byte
// big-endian length) to one reassembler: whatever the order, duplication
// or corruption, memory stays within limits and a completed message is
// exactly the bytes its CRC32C vouches for.
func FuzzReassemble(f *testing.F) {
	m, frames := testFrames(f, 200, 256, 1)
	want, _ := Encode(m)
	pack := func(idx ...int) []byte {
		var b []byte
		for _, i := range idx {
			b = binary.BigEndian.AppendUint16(b, uint16(len(frames[i])))
			b = append(b, frames[i]...)
		}
		return b
	}
	all := make([]int, len(frames))
	for i := range all {
		all[i] = len(frames) - 1 - i
	}
	f.Add(pack(all...))
	f.Add(pack(0, 0, 1, 2))
	f.Add(pack(append(all, all...)...))
	const maxTotal = 1 << 14
	f.Fuzz(func(t *testing.T, data []byte) {
		r := newReassembler(maxTotal, maxTotal)
		for len(data) >= 2 {
			n := int(binary.BigEndian.Uint16(data))
			data = data[2:]
			if n > len(data) {
				n = len(data)
			}
			frame := data[:n]
			data = data[n:]
			fr, err := decodeFrame(frame, false)
			if err != nil || fr.typ != typeChunk {
				continue
			}
			whole, _, err := r.add(&fr.chunk, "", false, time.Now())
			if err != nil && !isSentinel(err) && !errors.Is(err, ErrDuplicateChunk) {
				t.Fatalf("add: %v", err)
			}
			if _, b := r.inFlight(); b > maxTotal {
				t.Fatalf("%d bytes in flight, limit %d", b, maxTotal)
			}
			if whole != nil && fr.chunk.Sender == testSender && fr.chunk.Transfer == 1 && fr.chunk.WholeCRC == frames0CRC(t, frames) {
				if !bytes.Equal(whole, want) {
					t.Fatal("reassembled bytes differ from the original")
				}
			}
		}
	})
}

func frames0CRC(t *testing.T, frames [][]byte) uint32 {
	fr, err := decodeFrame(frames[0], false)
	if err != nil {
		t.Fatal(err)
	}
	return fr.chunk.WholeCRC
}

// seedEnvelopes returns valid frames of every kind plus a few broken ones.
func seedEnvelopes(tb testing.TB) [][]byte {
	var out [][]byte
	for _, m := range samples() {
		b, err := Encode(m)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, b)
	}
	_, frames := testFrames(tb, 100, 256, 1)
	out = append(out, frames[0], frames[len(frames)-1])
	n, _ := encodeNack(nack{Receiver: "r", Transfer: 1, Missing: []uint32{1}})
	out = append(out, n, []byte{0x93, 0x02, 0x01, 0x80}, []byte{0x93, 0x01, 0x63, 0x80}, []byte{0x93})
	return out
}

// TestWriteFuzzCorpus writes the seed corpus under testdata/fuzz when
// DPC_WRITE_CORPUS=1 (go test -run TestWriteFuzzCorpus ./transport).
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("DPC_WRITE_CORPUS") != "1" {
		t.Skip("set DPC_WRITE_CORPUS=1 to rewrite testdata/fuzz")
	}
	write := func(target string, seeds [][]byte) {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seeds {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	env := seedEnvelopes(t)
	write("FuzzDecode", env)
	write("FuzzDecodeFrame", env)
	for _, typ := range []Type{TypeJoin, TypeLeave, TypeHeartbeat, TypeRoundStart, TypeContribution, TypeParams, TypeLeader, TypeStatus} {
		var seeds [][]byte
		for _, m := range samples() {
			if m.Type() == typ {
				b, _ := Encode(m)
				seeds = append(seeds, b[3:], b[3:len(b)-1])
			}
		}
		var buf bytes.Buffer
		_ = msgpack.NewEncoder(&buf).Encode(map[string]any{"run": 1})
		seeds = append(seeds, buf.Bytes())
		name := map[Type]string{TypeJoin: "Join", TypeLeave: "Leave", TypeHeartbeat: "Heartbeat", TypeRoundStart: "RoundStart",
			TypeContribution: "Contribution", TypeParams: "Params", TypeLeader: "Leader", TypeStatus: "Status"}[typ]
		write("FuzzDecode"+name, seeds)
	}
	_, frames := testFrames(t, 100, 256, 1)
	bad := append([]byte(nil), frames[1]...)
	bad[len(bad)-1] ^= 1
	write("FuzzDecodeChunk", [][]byte{frames[0], frames[1], frames[len(frames)-1], bad, frames[0][:20]})
	n1, _ := encodeNack(nack{Receiver: "r", Transfer: 1, Missing: []uint32{0, 3}})
	write("FuzzDecodeNack", [][]byte{n1, n1[:len(n1)-2]})
	var seq []byte
	for i := len(frames) - 1; i >= 0; i-- {
		for range 2 {
			seq = binary.BigEndian.AppendUint16(seq, uint16(len(frames[i])))
			seq = append(seq, frames[i]...)
		}
	}
	write("FuzzReassemble", [][]byte{seq, seq[:len(seq)/2]})
}
