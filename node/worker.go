package node

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/seed"
	"github.com/dpcluster/dpcluster/transport"
)

// SkipReason says why a node did not answer a round. The values are
// metric label suffixes ("skipped_<reason>") and log fields.
type SkipReason string

// Reasons for not answering a round.
const (
	// SkipStaleTerm: the RoundStart came from a term lower than the newest
	// leader's (a deposed leader).
	SkipStaleTerm SkipReason = "stale_term"
	// SkipDuplicate: this (step, round) was seen before; a node answers
	// each round at most once.
	SkipDuplicate SkipReason = "duplicate"
	// SkipStaleStep: the step is far below the newest step seen (see
	// roundWindow); such a RoundStart can only be a replay.
	SkipStaleStep SkipReason = "stale_step"
	// SkipInvalid: the sampling rate, clip norm, deadline or inline
	// parameters were invalid.
	SkipInvalid SkipReason = "invalid"
	// SkipParamsMismatch: the round's sampling rate, clip norm or model
	// hash is not the run's (Config.SampleRate, Config.ClipNorm, the
	// model's hash). Logged at warn with both values (public constants).
	SkipParamsMismatch SkipReason = "params_mismatch"
	// SkipDeadline: the deadline passed before the node could answer (on
	// arrival, while waiting for Params, or during the computation).
	SkipDeadline SkipReason = "deadline"
	// SkipSuperseded: a newer round arrived while this one waited for its
	// Params.
	SkipSuperseded SkipReason = "superseded"
	// SkipCompute: computing the clipped sum failed: non-finite parameters
	// or an internal error, never the data (an example whose gradient is
	// not finite contributes zero and is counted; model.Workspace.ClippedSum).
	SkipCompute SkipReason = "compute_error"
	// SkipPublish: publishing the contribution failed.
	SkipPublish SkipReason = "publish_error"
)

var skipReasons = []SkipReason{SkipStaleTerm, SkipDuplicate, SkipStaleStep, SkipInvalid,
	SkipParamsMismatch, SkipDeadline, SkipSuperseded, SkipCompute, SkipPublish}

func (r SkipReason) label() string { return "skipped_" + string(r) }

// Stats counts what a Worker did. It holds only public quantities: never a
// batch size, sum or count.
type Stats struct {
	// Answered is the number of contributions published.
	Answered uint64
	// Skipped counts rounds not answered, by reason.
	Skipped map[SkipReason]uint64
	// ParamsReceived counts distinct valid Params versions stored.
	ParamsReceived uint64
	// ParamsRejected counts Params dropped: wrong length, non-finite
	// values, or a term lower than the newest leader's.
	ParamsRejected uint64
	// NeedParamsSent counts NeedParams requests published.
	NeedParamsSent uint64
	// LastStep is the last step this node contributed to (0: none).
	LastStep uint64
	// ParamsVersion is the highest Params version received.
	ParamsVersion uint64
	// Term and Leader are the newest leader seen (0, "": none yet).
	Term   uint64
	Leader string
}

// Worker states (Worker.state).
const (
	workerNew     int32 = iota // built; owns its engine
	workerStarted              // Run called; Run owns the engine and closes it
	workerClosed               // Close called before Run; engine closed
)

// Worker is one node of a training run: it answers the leader's rounds with
// the clipped gradient sum of a Poisson sample of its shard. Build it with
// NewWorker and call Run once (or Close, to release a Worker that will not
// run). Stats may be called concurrently with Run.
type Worker struct {
	cfg   Config
	m     *model.Model
	shard dataset.View // shared read-only with other in-process Workers
	conn  transport.Conn
	log   *slog.Logger
	met   *metrics
	dev   model.DeviceInfo

	state    atomic.Int32  // workerNew, workerStarted or workerClosed
	lastStep atomic.Uint64 // read by the heartbeat goroutine

	mu    sync.Mutex
	stats Stats

	// eng computes the clipped sums: allocated by NewWorker for batches of
	// up to maxBatch examples, used only by the Run loop goroutine, closed
	// by Run when it returns or by Close.
	eng      model.Engine
	maxBatch int
	// Owned by the Run loop goroutine. sum, like every θ version the
	// run loop holds, comes from vector: it may be the engine's memory,
	// released with the engine.
	batch      []int
	sum        []float32
	hostFailed bool // the engine's host memory refused once: Go memory from then on
	// canaries are the audit's gradient canaries (Config.Canaries), nil
	// in any other run; read-only after NewWorker.
	canaries *canaryVectors
	// incarnation tells this Worker apart from any other process given
	// the same node ID (transport.Join.Incarnation): drawn from
	// crypto/rand by NewWorker, sent in Join, Heartbeat and Leave;
	// read-only.
	incarnation string
}

// NewWorker returns a Worker for the node cfg.ID, computing gradients of m
// on shard and talking over conn (whose run must be cfg.Run). The Worker
// does not own conn: the caller closes it after Run returns. The shard must
// not be modified while the Worker exists. A nil log discards.
//
// NewWorker allocates the compute engine (on the CPU, or on cfg.Device)
// for batches of up to EngineBatch(cfg, shard.Len()) examples, so that a
// device that cannot run the model, or lacks the memory, fails here, before the node takes part in a run. The Worker owns the engine:
// Run releases it when it returns; call Close instead to release a Worker
// that will not run.
//
// Errors wrap ErrInvalidConfig, ErrEngine (with the device's error, such
// as model.ErrUnsupportedLayer naming the layer), or come from registering
// metrics.
func NewWorker(cfg Config, m *model.Model, shard *dataset.Dataset, conn transport.Conn, log *slog.Logger) (*Worker, error) {
	var v dataset.View // Data nil: refused by NewWorkerView
	if shard != nil {
		v = dataset.All(shard)
	}
	return NewWorkerView(cfg, m, v, conn, log)
}

// NewWorkerView is NewWorker on a view of a dataset: the rows shard.Rows
// of shard.Data, which the Worker reads without copying and may share
// with other Workers in the process (coordinator local's nodes share one
// training set: dataset.ShardViewsIID). The node's shard, the examples it
// samples from with probability q and the size it reports, is the view's
// rows only. shard.Data must not be modified while the Worker exists.
func NewWorkerView(cfg Config, m *model.Model, shard dataset.View, conn transport.Conn, log *slog.Logger) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if m == nil || conn == nil || shard.Data == nil {
		return nil, fmt.Errorf("%w: model, shard and conn must not be nil", ErrInvalidConfig)
	}
	if err := shard.Check(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if shard.Len() == 0 {
		return nil, fmt.Errorf("%w: shard %q is empty", ErrInvalidConfig, shard.Name)
	}
	if err := m.CheckDataset(shard.Data); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c := cfg.Canaries; c != nil {
		if err := c.validate(m.NumParams()); err != nil {
			return nil, err
		}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Worker{cfg: cfg, m: m, shard: shard, conn: conn, incarnation: rand.Text(),
		log: log.With("node", cfg.ID, "run", cfg.Run)}
	met, err := newMetrics(cfg.Registerer, cfg.Run, cfg.ID)
	if err != nil {
		return nil, err
	}
	w.met = met
	dev := cfg.Device
	if dev == nil {
		if dev, err = model.OpenDevice("cpu"); err != nil {
			return nil, err
		}
	}
	w.dev = dev.Info()
	w.maxBatch = EngineBatch(cfg, shard.Len(), m.ExampleBytes())
	if w.eng, err = dev.NewEngine(m, w.maxBatch); err != nil {
		return nil, fmt.Errorf("%w: on device %s (%s), batch capacity %d: %w", ErrEngine, w.dev.ID, w.dev.Name, w.maxBatch, err)
	}
	w.sum = w.vector()
	if c := cfg.Canaries; c != nil {
		w.canaries = newCanaryVectors(c, m.NumParams())
		w.log.Warn("node: PRIVACY AUDIT: this node injects gradient canaries; the run is an audit, not a training run",
			"canaries", len(c.IDs))
	}
	w.batch = make([]int, 0, w.maxBatch)
	w.met.device(w.dev)
	w.stats.Skipped = make(map[SkipReason]uint64)
	if cfg.SeededSampling {
		w.log.Warn("node: INSECURE: seeded sampling; batches are predictable and this node is NOT differentially private",
			"seed", cfg.SamplingSeed)
	}
	return w, nil
}

// vector returns a zeroed model-sized buffer for θ or the sum: the
// engine's own host memory if it has some (model.HostAllocator: a GPU
// engine's page-locked memory, which crosses the link with no staging
// copy), else Go memory. The engine's memory is released with the engine,
// so such a buffer must not outlive it: the run loop's buffers do not
// outlive Run, and Run closes the engine last. Called by NewWorker and the
// Run loop goroutine only.
func (w *Worker) vector() []float32 {
	n := w.m.NumParams()
	if a, ok := w.eng.(model.HostAllocator); ok && !w.hostFailed {
		v, err := a.AllocHost(n)
		if err == nil {
			return v
		}
		w.hostFailed = true
		w.log.Warn("node: the engine's host memory is not available; θ and the sum are staged (slower transfers)",
			"device", w.dev.ID, "err", err)
	}
	return make([]float32, n)
}

// DefaultEngineMemory is Config.EngineMemory's default: 2 GiB of
// per-example buffers (a BERT-base-sized encoder over 128 tokens needs
// several hundred MB an example in full fine-tuning).
const DefaultEngineMemory = 2 << 30

// EngineBatch is the number of examples the Worker's engine computes in one
// pass, for a shard of n ≥ 1 examples and the run's q, with exampleBytes
// the engine's buffers per example (model.Model.ExampleBytes; 0: not
// bounded): cfg.MaxBatch if set, else min(n, ⌈1.25·q·n⌉ + 16), and at
// most as many examples as cfg.EngineMemory holds (at least one). A
// Poisson batch has mean q·n and standard deviation below √(q·n); the
// margin 0.25·q·n + 16 is at least 4 standard deviations for every q·n
// (it is smallest, 4, at q·n = 64), so a batch rarely needs a second
// pass unless memory bounds it. A larger batch is computed in chunks
// (no example is dropped); the bound affects speed and memory, never
// results beyond float32 rounding.
func EngineBatch(cfg Config, n int, exampleBytes int64) int {
	if cfg.MaxBatch > 0 {
		return cfg.MaxBatch
	}
	b := max(1, min(n, int(math.Ceil(1.25*cfg.SampleRate*float64(n)))+16))
	if exampleBytes > 0 {
		budget := cmp.Or(cfg.EngineMemory, DefaultEngineMemory)
		b = min(b, int(max(1, budget/exampleBytes)))
	}
	return b
}

// Device describes the device the Worker computes on.
func (w *Worker) Device() model.DeviceInfo { return w.dev }

// Close releases the compute engine of a Worker whose Run was never
// called; Run then returns ErrClosed. Once Run has been called, Run owns
// the engine and releases it when it returns, and Close does nothing and
// returns nil. Close may be called concurrently with Run and more than
// once.
func (w *Worker) Close() error {
	if !w.state.CompareAndSwap(workerNew, workerClosed) {
		return nil
	}
	if err := w.eng.Close(); err != nil {
		return fmt.Errorf("node: closing the compute engine on %s: %w", w.dev.ID, err)
	}
	return nil
}

// Stats returns a snapshot of the Worker's counters.
func (w *Worker) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.stats
	s.Skipped = maps.Clone(w.stats.Skipped)
	return s
}

func (w *Worker) update(f func(*Stats)) {
	w.mu.Lock()
	f(&w.stats)
	w.mu.Unlock()
}

// Run takes part in the run until it ends, following the round protocol in
// the package documentation. It blocks until:
//
//   - the leader announces the end of the run (Status StatusDone or
//     StatusStopped): Run returns nil;
//   - the leader rejects this node with reason "model_hash": Run returns an
//     error wrapping ErrModelMismatch; with reason "seed_policy" or
//     "shard_identity": an error wrapping ErrRefused;
//   - ctx is cancelled: Run returns ctx.Err() (once a gradient computation
//     in progress, which is not interruptible, has finished);
//   - the connection is closed under it: Run returns an error wrapping
//     transport.ErrClosed.
//
// In every case but the last it publishes Leave before returning. When Run
// returns, its subscriptions are unsubscribed, no handler of this Worker is
// running, every goroutine Run started has exited and the compute engine
// is released (a failure to release it is logged). Run may be called only
// once per Worker (ErrAlreadyStarted), and not after Close (ErrClosed).
func (w *Worker) Run(ctx context.Context) error {
	if !w.state.CompareAndSwap(workerNew, workerStarted) {
		if w.state.Load() == workerClosed {
			return ErrClosed
		}
		return ErrAlreadyStarted
	}
	defer func() {
		if err := w.eng.Close(); err != nil {
			w.log.Warn("node: closing the compute engine", "device", w.dev.ID, "err", err)
		}
	}()
	if err := ctx.Err(); err != nil {
		return err
	}
	in := newInbox()
	var subs []transport.Subscription
	unsubscribe := func() {
		in.close()
		for _, s := range subs {
			if err := s.Unsubscribe(); err != nil {
				w.log.Debug("node: unsubscribe", "err", err)
			}
		}
	}
	for _, t := range []transport.Topic{transport.TopicLeader, transport.TopicRounds, transport.TopicParams, transport.TopicStatus} {
		s, err := w.conn.Subscribe(t, in.deliver)
		if err != nil {
			unsubscribe()
			return fmt.Errorf("node: subscribe %v: %w", t, err)
		}
		subs = append(subs, s)
	}

	w.log.Info("node: start", "model", w.m.Spec().Name, "model_hash", w.m.Hash(), "params", w.m.NumParams(),
		"shard", w.shard.Len(), "shard_index", w.cfg.ShardIndex, "shard_count", w.cfg.ShardCount,
		"shard_seed", w.cfg.ShardSeed, "q", w.cfg.SampleRate, "clip", w.cfg.ClipNorm, "seed_policy", w.seedPolicy(),
		"device", w.dev.ID, "device_name", w.dev.Name, "device_memory_bytes", w.dev.MemoryBytes,
		"compute_capability", w.dev.ComputeCapability, "engine_batch", w.maxBatch, "incarnation", w.incarnation)
	fatal := make(chan error, 1)
	hbCtx, hbStop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.heartbeat(hbCtx, fatal)
	}()

	s := newRunLoop(w)
	reason, err := s.loop(ctx, in, fatal)

	// Stop in order: no heartbeat may follow the Leave, and no handler of
	// ours may run after Run returns.
	hbStop()
	wg.Wait()
	unsubscribe()
	if !errors.Is(err, transport.ErrClosed) {
		w.leave(ctx, reason)
	}
	w.log.Info("node: stop", "reason", reason, "last_step", w.lastStep.Load())
	return err
}

// heartbeat publishes a Heartbeat every HeartbeatEvery until ctx ends. A
// closed connection is reported on fatal.
func (w *Worker) heartbeat(ctx context.Context, fatal chan<- error) {
	t := time.NewTicker(w.cfg.HeartbeatEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c := &w.cfg
			err := w.conn.Publish(ctx, transport.Heartbeat{Run: c.Run, NodeID: c.ID,
				ShardSize: w.shardClaim(), ModelHash: w.m.Hash(), Step: w.lastStep.Load(),
				ShardIndex: c.ShardIndex, ShardCount: c.ShardCount, ShardSeed: c.ShardSeed, SeedPolicy: w.seedPolicy(),
				DataSchema: c.DataSchema, Weights: c.Weights, Incarnation: w.incarnation, DataHash: c.DataHash})
			switch {
			case err == nil, ctx.Err() != nil:
			case errors.Is(err, transport.ErrClosed):
				select {
				case fatal <- fmt.Errorf("node: heartbeat: %w", err):
				default:
				}
				return
			default:
				w.log.Debug("node: heartbeat not sent", "err", err)
			}
		}
	}
}

// shardClaim is the shard size Join and Heartbeat report: the population
// the node's Poisson sampler draws from, its shard's examples and an
// audit's canary positions (Canaries.Positions).
func (w *Worker) shardClaim() int64 {
	n := int64(w.shard.Len())
	if w.canaries != nil {
		n += int64(w.canaries.positions)
	}
	return n
}

// seedPolicy is how this node draws its samples, as Join and Heartbeat
// report it: the leader of a private run refuses a seeded node.
func (w *Worker) seedPolicy() seed.Policy {
	if w.cfg.SeededSampling {
		return seed.Seeded
	}
	return seed.Crypto
}

func (w *Worker) join(ctx context.Context) error {
	c := &w.cfg
	err := w.conn.Publish(ctx, transport.Join{Run: c.Run, NodeID: c.ID,
		ShardSize: w.shardClaim(), ModelHash: w.m.Hash(),
		ShardIndex: c.ShardIndex, ShardCount: c.ShardCount, ShardSeed: c.ShardSeed, SeedPolicy: w.seedPolicy(),
		DataSchema: c.DataSchema, Weights: c.Weights, Incarnation: w.incarnation, DataHash: c.DataHash})
	if err != nil && !errors.Is(err, transport.ErrClosed) && ctx.Err() == nil {
		w.log.Warn("node: join not sent (heartbeats will register the node)", "err", err)
		return nil
	}
	return err
}

// leave publishes Leave, bounded by LeaveTimeout even if ctx is done.
func (w *Worker) leave(ctx context.Context, reason string) {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.LeaveTimeout)
	defer cancel()
	if err := w.conn.Publish(lctx, transport.Leave{Run: w.cfg.Run, NodeID: w.cfg.ID, Reason: reason, Incarnation: w.incarnation}); err != nil {
		w.log.Warn("node: leave not sent", "err", err)
	}
}
