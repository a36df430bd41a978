package coordinator

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/seed"
	"github.com/dpcluster/dpcluster/transport"
)

// natsPair starts an embedded NATS server (owned by the first client) on a
// free port and returns a connect function for more clients.
func natsPair(t *testing.T, run string) (server *transport.Client, dial func(name string) *transport.Client) {
	t.Helper()
	connect := func(name string, urls []string) *transport.Client {
		t.Helper()
		cfg := transport.DefaultConfig()
		cfg.Run, cfg.Name, cfg.URLs = run, name, urls
		cfg.Embedded.Port = -1 // used when urls is empty
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := transport.Connect(ctx, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	srv := connect("coord", nil)
	return srv, func(name string) *transport.Client { return connect(name, []string{srv.ServerURL()}) }
}

// identity is the shard and seed policy a script node reports.
type identity struct {
	index, count int
	seed         uint64
	size         int64
	policy       seed.Policy
}

// shardOf is shard i of 8 (seed 1) of the test run's N = 10000: 1250
// examples, the size admitNode requires of it, sampled from the CSPRNG.
func shardOf(i int) identity {
	return identity{index: i, count: 8, seed: 1, size: 1250, policy: seed.Crypto}
}

// scriptNode is a test node: it joins, heartbeats (reporting id), and
// answers every round it sees once with a fixed contribution (count, sum)
// from sumFor, or not at all where sumFor returns a nil sum.
type scriptNode struct {
	id     string
	conn   *transport.Client
	sumFor func(step uint64) (int64, []float32)

	mu       sync.Mutex
	answered map[uint64]int // step → answers
	status   []transport.Status

	stopHeartbeats context.CancelFunc
	heartbeatsDone chan struct{}
}

// leave stops the node's heartbeats, then publishes Leave.
func (n *scriptNode) leave(ctx context.Context) error {
	n.stopHeartbeats()
	<-n.heartbeatsDone
	return n.conn.Publish(ctx, transport.Leave{Run: n.conn.Subjects().Run(), NodeID: n.id, Reason: "test"})
}

func startScriptNode(t *testing.T, ctx context.Context, conn *transport.Client, id, modelHash string, ident identity, sumFor func(uint64) (int64, []float32)) *scriptNode {
	t.Helper()
	return startReportingNode(t, ctx, conn, transport.Heartbeat{Run: conn.Subjects().Run(), NodeID: id, ShardSize: ident.size, ModelHash: modelHash,
		ShardIndex: ident.index, ShardCount: ident.count, ShardSeed: ident.seed, SeedPolicy: ident.policy}, sumFor)
}

// startReportingNode starts a script node that heartbeats hb (which names
// the node and its run) every 100 ms, for a test of a report field that
// identity does not hold.
func startReportingNode(t *testing.T, ctx context.Context, conn *transport.Client, hb transport.Heartbeat, sumFor func(uint64) (int64, []float32)) *scriptNode {
	t.Helper()
	id := hb.NodeID
	n := &scriptNode{id: id, conn: conn, sumFor: sumFor, answered: make(map[uint64]int), heartbeatsDone: make(chan struct{})}
	hctx, stop := context.WithCancel(ctx)
	n.stopHeartbeats = stop
	t.Cleanup(stop)
	run := conn.Subjects().Run()
	if _, err := conn.Subscribe(transport.TopicRounds, func(m transport.Message) {
		rs := m.(transport.RoundStart)
		count, sum := n.sumFor(rs.Step)
		if sum == nil {
			return // a silent member: it heartbeats but does not answer
		}
		n.mu.Lock()
		n.answered[rs.Step]++
		n.mu.Unlock()
		_ = conn.Publish(ctx, transport.Contribution{Run: run, Step: rs.Step, RoundID: rs.RoundID, NodeID: id, Count: count, Sum: sum})
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Subscribe(transport.TopicStatus, func(m transport.Message) {
		st := m.(transport.Status)
		n.mu.Lock()
		n.status = append(n.status, st)
		n.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	beat := func() { _ = conn.Publish(ctx, hb) }
	beat()
	go func() {
		defer close(n.heartbeatsDone)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-hctx.Done():
				return
			case <-tick.C:
				beat()
			}
		}
	}()
	return n
}

func (n *scriptNode) gotStatus(code transport.StatusCode) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range n.status {
		if s.Code == code && (s.Node == "" || s.Node == n.id) {
			return true
		}
	}
	return false
}

// sentinelSum is a recognisable clipped sum: every coordinate is a
// distinct value built from the node and step, scaled so the L2 norm is
// 0.9·count·C.
func sentinelSum(node int, step uint64, dim int, count int64, clip float64) []float32 {
	s := make([]float32, dim)
	var ss float64
	for i := range s {
		s[i] = float32(1 + float64(node)*0.1 + float64(step)*0.001 + float64(i)*1e-5)
		ss += float64(s[i]) * float64(s[i])
	}
	scale := 0.9 * float64(count) * clip / math.Sqrt(ss)
	for i := range s {
		s[i] = float32(float64(s[i]) * scale)
	}
	return s
}

func openReplicaForServer(t *testing.T, dir string, opts ...ledger.Option) *Replica {
	t.Helper()
	r := openTestReplica(t, dir, freeAddr(t), opts...)
	t.Cleanup(func() { r.Close() })
	return r
}

// TestServerTrainsOverNATS runs the leader's round loop over a real NATS
// server and a real single-replica Raft: three scripted nodes answer each
// round; the run stops at MaxSteps. It checks that θ equals the optimizer
// run directly on (S + z)/B with the same seeded noise (noise is added once,
// to the float64 aggregate of the contributions in node order), that the
// ledger has one charge per applied step and audits clean, and that nodes
// are told the run is done. It runs in the default noise mode (discrete)
// and in the legacy floating-point one.
func TestServerTrainsOverNATS(t *testing.T) {
	for _, mode := range []string{NoiseDiscrete, NoiseLegacy} {
		t.Run(noiseModeLabel(mode), func(t *testing.T) { testServerTrainsOverNATS(t, mode) })
	}
}

func testServerTrainsOverNATS(t *testing.T, mode string) {
	const steps = 12
	dir := t.TempDir()
	c := testRunConfig()
	c.MaxSteps, c.NoiseMode = steps, mode
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	coordConn, dial := natsPair(t, c.Run)
	counts := []int64{30, 35, 40}
	var nodes []*scriptNode
	for i, id := range []string{"n0", "n1", "n2"} {
		nodes = append(nodes, startScriptNode(t, ctx, dial(id), id, c.ModelHash, shardOf(i), func(step uint64) (int64, []float32) {
			return counts[i], sentinelSum(i, step, c.Dim, counts[i], c.Optimizer.ClipNorm)
		}))
	}

	r := openReplicaForServer(t, dir)
	waitLeader(t, r)
	var err error
	scfg := DefaultServerConfig()
	scfg.MinNodes = 3
	scfg.Noise = mechanism.NewSeededNoiseSource(42)
	var progress []Progress
	scfg.OnStep = func(p Progress) { progress = append(progress, p) }
	reg := prometheus.NewRegistry()
	if scfg.Metrics, err = NewMetrics(reg, c.Run, "r1"); err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(r, coordConn, c, scfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := s.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Steps != steps || sum.Charges != steps || sum.Stopped != stopMaxSteps {
		t.Fatalf("summary %+v", sum)
	}
	if len(progress) != steps || progress[steps-1].Participants != 3 {
		t.Errorf("progress: %d calls, last %+v", len(progress), progress[len(progress)-1])
	}
	for name, want := range map[string]float64{
		"dpcluster_coordinator_step":                         steps,
		"dpcluster_coordinator_ledger_charges_total":         steps,
		"dpcluster_coordinator_contributions_accepted_total": 3 * steps,
		"dpcluster_coordinator_round_participants":           3,
		"dpcluster_coordinator_epsilon_spent":                sum.Epsilon,
	} {
		if got := gaugeValue(t, reg, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	for phase, n := range phaseCounts(t, reg) {
		if n != steps {
			t.Errorf("step_phase_seconds{phase=%q} has %d samples, want one per step (%d)", phase, n, steps)
		}
	}

	// Reference: the same seeded noise over the float64 sum of the three
	// contributions, in node-ID order.
	noise := mechanism.NewSeededNoiseSource(42)
	grads := make([][]float32, steps)
	for st := range grads {
		agg := make([]float64, c.Dim)
		for i := range nodes {
			for j, v := range sentinelSum(i, uint64(st+1), c.Dim, counts[i], c.Optimizer.ClipNorm) {
				agg[j] += float64(v)
			}
		}
		grads[st] = make([]float32, c.Dim)
		if err := privatize(c, noise, nil, grads[st], agg); err != nil {
			t.Fatal(err)
		}
	}
	got, step := r.FSM().Params(nil)
	if step != steps || !bitsEqual(got, reference(t, c, grads)) {
		t.Errorf("θ differs from the reference run on (S+z)/B (step %d)", step)
	}
	rep, err := ledger.Audit(filepath.Join(dir, LedgerFile))
	if err != nil || !rep.OK || rep.Applied != steps || rep.Charges != steps || rep.Mechanism != mode {
		t.Errorf("audit: %+v, %v", rep, err)
	}
	for _, n := range nodes {
		n.mu.Lock()
		for st := uint64(1); st <= steps; st++ {
			if n.answered[st] != 1 {
				t.Errorf("node %s saw round %d %d times", n.id, st, n.answered[st])
			}
		}
		n.mu.Unlock()
		if !n.gotStatus(transport.StatusDone) {
			t.Errorf("node %s was not told the run is done", n.id)
		}
	}

	// Nothing un-noised is persisted: no node's sum, nor the aggregate S,
	// appears (as float32 or float64 bytes) anywhere under the data dir —
	// Raft log segments, snapshots, ledger.
	if err := r.Snapshot(); err != nil {
		t.Fatal(err)
	}
	var needles [][]byte
	for st := uint64(1); st <= steps; st++ {
		agg := make([]float64, c.Dim)
		for i := range nodes {
			v := sentinelSum(i, st, c.Dim, counts[i], c.Optimizer.ClipNorm)
			needles = append(needles, floatBytes32(v[:8]))
			for j := range v {
				agg[j] += float64(v[j])
			}
		}
		agg32 := make([]float32, 8)
		for j := range agg32 {
			agg32[j] = float32(agg[j])
		}
		needles = append(needles, floatBytes32(agg32), floatBytes64(agg[:8]))
	}
	scanned := scanDir(t, dir, needles)
	if scanned < 3 {
		t.Errorf("scanned only %d files under the data dir", scanned)
	}
}

// scanDir fails the test if any needle occurs in any file under dir, and
// returns the number of files scanned.
func scanDir(t *testing.T, dir string, needles [][]byte) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n++
		for _, nd := range needles {
			if bytes.Contains(data, nd) {
				t.Errorf("%s holds un-noised values", path)
				return nil
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func floatBytes32(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func floatBytes64(v []float64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(x))
	}
	return b
}

// TestServerRejectsBadContributions: a node sending NaN, a node sending a
// sum longer than count·C, and a node running another model are refused
// with a reason; the rounds still complete with the good node, and the bad
// ones are told why.
func TestServerRejectsBadContributions(t *testing.T) {
	dir := t.TempDir()
	c := testRunConfig()
	c.MaxSteps = 3
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coordConn, dial := natsPair(t, c.Run)
	good := startScriptNode(t, ctx, dial("good"), "good", c.ModelHash, shardOf(0), func(step uint64) (int64, []float32) {
		return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm)
	})
	nan := startScriptNode(t, ctx, dial("nan"), "nan", c.ModelHash, shardOf(1), func(step uint64) (int64, []float32) {
		s := sentinelSum(1, step, c.Dim, 10, c.Optimizer.ClipNorm)
		s[3] = float32(math.NaN())
		return 10, s
	})
	long := startScriptNode(t, ctx, dial("long"), "long", c.ModelHash, shardOf(2), func(step uint64) (int64, []float32) {
		return 1, sentinelSum(2, step, c.Dim, 10, c.Optimizer.ClipNorm) // norm 9·C > 1·C
	})
	other := startScriptNode(t, ctx, dial("other"), "other", "another-model", shardOf(3), func(step uint64) (int64, []float32) {
		return 10, sentinelSum(3, step, c.Dim, 10, c.Optimizer.ClipNorm)
	})

	r := openReplicaForServer(t, dir)
	waitLeader(t, r)
	scfg := DefaultServerConfig()
	scfg.MinNodes = 3
	scfg.RoundTimeout = 500 * time.Millisecond
	scfg.Noise = mechanism.NewSeededNoiseSource(1)
	s, err := NewServer(r, coordConn, c, scfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var progress []Progress
	s.cfg.OnStep = func(p Progress) { progress = append(progress, p) }
	sum, err := s.Run(ctx)
	if err != nil || sum.Steps != 3 {
		t.Fatalf("Run: %+v, %v", sum, err)
	}
	for _, p := range progress {
		if p.Participants != 1 {
			t.Errorf("step %d accepted %d contributions, want 1 (the good node)", p.Step, p.Participants)
		}
	}
	for _, tc := range []struct {
		n      *scriptNode
		detail string
	}{{nan, "nan"}, {long, "norm_bound"}, {other, "model_hash"}} {
		tc.n.mu.Lock()
		found := false
		for _, st := range tc.n.status {
			if st.Code == transport.StatusRejected && st.Node == tc.n.id && st.Detail == tc.detail {
				found = true
			}
		}
		tc.n.mu.Unlock()
		if !found {
			t.Errorf("node %s was not told %q", tc.n.id, tc.detail)
		}
	}
	// The good node answered every step's round: once, or again when a
	// loaded machine delivered its answer after the 500 ms deadline and
	// the leader, with no contribution to release, opened the step's
	// round anew (closeRound); the steps' single participants above are
	// what was accepted.
	good.mu.Lock()
	for st := uint64(1); st <= 3; st++ {
		if good.answered[st] < 1 {
			t.Errorf("good node never answered round %d", st)
		}
	}
	good.mu.Unlock()
}

// runOneScriptedNode runs a one-replica Server for c in dir (seeded noise
// from noiseSeed) with one scripted node that answers every round with a
// sentinel sum of 10 examples, and returns what Run returns.
func runOneScriptedNode(t *testing.T, dir string, c RunConfig, noiseSeed uint64) (Summary, error) {
	t.Helper()
	_, sum, err := runScripted(t, dir, c, noiseSeed, func(step uint64) (int64, []float32) {
		return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm)
	}, nil, nil)
	return sum, err
}

// runScripted runs c on one replica in dir with one scripted node that
// answers each round with sumFor(step); tune adjusts the ServerConfig and
// opened sees the replica once it is open (either may be nil).
func runScripted(t *testing.T, dir string, c RunConfig, noiseSeed uint64, sumFor func(uint64) (int64, []float32),
	tune func(*ServerConfig), opened func(*Replica)) (*scriptNode, Summary, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coordConn, dial := natsPair(t, c.Run)
	n := startScriptNode(t, ctx, dial("n"), "n", c.ModelHash, shardOf(0), sumFor)
	r := openReplicaForServer(t, dir)
	if opened != nil {
		opened(r)
	}
	waitLeader(t, r)
	scfg := DefaultServerConfig()
	scfg.Noise = mechanism.NewSeededNoiseSource(noiseSeed)
	if tune != nil {
		tune(&scfg)
	}
	s, err := NewServer(r, coordConn, c, scfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := s.Run(ctx)
	return n, sum, err
}

// TestServerStopsAtBudget: with no MaxSteps, the leader stops the run when
// one more step would exceed the target ε; the ledger stays within it.
func TestServerStopsAtBudget(t *testing.T) {
	dir := t.TempDir()
	c := testRunConfig()
	// q = 0.01, σ = 1: find a target that allows a handful of steps.
	eps5, _, err := accounting.RDP{}.EpsilonOrder(c.Event(), 5, c.Delta)
	if err != nil {
		t.Fatal(err)
	}
	eps6, _, _ := accounting.RDP{}.EpsilonOrder(c.Event(), 6, c.Delta)
	c.TargetEpsilon = (eps5 + eps6) / 2
	sum, err := runOneScriptedNode(t, dir, c, 3)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Steps != 5 || sum.Stopped != stopBudget || sum.Epsilon > c.TargetEpsilon {
		t.Fatalf("summary %+v, target %v", sum, c.TargetEpsilon)
	}
	rep, err := ledger.Audit(filepath.Join(dir, LedgerFile))
	if err != nil || !rep.OK || rep.Applied != 5 {
		t.Errorf("audit %+v, %v", rep, err)
	}
}

// TestServerRunCancel: Run returns ctx.Err() when cancelled while waiting
// for nodes, and unsubscribes.
func TestServerRunCancel(t *testing.T) {
	c := testRunConfig()
	coordConn, _ := natsPair(t, c.Run)
	r := openReplicaForServer(t, t.TempDir())
	waitLeader(t, r)
	scfg := DefaultServerConfig()
	scfg.Noise = mechanism.NewSeededNoiseSource(3)
	s, err := NewServer(r, coordConn, c, scfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := s.Run(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run = %v, want deadline exceeded", err)
	}
}

// TestNewServerSeedPolicy: a seeded noise source needs the seeded policy,
// and the crypto policy a crypto source.
func TestNewServerSeedPolicy(t *testing.T) {
	c := testRunConfig()
	c.SeedPolicy = seed.Crypto
	if _, err := NewServer(nil, nil, c, ServerConfig{Noise: mechanism.NewSeededNoiseSource(1), RoundTimeout: 1, MinNodes: 1, NodeTimeout: 2, AnnounceEvery: 1}, nil); !errors.Is(err, ErrInvalidRunConfig) {
		t.Errorf("seeded source with crypto policy: %v", err)
	}
	c.SeedPolicy = seed.Seeded
	if _, err := NewServer(nil, nil, c, DefaultServerConfig(), nil); !errors.Is(err, ErrInvalidRunConfig) {
		t.Errorf("crypto source with seeded policy: %v", err)
	}
	bad := DefaultServerConfig()
	bad.MinNodes = 0
	if _, err := NewServer(nil, nil, c, bad, nil); err == nil {
		t.Error("MinNodes 0 accepted")
	}
}

// gaugeValue returns the value of the single series of metric name in reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// phaseCounts returns the sample count of each phase of
// dpcluster_coordinator_step_phase_seconds, failing if any is missing.
func phaseCounts(t *testing.T, reg *prometheus.Registry) map[string]uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "dpcluster_coordinator_step_phase_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "phase" {
					out[lp.GetValue()] = m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	for _, p := range []string{phasePrivatize, phaseCommit, phaseRelease} {
		if _, ok := out[p]; !ok {
			t.Fatalf("no step_phase_seconds{phase=%q}", p)
		}
	}
	return out
}

// TestServerLedgerFailureStopsRun: the ledger's fsync fails (a full disk)
// from round 4 on. The replica fails closed: Server.Run returns an error
// wrapping ErrFatal and ledger.ErrBroken, no θ is published past the last
// charge made durable, and the ledger on disk audits clean. Step 4's
// charge is proposed ahead, as θ_3 goes out, so the fsync that fails is
// step 4's charge, or step 5's when step 4's was durable before round 4
// opened (a race the test used to lose now and then: "last released θ is
// for step 4, want 3", with step 4 charged).
func TestServerLedgerFailureStopsRun(t *testing.T) {
	dir := t.TempDir()
	c := testRunConfig()
	c.MaxSteps = 10
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coordConn, dial := natsPair(t, c.Run)
	var failing atomic.Bool
	startScriptNode(t, ctx, dial("n"), "n", c.ModelHash, shardOf(0), func(step uint64) (int64, []float32) {
		if step == 4 {
			failing.Store(true) // the disk fills up during round 4
		}
		return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm)
	})
	var maxParams atomic.Uint64
	watcher := dial("watcher")
	if _, err := watcher.Subscribe(transport.TopicParams, func(m transport.Message) {
		if p := m.(transport.Params); p.Step > maxParams.Load() {
			maxParams.Store(p.Step)
		}
	}); err != nil {
		t.Fatal(err)
	}
	r := openReplicaForServer(t, dir, ledger.WithSyncHook(func(fh *os.File) error {
		if failing.Load() {
			return syscall.ENOSPC
		}
		return fh.Sync()
	}))
	waitLeader(t, r)
	scfg := DefaultServerConfig()
	scfg.Noise = mechanism.NewSeededNoiseSource(5)
	s, err := NewServer(r, coordConn, c, scfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Run(ctx)
	if !errors.Is(err, ErrFatal) || !errors.Is(err, ledger.ErrBroken) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Run = %v, want a fatal ledger error naming the cause", err)
	}
	rep, err := ledger.Audit(filepath.Join(dir, LedgerFile))
	if err != nil || !rep.OK || rep.Charges < 3 || rep.Charges > 4 || rep.Applied+rep.Unconfirmed != rep.Charges {
		t.Fatalf("audit after the failure: %+v, %v", rep, err)
	}
	// Params for the last charged step were released (after its commit);
	// wait for them to arrive, then check the next step's never were.
	last := uint64(rep.Charges)
	deadline := time.Now().Add(5 * time.Second)
	for maxParams.Load() < last && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // a later θ, had one been sent, arrives too
	if got := maxParams.Load(); got != last {
		t.Errorf("last released θ is for step %d, the last durable charge is step %d's", got, last)
	}
}

// TestServerJoin: a replica started without bootstrapping asks,
// over NATS, to join; the leader adds it as a voter, it catches up to the
// same state digest (removal: TestServerRoundsGoOnDuringMembershipChange).
func TestServerJoin(t *testing.T) {
	c := testRunConfig()
	c.MaxSteps = 40
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coordConn, dial := natsPair(t, c.Run)
	var gate atomic.Bool // rounds wait until the second replica is in
	startScriptNode(t, ctx, dial("n"), "n", c.ModelHash, shardOf(0), func(step uint64) (int64, []float32) {
		for step > 5 && !gate.Load() && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm)
	})
	r1 := openReplicaForServer(t, t.TempDir())
	waitLeader(t, r1)
	cfg2 := DefaultReplicaConfig()
	cfg2.ID, cfg2.RaftAddr, cfg2.DataDir = "r2", freeAddr(t), t.TempDir()
	r2, err := OpenReplica(cfg2, testInit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r2.Close() })

	scfg := DefaultServerConfig()
	scfg.Noise, scfg.AnnounceEvery = mechanism.NewSeededNoiseSource(8), 100*time.Millisecond
	s1, err := NewServer(r1, coordConn, c, scfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	scfg.Join = true
	s2, err := NewServer(r2, dial("r2"), c, scfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		sum Summary
		err error
	}
	res1, res2 := make(chan result, 1), make(chan result, 1)
	go func() { s, err := s1.Run(ctx); res1 <- result{s, err} }()
	go func() { s, err := s2.Run(ctx); res2 <- result{s, err} }()
	for !r1.HasVoter("r2", r2.Addr()) {
		if ctx.Err() != nil {
			t.Fatal("r2 was never added")
		}
		time.Sleep(10 * time.Millisecond)
	}
	gate.Store(true)
	a, b := <-res1, <-res2
	if a.err != nil || b.err != nil || a.sum.Steps != 40 || b.sum.Steps != 40 {
		t.Fatalf("r1 %+v %v; r2 %+v %v", a.sum, a.err, b.sum, b.err)
	}
	if a.sum.Digest != b.sum.Digest || a.sum.Digest == "" {
		t.Errorf("digests differ: %s vs %s", a.sum.Digest, b.sum.Digest)
	}
	checkReplicaViews(t, s1, s2)
}

// checkReplicaViews checks what the leader s1 and the follower s2 of
// TestServerJoin publish for dashboards (Status, History) after the run:
// each shows itself and the other from its last report;
// the follower records the steps it applied, without the round details
// only the leader knows.
func checkReplicaViews(t *testing.T, s1, s2 *Server) {
	t.Helper()
	for _, tc := range []struct {
		s              *Server
		self, peer     string
		role, peerRole Role
	}{{s1, "r1", "r2", RoleLeader, RoleFollower}, {s2, "r2", "r1", RoleFollower, RoleLeader}} {
		st := tc.s.Status()
		if st.Replica != tc.self || st.Step != 40 || st.Stopped != stopMaxSteps || len(st.Replicas) != 2 {
			t.Fatalf("%s: status %+v", tc.self, st)
		}
		for _, r := range st.Replicas {
			want := ReplicaStatus{ID: tc.peer, Role: tc.peerRole, Step: 40, Leader: "r1"}
			if r.Self {
				want = ReplicaStatus{ID: tc.self, Role: tc.role, Step: 40, Leader: "r1", Self: true}
			}
			stale := tc.s == s2 && !r.Self
			if stale {
				// The leader's last report may predate its last
				// steps, even its first: it reports every
				// AnnounceEvery (100 ms here), and the 40 steps can
				// take less. (The leader's view of the follower is
				// exact: its drain waited for the follower's report of
				// step 40.)
				want.Step = min(r.Step, 40)
			}
			if r.ID != want.ID || r.Role != want.Role || r.Step != want.Step || r.Step == 0 && !stale || r.Leader != want.Leader ||
				r.Self != want.Self || r.Term == 0 || r.Reported.IsZero() {
				t.Errorf("%s's view of %s: %+v, want %+v", tc.self, r.ID, r, want)
			}
		}
		h := tc.s.History()
		if n := len(h.Steps); n == 0 || h.Steps[n-1].Step != 40 || h.Steps[n-1].Epsilon != st.Epsilon {
			t.Fatalf("%s: history %+v", tc.self, h.Steps)
		}
		if tc.s == s2 {
			for _, p := range h.Steps {
				if p.Participants != 0 || p.RoundSeconds != 0 {
					t.Errorf("follower's history has round details: %+v", p)
				}
			}
		}
	}
}

// TestChargeCommittedWhileRoundRuns: a step's charge does not depend on
// the data, so the leader proposes it before the step's round closes (as
// the previous step is released, or as the round opens), and its commit
// and fsync overlap the nodes' computation instead of following it on the
// step's chain (issue 25). The scripted node answers round t only once the
// ledger holds t charges (or after 3 s): before, the charge was proposed
// after the round closed, so no answer ever found it.
func TestChargeCommittedWhileRoundRuns(t *testing.T) {
	c := testRunConfig()
	c.MaxSteps = 4
	var rep atomic.Pointer[Replica]
	var early atomic.Int64 // rounds answered before their charge was seen
	_, sum, err := runScripted(t, t.TempDir(), c, 5, func(step uint64) (int64, []float32) {
		for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(time.Millisecond) {
			if r := rep.Load(); r != nil && r.FSM().State().Charges >= step {
				break
			}
			if time.Now().After(deadline) {
				early.Add(1)
				break
			}
		}
		return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm)
	}, nil, rep.Store)
	if err != nil || sum.Steps != 4 || sum.Charges != 4 {
		t.Fatalf("Run = %+v, %v; want 4 steps, 4 charges", sum, err)
	}
	if n := early.Load(); n != 0 {
		t.Errorf("%d of 4 rounds answered without their step charged: the charge follows the round", n)
	}
}

// TestEmptyRoundKeepsItsCharge: a round that closes with no contribution
// releases nothing, and its step's charge (proposed before the round
// opened) is kept for the retried round: one charge per released step,
// none wasted on the empty round.
func TestEmptyRoundKeepsItsCharge(t *testing.T) {
	dir := t.TempDir()
	c := testRunConfig()
	c.MaxSteps = 4
	var silent atomic.Bool
	n, sum, err := runScripted(t, dir, c, 6, func(step uint64) (int64, []float32) {
		if step == 2 && silent.CompareAndSwap(false, true) {
			time.Sleep(900 * time.Millisecond) // past the round's deadline: it closes empty
		}
		return 10, sentinelSum(0, step, c.Dim, 10, c.Optimizer.ClipNorm)
	}, func(s *ServerConfig) { s.RoundTimeout = 300 * time.Millisecond }, nil)
	if err != nil || sum.Steps != 4 || sum.Charges != 4 {
		t.Fatalf("Run = %+v, %v; want 4 steps, 4 charges", sum, err)
	}
	n.mu.Lock()
	rounds := n.answered[2]
	n.mu.Unlock()
	if rounds < 2 {
		t.Errorf("step 2 had %d round(s), want the empty one and its retry", rounds)
	}
	rep, err := ledger.Audit(filepath.Join(dir, LedgerFile))
	if err != nil || !rep.OK || rep.Charges != 4 || rep.Applied != 4 {
		t.Errorf("audit %+v, %v", rep, err)
	}
}
