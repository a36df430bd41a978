package transport

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// testSender is the client ID of the chunks the tests make.
const testSender = "anon.s.0000000000000001"

// testFrames splits a Params of n floats into chunk frames of maxPayload.
func testFrames(t testing.TB, n, maxPayload int, transfer uint64) (Params, [][]byte) {
	t.Helper()
	v := make(Vector, n)
	for i := range v {
		v[i] = float32(i) * 0.5
	}
	m := Params{Run: "r", Step: 1, Version: transfer, Values: v}
	frames, err := SplitFrames(m, testSender, transfer, maxPayload)
	if err != nil {
		t.Fatal(err)
	}
	return m, frames
}

func mustChunk(t testing.TB, frame []byte) chunk {
	t.Helper()
	f, err := decodeFrame(frame, false)
	if err != nil || f.typ != typeChunk {
		t.Fatalf("decodeFrame: %v %v", f.typ, err)
	}
	return f.chunk
}

func TestReassembleAnyOrder(t *testing.T) {
	m, frames := testFrames(t, 3000, 1024, 1)
	want, _ := Encode(m)
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 20 {
		r := newReassembler(1<<20, 1<<20)
		order := rng.Perm(len(frames))
		if trial == 0 {
			for i := range order {
				order[i] = len(frames) - 1 - i
			}
		}
		var got []byte
		for k, i := range order {
			c := mustChunk(t, frames[i])
			whole, _, err := r.add(&c, "", false, time.Now())
			if err != nil {
				t.Fatalf("trial %d: add chunk %d: %v", trial, i, err)
			}
			if (whole != nil) != (k == len(order)-1) {
				t.Fatalf("trial %d: completion after %d of %d chunks", trial, k+1, len(order))
			}
			got = whole
			if k == 2 { // a duplicate mid-transfer
				if _, _, err := r.add(&c, "", false, time.Now()); !errors.Is(err, ErrDuplicateChunk) {
					t.Fatalf("duplicate: %v", err)
				}
			}
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("trial %d: reassembled bytes differ", trial)
		}
		// A late duplicate of a finished transfer does not restart it.
		c := mustChunk(t, frames[0])
		if _, _, err := r.add(&c, "", false, time.Now()); !errors.Is(err, ErrDuplicateChunk) {
			t.Fatalf("late duplicate: %v", err)
		}
		if n, b := r.inFlight(); n != 0 || b != 0 {
			t.Fatalf("in flight after completion: %d transfers, %d bytes", n, b)
		}
	}
}

func TestReassembleErrors(t *testing.T) {
	_, frames := testFrames(t, 3000, 1024, 1)
	_, other := testFrames(t, 3001, 1024, 1) // same sender and transfer number, other message
	now := time.Now()

	r := newReassembler(1<<20, 1<<20)
	c0, o1 := mustChunk(t, frames[0]), mustChunk(t, other[1])
	if _, _, err := r.add(&c0, "", false, now); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.add(&o1, "", false, now); !errors.Is(err, ErrCorrupt) {
		t.Errorf("inconsistent chunk: %v", err)
	}

	// Whole-message CRC mismatch: every chunk is self-consistent but the
	// announced whole CRC is wrong.
	r = newReassembler(1<<20, 1<<20)
	var err error
	for _, f := range frames {
		c := mustChunk(t, f)
		c.WholeCRC ^= 1
		_, _, err = r.add(&c, "", false, now)
	}
	if !errors.Is(err, ErrCorrupt) {
		t.Errorf("whole CRC mismatch: %v", err)
	}

	// Limits.
	r = newReassembler(1000, 1<<20)
	if _, _, err := r.add(&c0, "", false, now); !errors.Is(err, ErrTooLarge) {
		t.Errorf("message limit: %v", err)
	}
	r = newReassembler(1<<20, 20000)
	if _, _, err := r.add(&c0, "", false, now); err != nil {
		t.Fatal(err)
	}
	_, frames2 := testFrames(t, 3000, 1024, 2)
	c2 := mustChunk(t, frames2[0])
	if _, _, err := r.add(&c2, "", false, now); !errors.Is(err, ErrTooLarge) {
		t.Errorf("reassembly budget: %v", err)
	}
}

func TestScanNacksAndTimeouts(t *testing.T) {
	_, frames := testFrames(t, 3000, 1024, 1)
	t0 := time.Now()
	r := newReassembler(1<<20, 1<<20)
	for i, f := range frames {
		if i == 1 || i == len(frames)-1 {
			continue
		}
		c := mustChunk(t, f)
		if _, _, err := r.add(&c, "", false, t0); err != nil {
			t.Fatal(err)
		}
	}
	reqs, errs := r.scan(t0.Add(50*time.Millisecond), 100*time.Millisecond, time.Second, 2)
	if len(reqs) != 0 || len(errs) != 0 {
		t.Fatalf("early scan: %v %v", reqs, errs)
	}
	// First the hole below the highest index received; the tail may still
	// be coming.
	reqs, _ = r.scan(t0.Add(100*time.Millisecond), 100*time.Millisecond, time.Second, 2)
	if len(reqs) != 1 || reqs[0].sender != testSender || reqs[0].id != 1 || len(reqs[0].missing) != 1 || reqs[0].missing[0] != 1 {
		t.Fatalf("nack: %+v", reqs)
	}
	if reqs, _ = r.scan(t0.Add(150*time.Millisecond), 100*time.Millisecond, time.Second, 2); len(reqs) != 0 {
		t.Fatal("nacked again within NackAfter")
	}
	// After tailFactor·NackAfter of silence, the tail too.
	reqs, _ = r.scan(t0.Add(tailFactor*100*time.Millisecond), 100*time.Millisecond, time.Second, 2)
	if len(reqs) != 1 || len(reqs[0].missing) != 2 || reqs[0].missing[0] != 1 || int(reqs[0].missing[1]) != len(frames)-1 {
		t.Fatalf("second nack: %+v", reqs)
	}
	if reqs, _ = r.scan(t0.Add(900*time.Millisecond), 100*time.Millisecond, time.Second, 2); len(reqs) != 0 {
		t.Fatal("more than MaxNacks")
	}
	_, errs = r.scan(t0.Add(time.Second), 100*time.Millisecond, time.Second, 2)
	if len(errs) != 1 || !errors.Is(errs[0], ErrIncomplete) {
		t.Fatalf("timeout: %v", errs)
	}
	if n, b := r.inFlight(); n != 0 || b != 0 {
		t.Fatalf("memory not freed: %d transfers, %d bytes", n, b)
	}
}

func TestChunkCheck(t *testing.T) {
	_, frames := testFrames(t, 3000, 1024, 1)
	base := mustChunk(t, frames[1])
	cases := []struct {
		name   string
		mutate func(c *chunk)
	}{
		{"index past total", func(c *chunk) { c.Index = c.Total }},
		{"wrong offset", func(c *chunk) { c.Offset++ }},
		{"wrong total", func(c *chunk) { c.Total++ }},
		{"zero size", func(c *chunk) { c.Size = 0 }},
		{"short data", func(c *chunk) { c.Data = c.Data[1:] }},
		{"data CRC", func(c *chunk) { c.CRC ^= 1 }},
		{"bad sender", func(c *chunk) { c.Sender = "a.b" }},
		{"sender not a client ID", func(c *chunk) { c.Sender = "s" }},
		{"bad topic", func(c *chunk) { c.Topic = 0 }},
	}
	for _, tc := range cases {
		c := base
		tc.mutate(&c)
		frame := appendChunk(nil, &c)
		if _, err := decodeFrame(frame, false); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", tc.name, err)
		}
	}
	for i := range frames[0] {
		if _, err := decodeFrame(frames[0][:i], false); !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrCorrupt) {
			t.Errorf("prefix %d: %v", i, err)
		}
	}
}

func TestRetainCacheBounds(t *testing.T) {
	rc := &retainCache{maxBytes: 100, ttl: time.Second}
	t0 := time.Now()
	for i := range 5 {
		rc.put(&retained{id: uint64(i), data: make([]byte, 40), at: t0.Add(time.Duration(i) * time.Millisecond)})
	}
	if rc.get(2) != nil || rc.get(3) == nil || rc.get(4) == nil {
		t.Error("oldest not evicted first")
	}
	rc.put(&retained{id: 9, data: make([]byte, 101)})
	if rc.get(9) != nil {
		t.Error("oversized transfer retained")
	}
	rc.expire(t0.Add(time.Second + 3*time.Millisecond))
	if rc.get(3) != nil || rc.get(4) == nil {
		t.Error("expiry wrong")
	}
}

// TestRetainCacheRecycles checks the free list: a transfer's buffer is
// reused only once the cache, its sender and every NACK answer have let
// it go, within maxFree buffers and ttl.
func TestRetainCacheRecycles(t *testing.T) {
	rc := &retainCache{maxBytes: 1000, ttl: time.Second, perSubject: 1}
	t1 := &retained{id: 1, subject: "s", data: make([]byte, 100), refs: 1} // held by its sender
	rc.put(t1)
	rc.release(t1) // the sender is done
	if rc.get(1) != t1 {
		t.Fatal("t1 not retained")
	}
	// A NACK answer holds t1 while t2 evicts it from the cache.
	t2 := &retained{id: 2, subject: "s", data: make([]byte, 100), refs: 1}
	rc.put(t2)
	if rc.get(1) != nil {
		t.Fatal("t1 still retained after t2 on its subject")
	}
	if b := rc.buffer(100); b != nil {
		t.Fatal("buffer handed out while a NACK answer still holds it")
	}
	d1 := t1.data
	rc.release(t1) // the NACK answer is done
	if t1.data != nil {
		t.Error("released transfer keeps its data")
	}
	if b := rc.buffer(200); b != nil {
		t.Errorf("buffer of %d bytes for 200", cap(b))
	}
	if b := rc.buffer(40); b != nil {
		t.Errorf("buffer of %d bytes for 40 (more than twice)", cap(b))
	}
	b := rc.buffer(60)
	if b == nil || len(b) != 0 || &b[:1][0] != &d1[0] {
		t.Fatal("released buffer not handed out")
	}
	if rc.buffer(60) != nil {
		t.Fatal("one buffer handed out twice")
	}
	// At most maxFree buffers, none over maxBytes, none kept past ttl.
	for range maxFree + 1 {
		rc.recycle(make([]byte, 50))
	}
	rc.recycle(make([]byte, 1001))
	if len(rc.free) != maxFree {
		t.Errorf("%d free buffers, want %d", len(rc.free), maxFree)
	}
	rc.expire(time.Now().Add(time.Second))
	if len(rc.free) != 0 {
		t.Errorf("%d free buffers after ttl", len(rc.free))
	}
}

// TestReassemblerChunkBomb is issue 27's finding 1 at the reassembler: a
// node that announces transfers it never completes (a single chunk each)
// could fill the shared reassembly budget, so that the honest nodes'
// chunked contributions were refused. Now a topic's limit refuses a
// transfer announcing more than that topic's messages may hold, and one
// node holds at most maxPerNode transfers in flight (a newer one abandons
// its oldest): the bomber cannot crowd out the others.
func TestReassemblerChunkBomb(t *testing.T) {
	contrib := func(transfer uint64, n int) []chunk {
		v := make(Vector, n)
		frames, err := SplitFrames(Contribution{Run: "r", Step: 1, RoundID: 1, NodeID: "x", Count: 1, Sum: v}, testSender, transfer, 1024)
		if err != nil {
			t.Fatal(err)
		}
		cs := make([]chunk, len(frames))
		for i, f := range frames {
			cs[i] = mustChunk(t, f)
		}
		return cs
	}
	now := time.Now()
	// The shared budget holds 8 of the honest 3000-value contributions.
	budget := int64(8 * len(contrib(0, 3000)) * 1024)
	r := newReassembler(1<<20, budget)
	r.limitTopic(TopicContributions, ContributionMaxBytes(3000))

	// The bomber's transfers announce 60000 values: refused by the topic
	// limit at the first chunk.
	for i := range 3 {
		big := contrib(uint64(100+i), 60000)
		if _, _, err := r.add(&big[0], "bomber", false, now); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("bomb %d of %d bytes: %v, want ErrTooLarge", i, big[0].Len, err)
		}
	}
	// Many right-sized transfers it never completes: at most maxPerNode
	// stay in flight.
	for i := range 20 {
		part := contrib(uint64(200+i), 3000)
		if _, _, err := r.add(&part[0], "bomber", false, now); err != nil {
			t.Fatalf("bomber's transfer %d: %v", i, err)
		}
	}
	if n, _ := r.inFlight(); n != maxPerNode {
		t.Fatalf("%d transfers in flight after the bomber's 20, want %d", n, maxPerNode)
	}
	// The honest nodes' contributions all complete.
	for i := range 5 {
		node := fmt.Sprintf("honest-%d", i)
		var whole []byte
		for _, c := range contrib(uint64(300+i), 3000) {
			var err error
			if whole, _, err = r.add(&c, node, false, now); err != nil {
				t.Fatalf("%s: %v", node, err)
			}
		}
		if whole == nil {
			t.Fatalf("%s's contribution did not complete", node)
		}
	}
	// The limit is never below a real contribution's size.
	if got := ContributionMaxBytes(3000); got < int64(len(mustEncode(t, Contribution{Run: strings.Repeat("r", 64), NodeID: strings.Repeat("n", 64),
		Step: 1 << 62, RoundID: 1 << 62, Count: 1 << 62, Sum: make(Vector, 3000)}))) {
		t.Errorf("ContributionMaxBytes(3000) = %d is below a real contribution's size", got)
	}
}

func mustEncode(t *testing.T, m Message) []byte {
	t.Helper()
	b, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
