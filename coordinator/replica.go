package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/accounting"
	"github.com/dpcluster/dpcluster/raftlog"
	"github.com/dpcluster/dpcluster/raftnet"
)

// Replica is one coordinator replica: a Raft node over durable stores with
// the FSM on top.
type Replica struct {
	cfg       ReplicaConfig
	raft      *raft.Raft
	fsm       *FSM
	logs      *raftlog.Store
	transport raft.Transport
	tls       *raftnet.TLSStream // nil: plain TCP
	log       *slog.Logger

	// watch reports the end of inbound Raft connections to the leader
	// watch (leaderwatch.go; nil with ReplicaConfig.Transport); watchDone
	// is closed when the watch has returned.
	watch               *raftnet.WatchedStream
	stream              *raftnet.Stream // the TCP listener under both (nil with ReplicaConfig.Transport)
	watchDone           chan struct{}
	leaderExitElections atomic.Uint64

	// The snapshot goroutine (snapshots): stop ends it, stopped is closed
	// when it has.
	stop, stopped chan struct{}
	// rf is raft once NewRaft returned, and finalLater says the run
	// stopped before (finalTrailing).
	rf         atomic.Pointer[raft.Raft]
	finalLater atomic.Bool
}

// OpenReplica opens (creating if needed) the replica's data dir, starts
// Raft and, if asked, bootstraps the cluster.
func OpenReplica(cfg ReplicaConfig, init InitFunc) (*Replica, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("replica", cfg.ID)
	if err := makeDataDir(cfg, log); err != nil {
		return nil, err
	}
	raftLog := newRaftLogWriter(log, cfg.ID)
	hlog := hclog.New(&hclog.LoggerOptions{
		Name: "raft", Level: hclog.Warn, Output: raftLog, DisableTime: true,
	})

	fsm, err := NewFSM(cfg.DataDir, init, log, cfg.LedgerOptions...)
	if err != nil {
		return nil, err
	}
	fsm.snapModels, fsm.snapMin = int64(cfg.SnapshotModels), cfg.SnapshotMinBytes
	r := &Replica{cfg: cfg, fsm: fsm, log: log}
	ok := false
	defer func() {
		if !ok {
			r.closeStores()
		}
	}()
	if r.logs, err = raftlog.Open(filepath.Join(cfg.DataDir, "raft")); err != nil {
		return nil, err
	}
	logs := r.logs
	fsm.onConfigured = func(dim int) { logs.SetSegmentBytes(segmentBytesFor(dim)) }
	fsm.onStopped = func() {
		if rf := r.rf.Load(); rf != nil {
			r.finalTrailing(rf)
		} else {
			r.finalLater.Store(true)
		}
	}
	snaps, err := raftlog.OpenSnapshots(cfg.DataDir, cfg.SnapshotsRetained)
	if err != nil {
		return nil, err
	}
	if err := r.openTransport(hlog); err != nil {
		return nil, err
	}
	rc, err := raftConfig(cfg, hlog)
	if err != nil {
		return nil, err
	}
	if err := r.checkRaftState(snaps); err != nil {
		return nil, err
	}
	if cfg.Bootstrap {
		if err := r.bootstrap(rc, snaps); err != nil {
			return nil, err
		}
	}
	if err := r.startRaft(rc, snaps, raftLog); err != nil {
		return nil, err
	}
	ok = true
	return r, nil
}

// makeDataDir claims the replica's data dir (claimDataDir) and creates it
// and its raft/ folder if needed.
func makeDataDir(cfg ReplicaConfig, log *slog.Logger) error {
	if err := claimDataDir(cfg.DataDir, cfg.ID, log); err != nil {
		return err
	}
	for _, d := range []string{cfg.DataDir, filepath.Join(cfg.DataDir, "raft")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// checkRaftState refuses to start the replica (writing nothing, not even a
// bootstrap) if the Raft state its ledger charged from is gone from its
// log and snapshots: the ledger resumes only on that state.
func (r *Replica) checkRaftState(snaps raft.SnapshotStore) error {
	st, err := readRaftState(r.logs, snaps)
	if err != nil {
		return err
	}
	if err := r.fsm.checkRaftState(st); err != nil {
		return fmt.Errorf("coordinator: replica %s will not start on %s: %w; "+
			"to resume, restore this data directory's Raft log (raft/) and snapshots from a backup; "+
			"to train again instead, use a new data directory and keep this ledger (its charges were spent on the same data)",
			r.cfg.ID, r.cfg.DataDir, err)
	}
	return nil
}

// startRaft starts Raft on the replica's stores and transport, gives the
// Raft log writer its configuration (to name peers) and starts the
// snapshot goroutine.
func (r *Replica) startRaft(rc *raft.Config, snaps raft.SnapshotStore, raftLog *raftLogWriter) error {
	var err error
	r.raft, err = raft.NewRaft(rc, r.fsm, r.logs, r.logs, snaps, r.transport)
	if err != nil {
		return fmt.Errorf("coordinator: starting Raft: %w", err)
	}
	rf := r.raft
	r.rf.Store(rf)
	if r.finalLater.Load() {
		r.finalTrailing(rf)
	}
	raftLog.setConfiguration(func() raft.Configuration {
		f := rf.GetConfiguration()
		if f.Error() != nil {
			return raft.Configuration{}
		}
		return f.Configuration()
	})
	r.stop, r.stopped = make(chan struct{}), make(chan struct{})
	go r.snapshots()
	r.watchDone = make(chan struct{})
	if r.watch != nil {
		go r.watchLeader()
	} else {
		close(r.watchDone)
	}
	return nil
}

// openTransport sets r.transport: ReplicaConfig.Transport if given, else
// Raft's TCP transport listening on RaftAddr (with TLS if configured,
// r.tls), hashicorp/raft logging to hlog.
func (r *Replica) openTransport(hlog hclog.Logger) error {
	cfg := r.cfg
	if r.transport = cfg.Transport; r.transport != nil {
		return nil
	}
	stream, err := raftnet.Listen(cfg.RaftAddr)
	if err != nil {
		return fmt.Errorf("coordinator: Raft transport on %s: %w", cfg.RaftAddr, err)
	}
	r.stream = stream
	var layer raft.StreamLayer = stream
	if cfg.TLS != nil {
		r.tls = raftnet.NewTLSStream(stream, cfg.TLS, r.log)
		layer = r.tls
	}
	r.watch = raftnet.Watch(layer)
	layer = r.watch
	tc := &raft.NetworkTransportConfig{Stream: layer, MaxPool: 4, Timeout: 10 * time.Second, Logger: hlog}
	if len(cfg.DialAddrs) > 0 {
		tc.ServerAddressProvider = dialAddrs(cfg.DialAddrs)
	}
	r.transport = raft.NewNetworkTransportWithConfig(tc)
	return nil
}

// raftConfig is hashicorp/raft's configuration for the replica cfg,
// logging to hlog, validated by raft.ValidateConfig.
func raftConfig(cfg ReplicaConfig, hlog hclog.Logger) (*raft.Config, error) {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.TrailingLogs = cfg.TrailingLogs
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.Logger = hlog
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	return rc, nil
}

// bootstrap bootstraps the cluster with ReplicaConfig.Peers (or this
// replica alone) unless the stores already hold Raft state.
func (r *Replica) bootstrap(rc *raft.Config, snaps raft.SnapshotStore) error {
	has, err := raft.HasExistingState(r.logs, r.logs, snaps)
	if err != nil || has {
		return err
	}
	peers := r.cfg.Peers
	if len(peers) == 0 {
		peers = []raft.Server{{ID: rc.LocalID, Address: r.transport.LocalAddr()}}
	}
	if err := raft.BootstrapCluster(rc, r.logs, r.logs, snaps, r.transport, raft.Configuration{Servers: peers}); err != nil {
		return fmt.Errorf("coordinator: bootstrap: %w", err)
	}
	return nil
}

// segmentBytesFor is the Raft log's segment size for a model of dim
// parameters: one g̃ entry (4·dim bytes), at least 1 MiB. Compaction frees
// whole segments, so the log then keeps at most about one g̃ more than
// Raft asks it to.
func segmentBytesFor(dim int) int64 { return max(4*int64(dim), 1<<20) }

// snapshots takes the snapshots the state machine asks for (FSM.wantSnap):
// when the g̃ applied since the last one reach SnapshotModels copies of
// the model, and once the run has stopped (by then TrailingLogs is
// FinalTrailingLogs: finalTrailing). It runs from OpenReplica until Close.
func (r *Replica) snapshots() {
	defer close(r.stopped)
	for {
		select {
		case <-r.stop:
			return
		case <-r.fsm.wantSnap:
		}
		err := r.raft.Snapshot().Error()
		if err != nil && !errors.Is(err, raft.ErrNothingNewToSnapshot) && !errors.Is(err, raft.ErrRaftShutdown) {
			r.log.Warn("snapshot failed", "err", err)
		}
	}
}

// finalTrailing lowers TrailingLogs to FinalTrailingLogs once the run has
// stopped. The state machine calls it (onStopped) in the Apply that stops
// the run, so every snapshot of the stopped state, the one it then asks
// for or one raft takes meanwhile, compacts the log down to it.
func (r *Replica) finalTrailing(rf *raft.Raft) {
	rc := rf.ReloadableConfig()
	rc.TrailingLogs = r.cfg.FinalTrailingLogs
	if err := rf.ReloadConfig(rc); err != nil {
		r.log.Warn("keeping the trailing log entries", "err", err)
	}
}

func (r *Replica) closeStores() {
	if c, ok := r.transport.(raft.WithClose); ok {
		c.Close()
	}
	if r.logs != nil {
		r.logs.Close()
	}
	r.fsm.Close()
}

// FSM returns the replica's state machine.
func (r *Replica) FSM() *FSM { return r.fsm }

// Addr returns the Raft address this replica advertises.
func (r *Replica) Addr() string { return string(r.transport.LocalAddr()) }

// ID returns the replica's ID.
func (r *Replica) ID() string { return r.cfg.ID }

// Role is a replica's Raft role.
type Role string

// Roles, as Role reports them.
const (
	RoleFollower  Role = "follower"
	RoleCandidate Role = "candidate"
	RoleLeader    Role = "leader"
	RoleShutdown  Role = "shutdown"
)

// Roles lists every Role (metrics register one series per role).
func Roles() []Role { return []Role{RoleFollower, RoleCandidate, RoleLeader, RoleShutdown} }

// Role returns the replica's current Raft role.
func (r *Replica) Role() Role {
	switch r.raft.State() {
	case raft.Leader:
		return RoleLeader
	case raft.Candidate:
		return RoleCandidate
	case raft.Shutdown:
		return RoleShutdown
	}
	return RoleFollower
}

// IsLeader reports whether this replica currently leads.
func (r *Replica) IsLeader() bool { return r.raft.State() == raft.Leader }

// Term returns the current Raft term.
func (r *Replica) Term() uint64 { return r.raft.CurrentTerm() }

// Leader returns the ID of the replica this one believes leads ("" if
// none is known).
func (r *Replica) Leader() string {
	_, id := r.raft.LeaderWithID()
	return string(id)
}

// LeadershipChanges returns a channel that receives true when this replica
// gains leadership and false when it loses it. It holds only the latest
// change (raft's LeaderCh): a slow reader misses intermediate ones, so a
// reader re-reads IsLeader and Term on each signal. It has one reader,
// the replica's Server.
func (r *Replica) LeadershipChanges() <-chan bool { return r.raft.LeaderCh() }

// Voter is a voting member of the Raft configuration.
type Voter struct {
	ID, Addr string
}

// Voters returns the voters of the latest Raft configuration this replica
// knows (committed or not), in configuration order.
func (r *Replica) Voters() ([]Voter, error) {
	cf := r.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return nil, err
	}
	var vs []Voter
	for _, s := range cf.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			vs = append(vs, Voter{ID: string(s.ID), Addr: string(s.Address)})
		}
	}
	return vs, nil
}

// HasVoter reports whether the configuration has voter id (at addr, unless
// addr is empty).
func (r *Replica) HasVoter(id, addr string) bool {
	vs, err := r.Voters()
	if err != nil {
		return false
	}
	return slices.ContainsFunc(vs, func(v Voter) bool { return v.ID == id && (addr == "" || v.Addr == addr) })
}

// IsMember reports whether this replica is a voter in the configuration
// it knows.
func (r *Replica) IsMember() bool { return r.HasVoter(r.cfg.ID, "") }

// membershipTimeout bounds a membership change.
const membershipTimeout = 10 * time.Second

// AddVoter adds replica id, reached at addr, to the Raft configuration as
// a voter, and waits until the change is committed (bounded by ctx, at most
// 10 s). With Raft over TLS it first dials addr and requires the replica
// answering there to hold a replica certificate for id (else an error
// wrapping ErrPeerIdentity, and nothing changes): a membership request
// names the new replica by its certificate identity. Leader only.
func (r *Replica) AddVoter(ctx context.Context, id, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, membershipTimeout)
	defer cancel()
	if r.tls != nil {
		if err := r.tls.CheckPeer(ctx, addr, id); err != nil {
			return err
		}
	}
	return r.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, timeout(ctx)).Error()
}

// RemoveVoter removes replica id from the Raft configuration and waits
// until the change is committed (bounded by ctx, at most 10 s). Leader
// only.
func (r *Replica) RemoveVoter(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, membershipTimeout)
	defer cancel()
	return r.raft.RemoveServer(raft.ServerID(id), 0, timeout(ctx)).Error()
}

// timeout turns ctx's deadline into raft's timeout argument.
func timeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d), time.Millisecond)
	}
	return 0
}

// Barrier waits until every entry committed before it has been applied to
// this replica's FSM. A new leader calls it before opening a round, so no
// committed step is redone.
func (r *Replica) Barrier(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return r.raft.Barrier(timeout(ctx)).Error()
}

// propose applies an encoded entry and waits for it to be committed and
// applied to the local FSM.
func (r *Replica) propose(ctx context.Context, data []byte) (ApplyResult, error) {
	if err := ctx.Err(); err != nil {
		return ApplyResult{}, err
	}
	f := r.raft.Apply(data, timeout(ctx))
	if err := f.Error(); err != nil {
		return ApplyResult{}, err
	}
	res, _ := f.Response().(ApplyResult)
	return res, nil
}

// Configure proposes the run configuration. The first configuration entry
// of a log starts a new Raft history: Configure draws its ID. Applying it
// again with the same configuration is a no-op, so a new leader may
// re-propose it: on a replica that has applied the configuration,
// Configure proposes the same history ID.
func (r *Replica) Configure(ctx context.Context, c RunConfig) error {
	if err := c.Validate(); err != nil {
		return err
	}
	history, configured := r.fsm.configuredHistory()
	if !configured {
		var err error
		if history, err = newHistoryID(); err != nil {
			return err
		}
	}
	data, err := encodeEntry(entryConfig, configEntry{RunConfig: c, History: history})
	if err != nil {
		return err
	}
	res, err := r.propose(ctx, data)
	if err != nil {
		return err
	}
	return res.Err
}

// ProposeCharge proposes the charge of step's release (chargeEntry) and
// waits until it is committed and applied here: the ledger charged and
// fsynced. With res.Pending, the grad entry naming res.Index will apply
// its g̃; nothing derived from g̃ may leave the caller before this returns
// so.
func (r *Replica) ProposeCharge(ctx context.Context, step int64, event accounting.Event, round string) (ApplyResult, error) {
	crashPoint(CrashBeforeCharge, step)
	data, err := encodeEntry(entryCharge, chargeEntry{Step: step, Event: event, Round: round})
	if err != nil {
		return ApplyResult{}, err
	}
	res, err := r.propose(ctx, data)
	if err == nil {
		crashPoint(CrashChargeCommitted, step)
	}
	return res, err
}

// ProposeGrad appends step's g̃ for the charge entry at Raft index charge
// (gradEntry). It returns once the entry holds its place in the leader's
// log queue, so an entry proposed after it comes after it in the log; wait
// then blocks until it is committed and applied here. g must not change
// until wait returns.
func (r *Replica) ProposeGrad(ctx context.Context, step int64, charge uint64, g []float32) (wait func() (ApplyResult, error), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	crashPoint(CrashBeforeGrad, step)
	data, err := encodeGradEntry(step, charge, g)
	if err != nil {
		return nil, err
	}
	f := r.raft.Apply(data, timeout(ctx))
	return func() (ApplyResult, error) {
		crashPoint(CrashGradQueued, step)
		if err := f.Error(); err != nil {
			return ApplyResult{}, err
		}
		crashPoint(CrashGradApplied, step)
		res, _ := f.Response().(ApplyResult)
		return res, nil
	}, nil
}

// ProposeStep proposes step's release through the charge-ahead path and
// waits for both entries: the charge, then (if it is pending) g̃. It
// returns the grad entry's result, or the charge's if that did not become
// pending. For tests and tools that drive a replica step by step; the
// Server pipelines the two (round.go).
func (r *Replica) ProposeStep(ctx context.Context, step int64, event accounting.Event, noisyGrad []float32, round string) (ApplyResult, error) {
	res, err := r.ProposeCharge(ctx, step, event, round)
	if err != nil || !res.Pending {
		return res, err
	}
	wait, err := r.ProposeGrad(ctx, step, res.Index, noisyGrad)
	if err != nil {
		return ApplyResult{}, err
	}
	return wait()
}

// ProposeStop proposes the end of the run.
func (r *Replica) ProposeStop(ctx context.Context, reason string) error {
	data, err := encodeEntry(entryStop, stopEntry{Reason: reason})
	if err != nil {
		return err
	}
	_, err = r.propose(ctx, data)
	return err
}

// ProposeBind proposes binding node ID node to the content hash of its
// training data (bindEntry) and waits until it is applied here. The state
// machine keeps the first binding of an ID: read it back with
// FSM.DataBinding.
func (r *Replica) ProposeBind(ctx context.Context, node, dataHash string) error {
	data, err := encodeEntry(entryBind, bindEntry{Node: node, Data: dataHash})
	if err != nil {
		return err
	}
	res, err := r.propose(ctx, data)
	if err == nil {
		err = res.Err
	}
	return err
}

// Snapshot asks Raft for a snapshot now.
func (r *Replica) Snapshot() error { return r.raft.Snapshot().Error() }

// Close stops Raft (transferring leadership first if this replica leads
// and has peers) and closes the stores. Entries applied before Close are
// durable.
func (r *Replica) Close() error {
	if r.IsLeader() {
		if cf := r.raft.GetConfiguration(); cf.Error() == nil && len(cf.Configuration().Servers) > 1 {
			if err := r.raft.LeadershipTransfer().Error(); err != nil {
				r.log.Warn("leadership transfer before shutdown failed; the others will elect a leader", "err", err)
			} else {
				r.log.Info("transferred leadership before shutdown")
			}
		}
	}
	if r.stream != nil {
		// Raft's Shutdown waits for its RPCs; a dial to a peer that is
		// down must not hold it for its whole timeout (raftnet.Stream).
		r.stream.EndRetries()
	}
	err := r.raft.Shutdown().Error()
	close(r.stop)
	<-r.stopped
	<-r.watchDone
	r.closeStores()
	return err
}

// raftLogWriter forwards hashicorp/raft's log lines (hclog writes one
// whole line per Write) to the replica's slog logger, so every log line of
// the process goes through one handler, in one format. Raft logs at WARN
// and above only; lines keep their level (ERROR, else WARN), with one
// exception.
//
// The exception: hashicorp/raft logs "heartbeat timeout reached, starting
// election" at WARN whenever a follower's heartbeat timer fires, including
// the first election of a replica that is the only voter of its
// configuration. Every single replica (coordinator local, serve
// --bootstrap, and their restarts) becomes leader exactly that way, so
// that line is no fault there, and a warning on every normal start teaches
// operators to ignore warnings. The writer logs it at INFO when it is the
// first election line of this Raft instance and the latest configuration
// has this replica as its only voter; any later election, and every
// election in a configuration with other voters (where it means a leader
// was lost), stays a WARN. The match is on the message text, which
// hashicorp/raft has used unchanged since v1.0; if it changes, the line
// comes through at WARN again, never lost.
type raftLogWriter struct {
	log *slog.Logger
	id  raft.ServerID
	// configuration returns Raft's latest configuration; nil until Raft
	// has been created (a line before then keeps its level).
	configuration atomic.Pointer[func() raft.Configuration]
	// elections counts the election lines written so far.
	elections atomic.Int64
}

// electionLine is the message hashicorp/raft logs at WARN when a
// follower's heartbeat timer fires and it starts an election.
const electionLine = "raft: heartbeat timeout reached, starting election"

func newRaftLogWriter(log *slog.Logger, id string) *raftLogWriter {
	return &raftLogWriter{log: log, id: raft.ServerID(id)}
}

// setConfiguration gives the writer Raft's configuration once Raft
// exists. raft.Raft.GetConfiguration reads a copy without the main loop,
// so it is safe to call from a log line the main loop writes.
func (w *raftLogWriter) setConfiguration(fn func() raft.Configuration) { w.configuration.Store(&fn) }

func (w *raftLogWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := slog.LevelWarn
	switch {
	case strings.HasPrefix(line, "[ERROR]"):
		level = slog.LevelError
	case strings.Contains(line, electionLine) && w.elections.Add(1) == 1 && w.soleVoter():
		level = slog.LevelInfo
		line = strings.Replace(line, "[WARN] ", "[INFO] ", 1)
	}
	w.log.Log(context.Background(), level, "raft", "line", line)
	return len(p), nil
}

// soleVoter reports whether Raft's latest configuration has this replica
// as its only voter (false before Raft exists).
func (w *raftLogWriter) soleVoter() bool {
	fn := w.configuration.Load()
	if fn == nil {
		return false
	}
	voters := 0
	self := false
	for _, s := range (*fn)().Servers {
		if s.Suffrage == raft.Voter {
			voters++
			self = self || s.ID == w.id
		}
	}
	return voters == 1 && self
}

// dialAddrs is ReplicaConfig.DialAddrs as Raft's ServerAddressProvider:
// an ID it does not hold is an error, on which Raft logs a warning and
// dials the configured address.
type dialAddrs map[string]string

// errNoDialAddr is dialAddrs' answer for an ID it does not map; Raft then
// dials the address in its configuration.
var errNoDialAddr = errors.New("coordinator: no dial address for this peer")

// ServerAddr implements raft.ServerAddressProvider.
func (d dialAddrs) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	if a, ok := d[string(id)]; ok {
		return raft.ServerAddress(a), nil
	}
	return "", errNoDialAddr
}

// isLeadershipLoss reports whether err is one a deposed (or deposing)
// leader's Raft operation fails with.
func isLeadershipLoss(err error) bool {
	return errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) ||
		errors.Is(err, raft.ErrLeadershipTransferInProgress) || errors.Is(err, raft.ErrEnqueueTimeout)
}

// ErrReplicaCert is raftnet.ErrReplicaCert: returned (wrapped, with the
// reason) by ReplicaConfig.Validate and OpenReplica when the replica's own
// TLS certificate cannot serve it.
var ErrReplicaCert = raftnet.ErrReplicaCert

// ErrPeerIdentity is raftnet.ErrPeerIdentity: returned (wrapped) by
// Replica.AddVoter when the replica answering at the address of a join
// request does not hold a replica certificate for the ID it names.
var ErrPeerIdentity = raftnet.ErrPeerIdentity
