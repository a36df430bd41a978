package coordinator

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/dpcluster/dpcluster/transport"
)

// maxNodeID is the longest node ID a replica registers or binds.
const maxNodeID = 64

// This file is the loop's side of the nodes: the registry of live nodes,
// kept on every replica (so a new leader knows the nodes at once), and
// the parameters the leader publishes to them.

// onNodeMessage keeps the node registry. A message from a process whose
// node ID's seat another live process holds (registry.holder) leaves the
// registry as it is; a node admitNode refuses is dropped from it; either
// is, by the leader, told why (at most every 5 s). A NeedParams goes to
// onNeedParams.
func (l *loop) onNodeMessage(ctx context.Context, m transport.Message) {
	switch v := m.(type) {
	case transport.NeedParams:
		l.onNeedParams(ctx, v)
		return
	case transport.Leave:
		if !l.nodes.leave(v.NodeID, v.Incarnation) {
			l.log.Info("ignoring a leave from an incarnation that does not hold the node's seat", "node", v.NodeID,
				"incarnation", v.Incarnation, "reason", v.Reason)
			return
		}
		l.log.Info("node left", "node", v.NodeID, "incarnation", v.Incarnation, "reason", v.Reason)
		return
	}
	n, ok := reportOf(m)
	if !ok {
		return
	}
	id, c := n.id, n.shard
	if id == "" || len(id) > maxNodeID || c.size < 0 || len(n.incarnation) > transport.MaxIncarnation {
		l.log.Debug("ignoring node message with a bad node id, shard size or incarnation", "type", m.Type().String())
		return
	}
	now := time.Now()
	if holder, taken := l.nodes.holder(id, n.incarnation, now, l.s.cfg.NodeTimeout); taken {
		// Checked first: a message from another process must not change
		// the holder's registration, not even by the refusal's forget.
		l.s.metrics.nodeRefused(rejectSeatTaken)
		if l.lead != nil && l.nodes.shouldWarn(id, now) {
			l.log.Warn("refusing node", "node", id, "reason", rejectSeatTaken, "incarnation", n.incarnation, "holder_incarnation", holder)
			l.publish(ctx, transport.Status{ModelHash: l.s.run.ModelHash,
				Run: l.s.run.Run, From: l.rep.ID(), Node: id, Code: transport.StatusRejected,
				Detail: rejectSeatTaken + ": another live process holds node ID " + id,
			})
		}
		return
	}
	bound, isBound := l.rep.FSM().DataBinding(id)
	reason := admitNode(l.s.run, n)
	if reason == "" {
		reason = checkBinding(bound, isBound, n)
	}
	if reason != "" {
		l.refuseNode(ctx, n, reason, bound, now)
		return
	}
	if !isBound && n.dataHash != "" {
		l.bindData(id, n.dataHash)
	}
	isNew := l.nodes.seen(id, n.incarnation, c, now)
	if _, join := m.(transport.Join); join || isNew {
		// A Join is sent at a node's start and on a new leader term: a
		// restarted node shows up here even if it was still registered.
		if c.count == 0 {
			l.log.Info("node joined with its own data", "node", id, "examples", c.size, "data_schema", n.dataSchema,
				"seed_policy", n.seedPolicy, "incarnation", n.incarnation)
		} else {
			l.log.Info("node joined", "node", id, "shard", c.size, "shard_index", c.index, "shard_count", c.count,
				"shard_seed", c.seed, "seed_policy", n.seedPolicy, "incarnation", n.incarnation)
		}
	}
	if ls := l.lead; ls != nil && ls.phase == phaseIdle {
		ls.retryAt = time.Time{} // a new node may make a round possible
	}
}

// refuseNode drops node n, which run admission refused for reason (bound:
// the data hash its ID is bound to, for rejectDataHash), counts the
// refusal and, as the leader (at most every 5 s per node), logs it and
// tells the node why.
func (l *loop) refuseNode(ctx context.Context, n nodeReport, reason, bound string, now time.Time) {
	id, c := n.id, n.shard
	l.nodes.forget([]string{id})
	l.s.metrics.nodeRefused(reason)
	if l.lead == nil || !l.nodes.shouldWarn(id, now) {
		return
	}
	l.log.Warn("refusing node", "node", id, "reason", reason, "seed_policy", n.seedPolicy,
		"run_seed_policy", l.s.run.SeedPolicy, "shard_index", c.index, "shard_count", c.count,
		"data_schema", n.dataSchema, "run_data_schema", l.s.run.DataSchema,
		"weights", n.weights, "run_weights", l.s.run.pretrainedWeights())
	detail := reason
	switch reason {
	case rejectDataSchema:
		// The node is told what the run's data looks like (public:
		// the run file says it).
		detail += ": " + l.s.run.DataSchema
	case rejectWeights:
		// The node is told which weights the run starts from
		// (public inputs: the run file names them), "" for none.
		detail += ": " + l.s.run.pretrainedWeights()
	case rejectDataHash:
		// The node is told the hash its ID is bound to (a hash of its
		// own data, which it sent), to name both.
		detail += ": " + bound
		l.log.Warn("refusing node: its ID trained on other data in this run", "node", id, "data_hash", n.dataHash,
			"bound_data_hash", bound, "fix", "give the node the data it trained on (content hash "+bound+
				"), or train on the new data in a new run (another --data-dir, or run name)")
	}
	l.publish(ctx, transport.Status{ModelHash: l.s.run.ModelHash,
		Run: l.s.run.Run, From: l.rep.ID(), Node: id, Code: transport.StatusRejected, Detail: detail,
	})
}

// bindData binds node ID id, admitted unbound, to its data's content hash:
// the leader proposes a bind entry (once at a time per ID), so that every
// replica, and this one after a restart, refuses the ID's other data
// (checkBinding). Followers leave it to the leader.
func (l *loop) bindData(id, hash string) {
	if l.lead == nil || l.binding[id] {
		return
	}
	l.binding[id] = true
	l.start(opBind, l.lead.term, func(ctx context.Context) opResult {
		return opResult{node: id, err: l.rep.ProposeBind(ctx, id, hash)}
	})
}

// onNeedParams answers a node's request for parameters it lacks (leader
// only, at most every 200 ms per version).
func (l *loop) onNeedParams(ctx context.Context, np transport.NeedParams) {
	ls := l.lead
	if ls == nil || !ls.announcing {
		return
	}
	if !l.ahead.valid || np.Version != uint64(l.ahead.step) {
		return // only the last released θ is held, and published, here
	}
	now := time.Now()
	if now.Sub(l.lastResent[np.Version]) < 200*time.Millisecond {
		return
	}
	clear(l.lastResent)
	l.lastResent[np.Version] = now
	l.publishParams(ctx, ls.term)
}

// publishParams publishes the θ this leader last released (ahead, at
// leading.released), as Params. It is the only θ the leader publishes: the
// state machine's θ at the start of the term, then each θ_t once step t's
// charge is committed and applied (onCharged), so nothing uncharged is
// released (charge before release).
func (l *loop) publishParams(ctx context.Context, term uint64) {
	a := &l.ahead
	if !a.valid {
		return
	}
	err := l.s.conn.Publish(ctx, transport.Params{
		Run: l.s.run.Run, Step: uint64(a.step), Version: uint64(a.step), Term: term, Values: a.theta,
	})
	if err != nil && ctx.Err() == nil {
		l.log.Warn("publishing parameters failed", "step", a.step, "err", err)
	}
}

// publish sends m, logging a failure (at debug level: core NATS is
// at-most-once anyway, and the callers repeat what matters).
func (l *loop) publish(ctx context.Context, m transport.Message) {
	if err := l.s.conn.Publish(ctx, m); err != nil && ctx.Err() == nil {
		l.log.Debug("publish failed", "type", m.Type().String(), "err", err)
	}
}

// registry is the set of nodes heard from recently. Shard claims (a node's
// shard and its number of examples) are public configuration, not
// per-step data. It belongs to the loop.
type registry struct {
	nodes  map[string]nodeInfo
	warned map[string]time.Time
}

type nodeInfo struct {
	shard shardClaim
	// incarnation is the process holding the ID's seat (transport.Join.Incarnation).
	incarnation string
	seen        time.Time
	// since is when the node first made its current shard claim, in its
	// current incarnation: of two conflicting claims, the older one stands
	// (checkShards).
	since time.Time
	// answered and skipped count the rounds led here since the node
	// registered that accepted a contribution from it, or did not.
	answered, skipped int64
	// standing is its good standing in the rounds led here (standing.go).
	standing standing
}

// seen records a message from id, an admitted node, sent by incarnation,
// which takes id's seat; it reports whether id is new or its seat has a
// new holder (a restarted process). The caller checks first that the
// seat is not another live incarnation's (holder).
func (r *registry) seen(id, incarnation string, shard shardClaim, now time.Time) bool {
	n, known := r.nodes[id]
	isNew := !known || n.incarnation != incarnation
	if isNew || n.shard != shard {
		n.since = now // a new claim is a new node's, however long it has been registered
	}
	if isNew {
		n.standing = standing{} // a restarted process starts in good standing
	}
	n.shard, n.incarnation, n.seen = shard, incarnation, now
	r.nodes[id] = n
	return isNew
}

// holder returns the incarnation holding id's seat and true if that is not
// incarnation and the holder was heard from within timeout (it is live, by
// the rule live applies): the seat is taken. Otherwise the seat is free
// for incarnation: held by it already, by nobody, or by a lapsed holder.
func (r *registry) holder(id, incarnation string, now time.Time, timeout time.Duration) (string, bool) {
	n, ok := r.nodes[id]
	if !ok || n.incarnation == incarnation || now.Sub(n.seen) > timeout {
		return "", false
	}
	return n.incarnation, true
}

// leave frees id's seat if incarnation holds it (or nobody does), and reports
// whether it did: a Leave from another process, such as one refused the
// seat, does not end the holder's registration.
func (r *registry) leave(id, incarnation string) bool {
	n, ok := r.nodes[id]
	if ok && n.incarnation != incarnation {
		return false
	}
	delete(r.nodes, id)
	return true
}

// counted records a closed round: the nodes it accepted a contribution
// from, and the members it did not.
func (r *registry) counted(accepted, missing []string) {
	for _, id := range accepted {
		if n, ok := r.nodes[id]; ok {
			n.answered++
			r.nodes[id] = n
		}
	}
	for _, id := range missing {
		if n, ok := r.nodes[id]; ok {
			n.skipped++
			r.nodes[id] = n
		}
	}
}

func (r *registry) forget(ids []string) {
	for _, id := range ids {
		delete(r.nodes, id)
	}
}

// live returns the IDs of nodes heard from within timeout, oldest claim
// first (ties by ID), and their shard claims; it drops the others.
func (r *registry) live(now time.Time, timeout time.Duration) ([]string, map[string]shardClaim) {
	ids := make([]string, 0, len(r.nodes))
	claims := make(map[string]shardClaim, len(r.nodes))
	for id, n := range r.nodes {
		if now.Sub(n.seen) > timeout {
			delete(r.nodes, id)
			continue
		}
		ids = append(ids, id)
		claims[id] = n.shard
	}
	slices.SortFunc(ids, func(a, b string) int {
		if c := r.nodes[a].since.Compare(r.nodes[b].since); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	return ids, claims
}

func (r *registry) count() int { return len(r.nodes) }

// shouldWarn rate-limits refusals (model, shard identity, seed policy,
// seat taken) to one answer per node ID per 5 s.
func (r *registry) shouldWarn(id string, now time.Time) bool {
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
