package coordinator

import (
	"context"
	"slices"
	"time"

	"github.com/dpcluster/dpcluster/transport"
)

// This file is the loop's side of the control subject, which only
// replicas may publish on: the other replicas' reports, and the membership
// requests the leader acts on.

// onControl records the other replicas' reports (the drain waits on them)
// and starts the membership change a request asks for.
func (l *loop) onControl(ctx context.Context, c transport.Control) {
	if mine, ok := l.rep.FSM().configuredHistory(); ok && c.History != "" && c.History != mine {
		// Another replica group under this run's name (an operator's
		// copy of the run file on the same NATS): its reports are not
		// our peers' and its requests are not for us (issue 27).
		l.s.metrics.controlRefused(refusedForeignGroup)
		if !l.foreign[c.From+"/"+c.History] && len(l.foreign) < 64 {
			l.foreign[c.From+"/"+c.History] = true
			l.log.Warn("ignoring control traffic of another replica group under this run's name",
				"from", c.From, "code", c.Code, "their_history", c.History, "history", mine)
		}
		return
	}
	switch c.Code {
	case transport.ControlReplica:
		if c.From != l.rep.ID() {
			l.peers[c.From], l.peerSeen[c.From] = c, time.Now()
			if ls := l.lead; ls != nil && ls.phase == phaseDraining {
				l.checkDrain(ctx)
			}
		}
	case transport.ControlJoin, transport.ControlRemove:
		l.changeMembership(c)
	}
}

// changeMembership acts on a join or remove request while this replica
// leads. A join request names the new replica by ID; with Raft over TLS it
// is added only if the replica answering at its address holds a replica
// certificate for that ID (Replica.AddVoter). The change runs on an
// operation goroutine, one at a time: a request that comes while one runs
// is dropped (a joining replica repeats its request every second; an
// operator repeats remove-replica).
func (l *loop) changeMembership(c transport.Control) {
	if l.lead == nil {
		return
	}
	if l.memberBusy {
		l.log.Debug("membership request dropped: a change is in progress", "code", c.Code)
		return
	}
	voters, err := l.rep.Voters()
	if err != nil {
		l.log.Warn("membership request not handled: no Raft configuration", "err", err)
		return
	}
	has := func(id, addr string) bool {
		return slices.ContainsFunc(voters, func(v Voter) bool { return v.ID == id && (addr == "" || v.Addr == addr) })
	}
	var op func(ctx context.Context) error
	switch c.Code {
	case transport.ControlJoin:
		if c.From == "" || c.Addr == "" || has(c.From, c.Addr) {
			return
		}
		l.log.Info("adding replica", "replica", c.From, "addr", c.Addr)
		op = func(ctx context.Context) error { return l.rep.AddVoter(ctx, c.From, c.Addr) }
	case transport.ControlRemove:
		if c.Replica == "" || c.Replica == l.rep.ID() || !has(c.Replica, "") {
			return
		}
		l.log.Info("removing replica", "replica", c.Replica, "asked_by", c.From)
		op = func(ctx context.Context) error { return l.rep.RemoveVoter(ctx, c.Replica) }
	default:
		return
	}
	l.memberBusy = true
	l.start(opMembership, l.lead.term, func(ctx context.Context) opResult {
		return opResult{err: op(ctx), control: c}
	})
}
