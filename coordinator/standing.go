package coordinator

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/dpcluster/dpcluster/aggregation"
)

// Good standing: which of a round's members the round waits for.
//
// Every live admitted node whose shard claim checkShards accepts is a
// member of the round, is sent its RoundStart (a broadcast) and may
// answer: a valid contribution that arrives before the round closes is
// summed, whoever sent it. What standing decides is only when the round
// closes: once every member it waits for has been accepted (or the
// deadline passes). It waits for the members in good standing and for the
// members out of it whose next chance has come (retryAt); if that leaves
// none, for every member, so a run whose members have all lost good
// standing still waits each round out to its deadline instead of closing
// rounds empty at once.
//
// A member loses good standing when a round that waited for it closes
// without its contribution (missed: the deadline passed) or when its
// contribution is refused for its values (refused: dimension, count,
// NaN or Inf, norm; the round stops waiting for it at once). A member out
// of good standing regains it as soon as a round accepts a contribution
// of its: one that beats the members the round waits for, or one sent in
// time in a round that waits for it again. Those chances come after
// RoundTimeout, then twice as long after each one it misses, up to
// standingRetryMax: a member that stays silent costs a round deadline per
// chance, a slow but honest member (one that answers within the deadline)
// is waited for again within standingRetryMax and then keeps its good
// standing. A restarted node (a new incarnation) starts in good standing.
//
// Privacy. Which contributions a round sums still depends on nothing but
// arrival before the close and the validity checks (aggregation.Round),
// as it did when every round waited for every member to its deadline;
// standing only moves the close earlier, by a rule over those same two
// observations in earlier rounds, never over a contribution's values
// beyond the checks. Each step's release is still the sum of the
// accepted contributions plus noise added once, charged as before; a
// member left out of a step only lowers that step's batch. The one
// data-dependent refusal an honest node can meet (its Poisson sample over
// aggregation.CountBound, probability 2⁻⁶⁴ a step) is already counted in
// δ (docs/PRIVACY.md, item 6), and what it does to later rounds' closes
// lies inside that event. Timing remains the channel it was: a node whose
// computation runs past the deadline drops out of the step, and now also
// of the steps until its next chance.

// Standing values (NodeStatus.Standing) and the reasons a member is out
// of good standing: the label values of
// dpcluster_coordinator_nodes_out_of_standing.
const (
	standingGood    = "good"
	standingMissed  = "missed"  // a round that waited for it closed at its deadline without it
	standingRefused = "refused" // a contribution of its was refused for its values
)

var standingReasons = []string{standingMissed, standingRefused}

// standingRetryMax caps the wait between the chances a member out of
// good standing is given (a round that waits for it again).
const standingRetryMax = time.Minute

// standingLogEvery and standingLogLines rate-limit the log lines of one
// node's changes of standing: at most standingLogLines in a window of
// standingLogEvery (a loss and its regain are both logged; a member that
// flaps every round is not logged every round). The changes not logged
// are counted in the next line.
const (
	standingLogEvery = 10 * time.Second
	standingLogLines = 2
)

// standing is a registered node's good standing, kept by the leader.
type standing struct {
	// out is "" in good standing, else standingMissed or standingRefused;
	// detail the refusal's reason (aggregation.Reason's name) or
	// "deadline"; since when it lost good standing, and step the round's.
	out, detail string
	since       time.Time
	step        int64
	// misses counts the chances it missed since it lost good standing;
	// retryAt is when the next comes: the first round opened from then
	// on waits for it.
	misses  int
	retryAt time.Time
	// logWindow is when the current log window of its changes began,
	// logged the lines in it, unlogged the changes since the last line.
	logWindow time.Time
	logged    int
	unlogged  int
}

// logTurn reports whether a change of standing at now may be logged, and
// counts it either way.
func (s *standing) logTurn(now time.Time) bool {
	if now.Sub(s.logWindow) >= standingLogEvery {
		s.logWindow, s.logged = now, 0
	}
	if s.logged >= standingLogLines {
		s.unlogged++
		return false
	}
	s.logged++
	return true
}

// retryAfter is the wait before a member's next chance after it missed
// misses of them (1: it has just lost good standing): the round timeout,
// doubled for each further miss, at most standingRetryMax (but never less
// than the round timeout).
func retryAfter(roundTimeout time.Duration, misses int) time.Duration {
	d := roundTimeout
	for i := 1; i < misses && d < standingRetryMax; i++ {
		d *= 2
	}
	return max(roundTimeout, min(d, standingRetryMax))
}

// valueRefusal reports whether a contribution refused for reason was
// refused for what it holds, which costs its sender good standing. The
// other reasons are not the member's answer to this round: a contribution
// for another step or round (late from an earlier one, or replayed), a
// duplicate of one already accepted, one after the close, or a node that
// is not a member.
func valueRefusal(reason aggregation.Reason) bool {
	switch reason {
	case aggregation.ReasonDimension, aggregation.ReasonNegativeCount, aggregation.ReasonCountTooLarge,
		aggregation.ReasonNaN, aggregation.ReasonInf, aggregation.ReasonNormBound:
		return true
	}
	return false
}

// awaited returns the members of a round opened at now that the round
// waits for: those in good standing and those whose next chance has come;
// every member if that is none.
func (r *registry) awaited(members []string, now time.Time) map[string]bool {
	w := make(map[string]bool, len(members))
	for _, id := range members {
		if s := r.nodes[id].standing; s.out == "" || !now.Before(s.retryAt) {
			w[id] = true
		}
	}
	if len(w) == 0 {
		for _, id := range members {
			w[id] = true
		}
	}
	return w
}

// standingChange is one member's change of good standing at a round's
// close, for the log: st is its standing out of good standing (the new
// one if it lost it, the old one if it regained it).
type standingChange struct {
	id       string
	lost     bool // else regained
	st       standing
	unlogged int  // changes not logged before this one
	log      bool // log it (standing.logTurn)
}

// settleStanding updates the members' standing at the close of round or
// (at now) from its result: an accepted member is in good standing; a
// member whose contribution was refused for its values, and none accepted
// after, is out (refused); a member the round waited for and did not
// accept is out (missed). A member out of good standing that the round
// did not wait for and that sent nothing valid or refused stays as it
// was. A member that fails a round that waited for it while out of good
// standing (a chance) gets its next chance later (retryAfter).
func (r *registry) settleStanding(or *openRound, res aggregation.Result, now time.Time, roundTimeout time.Duration) []standingChange {
	var changes []standingChange
	record := func(id string, n *nodeInfo, lost bool, st standing) {
		c := standingChange{id: id, lost: lost, st: st}
		if n.standing.logTurn(now) {
			c.log, c.unlogged = true, n.standing.unlogged
			n.standing.unlogged = 0
		}
		changes = append(changes, c)
		r.nodes[id] = *n
	}
	for _, id := range res.Accepted {
		n, ok := r.nodes[id]
		if !ok || n.standing.out == "" {
			continue
		}
		was := n.standing
		n.standing = standing{logWindow: was.logWindow, logged: was.logged, unlogged: was.unlogged}
		record(id, &n, false, was)
	}
	fail := func(id, out, detail string) {
		n, ok := r.nodes[id]
		if !ok {
			return
		}
		s := &n.standing
		switch {
		case s.out == "":
			s.out, s.detail, s.since, s.step, s.misses = out, detail, now, or.step, 1
			s.retryAt = now.Add(retryAfter(roundTimeout, s.misses))
			record(id, &n, true, *s)
			return
		case or.awaited[id]:
			// A chance it was given and missed: the next comes later.
			s.out, s.detail = out, detail
			s.misses++
			s.retryAt = now.Add(retryAfter(roundTimeout, s.misses))
		default:
			s.out, s.detail = out, detail // not waited for: only the latest reason
		}
		r.nodes[id] = n
	}
	for _, id := range res.Missing {
		switch {
		case or.refused[id] != 0:
			fail(id, standingRefused, or.refused[id].String())
		case or.awaited[id]:
			fail(id, standingMissed, "deadline")
		}
	}
	return changes
}

// outOfStanding counts the registered nodes out of good standing, by
// reason, and lists them by ID.
func (r *registry) outOfStanding() (map[string]int, []string) {
	by := make(map[string]int, len(standingReasons))
	var ids []string
	for id, n := range r.nodes {
		if n.standing.out != "" {
			by[n.standing.out]++
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return by, ids
}

// standingSummary is the nodes out of good standing as the replica
// reports them ("" for none): "not waited for: b (missed at step 3), c
// (refused at step 5: nan)".
func (r *registry) standingSummary() string {
	_, ids := r.outOfStanding()
	if len(ids) == 0 {
		return ""
	}
	parts := make([]string, len(ids))
	for i, id := range ids {
		s := r.nodes[id].standing
		parts[i] = fmt.Sprintf("%s (%s at step %d", id, s.out, s.step)
		if s.out == standingRefused {
			parts[i] += ": " + s.detail
		}
		parts[i] += ")"
	}
	return "not waited for: " + strings.Join(parts, ", ")
}

// onStandingChanges logs the changes marked for the log and counts them
// all, then sets the gauge of the members out of good standing.
func (l *loop) onStandingChanges(changes []standingChange) {
	for _, c := range changes {
		l.s.metrics.standingChanged(c.lost)
		if !c.log {
			continue
		}
		args := []any{"node", c.id}
		if c.unlogged > 0 {
			args = append(args, "changes_not_logged", c.unlogged)
		}
		if c.lost {
			args = append(args, "reason", c.st.out, "detail", c.st.detail, "step", c.st.step,
				"next_chance_in", time.Until(c.st.retryAt).Round(time.Millisecond).String())
			l.log.Warn("node lost good standing: rounds no longer wait for it", args...)
		} else {
			args = append(args, "was", c.st.out, "out_since_step", c.st.step, "out_for", time.Since(c.st.since).Round(time.Millisecond).String())
			l.log.Info("node regained good standing: rounds wait for it again", args...)
		}
	}
	l.standingMetrics()
	if len(changes) > 0 {
		l.statusDirty = true
	}
}

// standingMetrics sets dpcluster_coordinator_nodes_out_of_standing from
// the registry.
func (l *loop) standingMetrics() {
	by, _ := l.nodes.outOfStanding()
	l.s.metrics.outOfStanding(by)
}

// Why a round closed: the label values of
// dpcluster_coordinator_rounds_closed_total.
const (
	closedAllAnswered      = "all_answered"      // every member was accepted
	closedStandingAnswered = "standing_answered" // every member it waited for was accepted or refused; some it did not wait for had not answered
	closedDeadline         = "deadline"          // the deadline passed
)

var closeCauses = []string{closedAllAnswered, closedStandingAnswered, closedDeadline}

// closeCause names why round or closed with result res.
func closeCause(or *openRound, res aggregation.Result) string {
	switch {
	case or.closedByStanding:
		return closedStandingAnswered
	case res.ClosedBy == aggregation.CauseDeadline:
		return closedDeadline
	}
	return closedAllAnswered
}
