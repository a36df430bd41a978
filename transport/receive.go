package transport

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"
)

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
