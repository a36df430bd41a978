package coordinator

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/aggregation"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/seed"
	"github.com/dpcluster/dpcluster/transport"
)

// Evaluator scores parameters on evaluation data, which is never training
// data; ServerConfig.EvalData says whether it is public or held out of the
// private training data. Implementations need not be safe for concurrent
// use; the Server calls Evaluate from one goroutine.
type Evaluator interface {
	Evaluate(theta []float32) (Evaluation, error)
}

// ServerConfig configures a replica's Server: the rounds its replica runs
// while it leads.
type ServerConfig struct {
	// RoundTimeout is how long a round waits for contributions before it
	// closes with whoever answered.
	RoundTimeout time.Duration
	// MinNodes is how many live registered nodes a round needs before it
	// opens. A round never opens with none: a step over no data would
	// spend privacy budget for nothing.
	MinNodes int
	// NodeTimeout drops a node from the registry when nothing (Join,
	// Heartbeat) was heard from it for this long.
	NodeTimeout time.Duration
	// AnnounceEvery is the period of the leader's Leader announcement.
	AnnounceEvery time.Duration
	// DrainTimeout bounds how long a leader that finished the run waits for
	// every voter to report that it applied the last step, before it
	// announces the end and returns.
	DrainTimeout time.Duration
	// EvalEvery evaluates θ on the Evaluator every EvalEvery applied steps
	// (0: only after the last step). Without an Evaluator, nothing is
	// evaluated.
	EvalEvery int64
	// Evaluator, if not nil, evaluates θ on evaluation data.
	Evaluator Evaluator
	// EvalData says where the Evaluator's data comes from, and so how
	// every evaluation is labelled (EvalData.Label). Required with an
	// Evaluator.
	EvalData EvalData
	// OnStep, if not nil, is called on the leader after each applied step
	// and after each evaluation (progress bars). It must not block.
	OnStep func(Progress)
	// Metrics, if not nil, receives the Server's metrics (NewMetrics).
	Metrics *Metrics
	// Join makes the replica ask the leader, over NATS, to add it as a Raft
	// voter (at its advertised Raft address) until it is a member. For a
	// replica started without bootstrapping into an existing cluster.
	Join bool
	// Noise is the leader's noise source (its mechanism is the run's
	// NoiseMode). Nil means a fresh
	// crypto-keyed one (mechanism.NewNoiseSource). A seeded source makes the
	// run NOT private; the Server refuses one unless the run's SeedPolicy
	// is seed.Seeded, and logs it loudly.
	Noise *mechanism.NoiseSource
	// Insecure says the replica's transport is not protected: it was
	// started with --insecure, without TLS. Its StatusReplica reports say
	// so (transport.Control.Insecure), for coordinator status to show.
	Insecure bool
}

// DefaultServerConfig returns rounds of at most 10 s over at least one
// node, nodes forgotten after 5 s of silence, a leader announcement every
// second, and evaluation only at the end.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{
		RoundTimeout:  10 * time.Second,
		MinNodes:      1,
		NodeTimeout:   5 * time.Second,
		AnnounceEvery: time.Second,
		DrainTimeout:  5 * time.Second,
	}
}

// Validate checks the configuration.
func (c ServerConfig) Validate() error {
	switch {
	case c.RoundTimeout <= 0:
		return fmt.Errorf("coordinator: round timeout %v must be positive", c.RoundTimeout)
	case c.MinNodes < 1:
		return fmt.Errorf("coordinator: min nodes %d must be at least 1", c.MinNodes)
	case c.NodeTimeout <= 0:
		return fmt.Errorf("coordinator: node timeout %v must be positive", c.NodeTimeout)
	case c.AnnounceEvery <= 0 || c.AnnounceEvery > c.NodeTimeout:
		return fmt.Errorf("coordinator: announce period %v must be in (0, node timeout %v]", c.AnnounceEvery, c.NodeTimeout)
	case c.DrainTimeout < 0:
		return fmt.Errorf("coordinator: drain timeout %v must not be negative", c.DrainTimeout)
	case c.EvalEvery < 0:
		return fmt.Errorf("coordinator: eval every %d must not be negative", c.EvalEvery)
	case c.Evaluator != nil && c.EvalData != EvalPublic && c.EvalData != EvalTrainHoldout:
		return fmt.Errorf("%w: an Evaluator needs EvalData EvalPublic or EvalTrainHoldout, not %d", ErrEvalDataUnset, c.EvalData)
	}
	return nil
}

// Progress is a public view of the run after a step, for progress bars
// and logs. It holds no un-noised quantity.
type Progress struct {
	Step          int64
	MaxSteps      int64
	Epsilon       float64
	TargetEpsilon float64
	// Participants is the number of nodes whose contribution the step's
	// round accepted.
	Participants int
	// Eval is the last evaluation, at step EvalStep (EvalStep 0: none
	// yet), on data EvalData: label it with EvalData.Label.
	Eval     Evaluation
	EvalStep int64
	EvalData EvalData
}

// Summary is the outcome of a run, as seen by one replica.
type Summary struct {
	Steps   int64   // applied steps
	Epsilon float64 // ε spent (at the run's δ)
	Delta   float64
	Charges uint64 // ledger charge records (≥ Steps)
	Stopped string // why the run stopped
	// Final is the evaluation of the final θ (leader with an Evaluator
	// only; FinalEvaluated says whether it is set) on data EvalData:
	// label it with EvalData.Label.
	Final          Evaluation
	FinalEvaluated bool
	EvalData       EvalData
	// Digest is FSM.Digest at the end: equal on replicas that agree bit
	// for bit on θ and the optimizer state.
	Digest string
}

// Server is one replica's part of a training run. On every replica it
// keeps the registry of live nodes (from Join and Heartbeat); while its
// replica leads, it runs rounds. For step t the leader does, in order
// (commit before release, DESIGN.md):
//
//  1. On gaining leadership: Barrier, so every committed step is applied
//     here and no committed step is redone; propose the run configuration
//     if the log has none; announce Leader{term} (and every AnnounceEvery
//     after); publish θ_{t-1}, which is committed.
//  2. Open round t: a fresh random round ID, the live registered nodes (a
//     node is registered only if admitNode admits it), a deadline
//     RoundTimeout away; publish RoundStart. No round opens while the live
//     nodes' shards are not disjoint (checkShards): the leader reports why
//     instead (log, metric, replica status).
//  3. Collect contributions into an aggregation.Round (which validates
//     them) until every node answered or the deadline passed.
//  4. Privatize S with the run's noise mode (privatize): by default snap
//     it to the grid Λℤ^d and add exact discrete Gaussian noise,
//     g̃ = Λ(round(S/Λ) + z)/B, z ~ N_Z(0, ⌈σC/Λ⌉²I) from the CSPRNG,
//     drawn while step 3 waits (z does not depend on the data); clear S
//     and z. Nothing un-noised leaves this function. Check g̃ with
//     dpadam.CheckGradient, the rule the state machine applies: if it
//     fails, propose the end of the run instead of the step.
//  5. Propose the step entry (t, g̃, the ledger event) and wait until it is
//     committed and applied here: the state machine has charged the
//     ledger (fsynced) and then updated θ.
//  6. Only then publish Params(θ_t).
//
// Before opening a round the leader checks that one more step fits the
// budget; if not, it proposes the end of the run (the state machine
// refuses an over-budget step anyway). When the state machine reports the
// run stopped, the leader evaluates the final θ, publishes Status done, and
// Run returns on every replica.
//
// Every replica also reports its state on the control subject
// (Control ControlReplica) and the leader acts on the membership requests
// there (ControlJoin, ControlRemove), which only replicas may publish.
type Server struct {
	replica *Replica
	conn    transport.Conn
	run     RunConfig
	cfg     ServerConfig
	log     *slog.Logger
	noise   *mechanism.NoiseSource
	metrics *Metrics
	// pending is the discrete noise of the open round's release, drawn
	// while the nodes compute (lead goroutine only).
	pending mechanism.Noise

	nodes registry
	round atomic.Pointer[openRound] // the leader's open round, if any
	last  Progress                  // the leader's last evaluation (lead goroutine only)

	// blocked is why the leader opens no round now (nil: not blocked);
	// set by the lead goroutine, read by the status reporter.
	blocked atomic.Pointer[roundBlock]
	// blockLogged and blockLoggedAt rate-limit the blocked warning (lead
	// goroutine only).
	blockLogged   string
	blockLoggedAt time.Time

	paramsMu   sync.Mutex
	lastResent map[uint64]time.Time // NeedParams rate limit, by version

	peersMu sync.Mutex
	peers   map[string]transport.Control // replicas' last ControlReplica, by ID

	// membership carries join and remove requests from the control
	// handler to the goroutine of Run that acts on them (leader only).
	membership chan transport.Control
}

type openRound struct {
	r    *aggregation.Round
	term uint64
}

// NewServer returns a Server for replica, training run over conn. The run
// configuration must be the one the replica's log holds (or will hold: the
// first leader proposes it).
func NewServer(replica *Replica, conn transport.Conn, run RunConfig, cfg ServerConfig, log *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := run.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	noise := cfg.Noise
	if noise == nil {
		var err error
		if noise, err = mechanism.NewNoiseSource(); err != nil {
			return nil, err
		}
	}
	if noise.Seeded() {
		if run.SeedPolicy != seed.Seeded {
			return nil, fmt.Errorf("%w: a seeded noise source needs seed policy %q", ErrInvalidRunConfig, seed.Seeded)
		}
		log.Warn("coordinator: SEEDED noise source: this run is NOT differentially private")
	} else if run.SeedPolicy != seed.Crypto {
		return nil, fmt.Errorf("%w: seed policy %q but a crypto noise source", ErrInvalidRunConfig, run.SeedPolicy)
	}
	if m, ok := run.Discrete(); ok {
		log.Info("coordinator: noise mode discrete", "grid", m.Grid(), "scale", m.Scale, "effective_sigma", m.Sigma)
	} else {
		log.Warn("coordinator: noise mode " + noiseModeLabel(run.NoiseMode) + ": the floating-point Gaussian sampler is NOT protected against floating-point attacks; use noise mode discrete for new runs")
	}
	return &Server{
		replica: replica, conn: conn, run: run, cfg: cfg, log: log, noise: noise,
		metrics: cfg.Metrics, nodes: registry{nodes: make(map[string]nodeInfo)},
		lastResent: make(map[uint64]time.Time), peers: make(map[string]transport.Control),
		membership: make(chan transport.Control, 16),
	}, nil
}

// ErrRunMismatch is returned by Run when the replica's log holds another
// run's configuration.
var ErrRunMismatch = errors.New("coordinator: the replica's log holds a different run")

// Run serves until the run stops (it returns the Summary and nil), ctx is
// cancelled (ctx.Err()), or the replica fails (an error wrapping
// ErrFatal). It subscribes to the node, contribution and control topics
// and unsubscribes before returning; every goroutine it starts has exited
// by then.
func (s *Server) Run(ctx context.Context) (Summary, error) {
	var subs []transport.Subscription
	defer func() {
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}()
	for _, t := range []struct {
		topic transport.Topic
		h     transport.Handler
	}{
		{transport.TopicNodes, s.onNodeMessage},
		{transport.TopicContributions, s.onContribution},
		{transport.TopicControl, s.onControl},
	} {
		sub, err := s.conn.Subscribe(t.topic, t.h)
		if err != nil {
			return Summary{}, err
		}
		subs = append(subs, sub)
	}
	// The reporter announces this replica's state until Run returns, and
	// once more on the way out (a follower that saw the run stop tells the
	// leader it has applied the last step).
	rctx, stopReport := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		s.report(rctx)
	}()
	go func() {
		defer wg.Done()
		s.changeMembership(rctx)
	}()
	defer func() {
		stopReport()
		wg.Wait()
		s.publishReplicaStatus(context.WithoutCancel(ctx))
	}()
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for {
		st := s.replica.FSM().State()
		s.observeState(st)
		if st.Fatal != nil {
			return s.summary(st), st.Fatal
		}
		if st.Stopped != "" && !s.replica.IsLeader() {
			return s.summary(st), nil
		}
		if s.replica.IsLeader() {
			done, err := s.lead(ctx)
			if err != nil || done {
				return s.finalSummary(ctx, err)
			}
			continue
		}
		select {
		case <-ctx.Done():
			return s.summary(st), ctx.Err()
		case <-poll.C:
		}
	}
}

// lead runs rounds for as long as this replica leads. It returns done when
// the run has stopped, and (false, nil) when leadership was lost.
func (s *Server) lead(ctx context.Context) (done bool, err error) {
	term := s.replica.Term()
	log := s.log.With("term", term)
	if err := s.replica.Barrier(ctx); err != nil {
		log.Warn("barrier failed; not leading", "err", err)
		return false, ignoreLeadershipLoss(ctx, err)
	}
	if c, ok := s.replica.FSM().Config(); !ok {
		if err := s.replica.Configure(ctx, s.run); err != nil {
			return false, ignoreLeadershipLoss(ctx, err)
		}
	} else if !sameConfig(c, s.run) {
		return false, fmt.Errorf("%w: log has run %q, this replica was given %q", ErrRunMismatch, c.Run, s.run.Run)
	}
	log.Info("leading", "step", s.replica.FSM().State().Applied)

	// The announcer owns nothing but its ticker; lead stops it on return.
	actx, stopAnnounce := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.announce(actx, term)
	}()
	defer func() {
		stopAnnounce()
		wg.Wait()
		s.round.Store(nil)
		s.setBlocked(log, nil)
	}()

	s.publishParams(ctx, term)
	g := make([]float32, s.run.Dim)
	for {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		if !s.replica.IsLeader() || s.replica.Term() != term {
			log.Info("lost leadership")
			return false, nil
		}
		st := s.replica.FSM().State()
		s.observeState(st)
		if st.Fatal != nil {
			return false, st.Fatal
		}
		if st.Stopped != "" {
			return true, nil
		}
		exceed, err := s.replica.FSM().WouldExceed()
		if err != nil {
			return false, err
		}
		if exceed {
			log.Info("privacy budget reached; stopping", "epsilon", st.Epsilon, "target", s.run.TargetEpsilon)
			if err := s.replica.ProposeStop(ctx, stopBudget); err != nil {
				return false, ignoreLeadershipLoss(ctx, err)
			}
			continue
		}
		nodes, shards, claims := s.nodes.live(time.Now(), s.cfg.NodeTimeout)
		// The live nodes are the next round's members: their shards must
		// be disjoint (admission.go).
		b := checkShards(claims, s.run.TotalExamples)
		s.setBlocked(log, b)
		if b != nil || len(nodes) < s.cfg.MinNodes {
			if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
				return false, err
			}
			continue
		}
		if err := s.step(ctx, log, term, st.Applied+1, nodes, shards, g); err != nil {
			return false, ignoreLeadershipLoss(ctx, err)
		}
	}
}

// setBlocked records why the leader opens no round (nil: it may open
// them) for the status reports and metrics, and logs a change at once and
// an unchanged block every 10 s.
func (s *Server) setBlocked(log *slog.Logger, b *roundBlock) {
	if b == nil {
		if s.blocked.Swap(nil) != nil {
			log.Info("rounds no longer blocked")
		}
		s.blockLogged = ""
		s.metrics.roundsBlocked("")
		return
	}
	s.blocked.Store(b)
	s.metrics.roundsBlocked(b.reason)
	now := time.Now()
	if msg := b.String(); msg != s.blockLogged || now.Sub(s.blockLoggedAt) >= 10*time.Second {
		s.blockLogged, s.blockLoggedAt = msg, now
		log.Warn("not opening rounds over the live nodes", "reason", b.reason, "detail", b.detail)
	}
}

// Stop reasons the Server writes into the log.
const (
	stopBudget   = "privacy budget exhausted"
	stopMaxSteps = "max steps reached"
)

// step runs round t (steps 2-6 of the Server doc comment).
func (s *Server) step(ctx context.Context, log *slog.Logger, term uint64, t int64, nodes []string, shards map[string]int64, g []float32) error {
	roundID, err := randomID()
	if err != nil {
		return err
	}
	started := time.Now()
	deadline := started.Add(s.cfg.RoundTimeout)
	r, err := aggregation.NewRound(uint64(t), nodes, s.run.Dim, s.run.Optimizer.ClipNorm, deadline,
		aggregation.WithRoundID(roundID), aggregation.WithShardSizes(shards))
	if err != nil {
		return err
	}
	s.round.Store(&openRound{r: r, term: term})
	err = s.conn.Publish(ctx, transport.RoundStart{
		Run: s.run.Run, Step: uint64(t), RoundID: roundID, Term: term, Leader: s.replica.ID(),
		ParamsVersion: uint64(t - 1), Deadline: deadline.UnixNano(),
		SampleRate: s.run.SampleRate, ClipNorm: s.run.Optimizer.ClipNorm, ModelHash: s.run.ModelHash,
	})
	if err != nil {
		r.Close()
		s.round.Store(nil)
		return fmt.Errorf("coordinator: publishing round %d: %w", t, err)
	}
	// The release's noise does not depend on the data: draw it now, while
	// the nodes compute (contributions reach the Round through the
	// transport's handlers meanwhile).
	if m, ok := s.run.Discrete(); ok {
		if err := s.noise.DrawDiscrete(&s.pending, m); err != nil {
			r.Close()
			s.round.Store(nil)
			return err
		}
		defer s.pending.Clear() // unused noise (no release) does not linger
	}
	// Wait for the round, watching leadership: a deposed leader must not
	// propose (it could not commit anyway) and should stop waiting.
	watch := time.NewTicker(50 * time.Millisecond)
	defer watch.Stop()
	for waiting := true; waiting; {
		select {
		case <-r.Done():
			waiting = false
		case <-ctx.Done():
			r.Close()
			s.round.Store(nil)
			return ctx.Err()
		case <-watch.C:
			if !s.replica.IsLeader() {
				r.Close()
				s.round.Store(nil)
				return raft.ErrNotLeader
			}
		}
	}
	res := r.Close()
	s.round.Store(nil)
	s.metrics.roundClosed(res, time.Since(started))
	if len(res.Accepted) == 0 {
		// Nobody answered (all nodes died, or the deadline was too
		// short): releasing noise over an empty sum would spend budget
		// for nothing. Forget the silent nodes and try again.
		log.Warn("round closed with no contribution; not releasing", "step", t, "cause", res.ClosedBy.String())
		s.nodes.forget(res.Missing)
		return nil
	}
	// 4. Noise over the sum, by the run's noise mode; then clear the sum.
	// The Result's Sum is this round's own buffer (the Round is discarded).
	err = privatize(s.run, s.noise, &s.pending, g, res.Sum)
	clear(res.Sum)
	if err != nil {
		return err
	}
	// g̃ must be one the state machine will accept: the optimizer's rule,
	// the same function the FSM applies before charging. A g̃ that fails
	// it (a clip norm so large that g̃ overflows the optimizer's bound, or
	// a broken noise source) is never proposed, so never released; the
	// run stops, since drawing noise again until g̃ passes would make the
	// release depend on the sum through the rejection.
	if err := dpadam.CheckGradient(g); err != nil {
		reason := fmt.Sprintf("step %d: noisy gradient not proposed: %v", t, err)
		log.Error("noisy gradient invalid; stopping the run", "step", t, "err", err)
		return s.replica.ProposeStop(ctx, reason)
	}
	// 5. Propose and wait for commit and local apply.
	ar, err := s.replica.ProposeStep(ctx, t, s.run.Event(), g, fmt.Sprintf("%s/%d/%016x", s.replica.ID(), term, roundID))
	if err != nil {
		return err
	}
	if !ar.Applied {
		// Refused by the state machine (budget, stop): the next loop
		// iteration sees the stopped state.
		log.Info("step not applied", "step", t, "reason", ar.Err)
		return nil
	}
	// 6. Release θ_t.
	s.publishParams(ctx, term)
	p := Progress{
		Step: t, MaxSteps: s.run.MaxSteps, Epsilon: ar.Epsilon, TargetEpsilon: s.run.TargetEpsilon,
		Participants: len(res.Accepted),
	}
	log.Debug("step committed", "step", t, "epsilon", ar.Epsilon, "participants", len(res.Accepted),
		"missing", len(res.Missing), "rejected", len(res.Rejected), "round_ms", time.Since(started).Milliseconds())
	if s.cfg.Evaluator != nil && s.cfg.EvalEvery > 0 && t%s.cfg.EvalEvery == 0 {
		s.evaluate(log, &p)
	}
	s.metrics.stepApplied(p)
	if s.cfg.OnStep != nil {
		s.cfg.OnStep(p)
	}
	return nil
}

// privatize forms the noisy gradient g̃ of the run's mechanism from the
// round's float64 sum (step 4 of the Server doc comment): the discrete
// Gaussian mechanism for NoiseDiscrete (RunConfig.Discrete), with the noise
// in pending if it is ready (drawn at the round's start; Apply zeroes it)
// or fresh noise otherwise; the legacy floating-point sampler for
// NoiseFloat and NoiseLegacy. It is the one place the leader's noise is
// added; RunConfig.Event is the one place it is accounted.
func privatize(run RunConfig, noise *mechanism.NoiseSource, pending *mechanism.Noise, g []float32, sum []float64) error {
	oc := run.Optimizer
	if run.NoiseMode == NoiseDiscrete {
		m, ok := run.Discrete()
		if !ok {
			return fmt.Errorf("%w: noise mode %q cannot be built", ErrInvalidRunConfig, run.NoiseMode)
		}
		if pending != nil && pending.Ready() {
			return m.Apply(g, sum, oc.ExpectedBatchSize, pending)
		}
		return noise.DiscreteNoisyGradient64(g, sum, m, oc.ExpectedBatchSize)
	}
	return noise.NoisyGradient64(g, sum, oc.NoiseMultiplier, oc.ClipNorm, oc.ExpectedBatchSize)
}

// noiseModeLabel names a noise mode for logs.
func noiseModeLabel(mode string) string {
	if mode == NoiseLegacy {
		return "float (legacy: configured before noise modes)"
	}
	return mode
}

// evaluate scores the committed θ on the evaluation data and records it
// in p. The log line and the metrics are labelled by s.cfg.EvalData.
func (s *Server) evaluate(log *slog.Logger, p *Progress) {
	theta, step := s.replica.FSM().Params(nil)
	m, err := s.cfg.Evaluator.Evaluate(theta)
	if err != nil {
		log.Warn("evaluation failed", "step", step, "err", err)
		return
	}
	d := s.cfg.EvalData
	p.Eval, p.EvalStep, p.EvalData = m, step, d
	s.last = *p
	s.metrics.evaluated(m, d)
	log.Info(d.Label()+" evaluation", "step", step, "accuracy", m.Accuracy, "loss", m.Loss, "examples", m.N,
		"eval_data", d.Key(), "private", d.Private(), "epsilon", p.Epsilon)
}

// finalSummary ends the run on the leader: evaluate the final θ, announce
// the end to nodes, and return.
func (s *Server) finalSummary(ctx context.Context, err error) (Summary, error) {
	st := s.replica.FSM().State()
	sum := s.summary(st)
	if err != nil {
		return sum, err
	}
	if s.cfg.Evaluator != nil {
		p := Progress{Step: st.Applied, MaxSteps: s.run.MaxSteps, Epsilon: st.Epsilon, TargetEpsilon: s.run.TargetEpsilon}
		if s.last.EvalStep == st.Applied && st.Applied > 0 {
			p.Eval, p.EvalStep, p.EvalData = s.last.Eval, s.last.EvalStep, s.last.EvalData // θ has not moved since
		} else {
			s.evaluate(s.log, &p)
		}
		if p.EvalStep > 0 {
			sum.Final, sum.FinalEvaluated, sum.EvalData = p.Eval, true, p.EvalData
			if s.cfg.OnStep != nil {
				s.cfg.OnStep(p)
			}
		}
	}
	s.drain(ctx, st.Applied)
	code := transport.StatusDone
	if st.Stopped != stopBudget && st.Stopped != stopMaxSteps {
		code = transport.StatusStopped
	}
	// Core NATS is at-most-once: say it a few times so nodes hear it.
	for i := range 3 {
		if i > 0 && sleepCtx(ctx, 100*time.Millisecond) != nil {
			break
		}
		_ = s.conn.Publish(ctx, transport.Status{
			Run: s.run.Run, From: s.replica.ID(), Step: uint64(st.Applied), Code: code, Detail: st.Stopped,
		})
	}
	s.log.Info("run finished", "steps", st.Applied, "epsilon", st.Epsilon, "reason", st.Stopped)
	return sum, nil
}

func (s *Server) summary(st State) Summary {
	d, _ := s.replica.FSM().Digest()
	return Summary{Steps: st.Applied, Epsilon: st.Epsilon, Delta: s.run.Delta, Charges: st.Charges, Stopped: st.Stopped, Digest: d}
}

// report publishes this replica's ControlReplica now and every
// AnnounceEvery until ctx ends, and, with ServerConfig.Join, asks to join
// (ControlJoin) until this replica is a member.
func (s *Server) report(ctx context.Context) {
	t := time.NewTicker(s.cfg.AnnounceEvery)
	defer t.Stop()
	for {
		s.publishReplicaStatus(ctx)
		if s.cfg.Join && !s.replica.isMember() {
			err := s.conn.Publish(ctx, transport.Control{Run: s.run.Run, From: s.replica.ID(),
				Code: transport.ControlJoin, Addr: s.replica.Addr()})
			if err != nil && ctx.Err() == nil {
				s.log.Debug("join request failed", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) publishReplicaStatus(ctx context.Context) {
	st := s.replica.FSM().State()
	_, leader := s.replica.raft.LeaderWithID()
	err := s.conn.Publish(ctx, transport.Control{
		Run: s.run.Run, From: s.replica.ID(), Step: uint64(st.Applied), Code: transport.ControlReplica,
		Term: s.replica.Term(), Role: strings.ToLower(s.replica.raft.State().String()), Leader: string(leader),
		Epsilon: st.Epsilon, Nodes: s.nodes.count(), Blocked: s.blocked.Load().String(), Insecure: s.cfg.Insecure,
	})
	if err != nil && ctx.Err() == nil {
		s.log.Debug("replica status failed", "err", err)
	}
}

// drain waits, at most DrainTimeout, until every other voter has reported
// applying step: a leader that exits at once could leave followers that
// never learn the final entries were committed.
func (s *Server) drain(ctx context.Context, step int64) {
	cf := s.replica.raft.GetConfiguration()
	if cf.Error() != nil || s.cfg.DrainTimeout == 0 {
		return
	}
	var waitFor []string
	for _, srv := range cf.Configuration().Servers {
		if srv.Suffrage == raft.Voter && string(srv.ID) != s.replica.ID() {
			waitFor = append(waitFor, string(srv.ID))
		}
	}
	deadline := time.Now().Add(s.cfg.DrainTimeout)
	for len(waitFor) > 0 && time.Now().Before(deadline) {
		s.peersMu.Lock()
		waitFor = slices.DeleteFunc(waitFor, func(id string) bool { return s.peers[id].Step >= uint64(step) })
		s.peersMu.Unlock()
		if len(waitFor) == 0 || sleepCtx(ctx, 20*time.Millisecond) != nil {
			break
		}
	}
	if len(waitFor) > 0 {
		s.log.Warn("finished before every replica reported the last step", "step", step, "waiting_for", waitFor)
	}
}

// announce publishes Leader{term} now and every AnnounceEvery until ctx
// ends.
func (s *Server) announce(ctx context.Context, term uint64) {
	t := time.NewTicker(s.cfg.AnnounceEvery)
	defer t.Stop()
	for {
		st := s.replica.FSM().State()
		err := s.conn.Publish(ctx, transport.Leader{Run: s.run.Run, ReplicaID: s.replica.ID(), Term: term, Step: uint64(st.Applied)})
		if err != nil && ctx.Err() == nil {
			s.log.Debug("leader announcement failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// publishParams publishes the committed θ and its step.
func (s *Server) publishParams(ctx context.Context, term uint64) {
	theta, step := s.replica.FSM().Params(nil)
	if theta == nil {
		return
	}
	err := s.conn.Publish(ctx, transport.Params{
		Run: s.run.Run, Step: uint64(step), Version: uint64(step), Term: term, Values: theta,
	})
	if err != nil && ctx.Err() == nil {
		s.log.Warn("publishing parameters failed", "step", step, "err", err)
	}
}

// onNodeMessage keeps the node registry (on every replica, so a new leader
// knows the nodes at once). A node admitNode refuses is dropped from the
// registry and, by the leader, told why (at most every 5 s).
func (s *Server) onNodeMessage(m transport.Message) {
	if v, ok := m.(transport.NeedParams); ok {
		s.onNeedParams(v)
		return
	}
	if v, ok := m.(transport.Leave); ok {
		s.nodes.forget([]string{v.NodeID})
		s.log.Info("node left", "node", v.NodeID, "reason", v.Reason)
		return
	}
	n, ok := reportOf(m)
	if !ok {
		return
	}
	id, c := n.id, n.shard
	if id == "" || len(id) > 64 || c.size < 0 {
		s.log.Debug("ignoring node message with a bad node id or shard size", "type", m.Type().String())
		return
	}
	if reason := admitNode(s.run, n); reason != "" {
		s.nodes.forget([]string{id})
		s.metrics.nodeRefused(reason)
		if s.replica.IsLeader() && s.nodes.shouldWarn(id, time.Now()) {
			s.log.Warn("refusing node", "node", id, "reason", reason, "seed_policy", n.seedPolicy,
				"run_seed_policy", s.run.SeedPolicy, "shard_index", c.index, "shard_count", c.count)
			_ = s.conn.Publish(context.Background(), transport.Status{
				Run: s.run.Run, From: s.replica.ID(), Node: id, Code: transport.StatusRejected, Detail: reason,
			})
		}
		return
	}
	isNew := s.nodes.seen(id, c, time.Now())
	if _, join := m.(transport.Join); join || isNew {
		// A Join is sent at a node's start and on a new leader term: a
		// restarted node shows up here even if it was still registered.
		s.log.Info("node joined", "node", id, "shard", c.size, "shard_index", c.index, "shard_count", c.count,
			"shard_seed", c.seed, "seed_policy", n.seedPolicy)
	}
}

// onContribution hands a contribution to the open round, if any.
func (s *Server) onContribution(m transport.Message) {
	c, ok := m.(transport.Contribution)
	if !ok {
		return
	}
	or := s.round.Load()
	if or == nil {
		if s.replica.IsLeader() {
			s.metrics.rejected(aggregation.ReasonLate) // between rounds
		}
		return // followers do not aggregate
	}
	err := or.r.Add(aggregation.Contribution{
		NodeID: c.NodeID, Step: c.Step, RoundID: c.RoundID, Count: c.Count, Sum: c.Sum,
	})
	if err == nil {
		s.metrics.accepted()
		return
	}
	reason := aggregation.ReasonOf(err)
	s.metrics.rejected(reason)
	// The reason is public; the values are not, and are never logged.
	s.log.Info("contribution rejected", "node", c.NodeID, "step", c.Step, "reason", reason.String())
	if reason != aggregation.ReasonWrongStep && reason != aggregation.ReasonWrongRound {
		_ = s.conn.Publish(context.Background(), transport.Status{
			Run: s.run.Run, From: s.replica.ID(), Node: c.NodeID, Step: c.Step,
			Code: transport.StatusRejected, Detail: reason.String(),
		})
	}
}

// changeMembership acts on the join and remove requests onControl
// forwards, while this replica leads, until ctx ends. A join request
// names the new replica by ID; with Raft over TLS it is added only if the
// replica answering at its address holds a replica certificate for that
// ID (Replica.AddVoter).
func (s *Server) changeMembership(ctx context.Context) {
	for {
		var c transport.Control
		select {
		case <-ctx.Done():
			return
		case c = <-s.membership:
		}
		if !s.replica.IsLeader() {
			continue
		}
		var err error
		switch c.Code {
		case transport.ControlJoin:
			if c.From == "" || c.Addr == "" || s.replica.hasVoter(c.From, c.Addr) {
				continue
			}
			s.log.Info("adding replica", "replica", c.From, "addr", c.Addr)
			err = s.replica.AddVoter(ctx, c.From, c.Addr)
		case transport.ControlRemove:
			if c.Replica == "" || c.Replica == s.replica.ID() || !s.replica.hasVoter(c.Replica, "") {
				continue
			}
			s.log.Info("removing replica", "replica", c.Replica, "asked_by", c.From)
			err = s.replica.raft.RemoveServer(raft.ServerID(c.Replica), 0, 10*time.Second).Error()
		}
		if err != nil && ctx.Err() == nil {
			s.log.Warn("membership change failed", "code", c.Code, "replica", cmp.Or(c.Replica, c.From), "err", err)
		}
	}
}

// onControl records the other replicas' reports and forwards membership
// requests to changeMembership (dropping them while it is busy: a joining
// replica repeats its request every second).
func (s *Server) onControl(m transport.Message) {
	c, ok := m.(transport.Control)
	if !ok {
		return
	}
	switch c.Code {
	case transport.ControlReplica:
		if c.From != s.replica.ID() {
			s.peersMu.Lock()
			s.peers[c.From] = c
			s.peersMu.Unlock()
		}
	case transport.ControlJoin, transport.ControlRemove:
		if s.replica.IsLeader() {
			select {
			case s.membership <- c:
			default:
				s.log.Debug("membership request dropped: busy", "code", c.Code)
			}
		}
	}
}

// onNeedParams answers a node's request for parameters it lacks (leader
// only, at most every 200 ms per version).
func (s *Server) onNeedParams(np transport.NeedParams) {
	if !s.replica.IsLeader() {
		return
	}
	_, applied := s.replica.FSM().Params(nil)
	if np.Version != uint64(applied) {
		return // only the committed θ is held, and published, here
	}
	now := time.Now()
	s.paramsMu.Lock()
	last := s.lastResent[np.Version]
	resend := now.Sub(last) >= 200*time.Millisecond
	if resend {
		clear(s.lastResent)
		s.lastResent[np.Version] = now
	}
	s.paramsMu.Unlock()
	if resend {
		s.publishParams(context.Background(), s.replica.Term())
	}
}

func (s *Server) observeState(st State) {
	s.metrics.observe(st, s.replica)
	s.metrics.nodeCount(s.nodes.count())
}

// ignoreLeadershipLoss turns the errors a deposed leader sees into nil:
// losing leadership is not a failure of the run.
func ignoreLeadershipLoss(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrEnqueueTimeout):
		return nil
	}
	return err
}

func randomID() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("coordinator: round id: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// registry is the set of nodes heard from recently. Shard claims (a node's
// shard and its number of examples) are public configuration, not
// per-step data.
type registry struct {
	mu     sync.Mutex
	nodes  map[string]nodeInfo
	warned map[string]time.Time
}

type nodeInfo struct {
	shard shardClaim
	seen  time.Time
}

// seen records a message from id, an admitted node; it reports whether id
// is new.
func (r *registry) seen(id string, shard shardClaim, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, known := r.nodes[id]
	r.nodes[id] = nodeInfo{shard: shard, seen: now}
	return !known
}

func (r *registry) forget(ids []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		delete(r.nodes, id)
	}
}

// live returns the sorted IDs of nodes heard from within timeout, their
// shard sizes and their shard claims; it drops the others.
func (r *registry) live(now time.Time, timeout time.Duration) ([]string, map[string]int64, map[string]shardClaim) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.nodes))
	shards := make(map[string]int64, len(r.nodes))
	claims := make(map[string]shardClaim, len(r.nodes))
	for id, n := range r.nodes {
		if now.Sub(n.seen) > timeout {
			delete(r.nodes, id)
			continue
		}
		ids = append(ids, id)
		shards[id] = n.shard.size
		claims[id] = n.shard
	}
	slices.Sort(ids)
	return ids, shards, claims
}

func (r *registry) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.nodes)
}

// shouldWarn rate-limits refusals (model, shard identity, seed policy) to
// one answer per node per 5 s.
func (r *registry) shouldWarn(id string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.warned == nil {
		r.warned = make(map[string]time.Time)
	}
	if now.Sub(r.warned[id]) < 5*time.Second {
		return false
	}
	if len(r.warned) > 4096 {
		clear(r.warned)
	}
	r.warned[id] = now
	return true
}
