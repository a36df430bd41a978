package coordinator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/internal/handoff"
	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/seed"
	"github.com/dpcluster/dpcluster/transport"
)

// Evaluator scores parameters on evaluation data, which is never training
// data; ServerConfig.EvalData says whether it is public or held out of the
// private training data. Implementations need not be safe for concurrent
// use: the Server runs one evaluation at a time, on a goroutine of its own
// beside the rounds (the final one on its loop, after the last has
// returned).
type Evaluator interface {
	Evaluate(theta []float32) (Evaluation, error)
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
	// Charged is the last step charged (State.ChargedStep), the step
	// Epsilon runs through: Steps, or one more when the run ended between
	// a step's charge and its update (an interruption, a stop, a g̃ that
	// failed the optimizer's check; the charge is counted in Epsilon).
	Charged int64
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

// Consensus is what a Server needs from its replica: the replicated state
// machine, the replica's Raft role, and the operations that go through the
// Raft log. *Replica implements it over hashicorp/raft; tests may wrap a
// Replica to hold or fail an operation.
//
// The blocking operations (Barrier, Configure, ProposeCharge, ProposeGrad
// and its wait, ProposeStop, AddVoter, RemoveVoter) are called from
// goroutines the Server owns, never from its loop or a transport handler,
// and may be called concurrently with the other methods.
type Consensus interface {
	ID() string
	// Addr is the Raft address this replica advertises (join requests).
	Addr() string
	FSM() *FSM
	Role() Role
	IsLeader() bool
	Term() uint64
	// Leader is the ID of the replica believed to lead ("" if unknown).
	Leader() string
	// LeadershipChanges signals gains and losses of leadership; a reader
	// re-reads IsLeader and Term on each signal (Replica.LeadershipChanges).
	LeadershipChanges() <-chan bool
	Voters() ([]Voter, error)
	// LeaderExitElections counts the elections this replica started on
	// proof that the leader's process was gone (Replica.LeaderExitElections).
	LeaderExitElections() uint64

	Barrier(ctx context.Context) error
	Configure(ctx context.Context, c RunConfig) error
	ProposeCharge(ctx context.Context, step int64, event accounting.Event, round string) (ApplyResult, error)
	ProposeGrad(ctx context.Context, step int64, charge uint64, noisyGrad []float32) (wait func() (ApplyResult, error), err error)
	ProposeStop(ctx context.Context, reason string) error
	ProposeBind(ctx context.Context, node, dataHash string) error
	AddVoter(ctx context.Context, id, addr string) error
	RemoveVoter(ctx context.Context, id string) error
}

var _ Consensus = (*Replica)(nil)

// Server is one replica's part of a training run. On every replica it
// keeps the registry of live nodes (from Join and Heartbeat); while its
// replica leads, it runs rounds. For step t the leader does, in order
// (charge before release, docs/PRIVACY.md item 14):
//
//  1. On gaining leadership: Barrier, so every committed step is applied
//     here and no committed step is redone; propose the run configuration
//     if the log has none; announce Leader{term} (and every AnnounceEvery
//     after); publish θ_{t-1}, which is committed.
//  2. Open round t: a fresh random round ID, the live registered nodes (a
//     node is registered only if admitNode admits it), a deadline
//     RoundTimeout away; publish RoundStart. No round opens while the live
//     nodes' shards are not disjoint (checkShards): the leader reports why
//     instead (log, metric, replica status). Step t's charge entry (t, the
//     ledger event, the round; no tensor) is already proposed, right
//     behind step t−1's grad entry as θ_{t−1} was released (step 6), or
//     is proposed now: it does not depend on the data, so its commit and
//     the ledger's fsync run while θ goes out and the nodes compute. A
//     round that closes empty keeps the charge for its retry.
//  3. Collect contributions into an aggregation.Round (which validates
//     them) until every member the round waits for (those in good
//     standing, standing.go) was accepted or refused, or the deadline
//     passed.
//  4. Privatize S with the run's noise mode (privatize): by default snap
//     it to the grid Λℤ^d and add exact discrete Gaussian noise,
//     g̃ = Λ(round(S/Λ) + z)/B, z ~ N_Z(0, ⌈σC/Λ⌉²I) from the CSPRNG,
//     drawn ahead, as z does not depend on the data: after the previous
//     round closed, or at step 2 after a new leadership or an empty
//     round; clear S and z. Nothing un-noised leaves this function. Check
//     g̃ with dpadam.CheckGradient, the rule the state machine applies: if
//     it fails, propose the end of the run instead of the step.
//  5. Wait until step t's charge is committed and applied here: the state
//     machine has charged the ledger (fsynced). g̃ is still only in this
//     process's memory. A charge the state machine refuses (the budget,
//     a stopped run) releases nothing of step t.
//  6. Only then compute θ_t on the loop's copy of the optimizer one step
//     ahead (aheadState), publish Params(θ_t), and propose the grad entry
//     (t, the charge's index, g̃) on a goroutine of its own; every replica
//     moves θ when it commits, while the next round runs. Step t+1's
//     charge (or the stop) is proposed right after it, unless the run
//     ends at step t (MaxSteps, or the budget).
//
// Before opening a round the leader checks that one more step fits the
// budget; if not, it proposes the end of the run (the state machine
// refuses an over-budget step anyway). When the state machine reports the
// run stopped, the leader evaluates the final θ, waits (at most
// DrainTimeout) for the other voters to report the last step, publishes
// Status done, and Run returns on every replica.
//
// Every replica also reports its state on the control subject
// (Control ControlReplica) and the leader acts on the membership requests
// there (ControlJoin, ControlRemove), which only replicas may publish.
//
// # Concurrency
//
// One goroutine, Run's loop, owns all of the protocol state: the node
// registry, the other replicas' reports, the open round, the noise drawn
// for it, the rate limits. The transport's handlers only forward messages
// to it (inbox); the Raft operations, which block until a quorum answers,
// run on goroutines the loop starts and waits for (ops), and report back
// on a channel, so the loop never blocks on Raft and a slow membership
// change does not hold up rounds. The files split the loop by concern:
// this file (the loop, its inbox and its operations), round.go (the
// leader's step up to g̃), charge.go (its charge and release),
// registry.go (nodes), membership.go
// (join and remove) and reports.go (replica reports, announcements,
// drain).
type Server struct {
	rep     Consensus
	conn    transport.Conn
	run     RunConfig
	cfg     ServerConfig
	log     *slog.Logger
	noise   *mechanism.NoiseSource
	metrics *Metrics
	board   *board // what the loop publishes for Status and History (status.go)
}

// NewServer returns a Server for replica, training run over conn. The run
// configuration must be the one the replica's log holds (or will hold: the
// first leader proposes it).
func NewServer(replica Consensus, conn transport.Conn, run RunConfig, cfg ServerConfig, log *slog.Logger) (*Server, error) {
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
	// A node's contribution has a known size for the run's model: a
	// transfer announcing more is refused at its first chunk (issue 27).
	if l, ok := conn.(transport.TopicLimiter); ok {
		l.LimitTopic(transport.TopicContributions, transport.ContributionMaxBytes(run.Dim))
	}
	return &Server{rep: replica, conn: conn, run: run, cfg: cfg, log: log, noise: noise, metrics: cfg.Metrics,
		board: newBoard(HistoryLimit)}, nil
}

// ErrRunMismatch is returned by Run when the replica's log holds another
// run's configuration.
var ErrRunMismatch = errors.New("coordinator: the replica's log holds a different run")

// Run serves until the run stops (it returns the Summary and nil), ctx is
// cancelled (ctx.Err()), or the replica fails (an error wrapping
// ErrFatal). It subscribes to the node, contribution and control topics
// and unsubscribes before returning; every goroutine it starts has exited
// by then. Run is called once per Server.
func (s *Server) Run(ctx context.Context) (Summary, error) {
	in := newInbox()
	var subs []transport.Subscription
	defer func() {
		in.close()
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}()
	for _, topic := range []transport.Topic{transport.TopicNodes, transport.TopicContributions, transport.TopicControl} {
		sub, err := s.conn.Subscribe(topic, in.deliver)
		if err != nil {
			return Summary{}, err
		}
		subs = append(subs, sub)
	}
	l := newLoop(s, in)
	sum, err := l.run(ctx)
	// Once more on the way out: a follower that saw the run stop tells the
	// leader it has applied the last step.
	l.publishReplicaStatus(context.WithoutCancel(ctx))
	return sum, err
}

// inbox carries messages from the subscription handlers (goroutines owned
// by the transport) to the loop. A handler only forwards: it blocks while
// the loop's queue for its kind is full (back-pressure on the
// subscription, which the transport bounds) and returns at once after
// close. close makes every handler call return promptly and waits for
// those in progress.
type inbox struct {
	nodes    chan transport.Message // Join, Heartbeat, Leave, NeedParams
	contribs chan transport.Contribution
	control  chan transport.Control
	gate     *handoff.Gate
}

func newInbox() *inbox {
	return &inbox{
		nodes:    make(chan transport.Message, 256),
		contribs: make(chan transport.Contribution, 64),
		control:  make(chan transport.Control, 64),
		gate:     handoff.NewGate(),
	}
}

// deliver is the transport.Handler of every subscription.
func (in *inbox) deliver(m transport.Message) {
	if !in.gate.Enter() {
		return
	}
	defer in.gate.Leave()
	switch v := m.(type) {
	case transport.Contribution:
		handoff.Send(in.gate, in.contribs, v)
	case transport.Control:
		handoff.Send(in.gate, in.control, v)
	case transport.Join, transport.Heartbeat, transport.Leave, transport.NeedParams:
		handoff.Send(in.gate, in.nodes, m)
	}
}

func (in *inbox) close() { in.gate.Close() }

// opKind names an operation that goes through Raft.
type opKind int

const (
	opBarrier opKind = iota
	opConfigure
	opCharge // a step's charge entry
	opGrad   // a step's grad entry, after its charge
	opStop
	opMembership
	opBind // a node's data binding
)

// opResult is what an operation reports back to the loop.
type opResult struct {
	kind opKind
	term uint64 // the leadership term it was started in
	err  error
	ar   ApplyResult
	// g is the noisy gradient an opGrad held, handed back to the loop
	// (its owner while no proposal holds it).
	g []float32
	// step carries what the loop needs after an opCharge or opGrad.
	step stepInFlight
	// control is an opMembership's request.
	control transport.Control
	// node is an opBind's node ID.
	node string
}

// loop is the state of one Run, owned by the loop goroutine (the one that
// called Run) except where noted.
type loop struct {
	s   *Server
	rep Consensus
	in  *inbox
	log *slog.Logger

	// ops are the goroutines running Raft operations; each sends one
	// opResult on results (or gives up when opCtx ends) and exits.
	opCtx    context.Context
	opCancel context.CancelFunc
	ops      sync.WaitGroup
	results  chan opResult

	nodes    registry
	peers    map[string]transport.Control // replicas' last ControlReplica, by ID
	peerSeen map[string]time.Time         // when each of peers was received
	// foreign holds the replicas of other groups (ID/history) whose
	// control traffic was ignored, to warn once each (at most 64).
	foreign    map[string]bool
	lastResent map[uint64]time.Time // NeedParams rate limit, by version
	memberBusy bool                 // a membership operation is running
	// binding holds the node IDs whose data binding this leader is
	// proposing (opBind), so that each is proposed once at a time.
	binding map[string]bool

	lead *leading // non-nil while this replica leads and knows it
	last Progress // the leader's last evaluation
	// baseLoss is the loss checkDivergence measures against (of θ of
	// baseStep; haveBase: known): θ₀'s, which a leader starting a run
	// evaluates first (baseAsked), else this leader's first evaluation.
	// diverged, once set, is the reason advance stops the run with.
	baseLoss  float64
	baseStep  int64
	haveBase  bool
	baseAsked bool
	diverged  string

	// An evaluation of θ runs on a goroutine of the loop's (startEval),
	// one at a time: evalBusy while it runs, its θ copied into evalTheta
	// (reused), its result on evalResults (buffered, so it never blocks).
	evalBusy    bool
	evalTheta   []float32
	evalResults chan evalResult
	// evalStep is the step of the evaluation running; evalNext, the first
	// evaluation that came due while θ₀'s ran, which runs after it (so
	// that θ₀'s does not cost the run its first evaluation).
	evalStep int64
	evalNext *evalResult

	// blocked is why the leader opens no round now (nil: not blocked);
	// blockLogged and blockLoggedAt rate-limit its warning.
	blocked       *roundBlock
	blockLogged   string
	blockLoggedAt time.Time

	// waiting is the leader waiting for nodes (nil: it has enough, or does
	// not lead); waitLoggedAt rate-limits its log line.
	waiting      *nodeWait
	waitLoggedAt time.Time

	// sum is the rounds' sum buffer (aggregation.WithSumBuffer): the open
	// round's until it closes, cleared once its noisy gradient is formed.
	sum []float64
	// grads are noisy-gradient buffers no proposal holds (at most two are
	// in use: one g̃ in its grad entry while the next is charged).
	grads [][]float32
	// ahead is θ and the optimizer as the leader releases them: the state
	// machine's, plus the step whose charge is applied and whose grad
	// entry may not be yet (aheadState).
	ahead aheadState
	// gradQueued is closed once the last grad entry proposed holds its
	// place in the log (nil: none proposed in this Run), so that the next
	// charge or stop is proposed after it.
	gradQueued chan struct{}
	// pending is the discrete noise of the next release, drawn during the
	// previous step's proposal or while the round's nodes compute, by
	// goroutines of the loop's (startNoise). While drawing is non-nil they
	// own pending; the loop waits for them (awaitNoise) before it touches
	// pending again, and drawErr is the draw's error if it could not start.
	pending mechanism.Noise
	drawing *mechanism.Drawing
	drawErr error

	nextReport time.Time
	exit       *exit // set when Run is to return

	// statusDirty says the state machine changed since Status was last
	// rebuilt (status.go).
	statusDirty bool
	// configChecked says the log's run configuration was compared with
	// the Server's (onState).
	configChecked bool
}

type exit struct {
	sum Summary
	err error
}

func newLoop(s *Server, in *inbox) *loop {
	return &loop{
		s: s, rep: s.rep, in: in, log: s.log,
		results:     make(chan opResult, 8),
		evalResults: make(chan evalResult, 1),
		nodes:       registry{nodes: make(map[string]nodeInfo)},
		peers:       make(map[string]transport.Control),
		peerSeen:    make(map[string]time.Time),
		foreign:     make(map[string]bool),
		lastResent:  make(map[uint64]time.Time),
		binding:     make(map[string]bool),
	}
}

// run is the loop. It returns when exit is set or ctx ends, after every
// operation it started has returned.
func (l *loop) run(ctx context.Context) (Summary, error) {
	l.opCtx, l.opCancel = context.WithCancel(ctx)
	defer func() {
		l.opCancel()
		l.ops.Wait()
		l.awaitNoise()
		l.pending.Clear()
		l.publishStatus(true)
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	fsm := l.rep.FSM()
	l.onState()
	for l.exit == nil {
		l.checkLeadership()
		if l.exit == nil {
			l.advance(ctx)
		}
		if l.exit != nil {
			break
		}
		now := time.Now()
		if !now.Before(l.nextReport) {
			l.report(ctx)
			l.nextReport = now.Add(l.s.cfg.AnnounceEvery)
		}
		if ls := l.lead; ls != nil && ls.announcing && !now.Before(ls.nextAnnounce) {
			l.announce(ctx)
			ls.nextAnnounce = now.Add(l.s.cfg.AnnounceEvery)
		}
		timer.Reset(time.Until(l.nextWake()))
		var roundDone <-chan struct{}
		if ls := l.lead; ls != nil && ls.round != nil {
			roundDone = ls.round.r.Done()
		}
		select {
		case <-ctx.Done():
			return l.settle(), ctx.Err()
		case <-l.rep.LeadershipChanges():
			// checkLeadership re-reads the role at the top of the loop.
		case <-fsm.Changed():
			l.onState()
		case r := <-l.results:
			l.onResult(ctx, r)
		case e := <-l.evalResults:
			l.onEval(e)
		case m := <-l.in.nodes:
			l.onNodeMessage(ctx, m)
		case c := <-l.in.contribs:
			l.onContribution(ctx, c)
		case c := <-l.in.control:
			l.onControl(ctx, c)
		case <-roundDone:
			l.closeRound(ctx)
		case <-timer.C:
			l.onTimer(ctx)
		}
		timer.Stop()
		l.publishStatus(false)
	}
	return l.exit.sum, l.exit.err
}

// nextWake is the earliest time the loop has something to do without a
// message: the next report, the next announcement, the leader's next look
// at the registry, the end of the drain.
func (l *loop) nextWake() time.Time {
	next := l.nextReport
	if ls := l.lead; ls != nil {
		if ls.announcing && ls.nextAnnounce.Before(next) {
			next = ls.nextAnnounce
		}
		if ls.phase == phaseIdle && ls.retryAt.After(time.Now()) && ls.retryAt.Before(next) {
			next = ls.retryAt
		}
		if ls.phase == phaseDraining && ls.drain.deadline.Before(next) {
			next = ls.drain.deadline
		}
	}
	return next
}

// onTimer handles the wake-ups of nextWake; reports and announcements are
// sent at the top of the loop.
func (l *loop) onTimer(ctx context.Context) {
	l.onState() // a safety net: the state is read at least every AnnounceEvery
	if ls := l.lead; ls != nil && ls.phase == phaseDraining {
		l.checkDrain(ctx)
	}
}

// onState reads the state machine after it changed: metrics, and the end
// of Run on a replica that does not lead.
func (l *loop) onState() {
	l.statusDirty = true
	st := l.rep.FSM().State()
	l.s.metrics.observe(st, l.rep)
	l.s.metrics.nodeCount(l.nodes.count())
	if st.Fatal != nil {
		l.finishWith(st, st.Fatal)
		return
	}
	if st.Configured && !l.configChecked {
		// Whatever this replica's role, and before a stopped run ends Run:
		// the log's run must be the one this replica was given (a finished
		// run restored from its last snapshot is stopped at once).
		l.configChecked = true
		if c, ok := l.rep.FSM().Config(); ok && !sameRun(c, l.s.run) {
			l.finishWith(st, runMismatch(c, l.s.run))
			return
		}
	}
	if st.Stopped != "" && l.lead == nil && !l.rep.IsLeader() {
		l.finishWith(st, nil)
	}
}

// finishWith ends Run with the state st and err.
func (l *loop) finishWith(st State, err error) {
	if l.exit == nil {
		l.exit = &exit{sum: l.summary(st), err: err}
	}
}

// fail ends Run with err.
func (l *loop) fail(err error) { l.finishWith(l.rep.FSM().State(), err) }

// settleTimeout bounds how long an interrupted Run waits for the entries
// already in the log to be applied (settle).
const settleTimeout = 2 * time.Second

// settle is the summary of an interrupted Run. A step proposed before the
// interruption may still be committed and applied, and its ε charged, after
// the loop stopped: on the leader it waits (at most settleTimeout) for the
// last g̃ to be queued and then for a Raft barrier, so that every entry in
// the log is applied, then reports the state, in the summary and in the
// metrics, so that neither reports less than the ledger charged.
func (l *loop) settle() Summary {
	if l.rep.IsLeader() {
		ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
		// The last g̃ proposed goes to the log even now (proposeGrad);
		// the barrier comes after it.
		if err := waitQueued(ctx, l.gradQueued); err != nil {
			l.s.log.Debug("interrupted: the last g̃ not queued", "err", err)
		}
		if err := l.rep.Barrier(ctx); err != nil {
			l.s.log.Debug("interrupted: entries not settled", "err", err)
		}
		cancel()
	}
	st := l.rep.FSM().State()
	l.s.metrics.observe(st, l.rep)
	return l.summary(st)
}

func (l *loop) summary(st State) Summary {
	d, _ := l.rep.FSM().Digest()
	return Summary{Steps: st.Applied, Epsilon: st.Epsilon, Delta: l.s.run.Delta, Charges: st.Charges, Charged: st.ChargedStep,
		Stopped: st.Stopped, Digest: d}
}

// start runs op on a goroutine of its own and sends its result to the
// loop. The goroutine exits after sending, or when opCtx ends (Run is
// returning; run waits for it).
func (l *loop) start(kind opKind, term uint64, op func(ctx context.Context) opResult) {
	l.ops.Add(1)
	go func() {
		defer l.ops.Done()
		r := op(l.opCtx)
		r.kind, r.term = kind, term
		select {
		case l.results <- r:
		case <-l.opCtx.Done():
		}
	}()
}

// onResult handles an operation's result.
func (l *loop) onResult(ctx context.Context, r opResult) {
	switch r.kind {
	case opGrad:
		l.putGrad(r.g)
	case opBind:
		delete(l.binding, r.node)
		if r.err != nil && ctx.Err() == nil {
			l.log.Warn("binding a node to its training data failed; retried at its next message", "node", r.node, "err", r.err)
		}
		return
	case opMembership:
		l.memberBusy = false
		if r.err != nil && ctx.Err() == nil {
			c := r.control
			l.log.Warn("membership change failed", "code", c.Code, "replica", cmp.Or(c.Replica, c.From), "err", r.err)
		}
		return
	}
	ls := l.lead
	if ls == nil || r.term != ls.term {
		return // started under a leadership this replica no longer holds
	}
	if r.err != nil {
		if ignoreLeadershipLoss(ctx, r.err) == nil {
			// Deposed while the operation ran. Lead again only after a
			// new Barrier (checkLeadership), which applies whatever of
			// this term's entries got committed.
			l.stepDown("lost leadership during a Raft operation: " + r.err.Error())
			return
		}
		l.fail(r.err)
		return
	}
	switch r.kind {
	case opBarrier, opConfigure:
		l.onLeading(ctx, r.kind)
	case opCharge:
		l.onChargeResult(ctx, r.step.step, r.ar)
	case opGrad:
		l.onGradApplied(r)
	case opStop:
		ls.phase = phaseIdle
	}
}

// ignoreLeadershipLoss turns the errors a deposed leader sees into nil:
// losing leadership is not a failure of the run.
func ignoreLeadershipLoss(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case isLeadershipLoss(err):
		return nil
	}
	return err
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
