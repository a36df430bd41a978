package coordinator

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/transport"
)

// TestNodeCannotAnswerForAnother: over NATS with TLS, node-1 answers every
// round first in node-0's name, twice: through a transport.Client (which
// puts the Contribution on node-0's subject, where the server refuses
// node-1's certificate) and as a raw nats.go client on its own subject
// (where the leader's transport drops it, the subject naming another node
// than the message). It also sends a Leave in node-0's name. node-0's own,
// later contributions are accepted: every step has one participant, and θ
// is the one the optimizer gives on node-0's sums with the same seeded
// noise.
func TestNodeCannotAnswerForAnother(t *testing.T) {
	const steps = 3
	dir := testPKI(t)
	c := testRunConfig()
	c.MaxSteps = steps
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	srv, dial := tlsServer(t, ctx, dir, c.Run)
	coordConn := dial("r1")

	const count = 10
	honest := func(step uint64) []float32 { return sentinelSum(0, step, c.Dim, count, c.Optimizer.ClipNorm) }
	forgedSum := func(step uint64) []float32 { return sentinelSum(9, step, c.Dim, count, c.Optimizer.ClipNorm) }

	// node-1: answers each round at once, as node-0, both ways.
	evil := dial("node-1")
	raw, _ := rawNATS(t, srv.URL(), dir, "node-1")
	ownSubject, err := evil.Subjects().Node(transport.TopicContributions, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	ownNodes, err := evil.Subjects().Node(transport.TopicNodes, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	forged := map[uint64]bool{}
	if _, err := evil.Subscribe(transport.TopicRounds, func(m transport.Message) {
		rs := m.(transport.RoundStart)
		forgery := transport.Contribution{Run: c.Run, Step: rs.Step, RoundID: rs.RoundID, NodeID: "node-0", Count: count, Sum: forgedSum(rs.Step)}
		errClient := evil.Publish(ctx, forgery)
		data, err := transport.Encode(forgery)
		if err == nil {
			err = raw.Publish(ownSubject, data)
		}
		if err == nil {
			err = raw.Flush()
		}
		if errClient != nil || err != nil {
			t.Errorf("forging step %d: %v, %v", rs.Step, errClient, err)
		}
		mu.Lock()
		forged[rs.Step] = true
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	leave, err := transport.Encode(transport.Leave{Run: c.Run, NodeID: "node-0", Reason: "forged"})
	if err != nil {
		t.Fatal(err)
	}

	// node-0 answers each round after node-1 has.
	node0 := startScriptNode(t, ctx, dial("node-0"), "node-0", c.ModelHash, shardOf(0), func(step uint64) (int64, []float32) {
		for {
			mu.Lock()
			done := forged[step]
			mu.Unlock()
			if done || ctx.Err() != nil {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := raw.Publish(ownNodes, leave); err != nil {
			t.Error(err)
		}
		time.Sleep(50 * time.Millisecond) // the forgeries reach the leader first
		return count, honest(step)
	})

	r := openReplicaForServer(t, t.TempDir())
	waitLeader(t, r)
	cfg := DefaultServerConfig()
	cfg.MinNodes = 1
	cfg.RoundTimeout = 2 * time.Second
	cfg.Noise = mechanism.NewSeededNoiseSource(42)
	var progress []Progress
	cfg.OnStep = func(p Progress) { progress = append(progress, p) }
	s, err := NewServer(r, coordConn, c, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := s.Run(ctx)
	if err != nil || sum.Steps != steps {
		t.Fatalf("Run: %+v, %v", sum, err)
	}
	for _, p := range progress {
		if p.Participants != 1 {
			t.Errorf("step %d accepted %d contributions, want 1 (node-0's)", p.Step, p.Participants)
		}
	}
	node0.mu.Lock()
	for _, st := range node0.status {
		if st.Code == transport.StatusRejected && st.Node == "node-0" {
			t.Errorf("node-0's contribution to step %d was rejected: %s", st.Step, st.Detail)
		}
	}
	node0.mu.Unlock()

	// θ is the optimizer's on node-0's own sums.
	noise := mechanism.NewSeededNoiseSource(42)
	grads := make([][]float32, steps)
	for st := range grads {
		agg := make([]float64, c.Dim)
		for j, v := range honest(uint64(st + 1)) {
			agg[j] = float64(v)
		}
		grads[st] = make([]float32, c.Dim)
		if err := privatize(c, noise, nil, grads[st], agg); err != nil {
			t.Fatal(err)
		}
	}
	if got, step := r.FSM().Params(nil); step != steps || !bitsEqual(got, reference(t, c, grads)) {
		t.Errorf("θ at step %d is not the run on node-0's own contributions", step)
	}
	if got, want := coordConn.Stats().WrongSender, uint64(2*steps); got < want {
		t.Errorf("the leader's transport dropped %d messages in another node's name, want ≥ %d", got, want)
	}
}
