package node

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/transport"
	"github.com/dpcluster/dpcluster/transport/fake"
)

const (
	testRun  = "node-test"
	testNode = "node-a"
	// wait bounds every wait for a message that must arrive; generous for
	// -race on a loaded 2-core machine.
	wait = 15 * time.Second
	// quiet is how long a test waits to see that a message does NOT come,
	// after a deterministic barrier (Stats) already showed the input was
	// processed.
	quiet = 200 * time.Millisecond
)

// testLogger logs to stderr at debug level when DPC_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("DPC_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// fixture is a small logistic regression on a Gaussian mixture.
type fixture struct {
	m     *model.Model
	shard *dataset.Dataset
	theta []float32
}

func newFixture(t *testing.T, spec model.Spec) fixture {
	t.Helper()
	m, err := model.New(spec)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dataset.GaussianMixture(400, 8, 3, 3, 7)
	if err != nil {
		t.Fatal(err)
	}
	theta := make([]float32, m.NumParams())
	if err := m.Init(theta, 1); err != nil {
		t.Fatal(err)
	}
	return fixture{m: m, shard: d, theta: theta}
}

func logregFixture(t *testing.T) fixture {
	return newFixture(t, model.LogReg([]int{8}, 3))
}

// leaderSide plays the coordinator's leader: it records what nodes send.
type leaderSide struct {
	t          *testing.T
	conn       transport.Conn
	joins      chan transport.Join
	heartbeats chan transport.Heartbeat
	leaves     chan transport.Leave
	contribs   chan transport.Contribution
	needs      chan transport.NeedParams
}

func newLeaderSide(t *testing.T, conn transport.Conn) *leaderSide {
	t.Helper()
	l := &leaderSide{t: t, conn: conn,
		joins: make(chan transport.Join, 64), heartbeats: make(chan transport.Heartbeat, 1024),
		leaves: make(chan transport.Leave, 8), contribs: make(chan transport.Contribution, 64),
		needs: make(chan transport.NeedParams, 256)}
	if _, err := conn.Subscribe(transport.TopicNodes, func(m transport.Message) {
		switch v := m.(type) {
		case transport.Join:
			l.joins <- v
		case transport.Heartbeat:
			select {
			case l.heartbeats <- v:
			default: // the test reads only a few
			}
		case transport.Leave:
			l.leaves <- v
		case transport.NeedParams:
			select {
			case l.needs <- v:
			default:
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Subscribe(transport.TopicContributions, func(m transport.Message) {
		l.contribs <- m.(transport.Contribution)
	}); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *leaderSide) publish(m transport.Message) {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := l.conn.Publish(ctx, m); err != nil {
		l.t.Fatalf("leader publish %T: %v", m, err)
	}
}

func (l *leaderSide) announce(replica string, term uint64) {
	l.t.Helper()
	l.publish(transport.Leader{Run: testRun, ReplicaID: replica, Term: term})
}

func (l *leaderSide) params(version, term uint64, theta []float32) {
	l.t.Helper()
	l.publish(transport.Params{Run: testRun, Step: version, Version: version, Term: term, Values: theta})
}

// The run's q and C in testConfig, and so in every round of fx.round.
const (
	testQ    = 0.25
	testClip = 1.0
)

// round returns a valid RoundStart of the test run (q = testQ, C =
// testClip, fx's model) for step at parameters step-1, closing in d.
func (fx fixture) round(step, id, term uint64, d time.Duration) transport.RoundStart {
	return transport.RoundStart{Run: testRun, Step: step, RoundID: id, Term: term, Leader: "r1",
		ParamsVersion: step - 1, Deadline: time.Now().Add(d).UnixNano(), SampleRate: testQ, ClipNorm: testClip,
		ModelHash: fx.m.Hash()}
}

// recv returns the next value from ch or fails the test after wait.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		var zero T
		t.Fatalf("no %s within %v", what, wait)
		return zero
	}
}

// none fails if ch yields a value within quiet.
func none[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("unexpected %s: %+v", what, v)
	case <-time.After(quiet):
	}
}

// eventually polls cond until it holds or wait passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// natsPair starts an embedded NATS server owned by the node's client and
// connects a second client, the leader's, to it.
func natsPair(t *testing.T) (nodeConn, leaderConn *transport.Client) {
	t.Helper()
	ctx := context.Background()
	cfg := transport.DefaultConfig()
	cfg.Run = testRun
	cfg.Embedded.Port = -1
	nodeConn, err := transport.Connect(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodeConn.Close() })
	lcfg := cfg
	lcfg.URLs = []string{nodeConn.ServerURL()}
	leaderConn, err = transport.Connect(ctx, lcfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leaderConn.Close() })
	return nodeConn, leaderConn
}

// fakePair connects two clients over an in-memory fake network.
func fakePair(t *testing.T) (net *fake.Network, nodeConn, leaderConn *transport.Client) {
	t.Helper()
	net = fake.NewNetwork(3, fake.Options{MaxPayload: 64 << 10})
	cfg := transport.DefaultClientConfig()
	cfg.Run = testRun
	nodeConn, err := transport.NewClient(net.Link("node"), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodeConn.Close() })
	leaderConn, err = transport.NewClient(net.Link("leader"), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leaderConn.Close() })
	return net, nodeConn, leaderConn
}

// testConfig is DefaultConfig with short timers.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.ID, cfg.Run = testNode, testRun
	cfg.SampleRate, cfg.ClipNorm = testQ, testClip
	cfg.ShardIndex, cfg.ShardCount, cfg.ShardSeed = 0, 1, 1
	cfg.HeartbeatEvery = 20 * time.Millisecond
	cfg.ParamsGrace = 0
	cfg.ParamsRetry = 30 * time.Millisecond
	return cfg
}

// running is a Worker whose Run is in progress.
type running struct {
	w      *Worker
	cancel context.CancelFunc
	done   chan error
}

// start builds a Worker and runs it until the test ends (or the caller
// reads done).
func start(t *testing.T, cfg Config, fx fixture, conn transport.Conn) *running {
	t.Helper()
	return startLogged(t, cfg, fx, conn, testLogger())
}

// startLogged is start with the Worker logging to log.
func startLogged(t *testing.T, cfg Config, fx fixture, conn transport.Conn, log *slog.Logger) *running {
	t.Helper()
	w, err := NewWorker(cfg, fx.m, fx.shard, conn, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{w: w, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-r.done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Logf("Run: %v", err)
			}
		case <-time.After(wait):
			t.Error("Run did not return after cancel")
		}
	})
	return r
}

// result waits for Run's result.
func (r *running) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(wait):
		t.Fatal("Run did not return")
		return nil
	}
}

func (r *running) skipped(reason SkipReason) uint64 { return r.w.Stats().Skipped[reason] }
