package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/internal/handoff"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/sampling"
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

// Option configures a Worker beyond Config.
type Option func(*options)

type options struct {
	seeded bool
	seed   uint64
	device model.Device
}

// WithSeededSampling makes the Worker draw each round's batch with
// sampling.NewSeededPoisson(q, seed+step) instead of a fresh
// crypto/rand-keyed sampler, so tests can recompute the exact batch. The
// batches are then predictable by anyone who knows the seed: the run is NOT
// differentially private. The Worker logs that at warn level. For tests and
// reproducible experiments only.
func WithSeededSampling(seed uint64) Option {
	return func(o *options) { o.seeded, o.seed = true, seed }
}

// WithDevice makes the Worker compute its clipped sums on dev (model.OpenDevice)
// instead of the CPU. NewWorker allocates the Worker's engine on dev
// (Device.NewEngine) and fails if it cannot; Run releases the engine when it
// returns (Close, for a Worker that never runs). The Worker does not own dev:
// the caller closes it after Run (or Close) has returned. A nil dev means the
// CPU, as without this option.
func WithDevice(dev model.Device) Option {
	return func(o *options) { o.device = dev }
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
	opts  options
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
	// Owned by the Run loop goroutine.
	batch []int
	sum   []float32
}

// NewWorker returns a Worker for the node cfg.ID, computing gradients of m
// on shard and talking over conn (whose run must be cfg.Run). The Worker
// does not own conn: the caller closes it after Run returns. The shard must
// not be modified while the Worker exists. A nil log discards.
//
// NewWorker allocates the compute engine (on the CPU, or on the device of
// WithDevice) for batches of up to EngineBatch(cfg, shard.Len()) examples,
// so that a device that cannot run the model, or lacks the memory, fails
// here, before the node takes part in a run. The Worker owns the engine:
// Run releases it when it returns; call Close instead to release a Worker
// that will not run.
//
// Errors wrap ErrInvalidConfig, ErrEngine (with the device's error, such
// as model.ErrUnsupportedLayer naming the layer), or come from registering
// metrics.
func NewWorker(cfg Config, m *model.Model, shard *dataset.Dataset, conn transport.Conn, log *slog.Logger, opts ...Option) (*Worker, error) {
	var v dataset.View // Data nil: refused by NewWorkerView
	if shard != nil {
		v = dataset.All(shard)
	}
	return NewWorkerView(cfg, m, v, conn, log, opts...)
}

// NewWorkerView is NewWorker on a view of a dataset: the rows shard.Rows
// of shard.Data, which the Worker reads without copying and may share
// with other Workers in the process (coordinator local's nodes share one
// training set: dataset.ShardViewsIID). The node's shard, the examples it
// samples from with probability q and the size it reports, is the view's
// rows only. shard.Data must not be modified while the Worker exists.
func NewWorkerView(cfg Config, m *model.Model, shard dataset.View, conn transport.Conn, log *slog.Logger, opts ...Option) (*Worker, error) {
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
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Worker{cfg: cfg, m: m, shard: shard, conn: conn,
		log: log.With("node", cfg.ID, "run", cfg.Run)}
	for _, o := range opts {
		o(&w.opts)
	}
	met, err := newMetrics(cfg.Registerer, cfg.Run, cfg.ID)
	if err != nil {
		return nil, err
	}
	w.met = met
	dev := w.opts.device
	if dev == nil {
		if dev, err = model.OpenDevice("cpu"); err != nil {
			return nil, err
		}
	}
	w.dev = dev.Info()
	w.maxBatch = EngineBatch(cfg, shard.Len())
	if w.eng, err = dev.NewEngine(m, w.maxBatch); err != nil {
		return nil, fmt.Errorf("%w: on device %s (%s), batch capacity %d: %w", ErrEngine, w.dev.ID, w.dev.Name, w.maxBatch, err)
	}
	w.sum = make([]float32, m.NumParams())
	w.batch = make([]int, 0, w.maxBatch)
	w.met.device(w.dev)
	w.stats.Skipped = make(map[SkipReason]uint64)
	if w.opts.seeded {
		w.log.Warn("node: INSECURE: seeded sampling; batches are predictable and this node is NOT differentially private",
			"seed", w.opts.seed)
	}
	return w, nil
}

// EngineBatch is the number of examples the Worker's engine computes in one
// pass, for a shard of n ≥ 1 examples and the run's q: cfg.MaxBatch if set,
// else min(n, ⌈1.25·q·n⌉ + 16). A Poisson batch has mean q·n and standard
// deviation below √(q·n); the margin 0.25·q·n + 16 is at least 4 standard
// deviations for every q·n (it is smallest, 4, at q·n = 64), so a batch
// rarely needs a second pass. A larger batch is computed in chunks (no
// example is dropped); the bound affects speed and memory, never results
// beyond float32 rounding.
func EngineBatch(cfg Config, n int) int {
	if cfg.MaxBatch > 0 {
		return cfg.MaxBatch
	}
	return max(1, min(n, int(math.Ceil(1.25*cfg.SampleRate*float64(n)))+16))
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
		"compute_capability", w.dev.ComputeCapability, "engine_batch", w.maxBatch)
	fatal := make(chan error, 1)
	hbCtx, hbStop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.heartbeat(hbCtx, fatal)
	}()

	s := newSession(w)
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
				ShardSize: int64(w.shard.Len()), ModelHash: w.m.Hash(), Step: w.lastStep.Load(),
				ShardIndex: c.ShardIndex, ShardCount: c.ShardCount, ShardSeed: c.ShardSeed, SeedPolicy: w.seedPolicy(),
				DataSchema: c.DataSchema})
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

// seedPolicy is how this node draws its samples, as Join and Heartbeat
// report it: the leader of a private run refuses a seeded node.
func (w *Worker) seedPolicy() seed.Policy {
	if w.opts.seeded {
		return seed.Seeded
	}
	return seed.Crypto
}

func (w *Worker) join(ctx context.Context) error {
	c := &w.cfg
	err := w.conn.Publish(ctx, transport.Join{Run: c.Run, NodeID: c.ID,
		ShardSize: int64(w.shard.Len()), ModelHash: w.m.Hash(),
		ShardIndex: c.ShardIndex, ShardCount: c.ShardCount, ShardSeed: c.ShardSeed, SeedPolicy: w.seedPolicy(),
		DataSchema: c.DataSchema})
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
	if err := w.conn.Publish(lctx, transport.Leave{Run: w.cfg.Run, NodeID: w.cfg.ID, Reason: reason}); err != nil {
		w.log.Warn("node: leave not sent", "err", err)
	}
}

// inbox carries messages from the subscription handlers (one goroutine per
// topic, owned by the transport) to the Run loop. close makes every handler
// call return promptly and waits for those in progress (handoff.Gate).
type inbox struct {
	leaders chan transport.Leader
	rounds  chan transport.RoundStart
	params  chan transport.Params
	status  chan transport.Status
	gate    *handoff.Gate
}

func newInbox() *inbox {
	return &inbox{
		leaders: make(chan transport.Leader, 16),
		rounds:  make(chan transport.RoundStart, 16),
		params:  make(chan transport.Params, 4),
		status:  make(chan transport.Status, 16),
		gate:    handoff.NewGate(),
	}
}

// deliver is the transport.Handler of every subscription.
func (in *inbox) deliver(m transport.Message) {
	if !in.gate.Enter() {
		return
	}
	defer in.gate.Leave()
	switch v := m.(type) {
	case transport.Leader:
		handoff.Send(in.gate, in.leaders, v)
	case transport.RoundStart:
		handoff.Send(in.gate, in.rounds, v)
	case transport.Params:
		handoff.Send(in.gate, in.params, v)
	case transport.Status:
		handoff.Send(in.gate, in.status, v)
	}
}

func (in *inbox) close() { in.gate.Close() }

// roundWindow is how many steps below the newest step seen a RoundStart may
// be and still be considered; older ones are ignored (SkipStaleStep), which
// bounds the memory of answered rounds while keeping "at most once" exact.
// Steps are opened in order (t+1 only after t committed), so a legitimate
// round is never more than one step below the newest.
const roundWindow = 64

// maxParamsKept bounds the parameter versions held (the highest ones).
const maxParamsKept = 3

type roundKey struct{ step, round uint64 }

type pendingRound struct {
	rs       transport.RoundStart
	deadline time.Time
	nextAsk  time.Time
}

// session is the state of one Run, owned by the loop goroutine.
type session struct {
	w       *Worker
	term    uint64
	leader  string
	leaders map[string]uint64 // replica → highest term it announced
	// deferred holds end-of-run statuses from a replica known only as an
	// older term's leader: its Leader announcement for the newer term may
	// still be on its way (different topics, different goroutines).
	deferred map[string]transport.Status
	params   map[uint64]transport.Vector
	// paramsTerm is the term of the leader that published each version
	// in params. A round uses a version only from its own term's leader:
	// a leader releases θ_t once step t is charged, before its g̃ is
	// committed, so a deposed leader's θ_t may differ from the θ_t its
	// successor releases after charging step t again.
	paramsTerm map[uint64]uint64
	seen       map[roundKey]struct{}
	maxStep    uint64
	pending    *pendingRound
	// foreign holds the replicas that announced another run under this
	// run's name (foreignRun), to warn once each; their messages are
	// ignored by what they say, not by who sends them (two groups may
	// use the same replica IDs).
	foreign map[string]bool
	// end is set when the run is over for this node.
	end *ending
}

type ending struct {
	reason string
	err    error
}

func newSession(w *Worker) *session {
	return &session{w: w, leaders: make(map[string]uint64), deferred: make(map[string]transport.Status), foreign: make(map[string]bool),
		params: make(map[uint64]transport.Vector), paramsTerm: make(map[uint64]uint64), seen: make(map[roundKey]struct{})}
}

// loop is the single goroutine that owns the protocol state. It returns
// the reason to give in Leave and Run's result.
func (s *session) loop(ctx context.Context, in *inbox, fatal <-chan error) (string, error) {
	w := s.w
	if err := w.join(ctx); err != nil {
		return "connection_closed", s.publishErr(ctx, err)
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	// silence fires when no coordinator has been heard for
	// CoordinatorTimeout, once one has been (nil until then).
	var silence <-chan time.Time
	var silenceTimer *time.Timer
	defer func() {
		if silenceTimer != nil {
			silenceTimer.Stop()
		}
	}()
	heard := func() {
		switch {
		case w.cfg.CoordinatorTimeout == 0:
		case silenceTimer == nil:
			silenceTimer = time.NewTimer(w.cfg.CoordinatorTimeout)
			silence = silenceTimer.C
		default:
			silenceTimer.Reset(w.cfg.CoordinatorTimeout)
		}
	}
	for s.end == nil {
		var wake <-chan time.Time
		if p := s.pending; p != nil {
			next := p.deadline
			if p.nextAsk.Before(next) {
				next = p.nextAsk
			}
			timer.Reset(time.Until(next))
			wake = timer.C
		}
		select {
		case <-ctx.Done():
			return "shutdown", ctx.Err()
		case err := <-fatal:
			return "connection_closed", err
		case l := <-in.leaders:
			heard()
			s.onLeader(ctx, l)
		case rs := <-in.rounds:
			heard()
			s.onRound(ctx, rs)
		case p := <-in.params:
			heard()
			s.onParams(ctx, p)
		case st := <-in.status:
			heard()
			s.onStatus(st)
		case <-wake:
			s.onTimer(ctx)
		case <-silence:
			w.log.Error("node: no coordinator replica heard; stopping", "for", w.cfg.CoordinatorTimeout)
			s.end = &ending{reason: "coordinator_gone", err: fmt.Errorf("%w for %v (the run may have ended, or its replicas stopped, while this node "+
				"was cut off): check `coordinator status`, then start the node again to rejoin", ErrCoordinatorGone, w.cfg.CoordinatorTimeout)}
		}
		timer.Stop()
	}
	return s.end.reason, s.end.err
}

// publishErr turns a failed publish into Run's result: ctx's error if it
// is done, else the error.
func (s *session) publishErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("node: %w", err)
}

// fatalPublish ends the run if err says the connection is closed and
// reports whether it did; other publish errors are the caller's to log.
func (s *session) fatalPublish(ctx context.Context, err error) bool {
	if errors.Is(err, transport.ErrClosed) {
		s.end = &ending{reason: "connection_closed", err: s.publishErr(ctx, err)}
		return true
	}
	return false
}

// adopt follows a new leader of a higher term: re-Join, and drop a waiting
// round of an older term.
func (s *session) adopt(ctx context.Context, replica string, term uint64) {
	w := s.w
	s.term, s.leader = term, replica
	w.update(func(st *Stats) { st.Term, st.Leader = term, replica })
	w.log.Info("node: new leader", "leader", replica, "term", term)
	if p := s.pending; p != nil && p.rs.Term < term {
		s.skip(p.rs, SkipStaleTerm, "a newer leader took over while the round waited for params")
		s.pending = nil
	}
	if err := w.join(ctx); err != nil {
		s.fatalPublish(ctx, err)
	}
	if st, ok := s.deferred[replica]; ok {
		delete(s.deferred, replica)
		s.apply(st)
	}
}

func (s *session) noteLeader(replica string, term uint64) {
	if replica == "" {
		return
	}
	if term > s.leaders[replica] {
		s.leaders[replica] = term
	}
	if len(s.leaders) > 64 { // bounded: forget the replicas of the oldest terms
		for r, t := range s.leaders {
			if t < s.term {
				delete(s.leaders, r)
			}
		}
	}
}

func (s *session) onLeader(ctx context.Context, l transport.Leader) {
	if why := s.foreignRun(l); why != "" {
		if !s.foreign[l.ReplicaID] { // warned once per replica
			s.w.log.Warn("node: a coordinator of another run with this run's name announces itself; ignoring it and its messages",
				"replica", l.ReplicaID, "term", l.Term, "detail", why)
			if len(s.foreign) < 64 {
				s.foreign[l.ReplicaID] = true
			}
		}
		return
	}
	if l.Term < s.term {
		s.w.log.Debug("node: ignoring leader of an older term", "leader", l.ReplicaID, "term", l.Term, "current_term", s.term)
		return
	}
	s.noteLeader(l.ReplicaID, l.Term)
	if l.Term > s.term {
		s.adopt(ctx, l.ReplicaID, l.Term)
	} else if s.leader == "" {
		s.leader = l.ReplicaID
	}
}

// foreignRun says why the leader l announces another run than this
// node's (checkRun's rule on its model, q and C), or "" if it is this
// node's run or does not say (an older leader).
func (s *session) foreignRun(l transport.Leader) string {
	if l.ModelHash == "" {
		return ""
	}
	return checkRun(transport.RoundStart{ModelHash: l.ModelHash, SampleRate: l.SampleRate, ClipNorm: l.ClipNorm}, s.w.cfg, s.w.m.Hash())
}

func (s *session) skip(rs transport.RoundStart, r SkipReason, why string) {
	w := s.w
	w.update(func(st *Stats) { st.Skipped[r]++ })
	w.met.skipped(r)
	level := slog.LevelInfo
	switch r {
	case SkipDuplicate, SkipStaleTerm, SkipStaleStep:
		level = slog.LevelDebug
	case SkipParamsMismatch:
		level = slog.LevelWarn
	}
	w.log.Log(context.Background(), level, "node: round skipped", "step", rs.Step, "round", rs.RoundID,
		"term", rs.Term, "reason", string(r), "detail", why)
}

func (s *session) onRound(ctx context.Context, rs transport.RoundStart) {
	w := s.w
	if rs.Term < s.term {
		s.skip(rs, SkipStaleTerm, fmt.Sprintf("term %d < current term %d", rs.Term, s.term))
		return
	}
	// A round is checked before anything in it is believed: a refused
	// round changes no state, so a forged round with a high term cannot
	// make the node follow its sender and ignore the real leader, nor a
	// huge step make it treat the real rounds as stale.
	if why := checkRound(rs, w.m.NumParams()); why != "" {
		s.skip(rs, SkipInvalid, why)
		return
	}
	if why := checkRun(rs, w.cfg, w.m.Hash()); why != "" {
		s.skip(rs, SkipParamsMismatch, why)
		return
	}
	key := roundKey{rs.Step, rs.RoundID}
	if _, dup := s.seen[key]; dup {
		s.skip(rs, SkipDuplicate, "round already seen")
		return
	}
	if s.maxStep > roundWindow && rs.Step < s.maxStep-roundWindow {
		s.skip(rs, SkipStaleStep, fmt.Sprintf("step far below the newest step %d", s.maxStep))
		return
	}
	// From here on the round counts as seen, whatever happens to it: it
	// is answered at most once.
	s.seen[key] = struct{}{}
	if rs.Step > s.maxStep {
		s.maxStep = rs.Step
		if len(s.seen) > 4*roundWindow {
			for k := range s.seen {
				if s.maxStep > roundWindow && k.step < s.maxStep-roundWindow {
					delete(s.seen, k)
				}
			}
		}
	}
	s.noteLeader(rs.Leader, rs.Term)
	if rs.Term > s.term {
		s.adopt(ctx, rs.Leader, rs.Term)
		if s.end != nil {
			return
		}
	}
	deadline := time.Unix(0, rs.Deadline)
	now := time.Now()
	if !now.Before(deadline) {
		s.skip(rs, SkipDeadline, "deadline passed on arrival")
		return
	}
	if p := s.pending; p != nil {
		s.skip(p.rs, SkipSuperseded, fmt.Sprintf("step %d round %d arrived", rs.Step, rs.RoundID))
		s.pending = nil
	}
	if len(rs.Params) > 0 {
		s.store(rs.ParamsVersion, rs.Term, rs.Params)
	}
	if theta, ok := s.params[rs.ParamsVersion]; ok && s.paramsTerm[rs.ParamsVersion] == rs.Term {
		s.answer(ctx, rs, deadline, theta)
		return
	}
	s.pending = &pendingRound{rs: rs, deadline: deadline, nextAsk: now.Add(w.cfg.ParamsGrace)}
	if w.cfg.ParamsGrace == 0 {
		s.askParams(ctx)
	}
}

// checkRound validates a RoundStart from the wire and returns why it is
// unusable, or "". The reasons name public constants only.
func checkRound(rs transport.RoundStart, numParams int) string {
	switch {
	case rs.Step == 0:
		return "step 0"
	case !(rs.SampleRate > 0 && rs.SampleRate <= 1):
		return fmt.Sprintf("sample rate %v not in (0, 1]", rs.SampleRate)
	case model.CheckClipNorm(rs.ClipNorm) != nil:
		return fmt.Sprintf("clip norm %v not in [%v, %v]", rs.ClipNorm, model.MinClipNorm, model.MaxClipNorm)
	case rs.Deadline <= 0:
		return "no deadline"
	}
	if len(rs.Params) > 0 {
		if err := checkParams(rs.Params, numParams); err != nil {
			return "inline params: " + err.Error()
		}
	}
	return ""
}

// checkRun returns why rs is not a round of the run this node was
// configured for, or "": its sampling rate q or clip norm C is not the
// run's (cfg.SampleRate, cfg.ClipNorm), or its model hash is not this
// node's model's (an empty hash, from an older leader, is refused too).
//
// This is the node's only check of a round's privacy parameters. The
// privacy of a step rests on them: the ledger charges every step as the
// Poisson-subsampled Gaussian mechanism with the run's q and σ at
// sensitivity C (dp-adambc.tex, Algorithm 1: "Take a random batch with
// sampling probability B/N", and g̃_t = (Σ clip_C(g_i) + z_t)/B with
// z_t ~ N(0, σ²C²I); Appendix E, q = L/N). A round naming q = 1 and
// C = 1e30 would make the node send its whole shard's unclipped gradient
// sum, which that charge does not cover. The comparison is exact (error
// bound 0): the node command and the replicas compute q = B/N with the same
// function (one correctly rounded IEEE-754 division of the same float64 B
// by the same integer N < 2⁵³, which converts exactly), C is the correctly
// rounded parse of the same decimal text of the run file (or flag), and
// msgpack carries float64 bits unchanged; any other value is a different
// run, or a forgery. The reasons name public constants only.
func checkRun(rs transport.RoundStart, cfg Config, modelHash string) string {
	switch {
	case rs.SampleRate != cfg.SampleRate:
		return fmt.Sprintf("sample rate q = %v, the run's is %v", rs.SampleRate, cfg.SampleRate)
	case rs.ClipNorm != cfg.ClipNorm:
		return fmt.Sprintf("clip norm C = %v, the run's is %v", rs.ClipNorm, cfg.ClipNorm)
	case rs.ModelHash != modelHash:
		return fmt.Sprintf("model hash %q, this node's model is %q", rs.ModelHash, modelHash)
	}
	return ""
}

// checkParams reports a parameter vector of the wrong length or with a
// non-finite value (named by index only).
func checkParams(v transport.Vector, numParams int) error {
	if len(v) != numParams {
		return fmt.Errorf("%d values, model has %d", len(v), numParams)
	}
	for i, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return fmt.Errorf("non-finite value at index %d", i)
		}
	}
	return nil
}

func (s *session) askParams(ctx context.Context) {
	w, p := s.w, s.pending
	p.nextAsk = time.Now().Add(w.cfg.ParamsRetry)
	err := w.conn.Publish(ctx, transport.NeedParams{Run: w.cfg.Run, NodeID: w.cfg.ID, Version: p.rs.ParamsVersion})
	if err != nil {
		if !s.fatalPublish(ctx, err) {
			w.log.Warn("node: params request not sent", "version", p.rs.ParamsVersion, "err", err)
		}
		return
	}
	w.update(func(st *Stats) { st.NeedParamsSent++ })
	w.log.Debug("node: asked for params", "version", p.rs.ParamsVersion, "step", p.rs.Step)
}

func (s *session) onTimer(ctx context.Context) {
	p := s.pending
	if p == nil {
		return
	}
	now := time.Now()
	if !now.Before(p.deadline) {
		s.skip(p.rs, SkipDeadline, fmt.Sprintf("params version %d did not arrive before the deadline", p.rs.ParamsVersion))
		s.pending = nil
		return
	}
	if !now.Before(p.nextAsk) {
		s.askParams(ctx)
	}
}

// store keeps a validated parameter version published in term, evicting
// the lowest beyond maxParamsKept. It reports whether v is new: a version
// not held, or held from an older term (replaced).
func (s *session) store(version, term uint64, v transport.Vector) bool {
	if old, ok := s.params[version]; ok {
		if s.paramsTerm[version] >= term {
			return false
		}
		s.params[version] = append(old[:0], v...)
		s.paramsTerm[version] = term
		return true
	}
	// A copy in a buffer of our own: the decoded values may sit at any
	// 4-byte offset of a message buffer, and the BLAS kernels' summation
	// order depends on alignment, so computing on the copy makes the sum
	// reproducible bit for bit. The buffer is the evicted version's, if
	// one is evicted (the loop owns them all; none is in use between
	// messages): no model-sized allocation per step.
	var buf transport.Vector
	if len(s.params) >= maxParamsKept {
		lowest := uint64(math.MaxUint64)
		for k := range s.params {
			lowest = min(lowest, k)
		}
		if version > lowest { // else v itself is the one evicted
			buf = s.params[lowest]
			delete(s.params, lowest)
			delete(s.paramsTerm, lowest)
			s.params[version] = append(buf[:0], v...)
			s.paramsTerm[version] = term
		}
	} else {
		s.params[version] = append(buf, v...)
		s.paramsTerm[version] = term
	}
	w := s.w
	var highest uint64
	w.update(func(st *Stats) {
		st.ParamsReceived++
		st.ParamsVersion = max(st.ParamsVersion, version)
		highest = st.ParamsVersion
	})
	w.met.params(highest)
	return true
}

func (s *session) onParams(ctx context.Context, p transport.Params) {
	w := s.w
	if p.Term < s.term {
		w.update(func(st *Stats) { st.ParamsRejected++ })
		w.log.Debug("node: ignoring params of an older term", "version", p.Version, "term", p.Term, "current_term", s.term)
		return
	}
	if err := checkParams(p.Values, w.m.NumParams()); err != nil {
		w.update(func(st *Stats) { st.ParamsRejected++ })
		w.log.Warn("node: invalid params dropped", "version", p.Version, "term", p.Term, "reason", err.Error())
		return
	}
	if !s.store(p.Version, p.Term, p.Values) {
		return
	}
	w.log.Debug("node: params received", "version", p.Version, "term", p.Term)
	if pr := s.pending; pr != nil && pr.rs.ParamsVersion == p.Version && pr.rs.Term == p.Term {
		s.pending = nil
		s.answer(ctx, pr.rs, pr.deadline, s.params[p.Version])
	}
}

// onStatus handles the leader's verdicts. Requests from other nodes and
// statuses about other nodes are ignored.
func (s *session) onStatus(st transport.Status) {
	if st.ModelHash != "" && st.ModelHash != s.w.m.Hash() {
		s.w.log.Debug("node: status from another run's coordinator ignored", "from", st.From, "code", st.Code)
		return
	}
	switch st.Code {
	case transport.StatusDone, transport.StatusStopped:
	case transport.StatusRejected:
		if st.Node != s.w.cfg.ID {
			return
		}
	default:
		return
	}
	if t, known := s.leaders[st.From]; known && t < s.term {
		// From a replica seen only as an older term's leader: either a
		// deposed leader, or a re-elected one whose new Leader
		// announcement has not been processed yet. Keep it until then.
		if len(s.deferred) < 16 {
			s.deferred[st.From] = st
		}
		s.w.log.Debug("node: status from an older term's leader deferred", "from", st.From, "code", st.Code)
		return
	}
	s.apply(st)
}

func (s *session) apply(st transport.Status) {
	w := s.w
	switch st.Code {
	case transport.StatusDone:
		w.log.Info("node: run done", "from", st.From, "step", st.Step, "detail", st.Detail)
		s.end = &ending{reason: "done"}
	case transport.StatusStopped:
		w.log.Info("node: run stopped", "from", st.From, "step", st.Step, "detail", st.Detail)
		s.end = &ending{reason: "stopped"}
	case transport.StatusRejected:
		if run, ok := strings.CutPrefix(st.Detail, RejectDataSchema+": "); ok {
			w.log.Error("node: the coordinator refuses this node: its data does not have the run's schema",
				"data_schema", w.cfg.DataSchema, "run_data_schema", run, "from", st.From)
			s.end = &ending{reason: "refused",
				err: fmt.Errorf("%w: this node's data has %s; the run's data has %s", ErrRefused, w.cfg.DataSchema, run)}
			return
		}
		switch st.Detail {
		case RejectModelHash:
			w.log.Error("node: coordinator runs a different model", "model_hash", w.m.Hash(), "from", st.From)
			s.end = &ending{reason: "model_mismatch",
				err: fmt.Errorf("%w (this node's model hash %s)", ErrModelMismatch, w.m.Hash())}
			return
		case RejectSeedPolicy, RejectShardIdentity:
			w.log.Error("node: the coordinator refuses this node", "reason", st.Detail, "seed_policy", w.seedPolicy(),
				"shard_index", w.cfg.ShardIndex, "shard_count", w.cfg.ShardCount, "from", st.From)
			s.end = &ending{reason: "refused",
				err: fmt.Errorf("%w: %s (seed policy %s, shard %d of %d)", ErrRefused, st.Detail, w.seedPolicy(),
					w.cfg.ShardIndex, w.cfg.ShardCount)}
			return
		}
		w.log.Warn("node: contribution rejected", "step", st.Step, "reason", st.Detail, "from", st.From)
	}
}

// answer samples the shard, computes the clipped sum at theta and publishes
// the contribution, unless the deadline passes first. The sum and count
// are private: they appear in no log, metric or error. No record changes
// whether the round is answered: ClippedSum zeroes an example whose
// gradient is not finite instead of failing.
func (s *session) answer(ctx context.Context, rs transport.RoundStart, deadline time.Time, theta transport.Vector) {
	w := s.w
	start := time.Now()
	count, err := w.compute(rs, theta)
	defer clear(w.sum) // private: keep it no longer than needed
	w.met.computed(time.Since(start).Seconds())
	if err != nil {
		s.skip(rs, SkipCompute, computeErrorClass(err))
		return
	}
	if !time.Now().Before(deadline) {
		s.skip(rs, SkipDeadline, "computation finished after the deadline")
		return
	}
	pctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	err = w.conn.Publish(pctx, transport.Contribution{Run: w.cfg.Run, Step: rs.Step, RoundID: rs.RoundID,
		NodeID: w.cfg.ID, Count: int64(count), Sum: w.sum})
	if err != nil {
		if s.fatalPublish(ctx, err) || ctx.Err() != nil {
			return
		}
		s.skip(rs, SkipPublish, err.Error())
		return
	}
	w.lastStep.Store(rs.Step)
	w.update(func(st *Stats) { st.Answered++; st.LastStep = rs.Step })
	w.met.answered(rs.Step)
	w.log.Debug("node: contribution sent", "step", rs.Step, "round", rs.RoundID,
		"compute", time.Since(start).Round(time.Microsecond))
}

// compute fills w.sum with the clipped gradient sum of a fresh Poisson
// sample and returns its size.
func (w *Worker) compute(rs transport.RoundStart, theta transport.Vector) (int, error) {
	// The run's own q and C (Config), never the round's: checkRun has
	// refused any round that names others, and reading them here as well
	// keeps the mechanism the ledger charges in one place on this side.
	q, clip := w.cfg.SampleRate, w.cfg.ClipNorm
	var (
		p   *sampling.Poisson
		err error
	)
	if w.opts.seeded {
		p, err = sampling.NewSeededPoisson(q, w.opts.seed+rs.Step)
	} else {
		p, err = sampling.NewPoisson(q)
	}
	if err != nil {
		return 0, err
	}
	// Positions in the shard, then rows of the shared dataset.
	w.batch = w.shard.Map(p.Sample(w.batch[:0], w.shard.Len()))
	return w.eng.ClippedSumIndexed(w.sum, theta, w.shard.Data, w.batch, clip)
}

// computeErrorClass names a compute error without its text, which could
// mention which examples were sampled (private).
func computeErrorClass(err error) string {
	switch {
	case errors.Is(err, model.ErrNonFinite):
		return "non-finite gradient"
	case errors.Is(err, model.ErrBadClip):
		return "bad clip norm"
	case errors.Is(err, model.ErrShape):
		return "shape mismatch"
	case errors.Is(err, sampling.ErrInvalidQ):
		return "bad sampling rate"
	}
	return "internal error"
}
