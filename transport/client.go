package transport

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
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
	// DeliveredMsgs and DeliveredBytes count what the embedded server
	// this client owns (if any) has delivered to its clients: every
	// subscriber's copy of every message, in bytes as encoded on the wire
	// (Server.Delivered). They are the traffic of the whole run through
	// that server, every client's.
	DeliveredMsgs, DeliveredBytes uint64
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
		st.DeliveredMsgs, st.DeliveredBytes = c.server.Delivered()
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
