package coordinator

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/internal/f32le"
)

// Raft log entries are one type byte, one version byte, then a msgpack
// body. A replica that meets an unknown type or version refuses the entry
// (and stops: it cannot apply the log deterministically).

type entryType uint8

const (
	entryConfig entryType = 1 // RunConfig: the run's definition
	entryStep   entryType = 2 // stepEntry: one noisy gradient, charged and applied (logs before the charge-ahead path)
	entryStop   entryType = 3 // stopEntry: end the run
	entryCharge entryType = 4 // chargeEntry: the charge of a release, ahead of its g̃
	entryGrad   entryType = 5 // gradEntry: the g̃ of a committed charge
	entryBind   entryType = 6 // bindEntry: the training data a node ID trains on
)

const entryVersion = 1

// ErrBadEntry is returned when a Raft log entry cannot be decoded.
var ErrBadEntry = errors.New("coordinator: malformed log entry")

// stepEntry is the privatized step the leader proposes. Grad holds g̃ as
// little-endian float32 bytes: it is the only tensor in the log, and it is
// already noised. Event is the mechanism the leader says produced it; the
// state machine charges the run configuration's event and refuses an entry
// whose Event differs.
type stepEntry struct {
	Step  int64            `msgpack:"step"`
	Event accounting.Event `msgpack:"event"`
	Grad  []byte           `msgpack:"grad"`
	// Round identifies the round that produced it (leader id and term),
	// for logs and audits.
	Round string `msgpack:"round"`
}

// chargeEntry charges one release before it exists outside the leader's
// memory: the leader proposes it once g̃ is formed, and only after it is
// committed (durable on a quorum of Raft logs) and applied on the leader
// (the leader's ledger charged and fsynced) does anything derived from g̃
// leave the leader: θ_t to the nodes, and g̃ itself in the gradEntry that
// follows. It holds no tensor. Event is the mechanism the leader says it
// releases; the state machine charges the run configuration's event and
// refuses an entry whose Event differs.
type chargeEntry struct {
	Step  int64            `msgpack:"step"`
	Event accounting.Event `msgpack:"event"`
	Round string           `msgpack:"round"`
}

// gradEntry carries the g̃ of the charge entry at Raft index Charge, for
// every replica to apply the optimizer update with. Grad is little-endian
// float32 bytes, as in stepEntry.
type gradEntry struct {
	Step   int64  `msgpack:"step"`
	Charge uint64 `msgpack:"charge"`
	Grad   []byte `msgpack:"grad"`
}

// entryHeader is the step and charge index of a grad or step entry (a
// step entry has no charge field), decoded without its g̃ (msgpack skips
// the bytes), for the readers of a log that do not apply it.
type entryHeader struct {
	Step   int64  `msgpack:"step"`
	Charge uint64 `msgpack:"charge"`
}

// gradEntryFloats is gradEntry with its Grad read from or written to
// float32s directly (encodeGradEntry, decodeGradInto).
type gradEntryFloats struct {
	Step   int64      `msgpack:"step"`
	Charge uint64     `msgpack:"charge"`
	Grad   gradFloats `msgpack:"grad"`
}

// encodeGradEntry is encodeEntry(entryGrad, gradEntry{...}) with Grad the
// bytes of g, converted once straight into the entry's buffer
// (TestGradEntryFastPath).
func encodeGradEntry(step int64, charge uint64, g []float32) ([]byte, error) {
	buf := bytes.NewBuffer(make([]byte, 0, 4*len(g)+64))
	buf.Write([]byte{byte(entryGrad), entryVersion})
	if err := msgpack.NewEncoder(buf).Encode(gradEntryFloats{Step: step, Charge: charge, Grad: gradFloats{src: g}}); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// decodeGradInto decodes a grad entry's body with g̃ going straight into
// dst: err is msgpack's error, gradErr says g̃ has the wrong length (as
// decodeStepInto). The returned entry's Grad is nil.
func decodeGradInto(body []byte, dst []float32) (g gradEntry, gradErr, err error) {
	in := gradEntryFloats{Grad: gradFloats{dst: dst}}
	if err := msgpack.Unmarshal(body, &in); err != nil {
		return gradEntry{}, nil, err
	}
	g = gradEntry{Step: in.Step, Charge: in.Charge}
	if n := in.Grad.n; n != 4*len(dst) {
		return g, fmt.Errorf("%w: %d bytes for %d floats", ErrBadEntry, n, len(dst)), nil
	}
	return g, nil, nil
}

// encodeStepEntry is encodeEntry(entryStep, stepEntry{...}) with Grad
// the bytes of g: the same bytes (TestStepEntryFastPath), but g̃ is
// converted once, straight into the entry's buffer, sized up front, and
// not copied again: the entry is model-sized and encoded on every step's
// serial chain.
func encodeStepEntry(step int64, event accounting.Event, g []float32, round string) ([]byte, error) {
	buf := bytes.NewBuffer(make([]byte, 0, 4*len(g)+512))
	buf.Write([]byte{byte(entryStep), entryVersion})
	err := msgpack.NewEncoder(buf).Encode(stepEntryFloats{Step: step, Event: event, Grad: gradFloats{src: g}, Round: round})
	if err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// decodeStepInto decodes a step entry's body as msgpack.Unmarshal into a
// stepEntry followed by getFloats(dst, Grad) would, with the same outcome
// (FuzzStepEntryFastPath): err is Unmarshal's error, gradErr getFloats's;
// but g̃ goes straight from the body into dst. The returned entry's Grad
// is nil. On an error dst may hold part of the values.
func decodeStepInto(body []byte, dst []float32) (s stepEntry, gradErr, err error) {
	in := stepEntryFloats{Grad: gradFloats{dst: dst}}
	if err := msgpack.Unmarshal(body, &in); err != nil {
		return stepEntry{}, nil, err
	}
	s = stepEntry{Step: in.Step, Event: in.Event, Round: in.Round}
	if n := in.Grad.n; n != 4*len(dst) {
		// Absent, nil or of the wrong length: getFloats's error.
		return s, fmt.Errorf("%w: %d bytes for %d floats", ErrBadEntry, n, len(dst)), nil
	}
	return s, nil, nil
}

// stepEntryFloats is stepEntry with its Grad read from or written to
// float32s directly.
type stepEntryFloats struct {
	Step  int64            `msgpack:"step"`
	Event accounting.Event `msgpack:"event"`
	Grad  gradFloats       `msgpack:"grad"`
	Round string           `msgpack:"round"`
}

// gradFloats is a step entry's grad field (msgpack bin of little-endian
// float32s): encoded from src, decoded into dst if it has 4·len(dst)
// bytes (n: how many it had; 0 if absent or nil).
type gradFloats struct {
	src, dst []float32
	n        int
}

// gradChunk is how many floats are converted at a time through a stack
// buffer.
const gradChunk = 1024

func (g gradFloats) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeBytesLen(4 * len(g.src)); err != nil {
		return err
	}
	if b, ok := f32le.View(g.src); ok {
		_, err := e.Writer().Write(b)
		return err
	}
	var chunk [4 * gradChunk]byte
	for i := 0; i < len(g.src); i += gradChunk {
		v := g.src[i:min(i+gradChunk, len(g.src))]
		putFloats(chunk[:4*len(v)], v)
		if _, err := e.Writer().Write(chunk[:4*len(v)]); err != nil {
			return err
		}
	}
	return nil
}

func (g *gradFloats) DecodeMsgpack(d *msgpack.Decoder) error {
	n, err := d.DecodeBytesLen()
	if err != nil {
		return err
	}
	g.n = max(n, 0) // -1: nil
	var chunk [4 * gradChunk]byte
	if g.n != 4*len(g.dst) {
		for left := g.n; left > 0; left -= len(chunk) { // skip it
			if err := d.ReadFull(chunk[:min(left, len(chunk))]); err != nil {
				return err
			}
		}
		return nil
	}
	if b, ok := f32le.View(g.dst); ok {
		return d.ReadFull(b)
	}
	for i := 0; i < len(g.dst); i += gradChunk {
		v := g.dst[i:min(i+gradChunk, len(g.dst))]
		if err := d.ReadFull(chunk[:4*len(v)]); err != nil {
			return err
		}
		f32le.Get(v, chunk[:])
	}
	return nil
}

// configEntry is the run configuration as the log carries it: the
// RunConfig's fields and, next to them, History, the ID of the Raft
// history this configuration starts (ledger.Position). The leader that
// first proposes the configuration draws History at random
// (Replica.Configure); a leader re-proposing it after a failover carries
// the same ID. Entries written before history IDs existed are a bare
// RunConfig and decode with History "".
type configEntry struct {
	RunConfig `msgpack:",inline"`
	History   string `msgpack:"history,omitempty"`
}

// decodeConfig decodes a configuration entry's body.
func decodeConfig(body []byte) (configEntry, error) {
	var c configEntry
	if err := msgpack.Unmarshal(body, &c); err != nil {
		return configEntry{}, fmt.Errorf("%w: config: %v", ErrBadEntry, err)
	}
	return c, nil
}

type stopEntry struct {
	Reason string `msgpack:"reason"`
}

// bindEntry binds node ID Node to the content hash of its training data
// (transport.Join.DataHash), as the leader first admitted it: the state
// machine keeps the first hash each ID is bound to, and the leader refuses
// the ID with any other (rejectDataHash), also after a restart or a
// failover, since the binding is in the log and the snapshots.
type bindEntry struct {
	Node string `msgpack:"node"`
	Data string `msgpack:"data"`
}

func encodeEntry(t entryType, body any) ([]byte, error) {
	b, err := msgpack.Marshal(body)
	if err != nil {
		return nil, err
	}
	return append([]byte{byte(t), entryVersion}, b...), nil
}

func decodeEntry(data []byte) (entryType, []byte, error) {
	if len(data) < 2 {
		return 0, nil, fmt.Errorf("%w: %d bytes", ErrBadEntry, len(data))
	}
	if data[1] != entryVersion {
		return 0, nil, fmt.Errorf("%w: version %d (this build reads %d)", ErrBadEntry, data[1], entryVersion)
	}
	switch t := entryType(data[0]); t {
	case entryConfig, entryStep, entryStop, entryCharge, entryGrad, entryBind:
		return t, data[2:], nil
	default:
		return 0, nil, fmt.Errorf("%w: unknown type %d", ErrBadEntry, data[0])
	}
}

// putFloats encodes v as little-endian float32 bytes into dst, which must
// have 4·len(v) bytes.
func putFloats(dst []byte, v []float32) { f32le.Put(dst, v) }

// getFloats decodes little-endian float32 bytes into dst.
func getFloats(dst []float32, b []byte) error {
	if len(b) != 4*len(dst) {
		return fmt.Errorf("%w: %d bytes for %d floats", ErrBadEntry, len(b), len(dst))
	}
	f32le.Get(dst, b)
	return nil
}
