package coordinator

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/mechanism"
	"github.com/dpcluster/dpcluster/raftnet"
)

// ServerConfig configures a replica's Server: the rounds its replica runs
// while it leads.
type ServerConfig struct {
	// RoundTimeout is how long a round waits for contributions before it
	// closes with whoever answered. It is also the wait before a member
	// that lost good standing is first waited for again (standing.go).
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
	// (0: only after the last step), beside the next rounds: the result is
	// logged and reported to OnStep when it is done, and a step that comes
	// due while the last evaluation still runs is not evaluated. Without
	// an Evaluator, nothing is evaluated.
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

// ReplicaConfig configures one coordinator replica.
type ReplicaConfig struct {
	// ID is the replica's Raft server ID, unique in the cluster.
	ID string
	// RaftAddr is the TCP address Raft binds and advertises, host:port.
	// Ignored (and may be empty) when Transport is set.
	RaftAddr string
	// DataDir holds the Raft log (raft/, see raftlog.Store), snapshots and the
	// ledger.
	DataDir string
	// Bootstrap starts a new cluster with Peers (or just this replica if
	// Peers is empty). It is a no-op on a data dir that already has state.
	Bootstrap bool
	// Peers are the initial voters when bootstrapping, this replica
	// included.
	Peers []raft.Server
	// DialAddrs, if set, map peer IDs to the address this replica dials
	// them at instead of their address in the Raft configuration (which
	// stays what every replica advertises and stores): a proxy between
	// this replica and that peer (the network soak's fault injection).
	// Peers not in the map are dialed at their configured address.
	DialAddrs map[string]string

	// Raft timing. Defaults favour fast failover on a LAN.
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	// SnapshotThreshold is how many log entries trigger a snapshot and
	// TrailingLogs how many stay after one, while the run is running
	// (once it has stopped, a last snapshot keeps FinalTrailingLogs).
	// Each step writes two entries, a small charge and g̃ (4 bytes per
	// parameter), so the log's disk use is bounded by bytes
	// (SnapshotModels) as well as by entries.
	SnapshotThreshold uint64
	TrailingLogs      uint64
	SnapshotInterval  time.Duration
	SnapshotsRetained int
	// SnapshotModels takes a snapshot once the g̃ applied since the last
	// one amount to this many copies of the model (4·dim bytes each;
	// 0: never by bytes). A snapshot holds θ and the optimizer's state (3
	// copies for Adam and DP-AdamBC), so with one snapshot retained the
	// Raft state on disk stays under about (3 + SnapshotModels +
	// TrailingLogs/2) copies, plus a snapshot being written, or
	// SnapshotMinBytes more for a model under SnapshotMinBytes/SnapshotModels.
	SnapshotModels int
	// SnapshotMinBytes is the least g̃ the byte trigger waits for (0: no
	// floor). A small model's snapshot every few steps frees almost
	// nothing, and a leader snapshotting (and compacting its log) faster
	// than a follower installs a snapshot sends a restarted follower
	// snapshot after snapshot: it never rejoins the quorum (44 installs in
	// 10 s at 60 steps a second before the floor). Below the floor Raft's
	// SnapshotThreshold, checked every SnapshotInterval, takes them.
	SnapshotMinBytes int64
	// FinalTrailingLogs is TrailingLogs once the run has stopped: the
	// replica then takes a last snapshot and keeps this many entries, so
	// a finished run's data dir holds the snapshot, at most
	// FinalTrailingLogs/2 g̃ and the ledger.
	FinalTrailingLogs uint64

	// TLS, if set, runs the Raft transport over mutual TLS: this replica
	// and its peers must hold replica certificates of one CA, and a
	// connection from anything else (a node's or observer's certificate,
	// another CA's, plaintext) is refused before Raft reads it. Nil: plain
	// TCP (a single machine, or a trusted network).
	TLS *raftnet.TLS

	// Transport, if not nil, carries this replica's Raft traffic instead
	// of the TCP listener on RaftAddr: tests run a cluster in one process
	// over raft.NewInmemTransport (package coordinatortest). The replica
	// advertises Transport.LocalAddr() and closes the transport on Close
	// if it implements raft.WithClose. It excludes TLS. Nil: TCP on
	// RaftAddr (with TLS if set), what every binary uses.
	Transport raft.Transport

	// LedgerOptions are passed to the ledger when it is opened (fault
	// injection in tests: ledger.WithSyncHook).
	LedgerOptions []ledger.Option

	// Logger receives the replica's structured logs, and hashicorp/raft's
	// own warnings and errors as "raft" records (nil: discarded).
	Logger *slog.Logger
}

// DefaultReplicaConfig returns the defaults: heartbeat, election and lease
// timeouts of 150 ms (over 25 leader kills of the process soak,
// docs/RELIABILITY.md, failover takes a median of 0.60 s and a p90 of
// 1.22 s at 150 ms against 1.17 s and 1.70 s at 500 ms; shorter timeouts
// make leaders step down needlessly on a loaded 2-core machine, and
// pre-vote, on in hashicorp/raft since 1.7, keeps a stalled follower from
// turning into a new election); a snapshot every 64
// entries (checked every 5 s) or every 4 models' worth of g̃ once that is
// at least 64 MiB, whichever comes first, with 8
// entries (4 steps) trailing while the run runs and 2 (its last step) once
// it has stopped; one snapshot retained. A follower more than about 4
// steps behind catches up from a snapshot rather than the log.
func DefaultReplicaConfig() ReplicaConfig {
	return ReplicaConfig{
		HeartbeatTimeout:   150 * time.Millisecond,
		ElectionTimeout:    150 * time.Millisecond,
		LeaderLeaseTimeout: 150 * time.Millisecond,
		CommitTimeout:      20 * time.Millisecond,
		SnapshotThreshold:  64,
		TrailingLogs:       8,
		SnapshotInterval:   5 * time.Second,
		SnapshotsRetained:  1,
		SnapshotModels:     4,
		SnapshotMinBytes:   64 << 20,
		FinalTrailingLogs:  2,
	}
}

// Validate checks the configuration. With TLS set, the certificate must be
// a replica certificate for ID that verifies against TLS.CAs (else an
// error wrapping ErrReplicaCert).
func (c ReplicaConfig) Validate() error {
	switch {
	case c.ID == "":
		return errors.New("coordinator: replica ID is empty")
	case c.Transport != nil && c.TLS != nil:
		return errors.New("coordinator: a Raft transport given in the config cannot also use the replica's TLS")
	case c.Transport == nil && c.RaftAddr == "":
		return errors.New("coordinator: Raft address is empty")
	case c.DataDir == "":
		return errors.New("coordinator: data dir is empty")
	case c.LeaderLeaseTimeout > c.HeartbeatTimeout:
		return errors.New("coordinator: leader lease timeout must not exceed the heartbeat timeout")
	case c.SnapshotThreshold == 0:
		return errors.New("coordinator: snapshot threshold must be positive")
	case c.SnapshotsRetained < 1:
		return errors.New("coordinator: must retain at least one snapshot")
	case c.SnapshotModels < 0:
		return errors.New("coordinator: snapshot models must not be negative")
	case c.SnapshotMinBytes < 0:
		return errors.New("coordinator: snapshot minimum bytes must not be negative")
	}
	if c.Transport != nil {
		return nil
	}
	host, _, err := net.SplitHostPort(c.RaftAddr)
	if err != nil {
		return fmt.Errorf("coordinator: Raft address %q: %w", c.RaftAddr, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("coordinator: Raft address %q is advertised to peers: give a reachable host, not a wildcard", c.RaftAddr)
	}
	if c.TLS != nil {
		if err := c.TLS.Check(c.ID); err != nil {
			return err
		}
	}
	return nil
}
