package coordinator

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/dpcluster/dpcluster/ledger"
)

// Raft log entries are one type byte, one version byte, then a msgpack
// body. A replica that meets an unknown type or version refuses the entry
// (and stops: it cannot apply the log deterministically).

type entryType uint8

const (
	entryConfig entryType = 1 // RunConfig: the run's definition
	entryStep   entryType = 2 // stepEntry: one noisy gradient
	entryStop   entryType = 3 // stopEntry: end the run
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
	Step  int64        `msgpack:"step"`
	Event ledger.Event `msgpack:"event"`
	Grad  []byte       `msgpack:"grad"`
	// Round identifies the round that produced it (leader id and term),
	// for logs and audits.
	Round string `msgpack:"round"`
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
	case entryConfig, entryStep, entryStop:
		return t, data[2:], nil
	default:
		return 0, nil, fmt.Errorf("%w: unknown type %d", ErrBadEntry, data[0])
	}
}

// putFloats encodes v as little-endian float32 bytes into dst, which must
// have 4·len(v) bytes.
func putFloats(dst []byte, v []float32) {
	for i, x := range v {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(x))
	}
}

// getFloats decodes little-endian float32 bytes into dst.
func getFloats(dst []float32, b []byte) error {
	if len(b) != 4*len(dst) {
		return fmt.Errorf("%w: %d bytes for %d floats", ErrBadEntry, len(b), len(dst))
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return nil
}
