package coordinator

import (
	"bytes"
	"math"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/dpcluster/dpcluster/ledger"
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
		{entryConfig, c}, // a configuration entry from before history IDs
		{entryConfig, configEntry{RunConfig: c, History: "0123456789abcdef0123456789abcdef"}},
		{entryConfig, legacy},
		{entryConfig, float},
		{entryStep, stepEntry{Step: 3, Event: c.Event(), Grad: make([]byte, 4*testDim), Round: "r1/2/00ff"}},
		{entryStop, stopEntry{Reason: stopBudget}},
		{entryCharge, chargeEntry{Step: 3, Event: c.Event(), Round: "r1/2/00ff"}},
		{entryGrad, gradEntry{Step: 3, Charge: 9, Grad: make([]byte, 4*testDim)}},
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
			c, err := decodeConfig(body)
			if err != nil {
				return
			}
			_ = c.Validate()
			_ = c.Event().Validate()
			_, _ = c.Discrete()
			v = c
			defer func() {
				again, _ := encodeEntry(typ, v)
				_, b2, _ := decodeEntry(again)
				c2, err := decodeConfig(b2)
				if err != nil || c2.History != c.History || !sameConfig(c2.RunConfig, c.RunConfig) {
					t.Fatalf("configuration entry does not round-trip: %+v, %v", c2, err)
				}
			}()
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
		case entryCharge:
			var s chargeEntry
			if msgpack.Unmarshal(body, &s) != nil {
				return
			}
			_ = s.Event.Validate()
			v = s
		case entryGrad:
			var s gradEntry
			if msgpack.Unmarshal(body, &s) != nil {
				return
			}
			g := make([]float32, len(s.Grad)/4)
			_ = getFloats(g, s.Grad)
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

// FuzzReadRaftState: whatever the log entries and the snapshot hold,
// readRaftState returns an error or a state, never panics; it fails only
// for a snapshot that does not decode; and it reports the configuration's
// history from the snapshot if that is configured, else from the first
// configuration entry in the log.
func FuzzReadRaftState(f *testing.F) {
	c := testRunConfig()
	cfg, _ := encodeEntry(entryConfig, configEntry{RunConfig: c, History: "aa"})
	legacy, _ := encodeEntry(entryConfig, c)
	step, _ := encodeEntry(entryStep, stepEntry{Step: 1, Event: c.Event(), Grad: make([]byte, 4*testDim)})
	fsm, err := NewFSM(f.TempDir(), testInit, nil)
	if err != nil {
		f.Fatal(err)
	}
	snapCfg, _ := encodeEntry(entryConfig, configEntry{RunConfig: c, History: "bb"})
	fsm.Apply(&raft.Log{Index: 2, Term: 1, Type: raft.LogCommand, Data: snapCfg})
	fs, err := fsm.Snapshot()
	if err != nil {
		f.Fatal(err)
	}
	var snap bytes.Buffer
	if err := fs.(*fsmSnapshot).write(&snap); err != nil {
		f.Fatal(err)
	}
	fsm.Close()
	f.Add(cfg, step, snap.Bytes())
	f.Add(step, legacy, []byte{})
	f.Add(step, step, snap.Bytes()[:30])
	f.Fuzz(func(t *testing.T, e1, e2, snapData []byte) {
		logs := raft.NewInmemStore()
		if err := logs.StoreLogs([]*raft.Log{
			{Index: 1, Term: 1, Type: raft.LogConfiguration},
			{Index: 2, Term: 1, Type: raft.LogCommand, Data: e1},
			{Index: 3, Term: 1, Type: raft.LogCommand, Data: e2},
		}); err != nil {
			t.Fatal(err)
		}
		snaps := raft.NewInmemSnapshotStore()
		if len(snapData) > 0 {
			sink, err := snaps.Create(raft.SnapshotVersionMax, 2, 1, raft.Configuration{}, 1, nil)
			if err != nil {
				t.Fatal(err)
			}
			sink.Write(snapData)
			sink.Close()
		}
		st, err := readRaftState(logs, snaps)
		sb, snapErr := decodeSnapshot(snapData)
		if len(snapData) > 0 && snapErr != nil {
			if err == nil {
				t.Fatal("a snapshot that does not decode was accepted")
			}
			return
		}
		if err != nil {
			t.Fatalf("readRaftState: %v", err)
		}
		if st.LastIndex != 3 {
			t.Fatalf("last index %d, want 3", st.LastIndex)
		}
		want := ledger.RaftState{LastIndex: 3}
		if len(snapData) > 0 && sb.Body.Configured {
			want.Configured, want.History = true, sb.Body.History
		} else {
			for _, e := range [][]byte{e1, e2} {
				if typ, body, err := decodeEntry(e); err == nil && typ == entryConfig {
					if ce, err := decodeConfig(body); err == nil {
						want.Configured, want.History = true, ce.History
						break
					}
				}
			}
		}
		if st != want {
			t.Fatalf("readRaftState = %+v, want %+v", st, want)
		}
	})
}

// FuzzStepEntryFastPath: the state machine's decoder of step entries
// (decodeStepInto, g̃ straight into the FSM's buffer) has the outcome of
// the plain one (msgpack.Unmarshal into a stepEntry, then getFloats) on
// any body: the same decode error or none, the same refusal of g̃ or none,
// the same fields and the same values bit for bit; and the leader's
// encoder (encodeStepEntry) writes exactly encodeEntry's bytes.
func FuzzStepEntryFastPath(f *testing.F) {
	c := testRunConfig()
	for _, dim := range []int{0, 3, gradChunk + 5} {
		g := make([]float32, dim)
		for i := range g {
			g[i] = float32(i)*0.5 - 7
		}
		data, err := encodeStepEntry(4, c.Event(), g, "r1/1/00")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data[2:], uint16(dim))
		f.Add(data[2:], uint16(dim+1))
	}
	f.Fuzz(func(t *testing.T, body []byte, dim uint16) {
		var plain stepEntry
		plainErr := msgpack.Unmarshal(body, &plain)
		want := make([]float32, dim)
		var plainGradErr error
		if plainErr == nil {
			plainGradErr = getFloats(want, plain.Grad)
		}
		got := make([]float32, dim)
		s, gradErr, err := decodeStepInto(body, got)
		if (err == nil) != (plainErr == nil) {
			t.Fatalf("decode error %v, plain %v", err, plainErr)
		}
		if err != nil {
			return
		}
		if (gradErr == nil) != (plainGradErr == nil) {
			t.Fatalf("grad error %v, plain %v", gradErr, plainGradErr)
		}
		// The events are compared bit for bit, through their encoding:
		// Event.Equal is float equality, under which an event holding a NaN
		// (which the state machine then refuses, on both paths) never
		// equals itself.
		se, err1 := msgpack.Marshal(s.Event)
		pe, err2 := msgpack.Marshal(plain.Event)
		if err1 != nil || err2 != nil {
			t.Fatalf("re-encoding the events: %v, %v", err1, err2)
		}
		if s.Step != plain.Step || s.Round != plain.Round || !bytes.Equal(se, pe) {
			t.Fatalf("fields %+v, plain %+v", s, plain)
		}
		if gradErr != nil {
			return
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("value %d: %v, plain %v", i, got[i], want[i])
			}
		}
		// Re-encoded, the fast encoder's bytes are the plain encoder's.
		fast, err1 := encodeStepEntry(s.Step, s.Event, got, s.Round)
		raw := make([]byte, 4*len(got))
		putFloats(raw, got)
		slow, err2 := encodeEntry(entryStep, stepEntry{Step: s.Step, Event: s.Event, Grad: raw, Round: s.Round})
		if err1 != nil || err2 != nil || !bytes.Equal(fast, slow) {
			t.Fatalf("encoders differ: %v, %v", err1, err2)
		}
	})
}

// FuzzGradEntryFastPath: decodeGradInto (g̃ straight into the state
// machine's buffer) has the outcome of msgpack.Unmarshal into a gradEntry
// then getFloats on any body, and encodeGradEntry writes exactly
// encodeEntry's bytes.
func FuzzGradEntryFastPath(f *testing.F) {
	for _, dim := range []int{0, 3, gradChunk + 5} {
		g := make([]float32, dim)
		for i := range g {
			g[i] = float32(i)*0.25 - 3
		}
		data, err := encodeGradEntry(4, 11, g)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data[2:], uint16(dim))
		f.Add(data[2:], uint16(dim+1))
	}
	f.Fuzz(func(t *testing.T, body []byte, dim uint16) {
		var plain gradEntry
		plainErr := msgpack.Unmarshal(body, &plain)
		want := make([]float32, dim)
		var plainGradErr error
		if plainErr == nil {
			plainGradErr = getFloats(want, plain.Grad)
		}
		got := make([]float32, dim)
		g, gradErr, err := decodeGradInto(body, got)
		if (err == nil) != (plainErr == nil) {
			t.Fatalf("decode error %v, plain %v", err, plainErr)
		}
		if err != nil {
			return
		}
		if (gradErr == nil) != (plainGradErr == nil) {
			t.Fatalf("grad error %v, plain %v", gradErr, plainGradErr)
		}
		if g.Step != plain.Step || g.Charge != plain.Charge {
			t.Fatalf("fields %+v, plain %+v", g, plain)
		}
		if gradErr != nil {
			return
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("value %d: %v, plain %v", i, got[i], want[i])
			}
		}
		fast, err1 := encodeGradEntry(g.Step, g.Charge, got)
		raw := make([]byte, 4*len(got))
		putFloats(raw, got)
		slow, err2 := encodeEntry(entryGrad, gradEntry{Step: g.Step, Charge: g.Charge, Grad: raw})
		if err1 != nil || err2 != nil || !bytes.Equal(fast, slow) {
			t.Fatalf("encoders differ: %v, %v", err1, err2)
		}
	})
}
