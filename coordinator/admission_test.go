package coordinator

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpcluster/dpcluster/aggregation"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/seed"
	"github.com/dpcluster/dpcluster/transport"
)

func TestAdmitNode(t *testing.T) {
	crypto, seeded := testRunConfig(), testRunConfig()
	crypto.SeedPolicy, seeded.SeedPolicy = seed.Crypto, seed.Seeded
	// Shard 1 of 3 of testRunConfig's N = 10000 holds 3333 examples.
	ok := nodeReport{id: "n", modelHash: crypto.ModelHash, seedPolicy: seed.Crypto,
		shard: shardClaim{index: 1, count: 3, seed: 1, size: 3333}}
	for _, tc := range []struct {
		name         string
		mod          func(*nodeReport)
		crypto, seed string // the verdict in a crypto and in a seeded run
	}{
		{"valid", func(*nodeReport) {}, "", ""},
		// Issue 27: a claimed size is the shard's own; a node cannot
		// claim more (or fewer) examples than its shard holds.
		{"shard 0's size", func(n *nodeReport) { n.shard.index, n.shard.size = 0, 3334 }, "", ""},
		{"empty shard", func(n *nodeReport) { n.shard.size = 0 }, rejectShardIdentity, rejectShardIdentity},
		{"size N", func(n *nodeReport) { n.shard.size = 10000 }, rejectShardIdentity, rejectShardIdentity},
		{"another shard's size", func(n *nodeReport) { n.shard.size = 3334 }, rejectShardIdentity, rejectShardIdentity},
		{"another model", func(n *nodeReport) { n.modelHash = "other" }, rejectModelHash, rejectModelHash},
		{"seeded node", func(n *nodeReport) { n.seedPolicy = seed.Seeded }, rejectSeedPolicy, ""},
		{"no seed policy (old node)", func(n *nodeReport) { n.seedPolicy = "" }, rejectShardIdentity, rejectShardIdentity},
		{"unknown seed policy", func(n *nodeReport) { n.seedPolicy = "lcg" }, rejectShardIdentity, rejectShardIdentity},
		{"no shard count (old node)", func(n *nodeReport) { n.shard = shardClaim{size: 100} }, rejectShardIdentity, rejectShardIdentity},
		{"index = count", func(n *nodeReport) { n.shard.index = 3 }, rejectShardIdentity, rejectShardIdentity},
		{"negative index", func(n *nodeReport) { n.shard.index = -1 }, rejectShardIdentity, rejectShardIdentity},
		{"negative size", func(n *nodeReport) { n.shard.size = -1 }, rejectShardIdentity, rejectShardIdentity},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := ok
			tc.mod(&n)
			if got := admitNode(crypto, n); got != tc.crypto {
				t.Errorf("private run: admitNode = %q, want %q", got, tc.crypto)
			}
			if got := admitNode(seeded, n); got != tc.seed {
				t.Errorf("seeded run: admitNode = %q, want %q", got, tc.seed)
			}
		})
	}
}

// TestAdmitNodeOwnData: in a run whose nodes bring their own data, a
// node is admitted only with the run's data schema and no shard claim;
// the schema is checked before the model, and a run of shard-holding
// nodes refuses a node with its own data.
func TestAdmitNodeOwnData(t *testing.T) {
	local := testRunConfig()
	local.DataSchema = "shape [20], 3 classes, labels 0123456789abcdef"
	shared := testRunConfig()
	ok := nodeReport{id: "n", modelHash: local.ModelHash, seedPolicy: seed.Crypto, dataSchema: local.DataSchema,
		shard: shardClaim{size: 700}}
	for _, tc := range []struct {
		name          string
		mod           func(*nodeReport)
		local, shared string // the verdict in a run of own-data nodes and in a run of shards
	}{
		{"valid", func(*nodeReport) {}, "", rejectShardIdentity},
		{"another shape", func(n *nodeReport) { n.dataSchema = "shape [10], 3 classes, labels 0123456789abcdef" }, rejectDataSchema, rejectShardIdentity},
		{"another label set", func(n *nodeReport) { n.dataSchema = "shape [20], 3 classes, labels fedcba9876543210" }, rejectDataSchema, rejectShardIdentity},
		{"another schema and model", func(n *nodeReport) { n.dataSchema, n.modelHash = "shape [10]", "other" }, rejectDataSchema, rejectModelHash},
		{"no schema (a shard node)", func(n *nodeReport) {
			n.dataSchema, n.shard = "", shardClaim{index: 0, count: 3, seed: 1, size: 3334}
		}, rejectDataSchema, ""},
		{"schema and a shard claim", func(n *nodeReport) { n.shard = shardClaim{index: 0, count: 3, seed: 1, size: 3334} }, rejectShardIdentity, rejectShardIdentity},
		{"schema and a shard seed", func(n *nodeReport) { n.shard.seed = 5 }, rejectShardIdentity, rejectShardIdentity},
		{"negative size", func(n *nodeReport) { n.shard.size = -1 }, rejectShardIdentity, rejectShardIdentity},
		{"another model", func(n *nodeReport) { n.modelHash = "other" }, rejectModelHash, rejectModelHash},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := ok
			tc.mod(&n)
			if got := admitNode(local, n); got != tc.local {
				t.Errorf("own-data run: admitNode = %q, want %q", got, tc.local)
			}
			if got := admitNode(shared, n); got != tc.shared {
				t.Errorf("shard run: admitNode = %q, want %q", got, tc.shared)
			}
		})
	}
}

// TestAdmitNodePretrained: a run started from a checkpoint admits only
// nodes whose weights are its checkpoint's, a node that reports none
// included; a run with no checkpoint refuses a node that reports one; and
// a node with another model hears model_hash first, whatever its weights.
func TestAdmitNodePretrained(t *testing.T) {
	runW, otherW := strings.Repeat("0f", 32), strings.Repeat("a1", 32)
	plain, pretrained := testRunConfig(), testRunConfig()
	pretrained.Pretrained = &Pretrained{WeightsSHA256: runW, Config: []byte(`{"model_type": "bert"}`)}
	if err := pretrained.Validate(); err != nil {
		t.Fatal(err)
	}
	node := func(model, weights string) nodeReport {
		return nodeReport{id: "n", modelHash: model, seedPolicy: seed.Crypto, weights: weights,
			shard: shardClaim{index: 1, count: 3, seed: 1, size: 3333}}
	}
	for _, tc := range []struct {
		name               string
		n                  nodeReport
		pretrained, noCkpt string // the verdict in a run with a checkpoint and in one without
	}{
		{"the run's weights", node(plain.ModelHash, runW), "", rejectWeights},
		{"other weights", node(plain.ModelHash, otherW), rejectWeights, rejectWeights},
		{"no weights", node(plain.ModelHash, ""), rejectWeights, ""},
		{"the run's weights in upper case", node(plain.ModelHash, strings.ToUpper(runW)), rejectWeights, rejectWeights},
		{"the run's weights, truncated", node(plain.ModelHash, runW[:63]), rejectWeights, rejectWeights},
		{"another model, the run's weights", node("other", runW), rejectModelHash, rejectModelHash},
		{"another model, other weights", node("other", otherW), rejectModelHash, rejectModelHash},
		{"another model, no weights", node("other", ""), rejectModelHash, rejectModelHash},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := admitNode(pretrained, tc.n); got != tc.pretrained {
				t.Errorf("run from a checkpoint: admitNode = %q, want %q", got, tc.pretrained)
			}
			if got := admitNode(plain, tc.n); got != tc.noCkpt {
				t.Errorf("run with no checkpoint: admitNode = %q, want %q", got, tc.noCkpt)
			}
		})
	}
}

// TestCheckShards: the round's members are the live nodes whose claims
// agree with every older claim; of two conflicting claims the older
// stands and the later is left out, with the reason and a detail naming
// both (issue 27: a node claiming another's shard no longer stops the
// rounds). order is oldest claim first.
func TestCheckShards(t *testing.T) {
	sh := func(index, count int, seed uint64, size int64) shardClaim {
		return shardClaim{index: index, count: count, seed: seed, size: size}
	}
	for _, tc := range []struct {
		name    string
		claims  map[string]shardClaim
		order   []string
		n       int64
		members []string
		want    string // the reason, "" for none left out
		detail  string // a substring of the detail
	}{
		{"none", nil, nil, 10, nil, "", ""},
		{"one node, whole set", map[string]shardClaim{"a": sh(0, 1, 1, 10)}, []string{"a"}, 10, []string{"a"}, "", ""},
		{"partition", map[string]shardClaim{"a": sh(0, 3, 1, 4), "b": sh(1, 3, 1, 3), "c": sh(2, 3, 1, 3)}, []string{"c", "a", "b"}, 10, []string{"a", "b", "c"}, "", ""},
		{"some shards missing", map[string]shardClaim{"a": sh(0, 3, 1, 4), "c": sh(2, 3, 1, 3)}, []string{"a", "c"}, 10, []string{"a", "c"}, "", ""},
		{"whole set twice", map[string]shardClaim{"a": sh(0, 1, 1, 10), "b": sh(0, 1, 1, 10)}, []string{"a", "b"}, 10, []string{"a"}, blockShardOverlap, "nodes a and b both hold shard 0 of 1: b, the later claim, left out"},
		{"same shard, the older claim stands", map[string]shardClaim{"a": sh(0, 3, 1, 4), "b": sh(1, 3, 1, 3), "z": sh(1, 3, 1, 3)}, []string{"z", "a", "b"}, 10, []string{"a", "z"}, blockShardOverlap, "nodes z and b both hold shard 1 of 3: b, the later claim, left out"},
		{"different counts", map[string]shardClaim{"a": sh(0, 2, 1, 5), "b": sh(1, 3, 1, 3)}, []string{"a", "b"}, 10, []string{"a"}, blockShardSplit, "node a cuts the training set into 2 shards with seed 1, node b into 3"},
		{"different seeds", map[string]shardClaim{"a": sh(0, 2, 1, 5), "b": sh(1, 2, 2, 5)}, []string{"b", "a"}, 10, []string{"b"}, blockShardSplit, "seed 1: a left out"},
		{"more than N", map[string]shardClaim{"a": sh(0, 2, 1, 6), "b": sh(1, 2, 1, 6)}, []string{"a", "b"}, 10, []string{"a"}, blockShardSizes, "more than N = 10"},
		{"exactly N", map[string]shardClaim{"a": sh(0, 2, 1, 5), "b": sh(1, 2, 1, 5)}, []string{"a", "b"}, 10, []string{"a", "b"}, "", ""},
		{"sizes that overflow int64", map[string]shardClaim{"a": sh(0, 2, 1, math.MaxInt64), "b": sh(1, 2, 1, math.MaxInt64)}, []string{"a", "b"}, math.MaxInt64, []string{"a"}, blockShardSizes, ""},
		// Nodes with their own data claim count 0: no overlap rule, only N.
		{"own data", map[string]shardClaim{"a": sh(0, 0, 0, 3), "b": sh(0, 0, 0, 5), "c": sh(0, 0, 0, 2)}, []string{"a", "b", "c"}, 10, []string{"a", "b", "c"}, "", ""},
		{"own data, more than N", map[string]shardClaim{"a": sh(0, 0, 0, 6), "b": sh(0, 0, 0, 5), "c": sh(0, 0, 0, 4)}, []string{"a", "b", "c"}, 10, []string{"a", "c"}, blockShardSizes, "more than N = 10 examples (node b: 5, the nodes before it: 6): b left out"},
		{"own data beside a shard", map[string]shardClaim{"a": sh(0, 0, 0, 3), "b": sh(0, 2, 1, 5)}, []string{"a", "b"}, 10, []string{"a"}, blockShardSplit, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			members, b := checkShards(tc.claims, tc.order, tc.n)
			if !slices.Equal(members, tc.members) {
				t.Errorf("members %v, want %v", members, tc.members)
			}
			if tc.want == "" {
				if b != nil {
					t.Fatalf("checkShards left out: %v", b)
				}
				return
			}
			if b == nil || b.reason != tc.want || !strings.Contains(b.detail, tc.detail) {
				t.Fatalf("checkShards = %v, want %s (%q)", b, tc.want, tc.detail)
			}
		})
	}
}

// TestRegistryOrdersClaimsByAge: a node that changes its claim is, for
// that claim, newer than every node whose claim stands (so it cannot take
// an older claim's place by claiming it), and one that keeps its claim
// keeps its age.
func TestRegistryOrdersClaimsByAge(t *testing.T) {
	var r registry
	r.nodes = make(map[string]nodeInfo)
	t0 := time.Now()
	r.seen("b", "", shardClaim{index: 1, count: 3, seed: 1, size: 3}, t0)
	r.seen("a", "", shardClaim{index: 0, count: 3, seed: 1, size: 4}, t0.Add(time.Second))
	r.seen("b", "", shardClaim{index: 1, count: 3, seed: 1, size: 3}, t0.Add(2*time.Second))
	if order, _ := r.live(t0.Add(2*time.Second), time.Minute); !slices.Equal(order, []string{"b", "a"}) {
		t.Fatalf("order %v, want b (older claim) then a", order)
	}
	// a now claims b's shard: its claim is the newest.
	r.seen("a", "", shardClaim{index: 1, count: 3, seed: 1, size: 3}, t0.Add(3*time.Second))
	order, claims := r.live(t0.Add(3*time.Second), time.Minute)
	if !slices.Equal(order, []string{"b", "a"}) {
		t.Fatalf("order %v, want b then a", order)
	}
	if members, b := checkShards(claims, order, 10); !slices.Equal(members, []string{"b"}) || b == nil || b.reason != blockShardOverlap {
		t.Fatalf("members %v (%v), want b alone, a left out for overlap", members, b)
	}
}

// TestRegistrySeats: a node ID's seat is held by one incarnation while it is
// live; a Leave from another incarnation does not free it, the holder's does,
// and a lapsed holder's seat is free.
func TestRegistrySeats(t *testing.T) {
	const timeout = 5 * time.Second
	claim := shardClaim{index: 0, count: 3, seed: 1, size: 4}
	t0 := time.Now()
	var r registry
	r.nodes = make(map[string]nodeInfo)
	if h, taken := r.holder("a", "s1", t0, timeout); taken {
		t.Fatalf("an empty registry: seat held by %q", h)
	}
	r.seen("a", "s1", claim, t0)
	if _, taken := r.holder("a", "s1", t0.Add(timeout), timeout); taken {
		t.Error("the holder's own incarnation refused its seat")
	}
	if h, taken := r.holder("a", "s2", t0.Add(timeout), timeout); !taken || h != "s1" {
		t.Errorf("another incarnation within the timeout: holder %q, taken %v; want s1, true", h, taken)
	}
	if h, taken := r.holder("a", "", t0, timeout); !taken || h != "s1" {
		t.Errorf("an incarnation-less (older) node: holder %q, taken %v; want s1, true", h, taken)
	}
	if r.leave("a", "s2") || r.count() != 1 {
		t.Error("another incarnation's Leave freed the seat")
	}
	if _, taken := r.holder("a", "s2", t0.Add(timeout+time.Nanosecond), timeout); taken {
		t.Error("a lapsed holder's seat is still taken")
	}
	// A new incarnation is a new claim: it is the newest, whatever the ID's age.
	r.seen("b", "sb", claim, t0.Add(time.Second))
	if !r.seen("a", "s3", claim, t0.Add(2*time.Second)) {
		t.Error("a new incarnation's message not reported new")
	}
	if order, _ := r.live(t0.Add(2*time.Second), timeout); !slices.Equal(order, []string{"b", "a"}) {
		t.Errorf("order %v, want b, then a's new incarnation", order)
	}
	if !r.leave("a", "s3") || r.count() != 1 {
		t.Error("the holder's Leave did not free its seat")
	}
	if !r.leave("z", "s9") {
		t.Error("a Leave for an unregistered ID reported the seat held")
	}
}

// lockedBuffer is a bytes.Buffer the Server's logger and the test may use
// at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// watchStatus records the replica reports (Control) that say rounds are
// blocked or wait for nodes, and the rejections (Status) published on the run, and counts
// RoundStarts.
type watchStatus struct {
	mu       sync.Mutex
	rounds   int
	blocked  []string
	waiting  []string
	rejected map[string]map[string]bool // node → details it was told
}

func (w *watchStatus) told(node, detail string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rejected[node][detail]
}

func watch(t *testing.T, conn *transport.Client) *watchStatus {
	t.Helper()
	w := &watchStatus{rejected: map[string]map[string]bool{}}
	if _, err := conn.Subscribe(transport.TopicRounds, func(transport.Message) {
		w.mu.Lock()
		w.rounds++
		w.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Subscribe(transport.TopicControl, func(m transport.Message) {
		c := m.(transport.Control)
		w.mu.Lock()
		defer w.mu.Unlock()
		if c.Code == transport.ControlReplica && c.Blocked != "" {
			w.blocked = append(w.blocked, c.Blocked)
		}
		if c.Code == transport.ControlReplica && c.Waiting != "" {
			w.waiting = append(w.waiting, c.Waiting)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Subscribe(transport.TopicStatus, func(m transport.Message) {
		st := m.(transport.Status)
		w.mu.Lock()
		defer w.mu.Unlock()
		switch {
		case st.Code == transport.StatusRejected:
			if w.rejected[st.Node] == nil {
				w.rejected[st.Node] = map[string]bool{}
			}
			w.rejected[st.Node][st.Detail] = true
		}
	}); err != nil {
		t.Fatal(err)
	}
	return w
}

// labelled returns the value of metric name's series with label=value.
func labelled(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					if m.GetGauge() != nil {
						return m.GetGauge().GetValue()
					}
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serverResult is what a Server's Run returned.
type serverResult struct {
	sum Summary
	err error
}

// runTestServer starts the round loop of r over conn on a goroutine,
// logging as text into logs; done receives what Run returns.
func runTestServer(t *testing.T, ctx context.Context, r *Replica, conn *transport.Client, c RunConfig, scfg ServerConfig) (
	s *Server, logs *lockedBuffer, done <-chan serverResult) {
	t.Helper()
	logs = new(lockedBuffer)
	s, err := NewServer(r, conn, c, scfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan serverResult, 1)
	go func() { sum, err := s.Run(ctx); ch <- serverResult{sum, err} }()
	return s, logs, ch
}

// TestServerBlocksOverlappingShards: while two live nodes hold overlapping
// parts of the training set — the same shard, or shards of different cuts
// — the later claim is left out of the rounds, so with --min-nodes 2 the
// leader opens no round; it logs why once, sets
// dpcluster_coordinator_rounds_blocked{reason} and reports the reason in
// its replica status. When the offending node leaves and one with the
// missing shard joins, the run proceeds (issue 11, item 6).
func TestServerBlocksOverlappingShards(t *testing.T) {
	const n = 10000 // testRunConfig's N
	crypto := seed.Crypto
	for _, tc := range []struct {
		name   string
		a, b   identity
		reason string
	}{
		{"whole set twice (no --shard-count)", identity{0, 1, 1, n, crypto}, identity{0, 1, 1, n, crypto}, blockShardOverlap},
		{"same shard", identity{0, 2, 1, n / 2, crypto}, identity{0, 2, 1, n / 2, crypto}, blockShardOverlap},
		{"different shard counts", identity{0, 2, 1, n / 2, crypto}, identity{1, 3, 1, n / 3, crypto}, blockShardSplit},
		{"different shard seeds", identity{0, 2, 1, n / 2, crypto}, identity{1, 2, 2, n / 2, crypto}, blockShardSplit},
		// More than N cannot be claimed here: a size that is not its
		// shard's is refused at admission (TestAdmitNode).
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testRunConfig()
			c.MaxSteps = 2
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			coordConn, dial := natsPair(t, c.Run)
			w := watch(t, dial("watcher"))
			sum := func(step uint64) (int64, []float32) { return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm) }
			a := startScriptNode(t, ctx, dial("a"), "a", c.ModelHash, tc.a, sum)
			b := startScriptNode(t, ctx, dial("b"), "b", c.ModelHash, tc.b, sum)

			r := openReplicaForServer(t, t.TempDir())
			waitLeader(t, r)
			scfg := DefaultServerConfig()
			scfg.MinNodes, scfg.AnnounceEvery = 2, 100*time.Millisecond
			scfg.Noise = mechanism.NewSeededNoiseSource(1)
			reg := prometheus.NewRegistry()
			var err error
			if scfg.Metrics, err = NewMetrics(reg, c.Run, "r1"); err != nil {
				t.Fatal(err)
			}
			_, logs, done := runTestServer(t, ctx, r, coordConn, c, scfg)

			// Blocked, and saying so: status, metric, log.
			waitFor(t, ctx, "a blocked replica status or a round", func() bool {
				w.mu.Lock()
				defer w.mu.Unlock()
				return len(w.blocked) >= 3 || w.rounds > 0 // reported every 100 ms: blocked for a while
			})
			w.mu.Lock()
			rounds, blocked := w.rounds, ""
			if len(w.blocked) > 0 {
				blocked = w.blocked[len(w.blocked)-1]
			}
			w.mu.Unlock()
			if rounds != 0 {
				t.Errorf("the leader opened %d rounds over overlapping shards", rounds)
			}
			if rounds > 0 {
				t.FailNow()
			}
			if !strings.HasPrefix(blocked, tc.reason+": ") {
				t.Errorf("replica status says blocked %q, want reason %s", blocked, tc.reason)
			}
			if v := labelled(t, reg, "dpcluster_coordinator_rounds_blocked", "reason", tc.reason); v != 1 {
				t.Errorf("rounds_blocked{%s} = %v, want 1", tc.reason, v)
			}
			if k := strings.Count(logs.String(), "leaving nodes out of rounds"); k != 1 {
				t.Errorf("%d blocked warnings while blocked for one reason, want 1 (rate-limited):\n%s", k, logs.String())
			}

			// a and b leave; c and d, holding the two halves of one cut,
			// join: the run proceeds.
			for _, x := range []*scriptNode{a, b} {
				if err := x.leave(ctx); err != nil {
					t.Fatal(err)
				}
			}
			startScriptNode(t, ctx, dial("c"), "c", c.ModelHash, identity{0, 2, 1, n / 2, crypto}, sum)
			startScriptNode(t, ctx, dial("d"), "d", c.ModelHash, identity{1, 2, 1, n / 2, crypto}, sum)
			res := <-done
			if res.err != nil || res.sum.Steps != 2 {
				t.Fatalf("Run after the overlap was resolved: %+v, %v", res.sum, res.err)
			}
			if v := labelled(t, reg, "dpcluster_coordinator_rounds_blocked", "reason", tc.reason); v != 0 {
				t.Errorf("rounds_blocked{%s} = %v after the overlap was resolved, want 0", tc.reason, v)
			}
			if !strings.Contains(logs.String(), "rounds no longer blocked") {
				t.Errorf("unblocking not logged:\n%s", logs.String())
			}
		})
	}
}

// TestServerLeavesOutALaterClaim is issue 27's finding 2: a node that
// claims another live node's shard (here: registered later, claiming
// shard 1 of 2, which b holds) made the leader stop opening rounds, and
// alone it halted the run. Now the older claim stands: the rounds go on
// over a and b, every one of them, and the claimant is left out and told
// why in the replica status.
func TestServerLeavesOutALaterClaim(t *testing.T) {
	const n = 10000 // testRunConfig's N
	c := testRunConfig()
	c.MaxSteps = 40
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coordConn, dial := natsPair(t, c.Run)
	w := watch(t, dial("watcher"))
	sum := func(step uint64) (int64, []float32) { return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm) }
	a := startScriptNode(t, ctx, dial("a"), "a", c.ModelHash, identity{0, 2, 1, n / 2, seed.Crypto}, sum)
	b := startScriptNode(t, ctx, dial("b"), "b", c.ModelHash, identity{1, 2, 1, n / 2, seed.Crypto}, sum)

	r := openReplicaForServer(t, t.TempDir())
	waitLeader(t, r)
	scfg := DefaultServerConfig()
	scfg.MinNodes, scfg.AnnounceEvery = 2, 100*time.Millisecond
	scfg.Noise = mechanism.NewSeededNoiseSource(1)
	s, err := NewServer(r, coordConn, c, scfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The rounds are slow enough that z joins while they run.
	done := make(chan error, 1)
	var sumRes Summary
	go func() {
		var err error
		sumRes, err = s.Run(ctx)
		done <- err
	}()
	waitFor(t, ctx, "a first round", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.rounds > 0
	})
	startScriptNode(t, ctx, dial("z"), "z", c.ModelHash, identity{1, 2, 1, n / 2, seed.Crypto}, sum)
	// The leader hears z and leaves it out, saying why, while the run
	// goes on.
	want := blockShardOverlap + ": nodes b and z both hold shard 1 of 2: z, the later claim, left out"
	waitFor(t, ctx, "the leader leaving z out", func() bool { return s.Status().Blocked == want })
	if err := <-done; err != nil || sumRes.Steps != c.MaxSteps {
		t.Fatalf("Run with a node claiming b's shard: %+v, %v; want all %d steps", sumRes, err, c.MaxSteps)
	}
	for _, x := range []*scriptNode{a, b} {
		x.mu.Lock()
		answered := len(x.answered)
		x.mu.Unlock()
		if answered != int(c.MaxSteps) {
			t.Errorf("%s answered %d rounds, want every one of %d", x.id, answered, c.MaxSteps)
		}
	}
}

// TestServerRefusesAnInflatedCount is issue 27's finding 3: a
// contribution's norm is checked against count·C with the node's own
// count, which was bounded only by its shard size, so one node could add
// its whole shard's worth of clipped gradients (about 117× a whole
// expected batch in the probe). Now the count is bounded by what its
// Poisson sample exceeds with probability 2^-64 (aggregation.CountBound):
// b's contribution claiming its whole shard is refused as
// count_too_large, every step, while a's honest ones count.
func TestServerRefusesAnInflatedCount(t *testing.T) {
	const n = 10000 // testRunConfig's N; q = 0.01: each shard of 5000 samples about 50
	c := testRunConfig()
	c.MaxSteps = 3
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coordConn, dial := natsPair(t, c.Run)
	w := watch(t, dial("watcher"))
	honest := func(step uint64) (int64, []float32) { return 50, sentinelSum(0, step, c.Dim, 50, c.Optimizer.ClipNorm) }
	inflated := func(step uint64) (int64, []float32) {
		return n / 2, sentinelSum(1, step, c.Dim, n/2, c.Optimizer.ClipNorm)
	}
	startScriptNode(t, ctx, dial("a"), "a", c.ModelHash, identity{0, 2, 1, n / 2, seed.Crypto}, honest)
	startScriptNode(t, ctx, dial("b"), "b", c.ModelHash, identity{1, 2, 1, n / 2, seed.Crypto}, inflated)

	r := openReplicaForServer(t, t.TempDir())
	waitLeader(t, r)
	scfg := DefaultServerConfig()
	scfg.MinNodes, scfg.RoundTimeout = 2, 2*time.Second
	scfg.Noise = mechanism.NewSeededNoiseSource(1)
	s, err := NewServer(r, coordConn, c, scfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := s.Run(ctx)
	if err != nil || sum.Steps != c.MaxSteps {
		t.Fatalf("Run = %+v, %v", sum, err)
	}
	if !w.told("b", "count_too_large") {
		t.Error("b's contribution claiming its whole shard (5000 of an expected 50) was not refused as count_too_large")
	}
	if w.told("a", "count_too_large") {
		t.Error("a's honest count was refused")
	}
}

// TestServerSeedPolicy: a private run (crypto seed policy) refuses a node
// that samples from a seed, and never makes it a round member; a seeded run
// takes it, and its ledger audits as not private. In both, a node that
// does not report its shard and seed policy (an older node) is refused
// (issue 11, item 7).
func TestServerSeedPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy  seed.Policy
		members int // nodes in every round
		private bool
	}{
		{seed.Crypto, 1, true},
		{seed.Seeded, 2, false},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			dir := t.TempDir()
			c := testRunConfig()
			c.MaxSteps, c.SeedPolicy = 3, tc.policy
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			coordConn, dial := natsPair(t, c.Run)
			w := watch(t, dial("watcher"))
			// Rounds are answered only once the refusals were published
			// (or 5 s have passed), so that the run cannot end before
			// they are.
			refused := func() bool {
				return w.told("old", rejectShardIdentity) && (!tc.private || w.told("seeded", rejectSeedPolicy))
			}
			gate := time.Now().Add(5 * time.Second)
			sum := func(step uint64) (int64, []float32) {
				for !refused() && time.Now().Before(gate) {
					time.Sleep(5 * time.Millisecond)
				}
				return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm)
			}
			startScriptNode(t, ctx, dial("crypto"), "crypto", c.ModelHash, shardOf(0), sum)
			seeded := shardOf(1)
			seeded.policy = seed.Seeded
			startScriptNode(t, ctx, dial("seeded"), "seeded", c.ModelHash, seeded, sum)
			startScriptNode(t, ctx, dial("old"), "old", c.ModelHash, identity{size: 1000}, sum)

			r := openReplicaForServer(t, dir)
			waitLeader(t, r)
			scfg := DefaultServerConfig()
			scfg.MinNodes, scfg.RoundTimeout = tc.members, 2*time.Second
			if tc.policy == seed.Seeded {
				scfg.Noise = mechanism.NewSeededNoiseSource(1)
			}
			reg := prometheus.NewRegistry()
			var err error
			if scfg.Metrics, err = NewMetrics(reg, c.Run, "r1"); err != nil {
				t.Fatal(err)
			}
			var progress []Progress
			scfg.OnStep = func(p Progress) { progress = append(progress, p) }
			s, err := NewServer(r, coordConn, c, scfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			res, err := s.Run(ctx)
			if err != nil || res.Steps != 3 {
				t.Fatalf("Run: %+v, %v", res, err)
			}
			for _, p := range progress {
				if p.Participants != tc.members {
					t.Errorf("step %d had %d participants, want %d", p.Step, p.Participants, tc.members)
				}
			}
			if !w.told("old", rejectShardIdentity) {
				t.Errorf("the node without a shard identity was not told %q", rejectShardIdentity)
			}
			if got := w.told("seeded", rejectSeedPolicy); got != tc.private {
				t.Errorf("the seeded node told %q: %v, want %v", rejectSeedPolicy, got, tc.private)
			}
			if tc.private {
				if v := labelled(t, reg, "dpcluster_coordinator_node_messages_refused_total", "reason", rejectSeedPolicy); v == 0 {
					t.Error("node_messages_refused_total{seed_policy} = 0")
				}
			}
			rep, err := ledger.Audit(filepath.Join(dir, LedgerFile))
			if err != nil || !rep.OK || rep.Applied != 3 {
				t.Fatalf("audit: %+v, %v", rep, err)
			}
			if rep.Private != tc.private || rep.Noise != tc.policy {
				t.Errorf("audit says noise %q, private %v; want %q, %v", rep.Noise, rep.Private, tc.policy, tc.private)
			}
		})
	}
}

// TestServerPretrainedWeights: a run started from a checkpoint refuses,
// through the leader's real admission path, a node that reports other
// weights and one that reports none: neither is ever a round member, each
// is told "pretrained_weights: " and the run's weights hash, the refusal
// is counted by reason, and the leader's warning names both hashes.
func TestServerPretrainedWeights(t *testing.T) {
	runW, otherW := strings.Repeat("0f", 32), strings.Repeat("a1", 32)
	c := testRunConfig()
	c.MaxSteps = 3
	c.Pretrained = &Pretrained{WeightsSHA256: runW, Config: []byte(`{"model_type": "bert"}`)}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coordConn, dial := natsPair(t, c.Run)
	w := watch(t, dial("watcher"))
	detail := rejectWeights + ": " + runW
	// Rounds are answered only once both refusals were published (or 5 s
	// have passed), so that the run cannot end before they are.
	gate := time.Now().Add(5 * time.Second)
	sum := func(step uint64) (int64, []float32) {
		for !(w.told("other", detail) && w.told("none", detail)) && time.Now().Before(gate) {
			time.Sleep(5 * time.Millisecond)
		}
		return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm)
	}
	for i, n := range []struct{ id, weights string }{{"same", runW}, {"other", otherW}, {"none", ""}} {
		sh := shardOf(i)
		startReportingNode(t, ctx, dial(n.id), transport.Heartbeat{Run: c.Run, NodeID: n.id, ShardSize: sh.size, ModelHash: c.ModelHash,
			ShardIndex: sh.index, ShardCount: sh.count, ShardSeed: sh.seed, SeedPolicy: sh.policy, Weights: n.weights}, sum)
	}

	r := openReplicaForServer(t, t.TempDir())
	waitLeader(t, r)
	scfg := DefaultServerConfig()
	scfg.MinNodes, scfg.RoundTimeout = 1, 2*time.Second
	scfg.Noise = mechanism.NewSeededNoiseSource(1)
	reg := prometheus.NewRegistry()
	var err error
	if scfg.Metrics, err = NewMetrics(reg, c.Run, "r1"); err != nil {
		t.Fatal(err)
	}
	var progress []Progress
	scfg.OnStep = func(p Progress) { progress = append(progress, p) }
	var logs lockedBuffer
	s, err := NewServer(r, coordConn, c, scfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Run(ctx)
	if err != nil || res.Steps != c.MaxSteps {
		t.Fatalf("Run: %+v, %v", res, err)
	}
	for _, p := range progress {
		if p.Participants != 1 {
			t.Errorf("step %d had %d participants, want 1 (the node with the run's weights)", p.Step, p.Participants)
		}
	}
	for _, id := range []string{"other", "none"} {
		if !w.told(id, detail) {
			t.Errorf("node %s was not told %q", id, detail)
		}
	}
	if w.told("same", detail) {
		t.Errorf("the node with the run's weights was told %q", detail)
	}
	if v := labelled(t, reg, "dpcluster_coordinator_node_messages_refused_total", "reason", rejectWeights); v < 2 {
		t.Errorf("node_messages_refused_total{%s} = %v, want at least 2 (one per refused node)", rejectWeights, v)
	}
	var warned bool
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "refusing node") && strings.Contains(line, "node=other") {
			warned = strings.Contains(line, "weights="+otherW) && strings.Contains(line, "run_weights="+runW)
			break
		}
	}
	if !warned {
		t.Errorf("no warning about node other naming weights=%s and run_weights=%s in:\n%s", otherW, runW, logs.String())
	}
}

// TestRefusalReasonsExported: every reason a node is refused for is a
// label value of the refusal counter, at zero before it first happens.
func TestRefusalReasonsExported(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := NewMetrics(reg, "test", "r1"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{rejectModelHash, rejectShardIdentity, rejectSeedPolicy, rejectDataSchema, rejectWeights, rejectSeatTaken} {
		if v := labelled(t, reg, "dpcluster_coordinator_node_messages_refused_total", "reason", r); v != 0 {
			t.Errorf("node_messages_refused_total{%s} = %v before any node, want 0", r, v)
		}
	}
}

// BenchmarkCheckShards: the check the leader runs before every round (and
// every 50 ms while it waits), over 1000 live nodes.
func BenchmarkCheckShards(b *testing.B) {
	claims := make(map[string]shardClaim, 1000)
	var order []string
	for i := range 1000 {
		id := fmt.Sprintf("node-%04d", i)
		claims[id] = shardClaim{index: i, count: 1000, seed: 1, size: 60}
		order = append(order, id)
	}
	for b.Loop() {
		if members, block := checkShards(claims, order, 60000); block != nil || len(members) != 1000 {
			b.Fatal("left nodes out")
		}
	}
}

// TestAdmitNodeBoundToRunFileNodes: a run that names its nodes admits
// only those IDs, each with the shard the list gives it, so no node can
// claim another's shard, even before that node has registered (issue 27:
// the hole first-come claims leave).
func TestAdmitNodeBoundToRunFileNodes(t *testing.T) {
	run := testRunConfig()
	run.Nodes = []string{"a", "b", "c"}
	claim := func(id string, index int) nodeReport {
		return nodeReport{id: id, modelHash: run.ModelHash, seedPolicy: seed.Crypto,
			shard: shardClaim{index: index, count: 3, seed: 1, size: iidShardSize(run.TotalExamples, index, 3)}}
	}
	for _, tc := range []struct {
		n    nodeReport
		want string
	}{
		{claim("a", 0), ""}, {claim("b", 1), ""}, {claim("c", 2), ""},
		{claim("b", 0), rejectShardIdentity}, // b claiming a's shard
		{claim("z", 0), rejectShardIdentity}, // not a node of the run
	} {
		if got := admitNode(run, tc.n); got != tc.want {
			t.Errorf("admitNode(%s claiming shard %d) = %q, want %q", tc.n.id, tc.n.shard.index, got, tc.want)
		}
	}
	other := claim("a", 0)
	other.shard.count, other.shard.size = 4, iidShardSize(run.TotalExamples, 0, 4)
	if got := admitNode(run, other); got != rejectShardIdentity {
		t.Errorf("a claiming shard 0 of 4 in a run of 3 named nodes: %q, want %q", got, rejectShardIdentity)
	}
	// With their own data, the list only says who may join.
	run.DataSchema = "shape [2], 2 classes, label set 0"
	own := nodeReport{id: "b", modelHash: run.ModelHash, seedPolicy: seed.Crypto, dataSchema: run.DataSchema, shard: shardClaim{size: 10}}
	if got := admitNode(run, own); got != "" {
		t.Errorf("own-data node b: %q", got)
	}
	own.id = "z"
	if got := admitNode(run, own); got != rejectShardIdentity {
		t.Errorf("own-data node z: %q, want %q", got, rejectShardIdentity)
	}
	run.Nodes = []string{"a", "a"}
	if err := run.Validate(); err == nil {
		t.Error("a run naming node a twice validates")
	}
}

// TestServerSeatTaken: a node ID has one seat, held by one process (its
// incarnation). A second process presenting the ID of a live node, here with
// another shard that overlaps node b's, is refused (seat_taken, counted
// and warned with both incarnations) and never becomes a round member: every
// round keeps a and b (the intruder's claim would have left a out for
// overlapping b). Once the holder and the intruder stop, a restarted
// process with the ID is admitted after the holder's seat lapses.
func TestServerSeatTaken(t *testing.T) {
	c := testRunConfig()
	c.MaxSteps = 100000
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coordConn, dial := natsPair(t, c.Run)
	w := watch(t, dial("watcher"))
	sum := func(step uint64) (int64, []float32) {
		time.Sleep(5 * time.Millisecond) // rounds at most ~200/s
		return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm)
	}
	report := func(id, incarnation string, shard identity) transport.Heartbeat {
		return transport.Heartbeat{Run: c.Run, NodeID: id, ShardSize: shard.size, ModelHash: c.ModelHash,
			ShardIndex: shard.index, ShardCount: shard.count, ShardSeed: shard.seed, SeedPolicy: shard.policy, Incarnation: incarnation}
	}
	holderConn := dial("a-s1")
	holder := startReportingNode(t, ctx, holderConn, report("a", "s1", shardOf(0)), sum)
	startReportingNode(t, ctx, dial("b"), report("b", "sb", shardOf(1)), sum)

	r := openReplicaForServer(t, t.TempDir())
	waitLeader(t, r)
	scfg := DefaultServerConfig()
	scfg.MinNodes, scfg.NodeTimeout, scfg.AnnounceEvery = 2, time.Second, 100*time.Millisecond
	scfg.Noise = mechanism.NewSeededNoiseSource(1)
	reg := prometheus.NewRegistry()
	var err error
	if scfg.Metrics, err = NewMetrics(reg, c.Run, "r1"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var participants []int // per applied step
	scfg.OnStep = func(p Progress) {
		mu.Lock()
		participants = append(participants, p.Participants)
		mu.Unlock()
	}
	steps := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(participants)
	}
	var logs lockedBuffer
	s, err := NewServer(r, coordConn, c, scfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = s.Run(runCtx)
	}()
	defer func() { stopRun(); <-done }()
	waitFor(t, ctx, "a first step", func() bool { return steps() > 0 })

	intruderConn := dial("a-s2")
	intruder := startReportingNode(t, ctx, intruderConn, report("a", "s2", shardOf(1)), sum)
	from := steps()
	waitFor(t, ctx, "20 steps with the intruder running", func() bool { return steps() >= from+20 })
	if detail := rejectSeatTaken + ": another live process holds node ID a"; !w.told("a", detail) {
		t.Errorf("the intruder was not told %q", detail)
	}
	mu.Lock()
	for i, p := range participants[from:] {
		if p != 2 {
			t.Errorf("step %d had %d participants with the intruder running, want 2 (a and b)", from+i+1, p)
		}
	}
	mu.Unlock()
	if b := s.Status().Blocked; b != "" {
		t.Errorf("rounds blocked (%s) with the intruder running; want its claim never counted", b)
	}
	if w.told("a", aggregation.ReasonUnknownNode.String()) {
		t.Errorf("node a was told %s: the intruder's claim displaced the holder's", aggregation.ReasonUnknownNode)
	}
	if v := labelled(t, reg, "dpcluster_coordinator_node_messages_refused_total", "reason", rejectSeatTaken); v < 1 {
		t.Errorf("node_messages_refused_total{%s} = %v, want at least 1", rejectSeatTaken, v)
	}
	var warned bool
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "refusing node") && strings.Contains(line, "reason="+rejectSeatTaken) {
			warned = strings.Contains(line, "incarnation=s2") && strings.Contains(line, "holder_incarnation=s1")
			break
		}
	}
	if !warned {
		t.Errorf("no warning about the refused incarnation naming incarnation=s2 and holder_incarnation=s1 in:\n%s", logs.String())
	}

	// The intruder's Leave, sent as it ends, does not free the seat.
	intruder.stopHeartbeats()
	<-intruder.heartbeatsDone
	if err := intruderConn.Publish(ctx, transport.Leave{Run: c.Run, NodeID: "a", Reason: "refused", Incarnation: "s2"}); err != nil {
		t.Fatal(err)
	}
	intruderConn.Close()
	// The holder dies without a Leave; a restarted process takes the
	// seat once it lapses (NodeTimeout after the holder's last message).
	holder.stopHeartbeats()
	<-holder.heartbeatsDone
	holderConn.Close()
	startReportingNode(t, ctx, dial("a-s3"), report("a", "s3", shardOf(0)), sum)
	waitFor(t, ctx, "the restarted process admitted", func() bool {
		for line := range strings.Lines(logs.String()) {
			if strings.Contains(line, `msg="node joined" node=a `) && strings.Contains(line, "incarnation=s3") {
				return true
			}
		}
		return false
	})
	from = steps()
	waitFor(t, ctx, "5 steps with the restarted process", func() bool { return steps() >= from+5 })
	mu.Lock()
	if p := participants[len(participants)-1]; p != 2 {
		t.Errorf("the last step had %d participants, want 2 (b and the restarted a)", p)
	}
	mu.Unlock()
}
