package transport

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Conn is what coordinator and node code needs from the message bus:
// publish and subscribe typed messages. Messages carrying tensors (Params,
// Contribution, RoundStart with inline parameters) are sent whole when they
// fit the server's max payload and chunked otherwise; the receiver sees the
// reassembled message either way. *Client implements Conn over NATS
// (Connect) and over the in-memory fake (transport/fake).
type Conn interface {
	// Publish sends m on its topic. It returns once m has been handed to
	// the link (for chunked messages: once every chunk was flushed to the
	// server), not when it was received. It fails with ErrWrongRun,
	// ErrUnknownType, ErrTooLarge, ErrClosed or the context's error.
	Publish(ctx context.Context, m Message) error
	// Subscribe calls h with every message received on topic, one at a
	// time in arrival order, from a goroutine owned by the subscription.
	// Messages published after Subscribe returns reach it.
	Subscribe(topic Topic, h Handler) (Subscription, error)
	// Close stops all subscriptions and releases the connection.
	Close() error
}

// Handler receives a decoded message. The message and its slices are owned
// by the handler.
type Handler func(Message)

// Subscription is an active Subscribe.
type Subscription interface {
	// Unsubscribe stops delivery. A handler call in progress completes; no
	// call starts after Unsubscribe returns. It may be called from the
	// handler itself.
	Unsubscribe() error
}

// Link is the raw, best-effort message layer under a Client: core NATS or
// the in-memory fake. Messages may be lost; a Link never alters bytes it
// delivers (the fake may, to test that the codec notices).
type Link interface {
	// Publish sends data on subject. It must not retain data.
	Publish(subject string, data []byte) error
	// Subscribe calls fn with each message on subject, which may hold the
	// NATS wildcards * (one token) and > (the rest), one at a time, with
	// the subject it was published on; fn owns data. Messages published
	// after Subscribe returns reach fn. The returned function unsubscribes.
	// A subscription the server refuses (NATS permissions) is an error
	// wrapping ErrPermission where the link can tell.
	Subscribe(subject string, fn func(subject string, data []byte)) (unsubscribe func() error, err error)
	// Flush returns once the link has handed every published message on
	// (for NATS: the server has processed them).
	Flush(ctx context.Context) error
	// MaxPayload is the largest message the link carries.
	MaxPayload() int
	// Close releases the link.
	Close() error
}

// Stats counts a Client's traffic. Values never include message contents.
type Stats struct {
	Published       uint64 // messages published (whole or chunked)
	ChunkedSent     uint64 // of which chunked
	Received        uint64 // messages delivered to subscriptions' queues
	DecodeErrors    uint64 // frames rejected (reported to OnError)
	DuplicateChunks uint64
	NacksSent       uint64
	NacksServed     uint64 // NACKs answered with a retransmission
	Retransmitted   uint64 // chunks resent
	Incomplete      uint64 // transfers dropped after TransferTimeout
	WrongSender     uint64 // messages dropped for naming another node than their subject (ErrWrongSender)
	TooLarge        uint64 // transfers refused for announcing more than their sender may send (ErrTooLarge; also in DecodeErrors)
	// TLSRefused and PermissionRefused count what the embedded server this
	// client owns (if any) refused: client TLS handshakes, and publishes
	// or subscriptions its permissions do not allow.
	TLSRefused, PermissionRefused uint64
	// Retained and RetainedBytes are the sent chunked messages kept for
	// retransmission now, and their bytes (ClientConfig.RetainPerSubject).
	Retained      int
	RetainedBytes int64
}

// Client is the typed, chunking layer over a Link. It is safe for concurrent
// use. Construct it with Connect (NATS) or NewClient (any Link).
type Client struct {
	link     Link
	cfg      ClientConfig
	log      *slog.Logger
	id       string
	subjects Subjects
	reasm    *reassembler
	retain   *retainCache
	seq      atomic.Uint64
	onClose  []func()
	server   *Server // embedded server owned by this client, if any

	stats struct {
		published, chunked, received, decodeErrs, dups, nacksSent, nacksServed, retrans, incomplete, wrongSender, tooLarge atomic.Uint64
	}
	wrongSenderLog rateLimit
	tooLargeLog    rateLimit

	mu     sync.Mutex
	closed bool
	topics map[Topic]*topicSubs
	unsubs []func() error // internal link subscriptions

	stop chan struct{}
	wg   sync.WaitGroup
}

type topicSubs struct {
	unsubscribe func() error
	subs        []*subscription
}

// NewClient returns a Client over link. Its ID is ClientID(cfg.Role,
// cfg.Name, a random nonce), with "anon" for an empty role or name. It
// subscribes to its NACK and inbox subjects and starts one background
// goroutine (NACKs and timeouts), both stopped by Close. The Client owns
// link: Close closes it. A nil log discards.
func NewClient(link Link, cfg ClientConfig, log *slog.Logger) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if link.MaxPayload() <= chunkOverhead+64 {
		return nil, fmt.Errorf("%w: link max payload %d too small", ErrInvalidConfig, link.MaxPayload())
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	subjects, err := NewSubjects(cfg.Run)
	if err != nil {
		return nil, err
	}
	var rnd [nonceLen / 2]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("transport: client id: %w", err)
	}
	role, name := cfg.Role, cfg.Name
	if role == "" {
		role = anonymous
	}
	if name == "" {
		name = anonymous
	}
	id := ClientID(role, name, hex.EncodeToString(rnd[:]))
	c := &Client{
		link:     link,
		cfg:      cfg,
		log:      log.With("client", id, "run", cfg.Run),
		id:       id,
		subjects: subjects,
		reasm:    newReassembler(cfg.MaxMessageBytes, cfg.MaxReassemblyBytes),
		retain:   &retainCache{maxBytes: cfg.RetainBytes, ttl: cfg.RetainFor, perSubject: cfg.RetainPerSubject},
		topics:   make(map[Topic]*topicSubs),
		stop:     make(chan struct{}),
	}
	for _, s := range []struct {
		subject string
		fn      func(string, []byte)
	}{
		{subjects.nackPattern(id), c.onNackFrame},
		{subjects.Inbox(id), func(_ string, b []byte) { c.onFrame(0, "", b) }},
	} {
		u, err := link.Subscribe(s.subject, s.fn)
		if err != nil {
			for _, u := range c.unsubs {
				_ = u()
			}
			return nil, fmt.Errorf("transport: subscribe %s: %w", s.subject, err)
		}
		c.unsubs = append(c.unsubs, u)
	}
	c.wg.Add(1)
	go c.janitor()
	return c, nil
}

// ServerURL returns the client URL of the embedded server this Client
// started (Connect with no URLs), or "" if it did not start one.
func (c *Client) ServerURL() string {
	if c.server == nil {
		return ""
	}
	return c.server.URL()
}

// ID returns the client's unique ID, ROLE.ID.NONCE (see ClientID): its
// address in its NACK and inbox subjects.
func (c *Client) ID() string { return c.id }

// Name returns the client's ID token: ClientConfig.Name, or the ID of its
// certificate; "" for an anonymous client.
func (c *Client) Name() string { return c.cfg.Name }

// Subjects returns the client's subject scheme.
func (c *Client) Subjects() Subjects { return c.subjects }

// Stats returns a snapshot of the client's counters.
func (c *Client) Stats() Stats {
	s := &c.stats
	n, bytes := c.retain.retainedBytes()
	st := Stats{
		Retained: n, RetainedBytes: bytes,
		Published: s.published.Load(), ChunkedSent: s.chunked.Load(), Received: s.received.Load(),
		DecodeErrors: s.decodeErrs.Load(), DuplicateChunks: s.dups.Load(), NacksSent: s.nacksSent.Load(),
		NacksServed: s.nacksServed.Load(), Retransmitted: s.retrans.Load(), Incomplete: s.incomplete.Load(),
		WrongSender: s.wrongSender.Load(), TooLarge: s.tooLarge.Load(),
	}
	if c.server != nil {
		st.TLSRefused, st.PermissionRefused = c.server.Refused()
	}
	return st
}

// Publish implements Conn.
func (c *Client) Publish(ctx context.Context, m Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.isClosed() {
		return ErrClosed
	}
	if m == nil || m.Type().Topic() == 0 {
		return fmt.Errorf("%w: %T", ErrUnknownType, m)
	}
	if m.RunName() != c.cfg.Run {
		return fmt.Errorf("%w: %q, client run %q", ErrWrongRun, m.RunName(), c.cfg.Run)
	}
	data, crcs, err := c.encode(m)
	if err != nil {
		return err
	}
	if int64(len(data)) > c.cfg.MaxMessageBytes {
		c.recycle(data)
		return fmt.Errorf("%w: %v of %d bytes, limit %d", ErrTooLarge, m.Type(), len(data), c.cfg.MaxMessageBytes)
	}
	topic := m.Type().Topic()
	subject := c.subjects.Topic(topic)
	if topic.PerNode() {
		node, _ := Sender(m)
		if subject, err = c.subjects.Node(topic, node); err != nil {
			c.recycle(data)
			return err
		}
	}
	c.stats.published.Add(1)
	if len(data) <= c.link.MaxPayload() {
		err := c.link.Publish(subject, data) // the link does not retain data
		c.recycle(data)
		return err
	}
	c.stats.chunked.Add(1)
	if crcs == nil { // the size hint said it would fit one frame
		crcs = chunkCRCs(data, c.chunkSize())
	}
	return c.sendChunked(ctx, subject, topic, data, crcs)
}

// chunkSize is the data bytes of each chunk but the last.
func (c *Client) chunkSize() uint32 { return uint32(c.link.MaxPayload() - chunkOverhead) }

// encode returns m's encoding. A message too large for one frame is
// encoded into a buffer from the retain cache's free list if one fits
// (the client owns the result, and gives it back with recycle or, once
// chunked, through the retain cache), and comes with its chunks' CRC32Cs
// (chunkCRCs), computed as it is encoded.
func (c *Client) encode(m Message) ([]byte, []uint32, error) {
	if hint := sizeHint(m); hint > c.link.MaxPayload() {
		return encodeInto(c.retain.buffer(hint), m, int(c.chunkSize()))
	}
	data, err := Encode(m)
	return data, nil, err
}

// recycle hands an encode buffer that no one holds to the retain cache's
// free list, if it is large enough to be worth keeping.
func (c *Client) recycle(data []byte) {
	if cap(data) > c.link.MaxPayload() {
		c.retain.recycle(data)
	}
}

// sendChunked publishes data as chunks of at most MaxPayload bytes each,
// flushing every WindowBytes, and keeps data for retransmission. Data
// belongs to the client (from encode): the retain cache recycles it once
// neither the cache nor this call nor a NACK answer holds it. Crcs are its
// chunks' CRC32Cs (chunkCRCs(data, c.chunkSize())).
func (c *Client) sendChunked(ctx context.Context, subject string, topic Topic, data []byte, crcs []uint32) error {
	maxPayload := c.link.MaxPayload()
	size := c.chunkSize()
	total := (uint64(len(data)) + uint64(size) - 1) / uint64(size)
	if total > 1<<32-1 {
		return fmt.Errorf("%w: %d chunks", ErrTooLarge, total)
	}
	if uint64(len(crcs)) != total {
		return fmt.Errorf("transport: %d chunk CRCs for %d chunks", len(crcs), total) // a bug
	}
	t := newRetained(c.seq.Add(1), subject, topic, data, size, crcs)
	t.at, t.refs = time.Now(), 1 // held by this call
	c.retain.put(t)
	defer c.retain.release(t)
	buf := make([]byte, 0, maxPayload)
	window := 0
	for i := uint32(0); i < t.total; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		ch := t.chunk(c.id, i)
		buf = appendChunk(buf[:0], &ch)
		if err := c.link.Publish(subject, buf); err != nil {
			return fmt.Errorf("transport: chunk %d of %d: %w", i, t.total, err)
		}
		window += len(buf)
		if window >= c.cfg.WindowBytes {
			if err := c.link.Flush(ctx); err != nil {
				return fmt.Errorf("transport: flush: %w", err)
			}
			window = 0
		}
	}
	return c.link.Flush(ctx)
}

// Subscribe implements Conn.
func (c *Client) Subscribe(topic Topic, h Handler) (Subscription, error) {
	if !topic.valid() {
		return nil, fmt.Errorf("transport: subscribe: unknown topic %d", topic)
	}
	if h == nil {
		return nil, errors.New("transport: subscribe: nil handler")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	ts := c.topics[topic]
	if ts == nil {
		u, err := c.link.Subscribe(c.subjects.Pattern(topic), func(subject string, b []byte) { c.onFrame(topic, subject, b) })
		if err != nil {
			return nil, fmt.Errorf("transport: subscribe %v: %w", topic, err)
		}
		ts = &topicSubs{unsubscribe: u}
		c.topics[topic] = ts
	}
	s := &subscription{c: c, topic: topic, h: h, queue: make(chan Message, c.cfg.QueueLen), done: make(chan struct{})}
	ts.subs = append(ts.subs, s)
	c.wg.Add(1)
	go s.run()
	return s, nil
}

type subscription struct {
	c     *Client
	topic Topic
	h     Handler
	queue chan Message
	done  chan struct{}
	once  sync.Once
}

func (s *subscription) run() {
	defer s.c.wg.Done()
	for {
		select {
		case <-s.done:
			return
		case m := <-s.queue:
			select {
			case <-s.done:
				return
			default:
			}
			s.h(m)
		}
	}
}

// deliver queues m, blocking while the queue is full (back-pressure into the
// link's buffers) until the subscription or client stops.
func (s *subscription) deliver(m Message) {
	select {
	case s.queue <- m:
	case <-s.done:
	}
}

// Unsubscribe implements Subscription.
func (s *subscription) Unsubscribe() error {
	c := s.c
	c.mu.Lock()
	var err error
	if ts := c.topics[s.topic]; ts != nil {
		for i, x := range ts.subs {
			if x == s {
				ts.subs = append(ts.subs[:i:i], ts.subs[i+1:]...)
				break
			}
		}
		if len(ts.subs) == 0 {
			delete(c.topics, s.topic)
			err = ts.unsubscribe()
		}
	}
	c.mu.Unlock()
	s.once.Do(func() { close(s.done) })
	return err
}

// TopicLimiter is implemented by a Conn that can bound the size of the
// messages it accepts on a topic (Client.LimitTopic).
type TopicLimiter interface {
	LimitTopic(t Topic, maxBytes int64)
}

// LimitTopic bounds the encoded size of messages received on topic t to
// maxBytes (0: only MaxMessageBytes): a chunked transfer announcing more
// is refused at its first chunk, before anything is allocated for it. The
// coordinator sets it for contributions to ContributionMaxBytes of the
// run's model, so a node cannot make the replicas reserve more than its
// contribution's size.
func (c *Client) LimitTopic(t Topic, maxBytes int64) { c.reasm.limitTopic(t, maxBytes) }

// ContributionMaxBytes bounds the encoded size of a Contribution whose sum
// has dim values (run and node names of the longest allowed length, every
// number at its widest): what a node's contribution to a run of that
// model may take, for LimitTopic.
func ContributionMaxBytes(dim int) int64 {
	long := strings.Repeat("x", 64)
	b, err := Encode(Contribution{Run: long, NodeID: long, Step: math.MaxUint64, RoundID: math.MaxUint64, Count: math.MaxInt64,
		Sum: make(Vector, 1)})
	if err != nil { // cannot happen for this message
		panic(err)
	}
	// The sum's bytes grow by 4 per value; its bin header (≤ 5 bytes) and
	// alignment pad (≤ 3) by at most 8 over the one-value encoding's.
	return int64(len(b)) + 4*int64(max(dim-1, 0)) + 8
}

// onFrame handles a frame from subject, a topic's (topic ≠ 0), or from the
// client's inbox (topic = 0, retransmitted chunks only).
func (c *Client) onFrame(topic Topic, subject string, data []byte) {
	f, err := decodeFrame(data, true)
	if err != nil {
		c.reject(err)
		return
	}
	node := "" // whose subject it came on, for a per-node topic
	if topic.PerNode() {
		var ok bool
		if node, ok = c.subjects.nodeOf(topic, subject); !ok {
			c.reject(fmt.Errorf("%w: frame on subject %q", ErrWrongSender, subject))
			return
		}
	}
	switch {
	case f.typ == typeChunk:
		if topic != 0 && f.chunk.Topic != topic {
			c.reject(fmt.Errorf("%w: %v chunk on the %v subject", ErrCorrupt, f.chunk.Topic, topic))
			return
		}
		whole, node, err := c.reasm.add(&f.chunk, node, topic == 0, time.Now())
		if errors.Is(err, ErrDuplicateChunk) {
			c.stats.dups.Add(1)
			return
		}
		if errors.Is(err, ErrTooLarge) {
			// A sender asking for more than its share: counted, and
			// logged at most once a second (a flood must not flood logs).
			c.stats.tooLarge.Add(1)
			if warn, suppressed := c.tooLargeLog.allow(time.Now()); warn {
				c.log.Warn("transport: refused a transfer larger than its sender may send", "err", err, "suppressed_before", suppressed)
			}
		}
		if err != nil {
			c.reject(err)
			return
		}
		if whole == nil {
			return
		}
		m, err := decode(whole, true)
		if err != nil {
			c.reject(err)
			return
		}
		c.dispatch(f.chunk.Topic, node, m)
	case f.typ == typeNack || topic == 0:
		c.reject(fmt.Errorf("%w: %v frame on the %v subject", ErrUnknownType, f.typ, topic))
	default:
		c.dispatch(topic, node, f.msg)
	}
}

// dispatch checks that m belongs on topic and to the client's run, and,
// for a per-node topic, that it names the node whose subject it (or all
// its chunks) arrived on, and queues it for every subscription of topic.
// It is the one place where a message's sender is checked: with TLS the
// server lets only node ID publish on ID's subjects (Subjects.Permissions),
// so a node cannot speak for another.
func (c *Client) dispatch(topic Topic, node string, m Message) {
	if m.Type().Topic() != topic {
		c.reject(fmt.Errorf("%w: %v on the %v subject", ErrUnknownType, m.Type(), topic))
		return
	}
	if m.RunName() != c.cfg.Run {
		c.reject(fmt.Errorf("%w: %v for run %q", ErrWrongRun, m.Type(), m.RunName()))
		return
	}
	if sender, ok := Sender(m); ok && sender != node {
		c.wrongSender(fmt.Errorf("%w: %v naming node %q on node %q's subject", ErrWrongSender, m.Type(), sender, node))
		return
	}
	c.mu.Lock()
	var subs []*subscription
	if ts := c.topics[topic]; ts != nil {
		subs = append(subs, ts.subs...)
	}
	c.mu.Unlock()
	for _, s := range subs {
		c.stats.received.Add(1)
		s.deliver(m)
	}
}

func (c *Client) reject(err error) {
	if errors.Is(err, ErrIncomplete) {
		c.stats.incomplete.Add(1)
	} else {
		c.stats.decodeErrs.Add(1)
	}
	c.log.Debug("transport: frame rejected", "err", err)
	if c.cfg.OnError != nil {
		c.cfg.OnError(err)
	}
}

// wrongSender drops a message that names another node than its subject:
// it counts it (Stats.WrongSender), logs a warning (at most one a second,
// the rest at debug level and counted in the next warning) and reports
// err to OnError.
func (c *Client) wrongSender(err error) {
	c.stats.wrongSender.Add(1)
	if warn, suppressed := c.wrongSenderLog.allow(time.Now()); warn {
		c.log.Warn("transport: dropped a message sent in another node's name", "err", err, "suppressed_before", suppressed)
	} else {
		c.log.Debug("transport: dropped a message sent in another node's name", "err", err)
	}
	if c.cfg.OnError != nil {
		c.cfg.OnError(err)
	}
}

// rateLimit allows one event a second and counts the others.
type rateLimit struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// allow reports whether an event at now may be logged, and how many were
// suppressed since the last one that was.
func (r *rateLimit) allow(now time.Time) (ok bool, suppressed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.last.IsZero() && now.Sub(r.last) < time.Second {
		r.suppressed++
		return false, 0
	}
	suppressed, r.last, r.suppressed = r.suppressed, now, 0
	return true, suppressed
}

// onNackFrame answers a retransmit request by resending the missing chunks
// of a retained transfer to the requester's inbox: the inbox of the
// receiver that the NACK's subject names, which NATS permissions bind to
// the publisher's certificate (Subjects.Permissions). A NACK whose body
// names another receiver is rejected, and nothing is resent.
func (c *Client) onNackFrame(subject string, data []byte) {
	rcv, ok := c.subjects.nackReceiver(c.id, subject)
	if !ok {
		c.reject(fmt.Errorf("%w: nack on subject %q", ErrCorrupt, subject))
		return
	}
	f, err := decodeFrame(data, true)
	if err != nil {
		c.reject(err)
		return
	}
	if f.typ != typeNack {
		c.reject(fmt.Errorf("%w: %v frame on the nack subject", ErrUnknownType, f.typ))
		return
	}
	if f.nack.Receiver != rcv {
		c.reject(fmt.Errorf("%w: nack from %s names the inbox of %s", ErrCorrupt, rcv, f.nack.Receiver))
		return
	}
	t := c.retain.get(f.nack.Transfer)
	if t == nil {
		c.log.Debug("transport: nack for a transfer no longer retained", "transfer", f.nack.Transfer)
		return
	}
	defer c.retain.release(t)
	inbox := c.subjects.Inbox(rcv)
	buf := make([]byte, 0, c.link.MaxPayload())
	sent := make([]uint64, (t.total+63)/64) // each index at most once per NACK: no amplification
	for _, i := range f.nack.Missing {
		if i >= t.total || sent[i/64]&(1<<(i%64)) != 0 {
			continue
		}
		sent[i/64] |= 1 << (i % 64)
		ch := t.chunk(c.id, i)
		buf = appendChunk(buf[:0], &ch)
		if err := c.link.Publish(inbox, buf); err != nil {
			c.log.Debug("transport: retransmit failed", "err", err)
			return
		}
		c.stats.retrans.Add(1)
	}
	c.stats.nacksServed.Add(1) // after the resends: a reader of Stats sees them
}

// janitor sends NACKs for stalled transfers, drops timed-out ones and
// expires the retransmit cache, until Close.
func (c *Client) janitor() {
	defer c.wg.Done()
	tick := time.NewTicker(max(c.cfg.NackAfter/4, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-c.stop:
			return
		case now := <-tick.C:
			reqs, errs := c.reasm.scan(now, c.cfg.NackAfter, c.cfg.TransferTimeout, c.cfg.MaxNacks)
			for _, err := range errs {
				c.reject(err)
			}
			for _, r := range reqs {
				data, err := encodeNack(nack{Receiver: c.id, Transfer: r.id, Missing: r.missing})
				if err == nil {
					err = c.link.Publish(c.subjects.Nack(r.sender, c.id), data)
				}
				if err != nil {
					c.log.Debug("transport: nack failed", "err", err)
					continue
				}
				c.stats.nacksSent.Add(1)
			}
			c.retain.expire(now)
		}
	}
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Close implements Conn: it unsubscribes everything, waits for the client's
// goroutines (so no handler runs after Close returns, unless Close is called
// from a handler, which it must not be), closes the link and stops an owned
// embedded server. Close is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	var errs []error
	for _, u := range c.unsubs {
		errs = append(errs, u())
	}
	var subs []*subscription
	for t, ts := range c.topics {
		errs = append(errs, ts.unsubscribe())
		subs = append(subs, ts.subs...)
		delete(c.topics, t)
	}
	c.mu.Unlock()
	close(c.stop)
	for _, s := range subs {
		s.once.Do(func() { close(s.done) })
	}
	c.wg.Wait()
	errs = append(errs, c.link.Close())
	for _, f := range c.onClose {
		f()
	}
	return errors.Join(errs...)
}
