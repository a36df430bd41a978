// Package transporttest is the conformance suite every transport.Conn
// implementation runs: the NATS client against an embedded server on a
// random port, and the client over the in-memory fake.
//
//	func TestConformance(t *testing.T) {
//		transporttest.Run(t, func(t *testing.T, cfg transport.ClientConfig, n int) transporttest.Harness {
//			... start n Conns of cfg on one bus ...
//		})
//	}
package transporttest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/pki"
	"github.com/dpcluster/dpcluster/transport"
)

// Harness is n connections on one message bus, as made by a Factory.
type Harness struct {
	// Conns are the connections, all built with the ClientConfig given to
	// the Factory.
	Conns []transport.Conn
	// Inject publishes raw bytes on subject, bypassing the codec, so the
	// suite can send malformed frames. MaxPayload is the bus's limit.
	Inject     func(subject string, data []byte) error
	MaxPayload int
	// Close closes every connection and anything the factory started (a
	// server, a raw injector). It must be idempotent.
	Close func()
}

// Factory builds a Harness of n connections using cfg. It should also
// register Close with t.Cleanup.
type Factory func(t *testing.T, cfg transport.ClientConfig, n int) Harness

// Run runs the conformance suite.
func Run(t *testing.T, newHarness Factory) {
	t.Run("RoundTripEveryType", func(t *testing.T) { testRoundTrip(t, newHarness) })
	t.Run("LargeBroadcast", func(t *testing.T) { testLargeBroadcast(t, newHarness) })
	t.Run("ManyLargeContributions", func(t *testing.T) { testManyContributions(t, newHarness) })
	t.Run("OrderFromOnePublisher", func(t *testing.T) { testOrder(t, newHarness) })
	t.Run("MalformedFrames", func(t *testing.T) { testMalformed(t, newHarness) })
	t.Run("ChunkFaults", func(t *testing.T) { testChunkFaults(t, newHarness) })
	t.Run("WrongSender", func(t *testing.T) { testWrongSender(t, newHarness) })
	t.Run("NackRecovery", func(t *testing.T) { testNackRecovery(t, newHarness) })
	t.Run("PublishErrors", func(t *testing.T) { testPublishErrors(t, newHarness) })
	t.Run("UnsubscribeAndClose", func(t *testing.T) { testUnsubscribe(t, newHarness) })
	t.Run("NoGoroutineLeak", func(t *testing.T) { testNoLeak(t, newHarness) })
}

// Config returns the ClientConfig the suite uses: run "conf", short NACK and
// transfer timeouts, OnError unset.
func Config() transport.ClientConfig {
	cfg := transport.DefaultClientConfig()
	cfg.Run = "conf"
	cfg.NackAfter = 50 * time.Millisecond
	cfg.TransferTimeout = 400 * time.Millisecond
	cfg.RetainFor = 2 * time.Second
	cfg.MaxMessageBytes = 64 << 20
	cfg.MaxReassemblyBytes = 256 << 20
	return cfg
}

// errorLog collects OnError calls.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorLog) add(err error) {
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
}

func (l *errorLog) count(target error) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.errs {
		if errors.Is(e, target) {
			n++
		}
	}
	return n
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// collector is a Handler that records messages.
type collector struct {
	mu   sync.Mutex
	msgs []transport.Message
}

func (c *collector) handle(m transport.Message) {
	c.mu.Lock()
	c.msgs = append(c.msgs, m)
	c.mu.Unlock()
}

func (c *collector) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

func (c *collector) all() []transport.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]transport.Message(nil), c.msgs...)
}

func subscribe(t *testing.T, c transport.Conn, topic transport.Topic) *collector {
	t.Helper()
	col := &collector{}
	if _, err := c.Subscribe(topic, col.handle); err != nil {
		t.Fatalf("Subscribe(%v): %v", topic, err)
	}
	return col
}

// vector returns n seeded float32 values, with ±0, subnormals, and extremes
// at the start so bit patterns are checked.
func vector(seed uint64, n int) transport.Vector {
	r := rand.New(rand.NewPCG(seed, 7))
	v := make(transport.Vector, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	special := []float32{0, float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, math.MaxFloat32, -1}
	copy(v, special[:min(len(special), n)])
	return v
}

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// Samples returns one message of every public type for run, with tensors of
// n floats where the type carries one.
func Samples(run string, n int) []transport.Message {
	return []transport.Message{
		transport.Join{Run: run, NodeID: "node-1", ShardSize: 60000, ModelHash: "sha256:ab12"},
		transport.Leave{Run: run, NodeID: "node-1", Reason: "shutdown"},
		transport.Heartbeat{Run: run, NodeID: "node-1", ShardSize: 60000, ModelHash: "sha256:ab12", Step: 41},
		transport.RoundStart{Run: run, Step: 42, RoundID: 0xdeadbeefcafe, Term: 3, Leader: "coord-a",
			ParamsVersion: 41, Deadline: 1_700_000_000_123_456_789, SampleRate: 0.004, ClipNorm: 1.5},
		transport.RoundStart{Run: run, Step: 43, RoundID: 1, Term: 3, Leader: "coord-a", ParamsVersion: 42, Params: vector(3, n)},
		transport.Contribution{Run: run, Step: 42, RoundID: 0xdeadbeefcafe, NodeID: "node-1", Count: 17, Sum: vector(1, n)},
		transport.Params{Run: run, Step: 42, Version: 42, Term: 3, Values: vector(2, n)},
		transport.Leader{Run: run, ReplicaID: "coord-a", Term: 3, Step: 41},
		transport.Status{Run: run, From: "coord-a", Node: "node-1", Step: 42, Code: transport.StatusRejected, Detail: "norm_bound"},
	}
}

func testRoundTrip(t *testing.T, newHarness Factory) {
	cfg := Config()
	h := newHarness(t, cfg, 2)
	defer h.Close()
	want := Samples(cfg.Run, 1000)
	cols := map[transport.Topic]*collector{}
	for _, m := range want {
		if cols[m.Type().Topic()] == nil {
			cols[m.Type().Topic()] = subscribe(t, h.Conns[1], m.Type().Topic())
		}
	}
	ctx := context.Background()
	for _, m := range want {
		if err := h.Conns[0].Publish(ctx, m); err != nil {
			t.Fatalf("Publish(%v): %v", m.Type(), err)
		}
	}
	waitFor(t, "all messages", func() bool {
		n := 0
		for _, c := range cols {
			n += c.len()
		}
		return n == len(want)
	})
	for _, m := range want {
		found := false
		for _, got := range cols[m.Type().Topic()].all() {
			if reflect.DeepEqual(got, m) {
				found = true
			}
		}
		if !found {
			t.Errorf("%v %+v not received intact", m.Type(), m)
		}
	}
}

func testLargeBroadcast(t *testing.T, newHarness Factory) {
	cfg := Config()
	h := newHarness(t, cfg, 4)
	defer h.Close()
	n := 3*h.MaxPayload/4 + 1000 // about 3 chunks
	want := transport.Params{Run: cfg.Run, Step: 7, Version: 7, Term: 1, Values: vector(9, n)}
	var cols []*collector
	for _, c := range h.Conns[1:] {
		cols = append(cols, subscribe(t, c, transport.TopicParams))
	}
	if err := h.Conns[0].Publish(context.Background(), want); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	for i, col := range cols {
		waitFor(t, fmt.Sprintf("params at subscriber %d", i+1), func() bool { return col.len() == 1 })
		got := col.all()[0].(transport.Params)
		if got.Step != want.Step || got.Version != want.Version || !sameBits(got.Values, want.Values) {
			t.Errorf("subscriber %d: params differ (len %d, want %d)", i+1, len(got.Values), len(want.Values))
		}
	}
}

func testManyContributions(t *testing.T, newHarness Factory) {
	cfg := Config()
	h := newHarness(t, cfg, 4)
	defer h.Close()
	col := subscribe(t, h.Conns[0], transport.TopicContributions)
	n := h.MaxPayload/2 + 12345 // two or three chunks each
	var wg sync.WaitGroup
	errs := make(chan error, len(h.Conns))
	for i, c := range h.Conns[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- c.Publish(context.Background(), transport.Contribution{
				Run: cfg.Run, Step: 1, NodeID: fmt.Sprintf("node-%d", i), Count: int64(i), Sum: vector(uint64(i), n)})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	waitFor(t, "contributions", func() bool { return col.len() == len(h.Conns)-1 })
	for _, m := range col.all() {
		c := m.(transport.Contribution)
		var i int
		if _, err := fmt.Sscanf(c.NodeID, "node-%d", &i); err != nil {
			t.Fatalf("node id %q", c.NodeID)
		}
		if c.Count != int64(i) || !sameBits(c.Sum, vector(uint64(i), n)) {
			t.Errorf("%s: contribution differs", c.NodeID)
		}
	}
}

func testOrder(t *testing.T, newHarness Factory) {
	cfg := Config()
	h := newHarness(t, cfg, 2)
	defer h.Close()
	col := subscribe(t, h.Conns[1], transport.TopicNodes)
	const n = 200
	for i := range n {
		if err := h.Conns[0].Publish(context.Background(), transport.Heartbeat{Run: cfg.Run, NodeID: "a", Step: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "heartbeats", func() bool { return col.len() == n })
	for i, m := range col.all() {
		if got := m.(transport.Heartbeat).Step; got != uint64(i) {
			t.Fatalf("message %d has step %d", i, got)
		}
	}
}

func testMalformed(t *testing.T, newHarness Factory) {
	cfg := Config()
	var log errorLog
	cfg.OnError = log.add
	h := newHarness(t, cfg, 2)
	defer h.Close()
	col := subscribe(t, h.Conns[1], transport.TopicNodes)
	subj, _ := transport.NewSubjects(cfg.Run)
	good, err := transport.Encode(transport.Join{Run: cfg.Run, NodeID: "n"})
	if err != nil {
		t.Fatal(err)
	}
	other, _ := transport.Encode(transport.Join{Run: "other", NodeID: "n"})
	status, _ := transport.Encode(transport.Status{Run: cfg.Run, From: "x"})
	badVersion := append([]byte{0x93, 0x02}, good[2:]...)
	unknownType := append([]byte{0x93, 0x01, 0x63}, good[3:]...)
	cases := []struct {
		name string
		data []byte
		want error
	}{
		{"bad version", badVersion, transport.ErrUnknownVersion},
		{"unknown type", unknownType, transport.ErrUnknownType},
		{"truncated", good[:len(good)-3], transport.ErrTruncated},
		{"empty", nil, transport.ErrTruncated},
		{"corrupt", []byte{0xc1, 0x00, 0x00}, transport.ErrCorrupt},
		{"trailing bytes", append(append([]byte(nil), good...), 0x00), transport.ErrCorrupt},
		{"wrong run", other, transport.ErrWrongRun},
		{"wrong topic", status, transport.ErrUnknownType},
	}
	nodeSubject, err := subj.Node(transport.TopicNodes, "n")
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range cases {
		if err := h.Inject(nodeSubject, tc.data); err != nil {
			t.Fatalf("%s: inject: %v", tc.name, err)
		}
		waitFor(t, tc.name+" error", func() bool { return log.count(tc.want) >= 1 })
		// The subscription still works.
		id := strings.ReplaceAll(tc.name, " ", "-")
		if err := h.Conns[0].Publish(context.Background(), transport.Join{Run: cfg.Run, NodeID: id}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "valid message after "+tc.name, func() bool { return col.len() == i+1 })
		if got := col.all()[i].(transport.Join).NodeID; got != id {
			t.Errorf("after %s: got node %q, want %q", tc.name, got, id)
		}
		log.mu.Lock()
		log.errs = nil
		log.mu.Unlock()
	}
}

// testWrongSender: a Join, Heartbeat, NeedParams, Leave or Contribution
// (whole or chunked) naming node n-0 but published on node n-1's subject
// is dropped and reported as ErrWrongSender; so is a chunk of a transfer
// begun on another node's subject (ErrCorrupt), and a resent chunk of a
// transfer never begun (ErrCorrupt). The same messages on their own node's
// subject are delivered, and Publish puts each on its node's subject.
func testWrongSender(t *testing.T, newHarness Factory) {
	cfg := Config()
	var log errorLog
	cfg.OnError = log.add
	h := newHarness(t, cfg, 2)
	defer h.Close()
	subj, _ := transport.NewSubjects(cfg.Run)
	nodes := subscribe(t, h.Conns[1], transport.TopicNodes)
	contribs := subscribe(t, h.Conns[1], transport.TopicContributions)
	on := func(topic transport.Topic, id string) string {
		t.Helper()
		s, err := subj.Node(topic, id)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	inject := func(subject string, frames ...[]byte) {
		t.Helper()
		for _, f := range frames {
			if err := h.Inject(subject, f); err != nil {
				t.Fatal(err)
			}
		}
	}
	big := transport.Contribution{Run: cfg.Run, Step: 1, RoundID: 7, NodeID: "n-0", Count: 3, Sum: vector(5, h.MaxPayload/2)}
	split := func(m transport.Message, xfer uint64) [][]byte {
		t.Helper()
		fr, err := transport.SplitFrames(m, transport.ClientID(pki.RoleNode, "n-1", "00000000000000bb"), xfer, h.MaxPayload/4)
		if err != nil || len(fr) < 3 {
			t.Fatalf("SplitFrames: %d frames, %v", len(fr), err)
		}
		return fr
	}

	// Forged: n-0's messages on n-1's subjects.
	forged := 0
	for _, m := range []transport.Message{
		transport.Join{Run: cfg.Run, NodeID: "n-0", ShardSize: 10},
		transport.Heartbeat{Run: cfg.Run, NodeID: "n-0", Step: 1},
		transport.NeedParams{Run: cfg.Run, NodeID: "n-0", Version: 1},
		transport.Leave{Run: cfg.Run, NodeID: "n-0"},
		transport.Contribution{Run: cfg.Run, Step: 1, RoundID: 7, NodeID: "n-0", Count: 1, Sum: transport.Vector{1}},
	} {
		data, err := transport.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		inject(on(m.Type().Topic(), "n-1"), data)
		forged++
		waitFor(t, fmt.Sprintf("%v in another's name refused", m.Type()), func() bool { return log.count(transport.ErrWrongSender) == forged })
	}
	inject(on(transport.TopicContributions, "n-1"), split(big, 1)...)
	forged++
	waitFor(t, "chunked contribution in another's name refused", func() bool { return log.count(transport.ErrWrongSender) == forged })
	// One transfer, its chunks on n-0's subject and then on n-1's: the
	// transfer stays n-0's, the other chunks are refused.
	fr := split(big, 2)
	inject(on(transport.TopicContributions, "n-0"), fr[0])
	inject(on(transport.TopicContributions, "n-1"), fr[1:]...)
	waitFor(t, "chunks on another node's subject refused", func() bool { return log.count(transport.ErrCorrupt) == len(fr)-1 })
	// A resent chunk of a transfer the receiver never saw: refused.
	if rcv, ok := h.Conns[1].(interface{ ID() string }); ok {
		inject(subj.Inbox(rcv.ID()), split(big, 3)[0])
		waitFor(t, "resent chunk of an unknown transfer refused", func() bool { return log.count(transport.ErrCorrupt) == len(fr) })
	}
	if st, ok := h.Conns[1].(interface{ Stats() transport.Stats }); ok {
		if got := st.Stats().WrongSender; got != uint64(forged) {
			t.Errorf("Stats().WrongSender = %d, want %d", got, forged)
		}
	}

	// Honest: the same messages, published by their node, are delivered,
	// and arrive after the forged ones (which therefore were dropped).
	ctx := context.Background()
	if err := h.Conns[0].Publish(ctx, transport.Join{Run: cfg.Run, NodeID: "n-0", ShardSize: 10}); err != nil {
		t.Fatal(err)
	}
	if err := h.Conns[0].Publish(ctx, big); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "n-0's own messages", func() bool { return nodes.len() == 1 && contribs.len() == 1 })
	if got := contribs.all()[0].(transport.Contribution); got.NodeID != "n-0" || !sameBits(got.Sum, big.Sum) {
		t.Errorf("n-0's contribution: node %q, sum intact %v", got.NodeID, sameBits(got.Sum, big.Sum))
	}
	if err := h.Conns[0].Publish(ctx, transport.Join{Run: cfg.Run, NodeID: "n.*"}); !errors.Is(err, transport.ErrWrongSender) {
		t.Errorf("Publish of a Join naming node %q: %v, want ErrWrongSender", "n.*", err)
	}
}

func testChunkFaults(t *testing.T, newHarness Factory) {
	cfg := Config()
	var log errorLog
	cfg.OnError = log.add
	h := newHarness(t, cfg, 2)
	defer h.Close()
	col := subscribe(t, h.Conns[1], transport.TopicParams)
	subj, _ := transport.NewSubjects(cfg.Run)
	params := func(v uint64) transport.Params {
		return transport.Params{Run: cfg.Run, Step: v, Version: v, Values: vector(v, h.MaxPayload/3)}
	}
	inject := func(frames ...[]byte) {
		t.Helper()
		for _, f := range frames {
			if err := h.Inject(subj.Topic(transport.TopicParams), f); err != nil {
				t.Fatal(err)
			}
		}
	}
	split := func(m transport.Params, xfer uint64) [][]byte {
		t.Helper()
		fr, err := transport.SplitFrames(m, transport.ClientID(pki.RoleReplica, "injector", "00000000000000aa"), xfer, h.MaxPayload/2)
		if err != nil || len(fr) < 3 {
			t.Fatalf("SplitFrames: %d frames, %v", len(fr), err)
		}
		return fr
	}
	delivered := 0
	expectDelivered := func(what string, m transport.Params) {
		t.Helper()
		delivered++
		waitFor(t, what, func() bool { return col.len() >= delivered })
		got := col.all()[delivered-1].(transport.Params)
		if got.Version != m.Version || !sameBits(got.Values, m.Values) {
			t.Fatalf("%s: got version %d, want %d (or values differ)", what, got.Version, m.Version)
		}
	}

	// Reordered and duplicated chunks: delivered once, intact.
	m1 := params(1)
	fr := split(m1, 1)
	for i := len(fr) - 1; i >= 0; i-- {
		inject(fr[i], fr[i])
	}
	inject(fr[0])
	expectDelivered("reordered transfer", m1)

	// A corrupt chunk is rejected; the transfer then misses it and times
	// out (the fake sender "injector" cannot answer the NACK).
	m2 := params(2)
	fr = split(m2, 2)
	bad := append([]byte(nil), fr[1]...)
	bad[len(bad)-1] ^= 0x40
	inject(fr[0], bad)
	inject(fr[2:]...)
	waitFor(t, "corrupt chunk error", func() bool { return log.count(transport.ErrCorrupt) == 1 })
	waitFor(t, "incomplete transfer", func() bool { return log.count(transport.ErrIncomplete) == 1 })

	// A truncated chunk frame.
	m3 := params(3)
	fr = split(m3, 3)
	inject(fr[0][:len(fr[0])/2])
	waitFor(t, "truncated chunk", func() bool { return log.count(transport.ErrTruncated) == 1 })
	// The rest, with the chunk resent whole, completes.
	inject(fr...)
	expectDelivered("transfer after truncated chunk", m3)

	// A chunk inconsistent with its transfer (another message's chunk with
	// the same transfer number).
	m4, m5 := params(4), params(5)
	fr4, fr5 := split(m4, 4), split(m5, 4)
	inject(fr4[0], fr5[1])
	waitFor(t, "inconsistent chunk", func() bool { return log.count(transport.ErrCorrupt) == 2 })
	inject(fr4[1:]...)
	expectDelivered("transfer after inconsistent chunk", m4)

	// Missing chunk: times out and frees its memory.
	m6 := params(6)
	fr = split(m6, 6)
	inject(fr[:len(fr)-1]...)
	waitFor(t, "missing chunk timeout", func() bool { return log.count(transport.ErrIncomplete) == 2 })

	// Everything still works from a real sender.
	m7 := params(7)
	if err := h.Conns[0].Publish(context.Background(), m7); err != nil {
		t.Fatal(err)
	}
	expectDelivered("valid transfer afterwards", m7)
}

// testNackRecovery makes a receiver miss one chunk of a real sender's
// transfer: the receiver NACKs it and the sender resends it from its
// retransmit cache. The sender first publishes the message with nobody
// subscribed; the suite then replays its chunks (transfer 1 of the sender's
// ID, the first chunked transfer of a new Client) minus one.
func testNackRecovery(t *testing.T, newHarness Factory) {
	cfg := Config()
	h := newHarness(t, cfg, 2)
	defer h.Close()
	sender, ok := h.Conns[0].(interface{ ID() string })
	if !ok {
		t.Skip("Conn does not expose its client ID")
	}
	m := transport.Params{Run: cfg.Run, Step: 11, Version: 11, Values: vector(11, h.MaxPayload)} // 4 chunks
	if err := h.Conns[0].Publish(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	col := subscribe(t, h.Conns[1], transport.TopicParams)
	frames, err := transport.SplitFrames(m, sender.ID(), 1, h.MaxPayload)
	if err != nil || len(frames) < 3 {
		t.Fatalf("SplitFrames: %d frames, %v", len(frames), err)
	}
	subj, _ := transport.NewSubjects(cfg.Run)
	for i, f := range frames {
		if i == 1 {
			continue
		}
		if err := h.Inject(subj.Topic(transport.TopicParams), f); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "transfer completed by retransmission", func() bool { return col.len() == 1 })
	got := col.all()[0].(transport.Params)
	if got.Version != m.Version || !sameBits(got.Values, m.Values) {
		t.Fatal("recovered params differ")
	}
}

func testPublishErrors(t *testing.T, newHarness Factory) {
	cfg := Config()
	cfg.MaxMessageBytes = 1 << 20
	cfg.MaxReassemblyBytes = 1 << 20
	h := newHarness(t, cfg, 1)
	defer h.Close()
	ctx := context.Background()
	c := h.Conns[0]
	cases := []struct {
		name string
		m    transport.Message
		want error
	}{
		{"wrong run", transport.Join{Run: "other"}, transport.ErrWrongRun},
		{"nil", nil, transport.ErrUnknownType},
		{"too large", transport.Params{Run: cfg.Run, Values: make(transport.Vector, 1<<18+1)}, transport.ErrTooLarge},
	}
	for _, tc := range cases {
		if err := c.Publish(ctx, tc.m); !errors.Is(err, tc.want) {
			t.Errorf("%s: Publish error %v, want %v", tc.name, err, tc.want)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.Publish(cctx, transport.Join{Run: cfg.Run}); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled context: %v", err)
	}
	if _, err := c.Subscribe(transport.Topic(99), func(transport.Message) {}); err == nil {
		t.Error("Subscribe to unknown topic succeeded")
	}
}

func testUnsubscribe(t *testing.T, newHarness Factory) {
	cfg := Config()
	h := newHarness(t, cfg, 2)
	defer h.Close()
	ctx := context.Background()
	keep := subscribe(t, h.Conns[1], transport.TopicStatus)
	gone := &collector{}
	sub, err := h.Conns[1].Subscribe(transport.TopicStatus, gone.handle)
	if err != nil {
		t.Fatal(err)
	}
	pub := func(i int) {
		if err := h.Conns[0].Publish(ctx, transport.Status{Run: cfg.Run, Step: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	pub(0)
	waitFor(t, "first status", func() bool { return keep.len() == 1 && gone.len() == 1 })
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	pub(1)
	waitFor(t, "second status", func() bool { return keep.len() == 2 })
	if gone.len() != 1 {
		t.Errorf("unsubscribed handler got %d messages, want 1", gone.len())
	}
	if err := h.Conns[0].Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := h.Conns[0].Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := h.Conns[0].Publish(ctx, transport.Status{Run: cfg.Run}); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Publish after Close: %v, want ErrClosed", err)
	}
	if _, err := h.Conns[0].Subscribe(transport.TopicStatus, func(transport.Message) {}); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Subscribe after Close: %v, want ErrClosed", err)
	}
}

func testNoLeak(t *testing.T, newHarness Factory) {
	before := runtime.NumGoroutine()
	cfg := Config()
	h := newHarness(t, cfg, 3)
	col := subscribe(t, h.Conns[1], transport.TopicParams)
	subscribe(t, h.Conns[2], transport.TopicNodes)
	if err := h.Conns[0].Publish(context.Background(), transport.Params{Run: cfg.Run, Values: vector(1, h.MaxPayload/2)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "params", func() bool { return col.len() == 1 })
	h.Close()
	h.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= before {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after Close, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}
