package node

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/transport"
)

// Errors returned by this package.
var (
	// ErrInvalidConfig is returned (wrapped, naming the field) by
	// Config.Validate and NewWorker for a configuration, model, shard or
	// connection that cannot work.
	ErrInvalidConfig = errors.New("node: invalid config")
	// ErrModelMismatch is returned (wrapped) by Worker.Run when the leader
	// rejects this node's contribution or registration with reason
	// "model_hash": the coordinator runs a different model specification,
	// so nothing this node computes can ever be used.
	ErrModelMismatch = errors.New("node: coordinator runs a different model")
	// ErrAlreadyStarted is returned by Worker.Run when Run was called
	// before on the same Worker.
	ErrAlreadyStarted = errors.New("node: worker already started")
	// ErrRefused is returned (wrapped, with the reason) by Worker.Run when
	// the leader refuses this node for good: with reason "seed_policy"
	// (the run is private and this node samples from a seed),
	// "shard_identity" (the leader found this node's shard identity
	// missing or invalid), "data_schema" (this node's data is not shaped
	// as the run's), "pretrained_weights" (this node's model starts
	// from other weights than the run's checkpoint). A "seat_taken"
	// refusal (another live process holds this node's ID) does not end
	// the run: the node waits for the seat to lapse.
	ErrRefused = errors.New("node: the coordinator refuses this node")
	// ErrEngine is returned (wrapped, with the device and the device's
	// own error, such as model.ErrUnsupportedLayer or an out-of-memory
	// error) by NewWorker when the compute engine cannot be allocated.
	ErrEngine = errors.New("node: cannot allocate the compute engine")
	// ErrCoordinatorGone is returned by Worker.Run when no coordinator
	// replica was heard for Config.CoordinatorTimeout after one was.
	ErrCoordinatorGone = errors.New("node: no coordinator replica heard")
	// ErrClosed is returned by Worker.Run on a Worker released with Close.
	ErrClosed = errors.New("node: worker closed")
)

// Status.Detail values with which the leader refuses a node's registration.
const (
	// RejectModelHash: the node's model hash differs from the run's.
	RejectModelHash = "model_hash"
	// RejectSeedPolicy: the run is private (crypto seed policy) and the
	// node samples from a seed (Config.SeededSampling).
	RejectSeedPolicy = "seed_policy"
	// RejectShardIdentity: the node's Join or Heartbeat lacks a valid
	// shard identity or seed policy (an older node).
	RejectShardIdentity = "shard_identity"
	// RejectDataSchema: in a run whose nodes bring their own data, the
	// node's data schema is not the run's. The Status.Detail is
	// "data_schema: " followed by the run's schema.
	RejectDataSchema = "data_schema"
	// RejectWeights: the node's pretrained weights (Config.Weights) are
	// not the run's checkpoint's, or the node reports weights in a run
	// with no checkpoint, or none in a run with one. The Status.Detail is
	// "pretrained_weights: " followed by the run's weights hash ("" for
	// none).
	RejectWeights = "pretrained_weights"
	// RejectDataHash: the node's ID is bound, in the run's replicated
	// state, to other training data (Config.DataHash) than the node
	// reports: the run trained this ID on data of another content. The
	// Status.Detail is "training_data: " followed by the bound hash.
	RejectDataHash = "training_data"
	// RejectSeatTaken: another process presenting this node's ID holds
	// the ID's seat and is live: two processes were started with one ID.
	// The Status.Detail is "seat_taken: " followed by a public sentence
	// naming the ID.
	RejectSeatTaken = "seat_taken"
)

// Config configures a Worker. Start from DefaultConfig.
type Config struct {
	// ID names the node in every message (Join, Heartbeat, Contribution,
	// Status). It must be unique within the run: 1–64 characters of
	// [A-Za-z0-9_-] (see ValidID).
	ID string
	// Run is the training run's name (transport.ValidRunName); it must be
	// the run of the Conn the Worker publishes on.
	Run string
	// SampleRate is the run's Poisson sampling rate q and ClipNorm its
	// per-example clip norm C, as the coordinator's run configuration has
	// them (coordinator.RunConfig.SampleRate and Optimizer.ClipNorm). The
	// node takes them from here, not from the leader: it refuses
	// (SkipParamsMismatch) every round that names another q, C or model.
	// The node command derives both from the run file with the function
	// the replicas use, so they are the same float64 values bit for bit.
	// Required: q in (0, 1], C positive and finite.
	SampleRate float64
	ClipNorm   float64
	// ShardIndex, ShardCount and ShardSeed identify the node's shard: part
	// ShardIndex of the run's training set cut into ShardCount IID parts
	// with seed ShardSeed (dataset.ShardIID). The node reports them, with
	// its shard size and seed policy, in Join and Heartbeat; the leader
	// opens no round while two live nodes claim the same part. Required:
	// ShardCount ≥ 1 and 0 ≤ ShardIndex < ShardCount, unless DataSchema is
	// set.
	ShardIndex int
	ShardCount int
	ShardSeed  uint64
	// DataSchema, in a run whose nodes bring their own data, is this
	// node's data schema (dataset.Schema's String). The node then holds
	// its own data, not a shard of a shared training set: ShardIndex,
	// ShardCount and ShardSeed must be 0. It is reported in Join and
	// Heartbeat; the leader refuses a node whose schema is not the run's
	// (RejectDataSchema).
	DataSchema string
	// Weights is the hex SHA-256 of the checkpoint weights this node's
	// model starts from (its model.safetensors), in lowercase
	// (transport.ValidWeights); "" for a model initialized from a seed.
	// It is reported in Join and Heartbeat; the leader refuses a node
	// whose weights are not the run's (RejectWeights). Default "".
	Weights string
	// DataHash is the content hash of the examples the node trains on
	// (dataset.Dataset.ContentHash of its shard or its own data: 64
	// lowercase hex digits), or "" for none. It is reported in Join and Heartbeat; the run binds the
	// node's ID to the first it admits, and refuses the ID with other
	// data later, also after a restart (RejectDataHash).
	DataHash string
	// HeartbeatEvery is the period of Heartbeat messages. Default 1 s.
	HeartbeatEvery time.Duration
	// MaxBatch is the compute engine's capacity in examples, allocated by
	// NewWorker (on the CPU or on Device). A Poisson batch
	// larger than this is processed in chunks (no example is dropped). 0
	// sizes it to min(shard size, ⌈1.25·q·shard size⌉ + 16), and to at
	// most EngineMemory's worth of examples (EngineBatch). Default 0.
	MaxBatch int
	// EngineMemory bounds, in bytes, the buffers the engine allocates per
	// example of its capacity (model.Model.ExampleBytes) when MaxBatch is
	// 0: a large model's batch is then computed in micro-batches that fit
	// it. 0 means DefaultEngineMemory.
	EngineMemory int64
	// CoordinatorTimeout ends the node (Run returns ErrCoordinatorGone)
	// when, after it has heard a coordinator replica, it hears nothing
	// from any (the leader announces itself every second) for this long:
	// the run ended or its replicas are gone while this node was cut off,
	// and no one will tell it. 0 never gives up. Default 5 minutes.
	CoordinatorTimeout time.Duration
	// ParamsGrace is how long a round whose Params version has not arrived
	// waits before the node asks for it (NeedParams). Large
	// Params travel in chunks on another subscription and may be delivered
	// a little after the RoundStart published after them; the grace avoids
	// asking for a copy already on its way. Default 50 ms; 0 asks at once.
	ParamsGrace time.Duration
	// ParamsRetry is the interval between repeated requests for a missing
	// Params version while its round is open. Default 250 ms.
	ParamsRetry time.Duration
	// LeaveTimeout bounds publishing the Leave message on the way out
	// (the Run context may already be cancelled then). Default 2 s.
	LeaveTimeout time.Duration
	// Device computes the Worker's clipped sums (model.OpenDevice: "cpu",
	// or "cuda:N" in a binary built with -tags cuda). NewWorker allocates
	// the Worker's engine on it (Device.NewEngine) and fails if it cannot;
	// Run releases the engine when it returns (Close, for a Worker that
	// never runs). The Worker does not own the device: the caller closes
	// it after Run (or Close) has returned. Nil means the CPU. Default nil.
	Device model.Device
	// SeededSampling makes the Worker draw each round's batch with
	// sampling.NewSeededPoisson(q, SamplingSeed+step) instead of a fresh
	// crypto/rand-keyed sampler, so tests can recompute the exact batch.
	// The batches are then predictable by anyone who knows the seed: the
	// run is NOT differentially private. The Worker logs that at warn
	// level, and reports it in Join and Heartbeat (seed.Seeded), so the
	// leader of a private run refuses it (RejectSeedPolicy). For tests and
	// reproducible experiments only. Default false.
	SeededSampling bool
	// SamplingSeed is the seed of SeededSampling; without SeededSampling it
	// must be 0. Default 0.
	SamplingSeed uint64
	// Canaries, if not nil, makes this Worker inject a privacy audit's
	// gradient canaries (see Canaries). Only coordinator audit-privacy sets
	// it; the Worker logs at warn that its run is an audit. Default nil.
	Canaries *Canaries
	// Registerer, if not nil, receives the Worker's Prometheus metrics
	// (see metrics.go), labelled node=ID so that several workers can share
	// one registry.
	Registerer prometheus.Registerer
}

// DefaultConfig returns a configuration for run "default" with a 1 s
// heartbeat, an automatically sized workspace and no metrics. ID, the run's
// SampleRate and ClipNorm and the shard identity must still be set.
func DefaultConfig() Config {
	return Config{
		Run:                "default",
		HeartbeatEvery:     time.Second,
		CoordinatorTimeout: 5 * time.Minute,
		ParamsGrace:        50 * time.Millisecond,
		ParamsRetry:        250 * time.Millisecond,
		LeaveTimeout:       2 * time.Second,
	}
}

// Validate checks ranges and cross-field relations. Errors wrap
// ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if !ValidID(c.ID) {
		bad("ID %q must be 1-64 of [A-Za-z0-9_-]", c.ID)
	}
	if !transport.ValidRunName(c.Run) {
		bad("Run %q must be 1-64 of [A-Za-z0-9_-]", c.Run)
	}
	if !(c.SampleRate > 0 && c.SampleRate <= 1) {
		bad("SampleRate %v must be the run's q, in (0, 1]", c.SampleRate)
	}
	if !(c.ClipNorm > 0) || math.IsInf(c.ClipNorm, 0) {
		bad("ClipNorm %v must be the run's clip norm C, positive and finite", c.ClipNorm)
	}
	if c.DataSchema != "" {
		if c.ShardIndex != 0 || c.ShardCount != 0 || c.ShardSeed != 0 {
			bad("a node with its own data (DataSchema %q) claims no shard: ShardIndex, ShardCount and ShardSeed must be 0", c.DataSchema)
		}
	} else if c.ShardCount < 1 {
		bad("ShardCount %d must be ≥ 1", c.ShardCount)
	} else if c.ShardIndex < 0 || c.ShardIndex >= c.ShardCount {
		bad("ShardIndex %d must be in [0, ShardCount %d)", c.ShardIndex, c.ShardCount)
	}
	if !transport.ValidWeights(c.DataHash) {
		bad("DataHash %q must be a SHA-256 as 64 lowercase hex digits, or empty", c.DataHash)
	}
	if !transport.ValidWeights(c.Weights) {
		bad("Weights %q must be a SHA-256 as 64 lowercase hex digits, or empty", c.Weights)
	}
	if c.CoordinatorTimeout < 0 {
		bad("CoordinatorTimeout %v must be ≥ 0", c.CoordinatorTimeout)
	}
	if c.HeartbeatEvery < time.Millisecond {
		bad("HeartbeatEvery %v must be ≥ 1ms", c.HeartbeatEvery)
	}
	if c.MaxBatch < 0 {
		bad("MaxBatch %d must be ≥ 0", c.MaxBatch)
	}
	if c.ParamsGrace < 0 {
		bad("ParamsGrace %v must be ≥ 0", c.ParamsGrace)
	}
	if c.ParamsRetry < time.Millisecond {
		bad("ParamsRetry %v must be ≥ 1ms", c.ParamsRetry)
	}
	if c.LeaveTimeout <= 0 {
		bad("LeaveTimeout %v must be > 0", c.LeaveTimeout)
	}
	if !c.SeededSampling && c.SamplingSeed != 0 {
		bad("SamplingSeed %d is set without SeededSampling", c.SamplingSeed)
	}
	return errors.Join(errs...)
}

// ValidID reports whether id is a valid node ID: 1–64 characters of
// [A-Za-z0-9_-], the same alphabet as run names (transport.ValidRunName),
// which is what the coordinator accepts from a Join or Heartbeat.
func ValidID(id string) bool { return transport.ValidRunName(id) }
