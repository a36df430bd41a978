package node

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
)

// RejectModelHash is the Status.Detail with which the leader rejects a node
// whose model hash differs from its own.
const RejectModelHash = "model_hash"

// Config configures a Worker. Start from DefaultConfig.
type Config struct {
	// ID names the node in every message (Join, Heartbeat, Contribution,
	// Status). It must be unique within the run: 1–64 characters of
	// [A-Za-z0-9_-] (see ValidID).
	ID string
	// Run is the training run's name (transport.ValidRunName); it must be
	// the run of the Conn the Worker publishes on.
	Run string
	// HeartbeatEvery is the period of Heartbeat messages. Default 1 s.
	HeartbeatEvery time.Duration
	// MaxBatch is the gradient workspace capacity in examples. A Poisson
	// batch larger than this is processed in chunks (no example is
	// dropped). 0 sizes the workspace at the first round to
	// min(shard size, ⌈1.25·q·shard size⌉ + 16). Default 0.
	MaxBatch int
	// ParamsGrace is how long a round whose Params version has not arrived
	// waits before the node asks for it (Status StatusNeedParams). Large
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
	// Registerer, if not nil, receives the Worker's Prometheus metrics
	// (see metrics.go), labelled node=ID so that several workers can share
	// one registry.
	Registerer prometheus.Registerer
}

// DefaultConfig returns a configuration for run "default" with a 1 s
// heartbeat, an automatically sized workspace and no metrics. ID must still
// be set.
func DefaultConfig() Config {
	return Config{
		Run:            "default",
		HeartbeatEvery: time.Second,
		ParamsGrace:    50 * time.Millisecond,
		ParamsRetry:    250 * time.Millisecond,
		LeaveTimeout:   2 * time.Second,
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
	return errors.Join(errs...)
}

// ValidID reports whether id is a valid node ID: 1–64 characters of
// [A-Za-z0-9_-], the same alphabet as run names (transport.ValidRunName),
// which is what the coordinator accepts from a Join or Heartbeat.
func ValidID(id string) bool { return transport.ValidRunName(id) }
