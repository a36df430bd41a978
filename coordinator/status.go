package coordinator

import (
	"cmp"
	"encoding/json"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dpcluster/dpcluster/seed"
)

// This file is the Server's read-only view of itself for dashboards
// (package coordinator/dashboard): a Status snapshot the loop replaces
// after each event (copy-on-write: a published Status is never modified),
// and a bounded History of the run's steps and evaluations, which the loop
// appends to. Both hold only public quantities: step numbers, ε, public
// configuration, timings, counts of nodes, and evaluations of θ labelled
// by their data (EvalData). No sum, no example count, no training loss.

// Status is a public snapshot of one replica's view of the run. A Status
// returned by Server.Status is shared: do not modify its slices.
type Status struct {
	Run     string `json:"run"`
	Replica string `json:"replica"`
	// Role, Term and Leader are this replica's Raft view.
	Role   Role   `json:"role"`
	Term   uint64 `json:"term"`
	Leader string `json:"leader"`
	// AppliedStep is the last step applied here (θ's step on this
	// replica). ChargedStep is the last step the ledger charged: the step
	// Epsilon runs through (State.ChargedStep), AppliedStep or one more
	// (a step charged ahead of its g̃, or one the run ended between its
	// charge and its update). Charges is the number of charge records
	// Epsilon is over. Step is ChargedStep, under the name dashboards
	// read first. MaxSteps is the run's limit.
	Step        int64  `json:"step"`
	AppliedStep int64  `json:"applied_step"`
	ChargedStep int64  `json:"charged_step"`
	Charges     uint64 `json:"charges"`
	MaxSteps    int64  `json:"max_steps"`
	// Epsilon is the ε spent at the run's Delta, by the ledger's
	// accountant (ledger.Spent), through ChargedStep; TargetEpsilon is
	// the run's budget.
	Epsilon       Float  `json:"epsilon"`
	TargetEpsilon Float  `json:"target_epsilon"`
	Delta         Float  `json:"delta"`
	Accountant    string `json:"accountant"`
	NoiseMode     string `json:"noise_mode"`
	// Private is false when the noise is seeded (seed.Seeded): such a run
	// is NOT differentially private.
	Private bool `json:"private"`
	// Stopped is why the run stopped ("" while it runs); Blocked why the
	// leader leaves a live node out of its rounds (a shard claim that
	// conflicts with an older one; checkShards), "" when it leaves none
	// out.
	Stopped string `json:"stopped"`
	Blocked string `json:"blocked"`
	// WaitingForNodes is how many more live nodes the leader needs before
	// it opens a round (ServerConfig.MinNodes), 0 when it does not wait;
	// MissingNodes the run's named nodes (RunConfig.Nodes) not live among
	// them, by ID.
	WaitingForNodes int      `json:"waiting_for_nodes"`
	MissingNodes    []string `json:"missing_nodes,omitempty"`
	// OutOfStanding lists the registered nodes out of good standing, by
	// ID: the leader's rounds do not wait for them (NodeStatus.Standing
	// says why). Empty on a follower, which leads no rounds.
	OutOfStanding []string `json:"out_of_standing,omitempty"`
	// Eval is the last evaluation of θ (nil: none yet; leader only).
	Eval *EvalPoint `json:"eval"`
	// Nodes are the registered nodes, by ID; Replicas the replicas this
	// one knows (itself and those that reported), by ID.
	Nodes    []NodeStatus    `json:"nodes"`
	Replicas []ReplicaStatus `json:"replicas"`
	// Updated is when the loop published this snapshot.
	Updated time.Time `json:"updated"`
}

// NodeStatus is a registered node as this replica sees it. Answered and
// Skipped count the rounds, led by this replica since the node
// registered, whose close accepted a contribution from it, or did not
// (missing or rejected); a follower leads none, so both stay 0 there.
// Standing is the node's good standing in the rounds this replica leads
// (standing.go): "good" (the rounds wait for it; always, on a follower),
// "missed" (a round that waited for it closed at its deadline without
// it) or "refused" (a contribution of its was refused for its values:
// StandingDetail names the reason, "nan", "count_too_large"...; for
// missed it is "deadline"); OutSinceStep is the step whose round it
// lost good standing in (0 in good standing).
type NodeStatus struct {
	ID             string    `json:"id"`
	ShardIndex     int       `json:"shard_index"`
	ShardCount     int       `json:"shard_count"`
	ShardSize      int64     `json:"shard_size"`
	LastSeen       time.Time `json:"last_seen"`
	Answered       int64     `json:"answered"`
	Skipped        int64     `json:"skipped"`
	Standing       string    `json:"standing"`
	StandingDetail string    `json:"standing_detail,omitempty"`
	OutSinceStep   int64     `json:"out_since_step,omitempty"`
}

// ReplicaStatus is a replica's last report (ControlReplica), or this
// replica's own state.
type ReplicaStatus struct {
	ID       string    `json:"id"`
	Role     Role      `json:"role"`
	Term     uint64    `json:"term"`
	Step     int64     `json:"step"`
	Leader   string    `json:"leader"`
	Self     bool      `json:"self"`
	Reported time.Time `json:"reported"`
}

// StepPoint is one applied step: ε after it and, on the replica that led
// it, the round's latency (RoundStart until the step was applied here)
// and how many nodes' contributions it accepted (0: not known here).
type StepPoint struct {
	Step         int64 `json:"step"`
	Epsilon      Float `json:"epsilon"`
	RoundSeconds Float `json:"round_seconds,omitempty"`
	Participants int   `json:"participants,omitempty"`
}

// EvalPoint is one evaluation of θ at Step on evaluation data Data
// (EvalData.Key: "test" or "nonprivate_holdout"), labelled Label
// (EvalData.Label); Private is EvalData.Private.
type EvalPoint struct {
	Step     int64  `json:"step"`
	Epsilon  Float  `json:"epsilon"`
	Accuracy Float  `json:"accuracy"`
	Loss     Float  `json:"loss"`
	N        int    `json:"n"`
	Data     string `json:"data"`
	Label    string `json:"label"`
	Private  bool   `json:"private"`
}

// History is the run's series as one replica recorded them since its Run
// started. Steps keeps at most HistoryLimit points: when full, every
// other point is dropped and from then on only steps that are multiples of
// Stride are kept (the first and last step always are). Evals is bounded
// the same way.
type History struct {
	Steps  []StepPoint `json:"steps"`
	Evals  []EvalPoint `json:"evals"`
	Stride int64       `json:"stride"`
}

// Float is a float64 that encodes in JSON as a number, or as null when
// it is not finite (a diverged model's loss), which encoding/json
// refuses; null decodes as NaN.
type Float float64

// MarshalJSON encodes f as a number, or null if f is NaN or infinite.
func (f Float) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(v)
}

// UnmarshalJSON decodes a number, or null as NaN.
func (f *Float) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*f = Float(math.NaN())
		return nil
	}
	var v float64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*f = Float(v)
	return nil
}

// HistoryLimit bounds each series of a History.
const HistoryLimit = 10000

// board is what the loop publishes for Server.Status and Server.History.
// The loop is the only writer; readers are any goroutine.
type board struct {
	status atomic.Pointer[Status]
	// builtAt and builtStep are when, and at which step, the loop built
	// status (the loop's alone).
	builtAt   time.Time
	builtStep int64

	mu         sync.Mutex
	steps      []StepPoint
	evals      []EvalPoint
	stride     int64 // of steps
	evalStride int64
	limit      int
}

func newBoard(limit int) *board {
	return &board{stride: 1, evalStride: 1, limit: max(limit, 4)}
}

// addStep records p, merging it into the last point if it is the same
// step (the leader learns a step's ε from the state machine, then its
// latency from the round).
func (b *board) addStep(p StepPoint) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := len(b.steps); n > 0 {
		last := &b.steps[n-1]
		switch {
		case p.Step == last.Step:
			last.Epsilon = p.Epsilon
			last.RoundSeconds = cmp.Or(p.RoundSeconds, last.RoundSeconds)
			last.Participants = cmp.Or(p.Participants, last.Participants)
			return
		case p.Step < last.Step:
			return
		case last.Step%b.stride != 0 && n > 1:
			// The last point was kept only as the latest: replace it.
			b.steps[n-1] = p
			return
		}
	}
	b.steps = append(b.steps, p)
	b.stride = downsample(&b.steps, b.stride, b.limit, func(p StepPoint) int64 { return p.Step })
}

func (b *board) addEval(p EvalPoint) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := len(b.evals); n > 0 {
		last := &b.evals[n-1]
		switch {
		case p.Step == last.Step:
			*last = p
			return
		case p.Step < last.Step:
			return
		case last.Step%b.evalStride != 0 && n > 1:
			b.evals[n-1] = p
			return
		}
	}
	b.evals = append(b.evals, p)
	b.evalStride = downsample(&b.evals, b.evalStride, b.limit, func(p EvalPoint) int64 { return p.Step })
}

// downsample halves a full series: it doubles stride until at most half
// of the points' steps are multiples of it, keeps those (and the first
// and the last point), and returns the new stride.
func downsample[T any](s *[]T, stride int64, limit int, step func(T) int64) int64 {
	if len(*s) < limit {
		return stride
	}
	pts := *s
	for {
		stride *= 2
		n := 0
		for _, p := range pts {
			if step(p)%stride == 0 {
				n++
			}
		}
		if n+2 <= limit/2 {
			break
		}
	}
	first, last := pts[0], pts[len(pts)-1]
	kept := pts[:1]
	kept[0] = first
	for _, p := range pts[1 : len(pts)-1] {
		if step(p)%stride == 0 {
			kept = append(kept, p)
		}
	}
	kept = append(kept, last)
	clear(pts[len(kept):])
	*s = kept
	return stride
}

func (b *board) history() History {
	b.mu.Lock()
	defer b.mu.Unlock()
	return History{Steps: slices.Clone(b.steps), Evals: slices.Clone(b.evals), Stride: b.stride}
}

// Status returns the last snapshot the Server's loop published (the zero
// Status before Run starts). It is safe to call from any goroutine, and
// never waits for the loop.
func (s *Server) Status() Status {
	if p := s.board.status.Load(); p != nil {
		return *p
	}
	return Status{Run: s.run.Run, Replica: s.rep.ID()}
}

// History returns a copy of the series the loop has recorded. It is safe
// to call from any goroutine.
func (s *Server) History() History { return s.board.history() }

// statusEvery bounds how often the loop rebuilds its Status while the
// step does not move: building it costs time linear in the nodes
// (BenchmarkPublishStatus), and heartbeats and contributions come often.
const statusEvery = 200 * time.Millisecond

// publishStatus records the applied step in the history and publishes a
// new Status built from the loop's state, if the step moved, statusEvery
// has passed since the last one, or final is set. Only the loop calls it:
// after each event it handled (so a Status is at most statusEvery, or the
// loop's longest wait, AnnounceEvery, old), and once with final when Run
// returns.
func (l *loop) publishStatus(final bool) {
	b := l.s.board
	now := time.Now()
	// Most loop iterations (a heartbeat, a contribution) change nothing
	// shown: they return here without reading the state machine, whose
	// State computes ε.
	if !final && !l.statusDirty && now.Sub(b.builtAt) < statusEvery && b.status.Load() != nil {
		return
	}
	l.statusDirty = false
	st := l.rep.FSM().State()
	// ε is paired with the last step charged: with the charge-ahead path
	// the ledger may hold the next step's charge before its g̃ is applied,
	// or keep it after the run ended without applying it.
	step := st.ChargedStep
	if step > 0 {
		b.addStep(StepPoint{Step: step, Epsilon: Float(st.Epsilon)})
	}
	if l.last.EvalStep > 0 {
		b.addEval(evalPoint(l.last))
	}
	if !final && step == b.builtStep && now.Sub(b.builtAt) < statusEvery && b.status.Load() != nil {
		return
	}
	b.builtAt, b.builtStep = now, step
	run := l.s.run
	out := &Status{
		Run: run.Run, Replica: l.rep.ID(), Role: l.rep.Role(), Term: l.rep.Term(), Leader: l.rep.Leader(),
		Step: step, AppliedStep: st.Applied, ChargedStep: step, Charges: st.Charges, MaxSteps: run.MaxSteps, Epsilon: Float(st.Epsilon), TargetEpsilon: Float(run.TargetEpsilon),
		Delta: Float(run.Delta), Accountant: run.AccountantName(), NoiseMode: noiseModeLabel(run.NoiseMode),
		Private: run.SeedPolicy == seed.Crypto, Stopped: st.Stopped, Blocked: l.blocked.String(),
		Nodes: make([]NodeStatus, 0, len(l.nodes.nodes)), Updated: now,
	}
	if w := l.waiting; w != nil {
		out.WaitingForNodes, out.MissingNodes = w.need-len(w.have), w.missing
	}
	if l.last.EvalStep > 0 {
		e := evalPoint(l.last)
		out.Eval = &e
	}
	for id, n := range l.nodes.nodes {
		ns := NodeStatus{
			ID: id, ShardIndex: n.shard.index, ShardCount: n.shard.count, ShardSize: n.shard.size,
			LastSeen: n.seen, Answered: n.answered, Skipped: n.skipped, Standing: standingGood,
		}
		if s := n.standing; s.out != "" {
			ns.Standing, ns.StandingDetail, ns.OutSinceStep = s.out, s.detail, s.step
		}
		out.Nodes = append(out.Nodes, ns)
	}
	_, out.OutOfStanding = l.nodes.outOfStanding()
	slices.SortFunc(out.Nodes, func(a, b NodeStatus) int { return cmp.Compare(a.ID, b.ID) })
	out.Replicas = append(out.Replicas, ReplicaStatus{ID: l.rep.ID(), Role: out.Role, Term: out.Term,
		Step: st.Applied, Leader: out.Leader, Self: true, Reported: now})
	for id, c := range l.peers {
		out.Replicas = append(out.Replicas, ReplicaStatus{ID: id, Role: Role(c.Role), Term: c.Term,
			Step: int64(c.Step), Leader: c.Leader, Reported: l.peerSeen[id]})
	}
	slices.SortFunc(out.Replicas, func(a, b ReplicaStatus) int { return cmp.Compare(a.ID, b.ID) })
	b.status.Store(out)
}

// recordStep adds what the leader knows of a step it led to the history.
func (l *loop) recordStep(p Progress, took time.Duration) {
	l.s.board.addStep(StepPoint{Step: p.Step, Epsilon: Float(p.Epsilon),
		RoundSeconds: Float(took.Seconds()), Participants: p.Participants})
}

func evalPoint(p Progress) EvalPoint {
	return EvalPoint{Step: p.EvalStep, Epsilon: Float(p.Epsilon), Accuracy: Float(p.Eval.Accuracy), Loss: Float(p.Eval.Loss),
		N: p.Eval.N, Data: p.EvalData.Key(), Label: p.EvalData.Label(), Private: p.EvalData.Private()}
}
