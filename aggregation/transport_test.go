package aggregation_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/aggregation"
	"github.com/dpcluster/dpcluster/pki"
	"github.com/dpcluster/dpcluster/transport"
	"github.com/dpcluster/dpcluster/transport/fake"
)

// Frames that fail to decode (bad version, truncated, corrupt message,
// corrupt chunk) are rejected by the transport with a specific error and
// never reach the round, which then accepts the valid contributions and
// sums them right.
func TestBadFramesLeaveRoundUsable(t *testing.T) {
	const dim = 40000 // 160 kB: chunked over a 64 KiB fake link
	cfg := transport.DefaultClientConfig()
	cfg.Run = "agg"
	cfg.NackAfter = 20 * time.Millisecond
	cfg.TransferTimeout = 200 * time.Millisecond
	var mu sync.Mutex
	var errs []error
	coordCfg := cfg
	coordCfg.OnError = func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }
	net := fake.NewNetwork(1, fake.Options{MaxPayload: 64 << 10})
	coord, err := transport.NewClient(net.Link("coord"), coordCfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	nodes := []string{"n1", "n2"}
	r, err := aggregation.NewRound(5, nodes, dim, 1, time.Now().Add(time.Minute), aggregation.WithRoundID(99))
	if err != nil {
		t.Fatal(err)
	}
	addErrs := make(chan error, 10)
	if _, err := coord.Subscribe(transport.TopicContributions, func(m transport.Message) {
		c := m.(transport.Contribution)
		addErrs <- r.Add(aggregation.Contribution{NodeID: c.NodeID, Step: c.Step, RoundID: c.RoundID, Count: c.Count, Sum: c.Sum})
	}); err != nil {
		t.Fatal(err)
	}
	contribution := func(node string, x float32) transport.Contribution {
		s := make(transport.Vector, dim)
		s[0], s[dim-1] = x, -x
		return transport.Contribution{Run: cfg.Run, Step: 5, RoundID: 99, NodeID: node, Count: 1, Sum: s}
	}
	whole, err := transport.Encode(contribution("n1", 0.5))
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := transport.SplitFrames(contribution("n1", 0.5), transport.ClientID(pki.RoleNode, "n1", "00000000000000ee"), 1, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	corruptChunk := slices.Clone(chunks[1])
	corruptChunk[len(corruptChunk)-7] ^= 1
	badVersion := slices.Clone(whole[:64<<10-1])
	badVersion[1] = 9
	subj, err := coord.Subjects().Node(transport.TopicContributions, "n1")
	if err != nil {
		t.Fatal(err)
	}
	inj := net.Link("injector")
	defer inj.Close()
	cases := []struct {
		name string
		data []byte
		want error
	}{
		{"bad version", badVersion, transport.ErrUnknownVersion},
		{"truncated message", whole[:1000], transport.ErrTruncated},
		{"corrupt message", []byte{0x93, 0x01, 0x05, 0xc1}, transport.ErrCorrupt},
		{"corrupt chunk", corruptChunk, transport.ErrCorrupt},
		{"truncated chunk", chunks[0][:100], transport.ErrTruncated},
	}
	for _, tc := range cases {
		mu.Lock()
		errs = nil
		mu.Unlock()
		if err := inj.Publish(subj, tc.data); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			ok := len(errs) == 1 && errors.Is(errs[0], tc.want)
			got := slices.Clone(errs)
			mu.Unlock()
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: errors %v, want one %v", tc.name, got, tc.want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for i, n := range nodes {
		nc, err := transport.NewClient(net.Link(n), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if err := nc.Publish(context.Background(), contribution(n, float32(i+1)/4)); err != nil {
			t.Fatal(err)
		}
	}
	res, err := r.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for range nodes {
		if err := <-addErrs; err != nil {
			t.Errorf("Add: %v", err)
		}
	}
	if len(addErrs) != 0 {
		t.Errorf("%d unexpected contributions reached the round", len(addErrs))
	}
	if res.ClosedBy != aggregation.CauseAllAnswered || res.Sum[0] != 0.75 || res.Sum[dim-1] != -0.75 || res.Count != 2 {
		t.Errorf("ClosedBy %v Sum[0] %v Sum[last] %v Count %d", res.ClosedBy, res.Sum[0], res.Sum[dim-1], res.Count)
	}
}
