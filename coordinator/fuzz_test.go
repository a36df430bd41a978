package coordinator

import (
	"bytes"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/vmihailenco/msgpack/v5"
)

// FuzzDecodeEntry feeds arbitrary bytes through the decoding the state
// machine does for a Raft log entry (envelope, body, tensor): it must
// return an error or a value, never panic; and an entry that decodes
// re-encodes to an entry that decodes the same way.
func FuzzDecodeEntry(f *testing.F) {
	c := testRunConfig()
	legacy, float := c, c
	legacy.NoiseMode, float.NoiseMode = NoiseLegacy, NoiseFloat
	for _, e := range []struct {
		t    entryType
		body any
	}{
		{entryConfig, c},
		{entryConfig, legacy},
		{entryConfig, float},
		{entryStep, stepEntry{Step: 3, Event: c.Event(), Grad: make([]byte, 4*testDim), Round: "r1/2/00ff"}},
		{entryStop, stopEntry{Reason: stopBudget}},
	} {
		b, err := encodeEntry(e.t, e.body)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{2, 9})
	f.Fuzz(func(t *testing.T, data []byte) {
		typ, body, err := decodeEntry(data)
		if err != nil {
			return
		}
		var v any
		switch typ {
		case entryConfig:
			var c RunConfig
			if msgpack.Unmarshal(body, &c) != nil {
				return
			}
			_ = c.Validate()
			_ = c.Event().Validate()
			_, _ = c.Discrete()
			v = c
		case entryStep:
			var s stepEntry
			if msgpack.Unmarshal(body, &s) != nil {
				return
			}
			_ = s.Event.Validate()
			g := make([]float32, len(s.Grad)/4)
			_ = getFloats(g, s.Grad)
			v = s
		case entryStop:
			var s stopEntry
			if msgpack.Unmarshal(body, &s) != nil {
				return
			}
			v = s
		}
		again, err := encodeEntry(typ, v)
		if err != nil {
			t.Fatalf("re-encoding a decoded %d entry: %v", typ, err)
		}
		if t2, _, err := decodeEntry(again); err != nil || t2 != typ {
			t.Fatalf("re-encoded entry decodes as %d, %v", t2, err)
		}
	})
}

// FuzzDecodeSnapshot: arbitrary bytes are a snapshot error, never a panic;
// a real snapshot decodes.
func FuzzDecodeSnapshot(f *testing.F) {
	dir := f.TempDir()
	fsm, err := NewFSM(dir, testInit, nil)
	if err != nil {
		f.Fatal(err)
	}
	c := testRunConfig()
	cfg, _ := encodeEntry(entryConfig, c)
	fsm.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: cfg})
	snap, err := fsm.Snapshot()
	if err != nil {
		f.Fatal(err)
	}
	var buf bytes.Buffer
	if err := snap.(*fsmSnapshot).write(&buf); err != nil {
		f.Fatal(err)
	}
	fsm.Close()
	f.Add(buf.Bytes())
	f.Add(buf.Bytes()[:20])
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := decodeSnapshot(data)
		if err == nil && int64(len(s.Ledger)) != s.Body.LedgerSize {
			t.Fatal("decoded snapshot's ledger length disagrees with its header")
		}
	})
}

// FuzzDecodeLog: the log store's value decoder rejects what it cannot
// verify and round-trips what it encodes.
func FuzzDecodeLog(f *testing.F) {
	f.Add(encodeLog(&raft.Log{Index: 9, Term: 2, Type: raft.LogCommand, Data: []byte("entry")}), uint64(9), []byte("entry"))
	f.Add([]byte{1, 2, 3}, uint64(1), []byte{})
	f.Fuzz(func(t *testing.T, v []byte, index uint64, data []byte) {
		var l raft.Log
		_ = decodeLog(v, &l)
		in := &raft.Log{Index: index, Term: index / 2, Type: raft.LogCommand, Data: data}
		if err := decodeLog(encodeLog(in), &l); err != nil || l.Index != index || !bytes.Equal(l.Data, data) {
			t.Fatalf("round trip of index %d, %d bytes: %+v, %v", index, len(data), l, err)
		}
	})
}
