package transport_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/dpcluster/dpcluster/pki"
	"github.com/dpcluster/dpcluster/transport"
	"github.com/dpcluster/dpcluster/transport/fake"
)

type inbox struct {
	mu   sync.Mutex
	msgs []transport.Message
}

func (b *inbox) add(m transport.Message) { b.mu.Lock(); b.msgs = append(b.msgs, m); b.mu.Unlock() }
func (b *inbox) n() int                  { b.mu.Lock(); defer b.mu.Unlock(); return len(b.msgs) }

func waitUntil(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func fakeConfig() transport.ClientConfig {
	cfg := transport.DefaultClientConfig()
	cfg.Run = "fake"
	cfg.NackAfter = 20 * time.Millisecond
	cfg.MaxNacks = 100
	cfg.TransferTimeout = 10 * time.Second
	cfg.RetainFor = 10 * time.Second
	return cfg
}

func paramsOf(run string, v uint64, n int) transport.Params {
	vals := make(transport.Vector, n)
	for i := range vals {
		vals[i] = float32(math.Sin(float64(i) + float64(v)))
	}
	return transport.Params{Run: run, Step: v, Version: v, Values: vals}
}

func checkParams(t *testing.T, got transport.Message, want transport.Params) {
	t.Helper()
	p := got.(transport.Params)
	if p.Version != want.Version || len(p.Values) != len(want.Values) {
		t.Fatalf("got version %d len %d, want %d len %d", p.Version, len(p.Values), want.Version, len(want.Values))
	}
	for i := range p.Values {
		if math.Float32bits(p.Values[i]) != math.Float32bits(want.Values[i]) {
			t.Fatalf("version %d: value %d differs", p.Version, i)
		}
	}
}

// Broadcast through drops, duplicates, reordering, delay and bit flips:
// every receiver gets every message intact, thanks to NACK retransmission.
func TestFakeFaultsRecoveredByNack(t *testing.T) {
	net := fake.NewNetwork(42, fake.Options{MaxPayload: 32 << 10})
	cfg := fakeConfig()
	// Four θ versions in flight on one subject at once, each to be
	// recovered: the sender must keep them all (the protocol itself keeps
	// only the latest per subject, ClientConfig.RetainPerSubject).
	cfg.RetainPerSubject = 4
	var corruptErrs atomic.Int64
	cfg.OnError = func(err error) {
		if errors.Is(err, transport.ErrCorrupt) {
			corruptErrs.Add(1)
		}
	}
	sender, err := transport.NewClient(net.Link("coord"), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Close()
	var boxes []*inbox
	var receivers []*transport.Client
	for i := range 3 {
		c, err := transport.NewClient(net.Link(fmt.Sprintf("node-%d", i)), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		b := &inbox{}
		if _, err := c.Subscribe(transport.TopicParams, b.add); err != nil {
			t.Fatal(err)
		}
		boxes = append(boxes, b)
		receivers = append(receivers, c)
	}
	net.SetFaults(fake.Faults{Drop: 0.1, Duplicate: 0.1, Reorder: 0.2, Corrupt: 0.02, Delay: time.Millisecond})
	const msgs, n = 4, 100_000 // 400 kB each: 13 chunks
	var want []transport.Params
	for v := range msgs {
		p := paramsOf(cfg.Run, uint64(v+1), n)
		want = append(want, p)
		if err := sender.Publish(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	for i, b := range boxes {
		waitUntil(t, fmt.Sprintf("receiver %d", i), 20*time.Second, func() bool { return b.n() >= msgs })
	}
	net.SetFaults(fake.Faults{})
	for i, b := range boxes {
		b.mu.Lock()
		got := append([]transport.Message(nil), b.msgs...)
		b.mu.Unlock()
		if len(got) != msgs {
			t.Fatalf("receiver %d got %d messages, want %d", i, len(got), msgs)
		}
		seen := map[uint64]bool{}
		for _, m := range got {
			v := m.(transport.Params).Version
			if seen[v] {
				t.Fatalf("receiver %d got version %d twice", i, v)
			}
			seen[v] = true
			checkParams(t, m, want[v-1])
		}
	}
	st := net.Stats()
	if st.Dropped == 0 || st.Duplicated == 0 || st.Reordered == 0 || st.Corrupted == 0 {
		t.Errorf("faults not exercised: %+v", st)
	}
	var nacks, dups uint64
	for _, r := range receivers {
		nacks += r.Stats().NacksSent
		dups += r.Stats().DuplicateChunks
	}
	if nacks == 0 || sender.Stats().Retransmitted == 0 || dups == 0 {
		t.Errorf("recovery not exercised: nacks %d, retransmitted %d, duplicate chunks %d", nacks, sender.Stats().Retransmitted, dups)
	}
	// Bit flips are caught by the chunk CRC32C (a flip in a chunk's
	// header can at worst start a bogus transfer that times out).
	if corruptErrs.Load() == 0 {
		t.Error("no corrupt chunk detected")
	}
}

// A receiver whose queue overflows (like a NATS slow consumer) loses chunks
// and recovers them by NACK.
func TestFakeSlowConsumerRecovers(t *testing.T) {
	net := fake.NewNetwork(7, fake.Options{MaxPayload: 16 << 10})
	cfg := fakeConfig()
	sender, _ := transport.NewClient(net.Link("coord"), cfg, nil)
	defer sender.Close()
	rcfg := cfg
	rcfg.QueueLen = 1
	recv, _ := transport.NewClient(net.Link("node"), rcfg, nil)
	defer recv.Close()
	b := &inbox{}
	release := make(chan struct{})
	if _, err := recv.Subscribe(transport.TopicParams, func(m transport.Message) {
		<-release
		b.add(m)
	}); err != nil {
		t.Fatal(err)
	}
	net.SetFaults(fake.Faults{QueueLimit: 8})
	ctx := context.Background()
	// Three small messages stall the receiver: one in the handler, one in
	// its queue, one blocking the link's delivery goroutine. The chunks
	// behind them overflow the link's queue.
	for v := range 3 {
		if err := sender.Publish(ctx, paramsOf(cfg.Run, uint64(v+1), 10)); err != nil {
			t.Fatal(err)
		}
	}
	want := paramsOf(cfg.Run, 4, 200_000) // 800 kB: 50 chunks
	if err := sender.Publish(ctx, want); err != nil {
		t.Fatal(err)
	}
	close(release)
	waitUntil(t, "params", 20*time.Second, func() bool { return b.n() == 4 })
	checkParams(t, b.msgs[3], want)
	if net.Stats().Overflowed == 0 || recv.Stats().NacksSent == 0 || sender.Stats().Retransmitted == 0 {
		t.Errorf("no overflow/NACK: %+v %+v", net.Stats(), recv.Stats())
	}
}

// A partitioned receiver gets nothing; after Heal it gets new messages.
func TestFakePartition(t *testing.T) {
	net := fake.NewNetwork(1, fake.Options{})
	cfg := fakeConfig()
	coord, _ := transport.NewClient(net.Link("coord"), cfg, nil)
	defer coord.Close()
	other, _ := transport.NewClient(net.Link("other"), cfg, nil)
	defer other.Close()
	node, _ := transport.NewClient(net.Link("node"), cfg, nil)
	defer node.Close()
	b := &inbox{}
	if _, err := node.Subscribe(transport.TopicStatus, b.add); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	net.Partition("coord", "node")
	if err := coord.Publish(ctx, transport.Status{Run: cfg.Run, From: "coord"}); err != nil {
		t.Fatal(err)
	}
	// A later message from an unpartitioned sender arrives; the
	// partitioned one, queued before it if at all, did not.
	if err := other.Publish(ctx, transport.Status{Run: cfg.Run, From: "other"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "other's status", 5*time.Second, func() bool { return b.n() == 1 })
	if from := b.msgs[0].(transport.Status).From; from != "other" {
		t.Fatalf("got status from %q through a partition", from)
	}
	net.Heal()
	if err := coord.Publish(ctx, transport.Status{Run: cfg.Run, From: "coord"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "coord's status after heal", 5*time.Second, func() bool { return b.n() == 2 })
	if net.Stats().Partitioned != 1 {
		t.Errorf("Partitioned = %d, want 1", net.Stats().Partitioned)
	}
}

// A filter drops one chunk deterministically the first time; the receiver
// NACKs it and gets it from the sender's retransmit cache.
func TestFakeFilterDropsOneChunk(t *testing.T) {
	net := fake.NewNetwork(1, fake.Options{MaxPayload: 8 << 10})
	cfg := fakeConfig()
	var mu sync.Mutex
	dropped := 0
	net.SetFaults(fake.Faults{Filter: func(from, subject string, data []byte) bool {
		mu.Lock()
		defer mu.Unlock()
		if from == "coord" && subject == "dpc.fake.params" && dropped < 3 {
			dropped++
			return dropped != 3 // drop the third chunk on the params subject
		}
		return true
	}})
	coord, _ := transport.NewClient(net.Link("coord"), cfg, nil)
	defer coord.Close()
	node, _ := transport.NewClient(net.Link("node"), cfg, nil)
	defer node.Close()
	b := &inbox{}
	if _, err := node.Subscribe(transport.TopicParams, b.add); err != nil {
		t.Fatal(err)
	}
	want := paramsOf(cfg.Run, 3, 10_000)
	if err := coord.Publish(context.Background(), want); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "params", 5*time.Second, func() bool { return b.n() == 1 })
	checkParams(t, b.msgs[0], want)
	if got := coord.Stats().Retransmitted; got != 1 {
		t.Errorf("Retransmitted = %d, want 1", got)
	}
}

// A NACK listing one chunk many times gets it resent once.
func TestNackIsNotAnAmplifier(t *testing.T) {
	net := fake.NewNetwork(1, fake.Options{MaxPayload: 8 << 10})
	cfg := fakeConfig()
	coord, _ := transport.NewClient(net.Link("coord"), cfg, nil)
	defer coord.Close()
	if err := coord.Publish(context.Background(), paramsOf(cfg.Run, 1, 10_000)); err != nil {
		t.Fatal(err)
	}
	rcv := transport.ClientID(pki.RoleNode, "evil", "0123456789abcdef")
	missing := make([]uint32, 1000)
	for i := range missing {
		missing[i] = 2
	}
	frame, err := msgpack.Marshal([]any{1, 17, map[string]any{"rcv": rcv, "xfer": 1, "missing": missing}})
	if err != nil {
		t.Fatal(err)
	}
	inj := net.Link("evil")
	defer inj.Close()
	if err := inj.Publish(coord.Subjects().Nack(coord.ID(), rcv), frame); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "nack served", 5*time.Second, func() bool { return coord.Stats().NacksServed == 1 })
	if got := coord.Stats().Retransmitted; got != 1 {
		t.Errorf("Retransmitted = %d, want 1", got)
	}
}

// TestRetentionBoundedOverRounds: over many rounds, a sender keeps for
// retransmission one chunked message per subject it publishes on (the
// latest), not every message of the last RetainFor: a node's retained
// bytes are one contribution, the leader's one RoundStart and one Params,
// whatever the number of rounds. Before RetainPerSubject the sender kept
// all 40 messages of this test (up to RetainBytes, 1 GiB). A NACK for the
// latest message is still answered.
func TestRetentionBoundedOverRounds(t *testing.T) {
	net := fake.NewNetwork(7, fake.Options{MaxPayload: 16 << 10})
	cfg := fakeConfig()
	leaderCfg, nodeCfg := cfg, cfg
	leaderCfg.Role, leaderCfg.Name = pki.RoleReplica, "r0"
	nodeCfg.Role, nodeCfg.Name = pki.RoleNode, "n0"
	leader, node := twoClients(t, net, "leader", leaderCfg, "node", nodeCfg)
	var got inbox
	if _, err := leader.Subscribe(transport.TopicContributions, got.add); err != nil {
		t.Fatal(err)
	}
	const dim, rounds = 20000, 20 // 80 kB tensors: 5 or more chunks each
	ctx := context.Background()
	var lastParams, lastContrib int64
	for step := uint64(1); step <= rounds; step++ {
		p := paramsOf("fake", step, dim)
		if err := leader.Publish(ctx, transport.RoundStart{Run: "fake", Step: step, RoundID: step, Deadline: 1,
			SampleRate: 0.5, ClipNorm: 1, Params: p.Values}); err != nil {
			t.Fatal(err)
		}
		if err := leader.Publish(ctx, p); err != nil {
			t.Fatal(err)
		}
		c := transport.Contribution{Run: "fake", Step: step, RoundID: step, NodeID: "n0", Count: 1, Sum: p.Values}
		if err := node.Publish(ctx, c); err != nil {
			t.Fatal(err)
		}
		pe, _ := transport.Encode(p)
		ce, _ := transport.Encode(c)
		lastParams, lastContrib = int64(len(pe)), int64(len(ce))
	}
	waitUntil(t, "every contribution", 10*time.Second, func() bool { return got.n() == rounds })
	ls, ns := leader.Stats(), node.Stats()
	if ls.ChunkedSent != 2*rounds || ns.ChunkedSent != rounds {
		t.Fatalf("chunked sent: leader %d, node %d; want %d, %d", ls.ChunkedSent, ns.ChunkedSent, 2*rounds, rounds)
	}
	if ns.Retained != 1 || ns.RetainedBytes != lastContrib {
		t.Errorf("node retains %d messages, %d bytes; want 1, %d (its last contribution)", ns.Retained, ns.RetainedBytes, lastContrib)
	}
	// The RoundStart carries the same tensor as the Params, plus a few
	// scalar fields.
	if ls.Retained != 2 || ls.RetainedBytes < 2*lastParams || ls.RetainedBytes > 2*lastParams+256 {
		t.Errorf("leader retains %d messages, %d bytes; want 2 (one RoundStart, one Params), about %d",
			ls.Retained, ls.RetainedBytes, 2*lastParams)
	}
}

// A sender reuses the encode buffer of a message evicted from its retain
// cache (RetainPerSubject 1) for the next one, but only once no NACK
// answer still resends from it: with drops and duplicates forcing NACKs
// while new versions go out on the same subject, every version arrives
// intact and no chunk fails its CRC (run with -race, a reused buffer still
// being resent from would also show as a data race).
func TestRecycledBufferNotReusedWhileResent(t *testing.T) {
	net := fake.NewNetwork(11, fake.Options{MaxPayload: 16 << 10})
	cfg := fakeConfig()
	var corruptErrs atomic.Int64
	cfg.OnError = func(err error) {
		if errors.Is(err, transport.ErrCorrupt) {
			corruptErrs.Add(1)
		}
	}
	sender, err := transport.NewClient(net.Link("coord"), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Close()
	var boxes []*inbox
	for i := range 3 {
		c, err := transport.NewClient(net.Link(fmt.Sprintf("node-%d", i)), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		b := &inbox{}
		if _, err := c.Subscribe(transport.TopicParams, b.add); err != nil {
			t.Fatal(err)
		}
		boxes = append(boxes, b)
	}
	net.SetFaults(fake.Faults{Drop: 0.05, Duplicate: 0.1, Reorder: 0.2, Delay: time.Millisecond})
	const versions, n = 15, 30_000 // 120 kB each: 8 chunks
	var want []transport.Params
	for v := range versions {
		p := paramsOf(cfg.Run, uint64(v+1), n)
		want = append(want, p)
		if err := sender.Publish(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		for i, b := range boxes {
			waitUntil(t, fmt.Sprintf("receiver %d, version %d", i, v+1), 20*time.Second, func() bool { return b.n() > v })
		}
	}
	net.SetFaults(fake.Faults{})
	for _, b := range boxes {
		b.mu.Lock()
		for _, m := range b.msgs {
			checkParams(t, m, want[m.(transport.Params).Version-1])
		}
		b.mu.Unlock()
	}
	if sender.Stats().Retransmitted == 0 {
		t.Error("no chunk was resent")
	}
	if n := corruptErrs.Load(); n != 0 {
		t.Errorf("%d corrupt frames with no corruption injected", n)
	}
}

// A message whose size hint says it fits one frame but whose encoding
// does not (a long string) is chunked all the same, its chunks hashed
// after encoding.
func TestChunkedPastSizeHint(t *testing.T) {
	net := fake.NewNetwork(3, fake.Options{MaxPayload: 8 << 10})
	cfg := fakeConfig()
	sender, receiver := twoClients(t, net, "node", cfg, "coord", cfg)
	var got inbox
	if _, err := receiver.Subscribe(transport.TopicNodes, got.add); err != nil {
		t.Fatal(err)
	}
	want := transport.Join{Run: cfg.Run, NodeID: "n0", ShardSize: 1, ModelHash: strings.Repeat("h", 50_000)}
	if err := sender.Publish(context.Background(), want); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the join", 5*time.Second, func() bool { return got.n() == 1 })
	if st := sender.Stats(); st.ChunkedSent != 1 {
		t.Errorf("chunked sent %d, want 1", st.ChunkedSent)
	}
	got.mu.Lock()
	defer got.mu.Unlock()
	if j := got.msgs[0].(transport.Join); j.ModelHash != want.ModelHash {
		t.Errorf("model hash of %d bytes, want %d", len(j.ModelHash), len(want.ModelHash))
	}
}

// twoClients opens clients on net's links a and b, with configurations
// ca and cb, closed when the test ends.
func twoClients(t *testing.T, net *fake.Network, a string, ca transport.ClientConfig, b string, cb transport.ClientConfig) (*transport.Client, *transport.Client) {
	t.Helper()
	var out [2]*transport.Client
	for i, c := range []struct {
		link string
		cfg  transport.ClientConfig
	}{{a, ca}, {b, cb}} {
		cl, err := transport.NewClient(net.Link(c.link), c.cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		out[i] = cl
	}
	return out[0], out[1]
}
