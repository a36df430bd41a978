package coordinator

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/seed"
)

// TestServerSaysWhichNodesItWaitsFor: a run naming nodes a and b, with
// MinNodes 2, and only a joined. The leader opens no round and says so:
// an INFO line naming the node it has and the one it waits for, written
// when the wait starts or changes and then only every waitLogEvery (not
// on each of the loop's 50 ms retries); its Status (the dashboard's /api/status) and
// its replica reports (`coordinator status`) carry the missing node. When
// b joins, the run starts and finishes, and the status no longer waits.
func TestServerSaysWhichNodesItWaitsFor(t *testing.T) {
	c := testRunConfig()
	c.MaxSteps, c.Nodes = 2, []string{"a", "b"}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coordConn, dial := natsPair(t, c.Run)
	w := watch(t, dial("watcher"))
	sum := func(step uint64) (int64, []float32) { return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm) }
	shard := func(i int) identity {
		return identity{i, 2, 1, iidShardSize(c.TotalExamples, i, 2), seed.Crypto}
	}
	startScriptNode(t, ctx, dial("a"), "a", c.ModelHash, shard(0), sum)

	r := openReplicaForServer(t, t.TempDir())
	waitLeader(t, r)
	scfg := DefaultServerConfig()
	scfg.MinNodes, scfg.AnnounceEvery = 2, 100*time.Millisecond
	scfg.Noise = mechanism.NewSeededNoiseSource(1)
	s, logs, done := runTestServer(t, ctx, r, coordConn, c, scfg)

	// Reported every 100 ms: waiting for a while, many times the loop's
	// 50 ms retry.
	waitFor(t, ctx, "replica reports that the leader waits, or a round", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.waiting) >= 8 || w.rounds > 0
	})
	w.mu.Lock()
	rounds, waiting := w.rounds, ""
	if len(w.waiting) > 0 {
		waiting = w.waiting[len(w.waiting)-1]
	}
	w.mu.Unlock()
	if rounds != 0 {
		t.Fatalf("the leader opened %d rounds with 1 of its 2 nodes", rounds)
	}
	if !strings.Contains(waiting, "1 of 2") || !strings.Contains(waiting, "missing b") {
		t.Errorf("replica report says waiting %q, want 1 of 2 and missing b", waiting)
	}
	st := s.Status()
	if st.WaitingForNodes != 1 || !slices.Equal(st.MissingNodes, []string{"b"}) {
		t.Errorf("status: waiting_for_nodes %d, missing_nodes %q; want 1 and [b]", st.WaitingForNodes, st.MissingNodes)
	}
	var lines []string
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "waiting for nodes") && strings.Contains(l, "have=a ") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "level=INFO") || !strings.Contains(lines[0], "missing=b") {
		t.Errorf("%d waiting lines with a alone, want 1 at INFO naming missing=b:\n%s", len(lines), logs.String())
	}

	startScriptNode(t, ctx, dial("b"), "b", c.ModelHash, shard(1), sum)
	res := <-done
	if res.err != nil || res.sum.Steps != 2 {
		t.Fatalf("Run once b joined: %+v, %v", res.sum, res.err)
	}
	if st := s.Status(); st.WaitingForNodes != 0 || len(st.MissingNodes) != 0 {
		t.Errorf("status after the run: waiting_for_nodes %d, missing_nodes %q; want 0 and none", st.WaitingForNodes, st.MissingNodes)
	}
}
