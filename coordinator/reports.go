package coordinator

import (
	"context"
	"slices"
	"time"

	"github.com/dpcluster/dpcluster/transport"
)

// This file is what a replica tells the others and the nodes about itself:
// its periodic report (ControlReplica) and join request, the leader's
// announcements, and the drain at the end of the run.

// report publishes this replica's ControlReplica and, with
// ServerConfig.Join, asks to join (ControlJoin) until this replica is a
// member. The loop calls it every AnnounceEvery.
func (l *loop) report(ctx context.Context) {
	l.publishReplicaStatus(ctx)
	if l.s.cfg.Join && !isVoter(l.rep, l.rep.ID()) {
		l.publish(ctx, transport.Control{Run: l.s.run.Run, From: l.rep.ID(),
			Code: transport.ControlJoin, Addr: l.rep.Addr()})
	}
}

// isVoter reports whether id is a voter in the configuration c knows.
func isVoter(c Consensus, id string) bool {
	vs, err := c.Voters()
	return err == nil && slices.ContainsFunc(vs, func(v Voter) bool { return v.ID == id })
}

func (l *loop) publishReplicaStatus(ctx context.Context) {
	st := l.rep.FSM().State()
	l.publish(ctx, transport.Control{
		Run: l.s.run.Run, From: l.rep.ID(), Step: uint64(st.Applied), Charged: uint64(st.ChargedStep), Code: transport.ControlReplica,
		Term: l.rep.Term(), Role: string(l.rep.Role()), Leader: l.rep.Leader(),
		Epsilon: st.Epsilon, Nodes: l.nodes.count(), Blocked: l.blocked.String(), Waiting: l.waiting.String(), Insecure: l.s.cfg.Insecure,
		Standing: l.nodes.standingSummary(),
		History:  st.History,
	})
}

// announce publishes Leader{term}; the loop calls it every AnnounceEvery
// while this replica leads and has caught up.
func (l *loop) announce(ctx context.Context) {
	st := l.rep.FSM().State()
	run := l.s.run
	l.publish(ctx, transport.Leader{Run: run.Run, ReplicaID: l.rep.ID(), Term: l.lead.term, Step: uint64(st.Applied),
		ModelHash: run.ModelHash, SampleRate: run.SampleRate, ClipNorm: run.Optimizer.ClipNorm})
}

// draining is the end of the run on the leader: it waits, at most
// DrainTimeout, until every other voter has reported applying the last
// step (a leader that exits at once could leave followers that never
// learn the final entries were committed), then announces the end.
type draining struct {
	step     int64
	waitFor  []string
	deadline time.Time
	sum      Summary
}

func (l *loop) startDrain(ctx context.Context, st State, sum Summary) {
	d := &l.lead.drain
	d.step, d.sum, d.deadline = st.Applied, sum, time.Now().Add(l.s.cfg.DrainTimeout)
	if vs, err := l.rep.Voters(); err == nil && l.s.cfg.DrainTimeout > 0 {
		for _, v := range vs {
			if v.ID != l.rep.ID() {
				d.waitFor = append(d.waitFor, v.ID)
			}
		}
	}
	l.checkDrain(ctx)
}

// checkDrain ends the drain when every voter reported, or at its deadline.
func (l *loop) checkDrain(ctx context.Context) {
	d := &l.lead.drain
	d.waitFor = slices.DeleteFunc(d.waitFor, func(id string) bool { return l.peers[id].Step >= uint64(d.step) })
	if len(d.waitFor) > 0 && time.Now().Before(d.deadline) {
		return
	}
	if len(d.waitFor) > 0 {
		l.log.Warn("finished before every replica reported the last step", "step", d.step, "waiting_for", d.waitFor)
	}
	st := l.rep.FSM().State()
	code := transport.StatusDone
	if st.Stopped != stopBudget && st.Stopped != stopMaxSteps {
		code = transport.StatusStopped
	}
	// Core NATS is at-most-once: say it a few times so nodes hear it.
	for i := range 3 {
		if i > 0 && sleepCtx(ctx, 100*time.Millisecond) != nil {
			break
		}
		l.publish(ctx, transport.Status{ModelHash: l.s.run.ModelHash,
			Run: l.s.run.Run, From: l.rep.ID(), Step: uint64(st.Applied), Code: code, Detail: st.Stopped,
		})
	}
	l.log.Info("run finished", "steps", st.Applied, "charged_step", st.ChargedStep, "epsilon", st.Epsilon, "reason", st.Stopped)
	l.exit = &exit{sum: d.sum}
}
