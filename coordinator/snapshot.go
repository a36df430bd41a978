package coordinator

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"os"

	"github.com/hashicorp/raft"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/internal/f32le"
	"github.com/dpcluster/dpcluster/ledger"
)

// A snapshot is: magic "DPCSNAP1", a little-endian uint64 body length, the
// msgpack body (snapshotBody), and the CRC32C of the body. It holds the run
// configuration, θ, the optimizer state, the run's stop reason, and the
// ledger's records up to the snapshot (so a replica that installs the
// snapshot from a peer ends up with the same ledger). Everything in it is
// public or privatized.

var snapMagic = [8]byte{'D', 'P', 'C', 'S', 'N', 'A', 'P', '1'}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrBadSnapshot is returned by Restore for a snapshot that does not decode.
var ErrBadSnapshot = errors.New("coordinator: malformed snapshot")

type snapshotBody struct {
	Configured bool      `msgpack:"configured"`
	Config     RunConfig `msgpack:"config"`
	Theta      []byte    `msgpack:"theta"` // little-endian float32
	Optimizer  []byte    `msgpack:"optimizer"`
	Applied    int64     `msgpack:"applied"`
	Stopped    string    `msgpack:"stopped"`
	// LedgerSize is the byte length of the ledger prefix at the snapshot,
	// and LedgerHead the hash of its last record.
	LedgerSize int64  `msgpack:"ledger_size"`
	LedgerHead string `msgpack:"ledger_head"`
	LedgerSeq  uint64 `msgpack:"ledger_seq"`

	// History is the Raft history ID of the configuration entry (empty in
	// snapshots written before history IDs).
	History string `msgpack:"history,omitempty"`
	// Pending is the pending charge (FSM): a snapshot taken between a
	// charge entry and its grad entry carries it, so a replica restored
	// from it applies that grad entry as the others do. Absent in
	// snapshots written before the charge-ahead path.
	Pending *pendingCharge `msgpack:"pending,omitempty"`
	// Bindings are the nodes' data bindings (bindEntry): node ID to the
	// content hash of its training data. Absent in snapshots written
	// before bindings, and when no node is bound.
	Bindings map[string]string `msgpack:"bindings,omitempty"`
}

type fsmSnapshot struct {
	body       snapshotBody
	ledgerPath string
	bufs       *snapBuffers      // body.Theta's and body.Optimizer's memory
	free       chan *snapBuffers // where Release hands bufs back
}

// snapBuffers are a snapshot's copies of θ and the optimizer state, 3 × 4·d
// bytes for DP-AdamBC (240 MB at 20M parameters, a snapshot every few
// steps there): reused from one snapshot to the next instead of allocated
// and zeroed each time. Raft takes one snapshot at a time and releases it
// before the next; a snapshot taken while another is held gets buffers of
// its own.
type snapBuffers struct {
	theta, opt []byte
}

// Snapshot captures the state. Raft calls it between Applies; the copy of θ
// and the optimizer state is taken here, and Persist (which may run
// concurrently with later Applies) reads only the immutable ledger prefix.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.tmu.RLock()
	defer f.tmu.RUnlock()
	// The small state under mu, released before the model-sized copies:
	// State and WouldExceed do not wait for them.
	f.mu.Lock()
	if f.fatal != nil {
		defer f.mu.Unlock()
		return nil, f.fatal
	}
	head, seq := f.ledger.Head()
	f.sinceSnap = 0
	s := &fsmSnapshot{ledgerPath: f.ledgerPath, body: snapshotBody{
		Applied: f.applied, Stopped: f.stopped, Pending: f.pending, Bindings: maps.Clone(f.bindings),
		LedgerSize: f.ledger.Size(), LedgerHead: head.Hash, LedgerSeq: seq,
	}}
	cfg, history := f.cfg, f.history
	f.mu.Unlock()
	if cfg != nil {
		s.body.Configured, s.body.Config, s.body.History = true, *cfg, history
		b := new(snapBuffers)
		select {
		case b = <-f.snapFree:
		default:
		}
		b.theta = f32le.Append(b.theta[:0], f.theta)
		opt, err := f.opt.AppendBinary(b.opt[:0])
		if err != nil {
			return nil, err
		}
		b.opt = opt
		s.body.Theta, s.body.Optimizer = b.theta, b.opt
		s.bufs, s.free = b, f.snapFree
	}
	return s, nil
}

// Persist writes the snapshot to sink.
func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	err := s.write(sink)
	if err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

// snapshotFile is the wire form: body plus the ledger prefix.
type snapshotFile struct {
	Body   snapshotBody `msgpack:"body"`
	Ledger []byte       `msgpack:"ledger"`
}

func (s *fsmSnapshot) write(w io.Writer) error {
	lf, err := os.Open(s.ledgerPath)
	if err != nil {
		return err
	}
	defer lf.Close()
	prefix := make([]byte, s.body.LedgerSize)
	if _, err := io.ReadFull(lf, prefix); err != nil {
		return fmt.Errorf("coordinator: reading ledger for snapshot: %w", err)
	}
	// The body is encoded twice, first only to count its bytes (the
	// header holds its length), then straight to w and its CRC: no
	// model-sized buffer holds the encoding.
	file := snapshotFile{Body: s.body, Ledger: prefix}
	var n countingWriter
	if err := msgpack.NewEncoder(&n).Encode(file); err != nil {
		return err
	}
	var hdr [16]byte
	copy(hdr[:8], snapMagic[:])
	binary.LittleEndian.PutUint64(hdr[8:], uint64(n.n))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	crc := crc32.New(castagnoli)
	out := &countingWriter{w: io.MultiWriter(w, crc)}
	bw := bufio.NewWriterSize(out, 1<<20)
	if err := msgpack.NewEncoder(bw).Encode(file); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if out.n != n.n {
		return fmt.Errorf("coordinator: snapshot body encoded to %d bytes, then %d", n.n, out.n)
	}
	var tail [4]byte
	binary.LittleEndian.PutUint32(tail[:], crc.Sum32())
	_, err = w.Write(tail[:])
	return err
}

// countingWriter counts the bytes written through it to w (nil: counts
// only).
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.w == nil {
		c.n += int64(len(p))
		return len(p), nil
	}
	k, err := c.w.Write(p)
	c.n += int64(k)
	return k, err
}

// Release hands the snapshot's buffers to the next snapshot; s must not be
// used afterwards (Raft calls it once, after Persist).
func (s *fsmSnapshot) Release() {
	if s.bufs == nil {
		return
	}
	s.body.Theta, s.body.Optimizer = nil, nil
	select {
	case s.free <- s.bufs:
	default:
	}
	s.bufs = nil
}

// Restore replaces the state with a snapshot's. If the local ledger already
// holds the snapshot's ledger prefix (same record count reached, same hash
// at that record) it is kept, records after the prefix included: Raft will
// replay their entries and the state machine will not charge them twice.
// Otherwise the snapshot's ledger replaces the local one, unless the local
// ledger is bound to another Raft history: then Restore refuses (an error
// wrapping ledger.ErrHistoryMismatch, and this replica fails closed)
// rather than drop another history's charges.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	defer f.notify()
	data, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	snap, err := decodeSnapshot(data)
	if err != nil {
		return err
	}
	f.tmu.Lock()
	defer f.tmu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	defer f.storeSpent() // the restored ledger's, or the old one's on failure
	if err := f.reconcileLedger(snap); err != nil {
		return err
	}
	b := snap.Body
	f.cfg, f.history, f.theta, f.opt, f.grad = nil, "", nil, nil, nil
	f.applied, f.thetaStep, f.stopped, f.diag, f.pending = b.Applied, b.Applied, b.Stopped, dpadam.Diagnostics{}, b.Pending
	f.bindings = b.Bindings
	if b.Configured {
		c := b.Config
		theta := make([]float32, c.Dim)
		if err := getFloats(theta, b.Theta); err != nil {
			return fmt.Errorf("%w: θ: %v", ErrBadSnapshot, err)
		}
		var opt dpadam.Optimizer
		if err := opt.UnmarshalBinary(b.Optimizer); err != nil {
			return fmt.Errorf("%w: %v", ErrBadSnapshot, err)
		}
		if opt.Dim() != c.Dim {
			return fmt.Errorf("%w: optimizer dimension %d, config %d", ErrBadSnapshot, opt.Dim(), c.Dim)
		}
		f.cfg, f.history, f.theta, f.opt, f.grad = &c, b.History, theta, &opt, make([]float32, c.Dim)
		f.warmLedger(c)
		if f.onConfigured != nil {
			f.onConfigured(c.Dim)
		}
	}
	f.restores.Add(1)
	f.log.Info("restored snapshot", "step", f.applied, "ledger_records", b.LedgerSeq)
	return nil
}

func decodeSnapshot(data []byte) (snapshotFile, error) {
	var s snapshotFile
	if len(data) < 20 || !bytes.Equal(data[:8], snapMagic[:]) {
		return s, fmt.Errorf("%w: bad header", ErrBadSnapshot)
	}
	n := binary.LittleEndian.Uint64(data[8:16])
	if n != uint64(len(data)-20) {
		return s, fmt.Errorf("%w: body length %d, have %d bytes", ErrBadSnapshot, n, len(data)-20)
	}
	body := data[16 : 16+n]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(data[16+n:]) {
		return s, fmt.Errorf("%w: checksum mismatch", ErrBadSnapshot)
	}
	if err := msgpack.Unmarshal(body, &s); err != nil {
		return s, fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	if int64(len(s.Ledger)) != s.Body.LedgerSize {
		return s, fmt.Errorf("%w: ledger prefix is %d bytes, header says %d", ErrBadSnapshot, len(s.Ledger), s.Body.LedgerSize)
	}
	return s, nil
}

// reconcileLedger makes the local ledger hold at least the snapshot's
// ledger prefix. Called with both locks held.
func (f *FSM) reconcileLedger(snap snapshotFile) error {
	local, err := os.ReadFile(f.ledgerPath)
	if err != nil {
		return err
	}
	if int64(len(local)) >= snap.Body.LedgerSize && bytes.Equal(local[:snap.Body.LedgerSize], snap.Ledger) {
		return nil // local ledger already holds the prefix
	}
	if err := f.ledger.CheckHistory(snap.Body.History); err != nil {
		f.fatal = fmt.Errorf("%w: restoring a snapshot: %w", ErrFatal, err)
		f.log.Error("snapshot of another Raft history; not replacing the ledger", "err", err)
		return f.fatal
	}
	if int64(len(local)) == f.ledger.Size() && bytes.HasPrefix(snap.Ledger, local) {
		// The usual case, a replica behind its leader: append what it
		// lacks (ledger.Extend verifies it), in time proportional to
		// that, not to the run.
		f.log.Info("extending local ledger with the snapshot's", "local_bytes", len(local), "snapshot_bytes", len(snap.Ledger))
		return f.ledger.Extend(snap.Ledger[len(local):])
	}
	f.log.Warn("replacing local ledger with the snapshot's", "local_bytes", len(local), "snapshot_bytes", len(snap.Ledger))
	if err := f.ledger.Close(); err != nil {
		return err
	}
	if err := ledger.Install(f.ledgerPath, snap.Ledger); err != nil {
		return err
	}
	l, err := ledger.Open(f.ledgerPath, f.ledgerOpts...)
	if err != nil {
		return err
	}
	f.ledger = l
	return nil
}
