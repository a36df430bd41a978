package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/dpcluster/dpcluster/aggregation"
	"github.com/dpcluster/dpcluster/transport"
)

// roundWindow is how many steps below the newest step seen a RoundStart may
// be and still be considered; older ones are ignored (SkipStaleStep), which
// bounds the memory of answered rounds while keeping "at most once" exact.
// Steps are opened in order (t+1 only after t committed), so a legitimate
// round is never more than one step below the newest.
const roundWindow = 64

type roundKey struct{ step, round uint64 }

type pendingRound struct {
	rs       transport.RoundStart
	deadline time.Time
	nextAsk  time.Time
}

// runLoop is the state of one Run, owned by the loop goroutine.
type runLoop struct {
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
	// notMemberWarned is set once an unknown_node rejection was logged
	// at warn; later ones are logged at debug.
	notMemberWarned bool
	// seatWarned is set once a seat_taken refusal was logged: the node
	// waits for the seat rather than ending, and says so once.
	seatWarned bool
	// end is set when the run is over for this node.
	end *ending
}

type ending struct {
	reason string
	err    error
}

func newRunLoop(w *Worker) *runLoop {
	return &runLoop{w: w, leaders: make(map[string]uint64), deferred: make(map[string]transport.Status), foreign: make(map[string]bool),
		params: make(map[uint64]transport.Vector), paramsTerm: make(map[uint64]uint64), seen: make(map[roundKey]struct{})}
}

// loop is the single goroutine that owns the protocol state. It returns
// the reason to give in Leave and Run's result.
func (s *runLoop) loop(ctx context.Context, in *inbox, fatal <-chan error) (string, error) {
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
func (s *runLoop) publishErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("node: %w", err)
}

// fatalPublish ends the run if err says the connection is closed and
// reports whether it did; other publish errors are the caller's to log.
func (s *runLoop) fatalPublish(ctx context.Context, err error) bool {
	if errors.Is(err, transport.ErrClosed) {
		s.end = &ending{reason: "connection_closed", err: s.publishErr(ctx, err)}
		return true
	}
	return false
}

// adopt follows a new leader of a higher term: re-Join, and drop a waiting
// round of an older term.
func (s *runLoop) adopt(ctx context.Context, replica string, term uint64) {
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

func (s *runLoop) noteLeader(replica string, term uint64) {
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

func (s *runLoop) onLeader(ctx context.Context, l transport.Leader) {
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
func (s *runLoop) foreignRun(l transport.Leader) string {
	if l.ModelHash == "" {
		return ""
	}
	return checkRun(transport.RoundStart{ModelHash: l.ModelHash, SampleRate: l.SampleRate, ClipNorm: l.ClipNorm}, s.w.cfg, s.w.m.Hash())
}

func (s *runLoop) skip(rs transport.RoundStart, r SkipReason, why string) {
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

func (s *runLoop) onRound(ctx context.Context, rs transport.RoundStart) {
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
		s.store(rs.ParamsVersion, rs.Term, rs.Params, true)
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

func (s *runLoop) onTimer(ctx context.Context) {
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

// onStatus handles the leader's verdicts. Requests from other nodes and
// statuses about other nodes are ignored.
func (s *runLoop) onStatus(st transport.Status) {
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

func (s *runLoop) apply(st transport.Status) {
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
		if run, ok := strings.CutPrefix(st.Detail, RejectWeights+": "); ok {
			w.log.Error("node: the coordinator refuses this node: its model starts from other pretrained weights than the run's",
				"weights", w.cfg.Weights, "run_weights", run, "from", st.From)
			fix := "give the node the run's checkpoint folder (--init-from)"
			if run == "" {
				fix = "the run starts from no checkpoint: start the node without --init-from"
			}
			s.end = &ending{reason: "refused",
				err: fmt.Errorf("%w: this node's pretrained weights sha256 %s, the run's %s: %s",
					ErrRefused, weightsName(w.cfg.Weights), weightsName(run), fix)}
			return
		}
		if bound, ok := strings.CutPrefix(st.Detail, RejectDataHash+": "); ok {
			s.end = w.otherData(bound, st.From)
			return
		}
		if held, ok := strings.CutPrefix(st.Detail, RejectSeatTaken+": "); ok {
			// Either this process restarted after one with its ID died
			// without leaving, whose seat lapses when its heartbeats are
			// overdue, or two live processes share the ID. The node keeps
			// heartbeating, so the first case resolves itself; it says
			// so once.
			if !s.seatWarned {
				s.seatWarned = true
				w.log.Error("node: the coordinator refuses this node for now: another process holds its node ID; waiting for that seat to lapse "+
					"(a process that died without leaving loses it when its heartbeats are overdue); if another process does run with this ID, stop it or give this node another --id",
					"detail", held, "incarnation", w.incarnation, "from", st.From)
			}
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
		if st.Detail == aggregation.ReasonUnknownNode.String() {
			// The leader opens rounds without this node: every answer is
			// refused alike, so one warning says it, not one per round.
			if !s.notMemberWarned {
				s.notMemberWarned = true
				w.log.Warn("node: the leader refuses this node's contributions: it is not a member of the rounds "+
					"(its shard claim conflicts with an older node's, or the nodes hold more than the run's N examples: "+
					"see the coordinator's blocked reason); further such rejections are logged at debug",
					"step", st.Step, "reason", st.Detail, "from", st.From)
			} else {
				w.log.Debug("node: contribution rejected", "step", st.Step, "reason", st.Detail, "from", st.From)
			}
			return
		}
		w.log.Warn("node: contribution rejected", "step", st.Step, "reason", st.Detail, "from", st.From)
	}
}

// weightsName is a pretrained weights hash as an error names it: "none"
// for a model initialized from a seed.
// otherData is the end of a node whose ID the run trained on other data,
// of content hash bound (RejectDataHash), as replica from says.
func (w *Worker) otherData(bound, from string) *ending {
	w.log.Error("node: the coordinator refuses this node: the run trained this node ID on other data",
		"data_hash", w.cfg.DataHash, "bound_data_hash", bound, "from", from)
	return &ending{reason: "refused",
		err: fmt.Errorf("%w: node %s trained this run on data with content hash %s, and now reads data with content hash %s: "+
			"give it the data it trained on, or train on the new data in a new run (another --data-dir or run name)",
			ErrRefused, w.cfg.ID, weightsName(bound), weightsName(w.cfg.DataHash))}
}

func weightsName(hash string) string {
	if hash == "" {
		return "none"
	}
	return hash
}
