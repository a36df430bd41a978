package coordinatortest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/node"
	"github.com/dpcluster/dpcluster/pki"
	"github.com/dpcluster/dpcluster/seed"
	"github.com/dpcluster/dpcluster/transport"
	"github.com/dpcluster/dpcluster/transport/fake"
)

// ErrInvalidOptions is returned (wrapped) by Options.Validate.
var ErrInvalidOptions = errors.New("coordinatortest: invalid options")

// Options configure a Cluster. The zero value is completed by
// DefaultOptions' values field by field.
type Options struct {
	// Replicas is the number of coordinator replicas bootstrapped
	// together, named r0, r1, …; Nodes the number of nodes, n0, n1, ….
	Replicas int
	Nodes    int
	// Seed seeds everything random the harness controls: replica i's
	// noise source (Seed+1+i: the replicas draw different noise, so a θ_t
	// released by two leaders from two proposals differs), the nodes'
	// Poisson sampling, the dataset and the fake network's faults. The
	// run is therefore SeedSeeded: NOT private, a test run.
	Seed uint64
	// MaxSteps ends the run (default 40).
	MaxSteps int64
	// RoundTimeout is the Server's round deadline (default 300 ms).
	RoundTimeout time.Duration
	// RaftTimeout is the replicas' heartbeat, election and lease timeout
	// (default 100 ms).
	RaftTimeout time.Duration
	// Logger receives every replica's, server's and node's logs (nil:
	// discarded).
	Logger *slog.Logger
	// CrashAt, if set, kills the leader at a point of its commit path
	// (crash.go).
	CrashAt *CrashAt
}

// DefaultOptions returns 3 replicas, 3 nodes, seed 1, 40 steps, rounds of
// at most 300 ms and Raft timeouts of 100 ms: failover in a few hundred
// milliseconds, and steady under -race on a loaded 2-core machine.
func DefaultOptions() Options {
	return Options{Replicas: 3, Nodes: 3, Seed: 1, MaxSteps: 40,
		RoundTimeout: 300 * time.Millisecond, RaftTimeout: 100 * time.Millisecond}
}

func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.Replicas == 0 {
		o.Replicas = d.Replicas
	}
	if o.Nodes == 0 {
		o.Nodes = d.Nodes
	}
	if o.MaxSteps == 0 {
		o.MaxSteps = d.MaxSteps
	}
	if o.RoundTimeout == 0 {
		o.RoundTimeout = d.RoundTimeout
	}
	if o.RaftTimeout == 0 {
		o.RaftTimeout = d.RaftTimeout
	}
	return o
}

// Validate checks ranges (after defaults are filled in).
func (o Options) Validate() error {
	switch {
	case o.Replicas < 1 || o.Replicas > 9:
		return fmt.Errorf("%w: Replicas %d must be in [1, 9]", ErrInvalidOptions, o.Replicas)
	case o.Nodes < 1 || o.Nodes > 16:
		return fmt.Errorf("%w: Nodes %d must be in [1, 16]", ErrInvalidOptions, o.Nodes)
	case o.MaxSteps < 1:
		return fmt.Errorf("%w: MaxSteps %d must be positive", ErrInvalidOptions, o.MaxSteps)
	case o.RoundTimeout < 10*time.Millisecond:
		return fmt.Errorf("%w: RoundTimeout %v must be at least 10ms", ErrInvalidOptions, o.RoundTimeout)
	case o.RaftTimeout < 10*time.Millisecond:
		return fmt.Errorf("%w: RaftTimeout %v must be at least 10ms", ErrInvalidOptions, o.RaftTimeout)
	}
	return nil
}

// Cluster is a training run in one process: coordinator replicas (real
// coordinator.Replica over durable stores in t.TempDir(), Raft over raft's
// in-memory transport, each with a coordinator.Server), node.Workers, and
// an observer that records every Params message, all over one
// fake.Network. Its methods are safe for concurrent use. NewCluster
// registers its shutdown with t.Cleanup.
type Cluster struct {
	t    testing.TB
	opts Options
	base string // the replicas' data dirs are base/ID
	// Run is the run's configuration (SeedSeeded, discrete noise).
	Run coordinator.RunConfig

	net   *fake.Network
	model *model.Model
	init  coordinator.InitFunc
	ctx   context.Context
	stop  context.CancelFunc
	log   *slog.Logger

	obs *observer

	mu       sync.Mutex
	replicas map[string]*member // by ID, removed ones included
	order    []string           // replica IDs in creation order
	nodes    []*worker
	cut      map[[2]string]bool // the current partition, both directions
	nodeIDs  []string

	crashOnce atomic.Bool // CrashAt has fired

	wg sync.WaitGroup // every goroutine the cluster starts
}

// member is one replica and its Server.
type member struct {
	id      string
	addr    raft.ServerAddress
	trans   *raft.InmemTransport
	replica *coordinator.Replica
	dir     string
	conn    *transport.Client
	stop    context.CancelFunc
	done    chan struct{} // closed when the Server's Run returned
	sum     coordinator.Summary
	err     error
	removed bool
	crashed bool          // killed by Crash (removed too)
	killed  chan struct{} // closed when Crash starts stopping it
	closed  chan struct{} // closed once Crash closed it
}

type worker struct {
	id   string
	conn *transport.Client
	stop context.CancelFunc
	done chan struct{}
}

// NewCluster starts opts.Replicas replicas (bootstrapped as one Raft
// cluster, fully connected), their Servers, and opts.Nodes nodes, and
// returns at once; Leader waits for the first election. It fails t on a
// set-up error. Everything stops in t.Cleanup.
func NewCluster(t testing.TB, opts Options) *Cluster {
	t.Helper()
	opts = opts.withDefaults()
	if err := opts.Validate(); err != nil {
		t.Fatal(err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	spec := model.LogReg([]int{8}, 3)
	m, err := model.New(spec)
	if err != nil {
		t.Fatal(err)
	}
	data, err := dataset.GaussianMixture(150*opts.Nodes, 8, 3, 3, opts.Seed)
	if err != nil {
		t.Fatal(err)
	}
	shards, err := dataset.ShardIID(data, opts.Nodes, opts.Seed)
	if err != nil {
		t.Fatal(err)
	}
	// Made before the shutdown is registered, so removed after it.
	base := t.TempDir()
	ctx, stop := context.WithCancel(context.Background())
	c := &Cluster{base: base,
		t: t, opts: opts, Run: runConfig(m, int64(data.Len()), opts.MaxSteps),
		net: fake.NewNetwork(opts.Seed, fake.Options{}), model: m, ctx: ctx, stop: stop, log: log,
		replicas: make(map[string]*member), cut: make(map[[2]string]bool),
	}
	c.init = func(rc coordinator.RunConfig) ([]float32, error) { return rc.Theta0(m) }
	t.Cleanup(c.shutdown)
	if c.obs, err = newObserver(c); err != nil {
		t.Fatal(err)
	}
	var peers []raft.Server
	for i := range opts.Replicas {
		id := fmt.Sprintf("r%d", i)
		peers = append(peers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(id)})
	}
	for _, p := range peers {
		if err := c.startReplica(string(p.ID), peers); err != nil {
			t.Fatal(err)
		}
	}
	for i := range opts.Nodes {
		if err := c.startNode(i, shards[i]); err != nil {
			t.Fatal(err)
		}
	}
	c.wg.Add(1)
	go func() { defer c.wg.Done(); c.obs.sample(ctx) }()
	return c
}

// runConfig is a small, seeded, discrete-noise run of the logistic
// regression m over n examples (q = 0.1).
func runConfig(m *model.Model, n int64, maxSteps int64) coordinator.RunConfig {
	opt := dpadam.DefaultConfig()
	opt.NoiseMultiplier, opt.ClipNorm = 1.0, 1.0
	q := 0.1
	opt.ExpectedBatchSize = q * float64(n)
	return coordinator.RunConfig{
		Run: "cluster", ModelHash: m.Hash(), Dim: m.NumParams(), InitSeed: 3, TotalExamples: n,
		SampleRate: q, Optimizer: opt, TargetEpsilon: 1e6, Delta: 1e-5, MaxSteps: maxSteps,
		SeedPolicy: seed.Seeded, NoiseMode: coordinator.NoiseDiscrete,
	}
}

func (c *Cluster) clientConfig(role pki.Role, name string) transport.ClientConfig {
	cfg := transport.DefaultClientConfig()
	cfg.Run, cfg.Role, cfg.Name = c.Run.Run, role, name
	return cfg
}

// startReplica opens replica id on its own in-memory Raft transport,
// connected to every replica it is not cut from, and starts its Server.
// With peers it bootstraps them; without, it asks the leader to add it
// (ServerConfig.Join).
func (c *Cluster) startReplica(id string, peers []raft.Server) error {
	addr, trans := raft.NewInmemTransport(raft.ServerAddress(id))
	m := &member{id: id, addr: addr, trans: trans, dir: filepath.Join(c.base, id), done: make(chan struct{}), killed: make(chan struct{}), closed: make(chan struct{})}
	c.mu.Lock()
	if _, dup := c.replicas[id]; dup {
		c.mu.Unlock()
		return fmt.Errorf("%w: replica %q exists", ErrInvalidOptions, id)
	}
	for _, o := range c.replicas {
		if !o.removed && !c.cut[[2]string{id, o.id}] {
			trans.Connect(o.addr, o.trans)
			o.trans.Connect(addr, trans)
		}
	}
	c.replicas[id] = m
	c.order = append(c.order, id)
	c.mu.Unlock()

	rcfg := coordinator.DefaultReplicaConfig()
	rcfg.ID, rcfg.DataDir, rcfg.Transport, rcfg.Logger = id, m.dir, trans, c.log
	rcfg.Bootstrap, rcfg.Peers = peers != nil, peers
	d := c.opts.RaftTimeout
	rcfg.HeartbeatTimeout, rcfg.ElectionTimeout, rcfg.LeaderLeaseTimeout = d, d, d
	rcfg.CommitTimeout = 5 * time.Millisecond
	rcfg.SnapshotThreshold, rcfg.TrailingLogs, rcfg.SnapshotInterval = 16, 8, 200*time.Millisecond
	rep, err := coordinator.OpenReplica(rcfg, c.init)
	if err != nil {
		return err
	}
	c.mu.Lock()
	m.replica = rep // live() lists it from now on
	c.mu.Unlock()
	if m.conn, err = transport.NewClient(c.net.Link(id), c.clientConfig(pki.RoleReplica, id), c.log); err != nil {
		return err
	}
	scfg := coordinator.DefaultServerConfig()
	scfg.RoundTimeout = c.opts.RoundTimeout
	scfg.NodeTimeout = 5 * c.opts.RoundTimeout
	scfg.AnnounceEvery = 50 * time.Millisecond
	scfg.DrainTimeout = 2 * time.Second
	scfg.Join = peers == nil
	scfg.Noise = mechanism.NewSeededNoiseSource(c.opts.Seed + 1 + uint64(len(c.order)))
	var cons coordinator.Consensus = rep
	if c.opts.CrashAt != nil {
		cons = &crashHooks{Replica: rep, c: c, id: id}
	}
	srv, err := coordinator.NewServer(cons, m.conn, c.Run, scfg, c.log)
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(c.ctx)
	m.stop = stop
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(m.done)
		m.sum, m.err = srv.Run(ctx)
	}()
	return nil
}

// startNode starts node i on shard.
func (c *Cluster) startNode(i int, shard *dataset.Dataset) error {
	id := fmt.Sprintf("n%d", i)
	m, err := model.New(model.LogReg([]int{8}, 3)) // a Worker's own model: engines are not shared
	if err != nil {
		return err
	}
	conn, err := transport.NewClient(c.net.Link(id), c.clientConfig(pki.RoleNode, id), c.log)
	if err != nil {
		return err
	}
	cfg := node.DefaultConfig()
	cfg.ID, cfg.Run = id, c.Run.Run
	cfg.SampleRate, cfg.ClipNorm = c.Run.SampleRate, c.Run.Optimizer.ClipNorm
	cfg.ShardIndex, cfg.ShardCount, cfg.ShardSeed = i, c.opts.Nodes, c.opts.Seed
	cfg.HeartbeatEvery = 50 * time.Millisecond
	cfg.SeededSampling, cfg.SamplingSeed = true, c.opts.Seed*1000+uint64(i)
	w, err := node.NewWorker(cfg, m, shard, conn, c.log)
	if err != nil {
		conn.Close()
		return err
	}
	ctx, stop := context.WithCancel(c.ctx)
	nw := &worker{id: id, conn: conn, stop: stop, done: make(chan struct{})}
	c.mu.Lock()
	c.nodes = append(c.nodes, nw)
	c.nodeIDs = append(c.nodeIDs, id)
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(nw.done)
		_ = w.Run(ctx) // ends with the run (Status done) or the cluster
	}()
	return nil
}

// Replicas returns the IDs of the replicas not removed, in creation order.
func (c *Cluster) Replicas() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for _, id := range c.order {
		if !c.replicas[id].removed {
			ids = append(ids, id)
		}
	}
	return ids
}

// Nodes returns the node IDs.
func (c *Cluster) Nodes() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.nodeIDs)
}

// Replica returns replica id (nil if there is none).
func (c *Cluster) Replica(id string) *coordinator.Replica {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.replicas[id]; m != nil {
		return m.replica
	}
	return nil
}

func (c *Cluster) live() []*member {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ms []*member
	for _, id := range c.order {
		if m := c.replicas[id]; !m.removed && m.replica != nil {
			ms = append(ms, m)
		}
	}
	return ms
}

// Leader waits until one replica leads and a majority of its voters name
// it leader, and returns its ID; "" if ctx ends first.
func (c *Cluster) Leader(ctx context.Context) string {
	for {
		for _, m := range c.live() {
			if !m.replica.IsLeader() {
				continue
			}
			voters := voterIDs(m.replica)
			agree := 0
			for _, o := range c.live() {
				if slices.Contains(voters, o.id) && o.replica.Leader() == m.id {
					agree++
				}
			}
			if agree > len(voters)/2 {
				return m.id
			}
		}
		if sleep(ctx, 5*time.Millisecond) != nil {
			return ""
		}
	}
}

// Applied returns the highest step applied on any live replica.
func (c *Cluster) Applied() int64 {
	var top int64
	for _, m := range c.live() {
		top = max(top, m.replica.FSM().State().Applied)
	}
	return top
}

// Charged returns the highest step charged on any live replica: applied,
// or charged ahead of its g̃ (the pending charge).
func (c *Cluster) Charged() int64 {
	var top int64
	for _, m := range c.live() {
		st := m.replica.FSM().State()
		top = max(top, st.Applied, st.PendingStep)
	}
	return top
}

// WaitApplied waits until some live replica has applied step, and fails t
// if ctx ends first.
func (c *Cluster) WaitApplied(ctx context.Context, t testing.TB, step int64) {
	t.Helper()
	for c.Applied() < step {
		if sleep(ctx, 5*time.Millisecond) != nil {
			t.Fatalf("step %d not applied (at %d): %v", step, c.Applied(), ctx.Err())
		}
	}
}

// AddReplica starts a new replica id that asks the leader, over NATS, to
// add it as a voter (the path `coordinator serve --join` takes). It
// returns at once; WaitVoters waits for the change.
func (c *Cluster) AddReplica(id string) error { return c.startReplica(id, nil) }

// RemoveReplica asks the leader, over NATS (transport.ControlRemove, as
// `coordinator remove-replica` does), to remove replica id, repeating the
// request every 100 ms until a majority of the remaining voters no
// longer list id or ctx ends; then it stops id's Server and closes it.
// PublishControl publishes m on the run's control subject as the
// cluster's observer (a replica's permissions).
func (c *Cluster) PublishControl(ctx context.Context, m transport.Control) error {
	return c.obs.conn.Publish(ctx, m)
}

func (c *Cluster) RemoveReplica(ctx context.Context, id string) error {
	return c.RemoveReplicaOfGroup(ctx, id, "")
}

// RemoveReplicaOfGroup is RemoveReplica with requests that name the
// replica group by its history ID (transport.Control.History), as
// `coordinator remove-replica` sends them.
func (c *Cluster) RemoveReplicaOfGroup(ctx context.Context, id, history string) error {
	req := transport.Control{Run: c.Run.Run, From: "coordinatortest", Code: transport.ControlRemove, Replica: id, History: history}
	for {
		gone := 0
		others := 0
		for _, m := range c.live() {
			if m.id == id {
				continue
			}
			others++
			if v := voterIDs(m.replica); v != nil && !slices.Contains(v, id) {
				gone++
			}
		}
		if gone > others/2 {
			break
		}
		if err := c.obs.conn.Publish(ctx, req); err != nil {
			return err
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	c.mu.Lock()
	m := c.replicas[id]
	m.removed = true
	c.mu.Unlock()
	m.stop()
	<-m.done
	return errors.Join(m.replica.Close(), m.conn.Close())
}

// WaitVoters waits until every live replica's configuration has exactly
// the voters want (sorted IDs), and fails t if ctx ends first.
func (c *Cluster) WaitVoters(ctx context.Context, t testing.TB, want []string) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	for {
		ok := true
		for _, m := range c.live() {
			if !slices.Equal(voterIDs(m.replica), want) {
				ok = false
			}
		}
		if ok {
			return
		}
		if sleep(ctx, 5*time.Millisecond) != nil {
			for _, m := range c.live() {
				t.Logf("%s voters %v", m.id, voterIDs(m.replica))
			}
			t.Fatalf("voters never became %v: %v", want, ctx.Err())
		}
	}
}

// Wait waits until every live replica's Server has returned (the run
// stopped) and fails t if one returned an error or ctx ended first. It
// returns the summaries by replica ID.
func (c *Cluster) Wait(ctx context.Context, t testing.TB) map[string]coordinator.Summary {
	t.Helper()
	sums := make(map[string]coordinator.Summary)
	for _, m := range c.live() {
		select {
		case <-m.done:
		case <-ctx.Done():
			t.Fatalf("replica %s still serving (step %d): %v", m.id, m.replica.FSM().State().Applied, ctx.Err())
		}
		if m.err != nil {
			t.Errorf("replica %s: Run: %v", m.id, m.err)
		}
		sums[m.id] = m.sum
	}
	return sums
}

// shutdown stops every Server and node, then closes the replicas and the
// links. Raft is healed first so a closing leader hands over quickly.
func (c *Cluster) shutdown() {
	c.Heal()
	c.stop()
	c.wg.Wait()
	for _, m := range c.live() {
		if err := m.replica.Close(); err != nil {
			c.t.Logf("closing replica %s: %v", m.id, err)
		}
		if m.conn != nil {
			m.conn.Close()
		}
	}
	c.mu.Lock()
	nodes := c.nodes
	c.mu.Unlock()
	for _, n := range nodes {
		n.conn.Close()
	}
	if c.obs != nil {
		c.obs.conn.Close()
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// VoterIDs returns the sorted IDs of the voters replica id knows of.
func (c *Cluster) VoterIDs(id string) []string { return voterIDs(c.Replica(id)) }

// voterIDs returns the sorted IDs of r's voters, or nil if it cannot read
// its configuration (Raft shut down).
func voterIDs(r *coordinator.Replica) []string {
	vs, err := r.Voters()
	if err != nil {
		return nil
	}
	ids := make([]string, len(vs))
	for i, v := range vs {
		ids[i] = v.ID
	}
	slices.Sort(ids)
	return ids
}
