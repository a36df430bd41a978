package transport

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestCRC32CCombine checks crc32cCombine against hashing the concatenation.
func TestCRC32CCombine(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 1<<16)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	lens := []int{0, 1, 2, 3, 4, 7, 8, 255, 256, 1000, 4096, 65535}
	for range 200 {
		lens = append(lens, rng.IntN(len(buf)+1))
	}
	for _, n := range lens {
		a, b := buf[:rng.IntN(len(buf)-n+1)], buf[len(buf)-n:]
		want := crc32.Checksum(append(append([]byte(nil), a...), b...), castagnoli)
		got := crc32cCombine(crc32.Checksum(a, castagnoli), crc32.Checksum(b, castagnoli), uint64(len(b)))
		if got != want {
			t.Fatalf("|A| %d |B| %d: combine %08x, checksum %08x", len(a), len(b), got, want)
		}
	}
	// Long zero runs: compare with hashing them (lengths past 32 bits of
	// bytes would take too long; these exercise several table entries).
	for _, n := range []uint64{1 << 20, 3<<20 + 5, 40 << 20} {
		zeros := make([]byte, n)
		crcA := crc32.Checksum(buf[:100], castagnoli)
		want := crc32.Update(crcA, castagnoli, zeros)
		if got := crc32cCombine(crcA, crc32.Checksum(zeros, castagnoli), n); got != want {
			t.Fatalf("zeros %d: combine %08x, update %08x", n, got, want)
		}
	}
}

// TestChunkCRCNaive checks chunk.crc, which combines the header's and the
// data's CRCs, and newRetained's combined CRCs against hashing the bytes
// they cover in one piece.
func TestChunkCRCNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	data := make([]byte, 10000)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	for _, size := range []uint32{1, 7, 64, 1000, 4096, 10000, 20000} {
		tr := newRetained(42, "s", TopicParams, data, size, chunkCRCs(data, size))
		if want := crc32.Checksum(data, castagnoli); tr.wholeCRC != want {
			t.Fatalf("size %d: whole CRC %08x, want %08x", size, tr.wholeCRC, want)
		}
		for i := range tr.total {
			c := tr.chunk(testSender, i)
			if want := crc32.Checksum(c.Data, castagnoli); c.dataCRC != want {
				t.Fatalf("size %d chunk %d: data CRC %08x, want %08x", size, i, c.dataCRC, want)
			}
			var h []byte
			h = append(h, byte(len(c.Sender)))
			h = append(h, c.Sender...)
			h = binary.LittleEndian.AppendUint64(h, c.Transfer)
			h = append(h, byte(c.Topic))
			h = binary.LittleEndian.AppendUint32(h, c.Index)
			h = binary.LittleEndian.AppendUint32(h, c.Total)
			h = binary.LittleEndian.AppendUint32(h, c.Size)
			h = binary.LittleEndian.AppendUint64(h, c.Offset)
			h = binary.LittleEndian.AppendUint64(h, c.Len)
			h = binary.LittleEndian.AppendUint32(h, c.WholeCRC)
			want := crc32.Checksum(append(h, c.Data...), castagnoli)
			if c.CRC != want || c.crc() != want {
				t.Fatalf("size %d chunk %d: CRC %08x, crc() %08x, want %08x", size, i, c.CRC, c.crc(), want)
			}
			if err := c.check(); err != nil {
				t.Fatalf("size %d chunk %d: %v", size, i, err)
			}
		}
	}
}

// TestEncodeHashesChunks checks that encodeInto with a chunk size writes
// the same bytes as Encode, over a reused buffer or not, and returns the
// CRC32Cs that chunkCRCs computes from them, including when the encoding
// outgrows its size hint (a long string) and the buffer moves.
func TestEncodeHashesChunks(t *testing.T) {
	vec := func(n int) Vector {
		v := make(Vector, n)
		for i := range v {
			v[i] = float32(i) * 0.25
		}
		return v
	}
	msgs := []Message{
		Params{Run: "r", Step: 1, Version: 1, Values: vec(0)},
		Params{Run: "r", Step: 2, Version: 2, Values: vec(1)},
		Params{Run: "r", Step: 3, Version: 3, Values: vec(300_001)},
		Contribution{Run: "r", Step: 4, NodeID: "n0", Count: 1, Sum: vec(70_000)},
		RoundStart{Run: "r", Step: 5, RoundID: 5, Deadline: 1, SampleRate: 0.5, ClipNorm: 1, Params: vec(5000)},
		Join{Run: "r", NodeID: "n0", ModelHash: strings.Repeat("h", 5000)},
	}
	garbage := make([]byte, 2<<20)
	for i := range garbage {
		garbage[i] = 0xa5
	}
	for _, m := range msgs {
		want, err := Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		for _, size := range []int{1, 7, 64, 1000, 65536 + 3, 1 << 20} {
			for _, dst := range [][]byte{nil, make([]byte, 0, 10), garbage} {
				got, crcs, err := encodeInto(dst, m, size)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("%v, chunk size %d, dst cap %d: bytes differ from Encode's", m.Type(), size, cap(dst))
				}
				if wantCRCs := chunkCRCs(got, uint32(size)); !slices.Equal(crcs, wantCRCs) {
					t.Fatalf("%v, chunk size %d, dst cap %d: %d chunk CRCs differ from chunkCRCs' %d", m.Type(), size, cap(dst), len(crcs), len(wantCRCs))
				}
			}
		}
	}
}
