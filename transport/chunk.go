package transport

import (
	"fmt"
	"hash/crc32"
	"slices"
	"sync"
	"time"
)

type transferKey struct {
	sender string
	id     uint64
}

// transfer is the receive state of one chunked message.
type transfer struct {
	topic    Topic
	node     string // the node whose subject the chunks arrived on (per-node topics)
	total    uint32
	size     uint32
	length   uint64
	wholeCRC uint32
	buf      []byte
	have     []uint64 // bitset of received chunk indices
	n        uint32
	maxIdx   uint32 // highest index received
	next     uint32 // chunks [0, next) are in runCRC
	runCRC   uint32 // CRC32C of buf[:next·size], extended as chunks arrive in order
	sizePow  uint32 // x^(8·size) mod P, to extend runCRC by a chunk of size bytes
	started  time.Time
	last     time.Time // last new chunk
	lastNack time.Time
	nacks    int
}

// reassembler rebuilds chunked messages. It is safe for concurrent use. Its
// memory is bounded: a transfer may not exceed maxMessage bytes and all
// transfers in flight together may not exceed maxTotal bytes; a transfer that
// is not complete timeout after its first chunk is dropped and freed.
//
// Per sender: on a topic with a limit (limitTopic), a transfer may not
// announce more than that limit (a node's contribution has a known size
// for the run's model), and at most maxPerNode transfers are in flight on
// one node's subject of a per-node topic (a newer one abandons the
// oldest); so no sender can
// take more than its own share of maxTotal by announcing transfers it
// never completes (issue 27: three single chunks announcing 1 GiB each
// filled the shared budget and starved the honest nodes).
type reassembler struct {
	maxMessage int64
	maxTotal   int64

	mu       sync.Mutex
	inflight int64
	xfers    map[transferKey]*transfer
	finished map[transferKey]time.Time // completed or abandoned, to drop late duplicates
	topicMax map[Topic]int64           // limitTopic's
	perNode  map[string]int            // transfers in flight per node subject
}

// maxPerNode is how many transfers may be in flight on one node's subject
// at once: its contribution to the current round, and one to the round
// before or after it.
const maxPerNode = 2

// limitTopic bounds the announced length of transfers on topic to max
// bytes (0 removes the bound).
func (r *reassembler) limitTopic(t Topic, max int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if max <= 0 {
		delete(r.topicMax, t)
		return
	}
	r.topicMax[t] = max
}

func newReassembler(maxMessage, maxTotal int64) *reassembler {
	return &reassembler{
		maxMessage: maxMessage,
		maxTotal:   maxTotal,
		xfers:      make(map[transferKey]*transfer),
		finished:   make(map[transferKey]time.Time),
		topicMax:   make(map[Topic]int64),
		perNode:    make(map[string]int),
	}
}

// add stores c, which must have passed chunk.check, and which arrived on
// the subject of node (a per-node topic's; "" for the others) or, if
// resent, on the receiver's inbox. It returns the whole message once the
// last missing chunk arrives and the whole-message CRC32C matches, with
// the node whose subject the transfer's chunks arrived on: a transfer
// opens only with a chunk from a topic subject, and every chunk from a
// topic subject must come from the same node's. Errors: ErrDuplicateChunk
// for a chunk already held (or of a finished transfer), ErrCorrupt for a
// chunk inconsistent with its transfer (another node's subject included), a
// resent chunk of an unknown transfer, or a whole-message CRC mismatch (the
// transfer is dropped), ErrTooLarge when the transfer does not fit the
// limits. c.Data is copied; c.dataCRC (set by check) must be its CRC32C.
func (r *reassembler) add(c *chunk, node string, resent bool, now time.Time) ([]byte, string, error) {
	key := transferKey{c.Sender, c.Transfer}
	r.mu.Lock()
	if _, ok := r.finished[key]; ok {
		r.mu.Unlock()
		return nil, "", fmt.Errorf("%w: transfer %d from %s already finished", ErrDuplicateChunk, c.Transfer, c.Sender)
	}
	x := r.xfers[key]
	if x == nil {
		// A receiver NACKs only transfers it has seen, so a resent chunk
		// never opens one: one that would came from someone who may
		// publish on the inbox, not on the subject the transfer names.
		if resent {
			r.mu.Unlock()
			return nil, "", fmt.Errorf("%w: resent chunk of unknown transfer %d from %s", ErrCorrupt, c.Transfer, c.Sender)
		}
		if c.Len > uint64(r.maxMessage) {
			r.mu.Unlock()
			return nil, "", fmt.Errorf("%w: transfer of %d bytes, limit %d", ErrTooLarge, c.Len, r.maxMessage)
		}
		if max, ok := r.topicMax[c.Topic]; ok && c.Len > uint64(max) {
			r.mu.Unlock()
			return nil, "", fmt.Errorf("%w: %v transfer of %d bytes from %s, limit %d for that topic", ErrTooLarge, c.Topic, c.Len, c.Sender, max)
		}
		if node != "" && r.perNode[node] >= maxPerNode {
			// The node's newest transfer supersedes its oldest (a lost
			// chunk of an old round must not block its next ones).
			r.dropOldestLocked(node, now)
		}
		if r.inflight+int64(c.Len) > r.maxTotal {
			r.mu.Unlock()
			return nil, "", fmt.Errorf("%w: %d bytes in flight, limit %d", ErrTooLarge, r.inflight+int64(c.Len), r.maxTotal)
		}
		x = &transfer{
			topic: c.Topic, node: node, total: c.Total, size: c.Size, length: c.Len, wholeCRC: c.WholeCRC,
			buf:     make([]byte, c.Len),
			have:    make([]uint64, (c.Total+63)/64),
			sizePow: crcXPow8N(uint64(c.Size)),
			started: now,
		}
		r.inflight += int64(c.Len)
		r.xfers[key] = x
		if node != "" {
			r.perNode[node]++
		}
	} else if x.topic != c.Topic || x.total != c.Total || x.size != c.Size || x.length != c.Len || x.wholeCRC != c.WholeCRC ||
		!resent && x.node != node {
		r.mu.Unlock()
		return nil, "", fmt.Errorf("%w: chunk %d inconsistent with transfer %d from %s", ErrCorrupt, c.Index, c.Transfer, c.Sender)
	}
	w, bit := c.Index/64, uint64(1)<<(c.Index%64)
	if x.have[w]&bit != 0 {
		r.mu.Unlock()
		return nil, "", fmt.Errorf("%w: chunk %d of transfer %d from %s", ErrDuplicateChunk, c.Index, c.Transfer, c.Sender)
	}
	copy(x.buf[c.Offset:], c.Data)
	x.have[w] |= bit
	x.n++
	x.maxIdx = max(x.maxIdx, c.Index)
	x.last = now
	// Extend the running whole-message CRC while the prefix is complete.
	// A chunk that extends it as it arrives (in-order arrival, the common
	// case) adds its data CRC, which check computed: its bytes are hashed
	// once. A chunk that arrived before a missing one is hashed again
	// from buf when the prefix reaches it.
	for x.next < x.total && x.have[x.next/64]&(1<<(x.next%64)) != 0 {
		off := uint64(x.next) * uint64(x.size)
		piece := x.buf[off:min(off+uint64(x.size), x.length)]
		switch {
		case x.next != c.Index:
			x.runCRC = crc32.Update(x.runCRC, castagnoli, piece)
		case len(piece) == int(x.size):
			x.runCRC = crcMulMod(x.sizePow, x.runCRC) ^ c.dataCRC
		default:
			x.runCRC = crc32cCombine(x.runCRC, c.dataCRC, uint64(len(piece)))
		}
		x.next++
	}
	if x.n < x.total {
		r.mu.Unlock()
		return nil, "", nil
	}
	r.finishLocked(key, x, now)
	r.mu.Unlock()
	if x.runCRC != x.wholeCRC {
		return nil, "", fmt.Errorf("%w: transfer %d from %s: whole-message CRC32C mismatch", ErrCorrupt, c.Transfer, c.Sender)
	}
	return x.buf, x.node, nil
}

// dropOldestLocked abandons node's oldest transfer in flight.
func (r *reassembler) dropOldestLocked(node string, now time.Time) {
	var oldest transferKey
	var ox *transfer
	for k, x := range r.xfers {
		if x.node == node && (ox == nil || x.started.Before(ox.started)) {
			oldest, ox = k, x
		}
	}
	if ox != nil {
		r.finishLocked(oldest, ox, now)
	}
}

func (r *reassembler) finishLocked(key transferKey, x *transfer, now time.Time) {
	delete(r.xfers, key)
	r.inflight -= int64(x.length)
	r.finished[key] = now
	if x.node != "" {
		if r.perNode[x.node]--; r.perNode[x.node] <= 0 {
			delete(r.perNode, x.node)
		}
	}
}

// tailFactor: chunks past the highest index received are NACKed after a
// stall of tailFactor·NackAfter.
const tailFactor = 4

// nackReq asks sender to resend the listed chunks of transfer id.
type nackReq struct {
	sender  string
	id      uint64
	missing []uint32
}

// scan drops transfers older than timeout (returning an ErrIncomplete error
// for each), forgets finished transfers older than timeout, and returns a
// NACK for each transfer that received no new chunk for nackAfter and was
// not NACKed in the last nackAfter, at most maxNacks times per transfer. A
// NACK lists the holes below the highest index received, and after a stall
// of tailFactor·nackAfter also the missing tail.
func (r *reassembler) scan(now time.Time, nackAfter, timeout time.Duration, maxNacks int) ([]nackReq, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var reqs []nackReq
	var errs []error
	for key, x := range r.xfers {
		if now.Sub(x.started) >= timeout {
			r.finishLocked(key, x, now)
			errs = append(errs, fmt.Errorf("%w: transfer %d from %s (%v): %d of %d chunks after %v",
				ErrIncomplete, key.id, key.sender, x.topic, x.n, x.total, timeout))
			continue
		}
		if x.nacks >= maxNacks || now.Sub(x.last) < nackAfter || now.Sub(x.lastNack) < nackAfter {
			continue
		}
		// Senders publish chunks in index order and NATS keeps one
		// publisher's order, so a hole below the highest index received is
		// a loss. Missing chunks above it may still be on their way (a
		// sender paused by flow control or a busy CPU): they are NACKed
		// only after a stall of tailFactor·nackAfter.
		limit := x.maxIdx + 1
		if now.Sub(x.last) >= tailFactor*nackAfter {
			limit = x.total
		}
		var missing []uint32
		for i := uint32(0); i < limit && len(missing) < maxNackIndices; i++ {
			if x.have[i/64]&(1<<(i%64)) == 0 {
				missing = append(missing, i)
			}
		}
		if len(missing) == 0 {
			continue
		}
		x.lastNack = now
		x.nacks++
		reqs = append(reqs, nackReq{sender: key.sender, id: key.id, missing: missing})
	}
	for key, t := range r.finished {
		if now.Sub(t) >= timeout {
			delete(r.finished, key)
		}
	}
	return reqs, errs
}

// inFlight returns the number of incomplete transfers and their bytes.
func (r *reassembler) inFlight() (int, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.xfers), r.inflight
}

// retained is a sent transfer kept for retransmission.
type retained struct {
	id       uint64
	subject  string // the subject it was published on
	topic    Topic
	data     []byte
	crcs     []uint32 // CRC32C of each chunk's data
	wholeCRC uint32
	size     uint32
	total    uint32
	at       time.Time
	// refs counts the holders of data: the retain cache while it keeps
	// the transfer, the sender while it publishes it, a NACK answer while
	// it resends from it. The last to let go hands data back to the
	// cache's free list (retainCache.release).
	refs int
}

// chunkCRCs returns the CRC32C of each size-byte chunk of data (the last
// one shorter).
func chunkCRCs(data []byte, size uint32) []uint32 {
	crcs := make([]uint32, (uint64(len(data))+uint64(size)-1)/uint64(size))
	for i := range crcs {
		off := uint64(i) * uint64(size)
		crcs[i] = crc32.Checksum(data[off:min(off+uint64(size), uint64(len(data)))], castagnoli)
	}
	return crcs
}

// newRetained returns transfer id of data, cut into chunks of size bytes
// whose CRC32Cs are crcs (chunkCRCs(data, size)), with the whole CRC32C
// combined from them: data is not hashed again. The caller checks that the
// number of chunks fits a uint32.
func newRetained(id uint64, subject string, topic Topic, data []byte, size uint32, crcs []uint32) *retained {
	t := &retained{id: id, subject: subject, topic: topic, data: data, crcs: crcs, size: size, total: uint32(len(crcs))}
	sizePow := crcXPow8N(uint64(size))
	var whole uint32 // the CRC32C of no bytes
	for i, crc := range crcs {
		if n := min(uint64(size), uint64(len(data))-uint64(i)*uint64(size)); n == uint64(size) {
			whole = crcMulMod(sizePow, whole) ^ crc
		} else {
			whole = crc32cCombine(whole, crc, n)
		}
	}
	t.wholeCRC = whole
	return t
}

// chunk returns chunk i of the retained transfer.
func (t *retained) chunk(sender string, i uint32) chunk {
	off := uint64(i) * uint64(t.size)
	end := min(off+uint64(t.size), uint64(len(t.data)))
	c := chunk{
		Sender: sender, Transfer: t.id, Topic: t.topic, Index: i, Total: t.total, Size: t.size,
		Offset: off, Len: uint64(len(t.data)), WholeCRC: t.wholeCRC, Data: t.data[off:end],
		dataCRC: t.crcs[i],
	}
	c.CRC = c.crcWith(c.dataCRC)
	return c
}

// retainCache keeps the most recent sent transfers, bounded in bytes, in
// age, and per subject (perSubject > 0: a newer transfer on a subject
// evicts the oldest beyond perSubject; 0: no per-subject bound), oldest
// evicted first.
//
// It also recycles their encode buffers: a transfer's data, once no one
// holds it (retained.refs), goes to a free list of at most maxFree buffers
// of at most maxBytes each that the next large Publish encodes into (buffer),
// so a sender does not allocate, zero and fault in a model-sized buffer per
// message. A free buffer unused for ttl is dropped.
type retainCache struct {
	maxBytes   int64
	ttl        time.Duration
	perSubject int

	mu    sync.Mutex
	bytes int64
	order []*retained
	free  []freeBuf
}

// maxFree bounds the free list: one buffer per subject a client sends
// large messages on (a node: its contributions; the leader: RoundStart and
// Params) lets each reuse the buffer its previous message let go.
const maxFree = 2

type freeBuf struct {
	b  []byte
	at time.Time // when it was freed
}

// put keeps t, which the caller holds (t.refs ≥ 1), if it fits maxBytes,
// evicting older transfers as the bounds require.
func (rc *retainCache) put(t *retained) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if int64(len(t.data)) > rc.maxBytes {
		return
	}
	t.refs++
	if rc.perSubject > 0 {
		same := 0
		for i := len(rc.order) - 1; i >= 0; i-- {
			if rc.order[i].subject != t.subject {
				continue
			}
			if same++; same >= rc.perSubject {
				rc.removeLocked(i)
			}
		}
	}
	rc.order = append(rc.order, t)
	rc.bytes += int64(len(t.data))
	for rc.bytes > rc.maxBytes {
		rc.removeLocked(0)
	}
}

// removeLocked drops order[i].
func (rc *retainCache) removeLocked(i int) {
	t := rc.order[i]
	rc.bytes -= int64(len(t.data))
	copy(rc.order[i:], rc.order[i+1:])
	rc.order[len(rc.order)-1] = nil
	rc.order = rc.order[:len(rc.order)-1]
	rc.releaseLocked(t, time.Now())
}

// get returns the retained transfer id, or nil. The caller holds it until
// it calls release.
func (rc *retainCache) get(id uint64) *retained {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, t := range rc.order {
		if t.id == id {
			t.refs++
			return t
		}
	}
	return nil
}

// release lets go of t (held from get, or by its sender). The caller must
// not use t.data afterwards.
func (rc *retainCache) release(t *retained) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.releaseLocked(t, time.Now())
}

// releaseLocked drops a hold on t; the last one puts t.data on the free
// list, unless the list is full or the buffer would exceed maxBytes.
func (rc *retainCache) releaseLocked(t *retained, now time.Time) {
	if t.refs--; t.refs > 0 || t.data == nil {
		return
	}
	b := t.data[:0]
	t.data = nil
	if len(rc.free) >= maxFree || int64(cap(b)) > rc.maxBytes {
		return
	}
	rc.free = append(rc.free, freeBuf{b: b, at: now})
}

// buffer returns an empty buffer of capacity at least n from the free
// list, or nil if none is large enough. It takes the smallest that is, and
// none more than twice n (which would waste memory for as long as it is
// retained).
func (rc *retainCache) buffer(n int) []byte {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	best := -1
	for i, f := range rc.free {
		if c := cap(f.b); c >= n && c <= 2*n && (best < 0 || c < cap(rc.free[best].b)) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	b := rc.free[best].b
	rc.free = append(rc.free[:best], rc.free[best+1:]...)
	return b
}

// recycle puts b, an encode buffer that was never retained (its message
// went out whole, or not at all), on the free list.
func (rc *retainCache) recycle(b []byte) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.releaseLocked(&retained{data: b, refs: 1}, time.Now())
}

// retainedBytes returns the number of transfers kept and their bytes.
func (rc *retainCache) retainedBytes() (int, int64) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.order), rc.bytes
}

// expire drops retained transfers and free buffers older than ttl.
func (rc *retainCache) expire(now time.Time) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for len(rc.order) > 0 && now.Sub(rc.order[0].at) >= rc.ttl {
		rc.removeLocked(0)
	}
	rc.free = slices.DeleteFunc(rc.free, func(f freeBuf) bool { return now.Sub(f.at) >= rc.ttl })
}
