package coordinator

import (
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/raftnet"
)

// The leader watch (issue 27, failover ≤ 0.5 s p90). Without it a follower
// notices a dead leader only when its heartbeat timer runs out (150–300 ms
// after the last contact, randomized), and its pre-vote succeeds only once
// the other survivor's timer has run out too (hashicorp/raft's leader
// stickiness: a follower refuses to vote while it still has a leader), so a
// failover's election took 150–690 ms (docs/RELIABILITY.md).
//
// A follower starts an election at once when it has proof that the
// leader's process is gone, all of:
//
//  1. an inbound Raft connection ended (raftnet.WatchedStream: a killed
//     process's connections are closed by its kernel);
//  2. the leader has been silent for leaderSilence since its last contact
//     (a live leader heartbeats every HeartbeatTimeout/10 to /5);
//  3. the leader's Raft address refuses TCP connections (raftnet.Refused):
//     a process that is alive, paused or partitioned away, or a proxy in
//     between, does not refuse, so a live leader is never deposed by this
//     path, which pre-vote alone guarantees otherwise.
//
// It then waits its turn among the surviving voters (rank × leaderSilence,
// by ID, so that two survivors do not split the vote); if another survivor
// asked for votes meanwhile (the term moved), it gives that election
// leaderSilence to produce a leader (awaitElection); then, if no new leader
// has been heard from, it sends itself Raft's TimeoutNow, the RPC of a leadership transfer: it
// becomes a candidate at once, and its vote requests carry the transfer
// flag, which the other survivors grant although their own timers still
// run. Raft's safety does not depend on any of this: a vote still needs an
// up-to-date log, a new term and a quorum. When any proof is missing the
// watch does nothing and Raft's timers decide, as before.

// leaderSilence is how long the leader must have been silent (condition 2),
// and the step between the survivors' turns.
const leaderSilence = 50 * time.Millisecond

// leaderWatchPoll is how often the watch re-reads the last contact.
const leaderWatchPoll = 5 * time.Millisecond

// watchLeader runs the leader watch until r.stop is closed; it closes
// r.watchDone when it returns. Started by startRaft when the replica has
// its own TCP transport (r.watch).
func (r *Replica) watchLeader() {
	defer close(r.watchDone)
	for {
		select {
		case <-r.stop:
			return
		case <-r.watch.Ended():
		}
		if r.leaderGone() {
			r.electOnLeaderExit()
		}
	}
}

// leaderGone reports whether the leader this follower knows has been
// silent for leaderSilence and its address refuses connections (conditions
// 2 and 3), waiting at most the heartbeat timeout for the silence.
func (r *Replica) leaderGone() bool {
	addr, id := r.raft.LeaderWithID()
	if r.raft.State() != raft.Follower || id == "" || string(id) == r.cfg.ID {
		return false
	}
	deadline := time.Now().Add(r.cfg.HeartbeatTimeout)
	for time.Since(r.raft.LastContact()) < leaderSilence {
		if time.Now().After(deadline) {
			return false // the leader still heartbeats: the connection ended for another reason
		}
		select {
		case <-r.stop:
			return false
		case <-time.After(leaderWatchPoll):
		}
	}
	dial := string(addr)
	if a, ok := r.cfg.DialAddrs[string(id)]; ok {
		dial = a
	}
	if !raftnet.Refused(dial, leaderSilence) {
		return false
	}
	// Still the same leader, and still a follower?
	_, now := r.raft.LeaderWithID()
	return now == id && r.raft.State() == raft.Follower
}

// electOnLeaderExit waits this replica's turn among the surviving voters,
// and, if the dead leader is still the one it knows then, makes it a
// candidate with Raft's TimeoutNow sent to itself.
func (r *Replica) electOnLeaderExit() {
	_, dead := r.raft.LeaderWithID()
	term := r.raft.CurrentTerm()
	cf := r.raft.GetConfiguration()
	if cf.Error() != nil {
		return
	}
	var voters []string
	for _, s := range cf.Configuration().Servers {
		if s.Suffrage == raft.Voter && s.ID != dead {
			voters = append(voters, string(s.ID))
		}
	}
	slices.Sort(voters)
	rank := slices.Index(voters, r.cfg.ID)
	if rank < 0 {
		return // not a voter: it cannot win
	}
	select {
	case <-r.stop:
		return
	case <-time.After(time.Duration(rank) * leaderSilence):
	}
	if r.raft.CurrentTerm() != term && !r.awaitElection(dead) {
		return
	}
	if _, id := r.raft.LeaderWithID(); (id != dead && id != "") || r.raft.State() != raft.Follower {
		return // another survivor won, or Raft's own timer fired here
	}
	self := r.transport.LocalAddr()
	req := &raft.TimeoutNowRequest{RPCHeader: raft.RPCHeader{
		ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(r.cfg.ID), Addr: []byte(self)}}
	if err := r.transport.TimeoutNow(raft.ServerID(r.cfg.ID), self, req, &raft.TimeoutNowResponse{}); err != nil {
		r.log.Warn("the leader's process is gone; starting an election failed, Raft's timers will", "leader", string(dead), "err", err)
		return
	}
	r.leaderExitElections.Add(1)
	r.log.Info("the leader's process is gone (connection ended, silent, address refused); started an election", "leader", string(dead))
}

// awaitElection is called when the term moved while this replica waited
// its turn: another survivor asked for votes. It waits up to leaderSilence
// for a leader to be heard from and reports whether none was (that
// candidate lost, its log behind this one's, say a replica restarted
// moments ago: this one goes) and this replica is still a follower. Going
// at once instead would depose a candidate that is winning.
func (r *Replica) awaitElection(dead raft.ServerID) bool {
	deadline := time.Now().Add(leaderSilence)
	for time.Now().Before(deadline) {
		if _, id := r.raft.LeaderWithID(); (id != "" && id != dead) || r.raft.State() != raft.Follower {
			return false
		}
		select {
		case <-r.stop:
			return false
		case <-time.After(leaderWatchPoll):
		}
	}
	return r.raft.State() == raft.Follower
}

// LeaderExitElections is the number of elections this replica started on
// proof that the leader's process was gone (the leader watch), not on
// Raft's heartbeat timeout.
func (r *Replica) LeaderExitElections() uint64 { return r.leaderExitElections.Load() }
