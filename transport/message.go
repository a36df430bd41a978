package transport

import (
	"fmt"

	"github.com/dpcluster/dpcluster/seed"
)

// Version is the envelope format version written by this build. Decoders
// reject every other version with ErrUnknownVersion. Adding an optional
// field to a message body keeps the version (decoders ignore unknown map
// keys); changing the meaning or type of a field, or the envelope or chunk
// layout, takes a new version.
const Version = 1

// Type identifies a message body in the envelope. Values are part of the
// wire format and never reused.
type Type uint8

// Message types. typeChunk and typeNack are internal frames of the chunked
// transfer and are never delivered to a Handler.
const (
	TypeJoin         Type = 1
	TypeLeave        Type = 2
	TypeHeartbeat    Type = 3
	TypeRoundStart   Type = 4
	TypeContribution Type = 5
	TypeParams       Type = 6
	TypeLeader       Type = 7
	TypeStatus       Type = 8
	TypeControl      Type = 9
	TypeNeedParams   Type = 10

	typeChunk Type = 16
	typeNack  Type = 17
)

// String returns the type's name for logs and metrics.
func (t Type) String() string {
	switch t {
	case TypeJoin:
		return "join"
	case TypeLeave:
		return "leave"
	case TypeHeartbeat:
		return "heartbeat"
	case TypeRoundStart:
		return "round_start"
	case TypeContribution:
		return "contribution"
	case TypeParams:
		return "params"
	case TypeLeader:
		return "leader"
	case TypeStatus:
		return "status"
	case TypeControl:
		return "control"
	case TypeNeedParams:
		return "need_params"
	case typeChunk:
		return "chunk"
	case typeNack:
		return "nack"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Topic returns the topic on which messages of type t travel, or 0 for
// internal and unknown types.
func (t Type) Topic() Topic {
	switch t {
	case TypeJoin, TypeLeave, TypeHeartbeat, TypeNeedParams:
		return TopicNodes
	case TypeRoundStart:
		return TopicRounds
	case TypeContribution:
		return TopicContributions
	case TypeParams:
		return TopicParams
	case TypeLeader:
		return TopicLeader
	case TypeStatus:
		return TopicStatus
	case TypeControl:
		return TopicControl
	}
	return 0
}

// Sender returns the node that m names as its sender: the NodeID of a
// Join, Leave, Heartbeat, NeedParams or Contribution (the messages of the
// per-node topics, Topic.PerNode), and false for every other message.
// Those travel on the sender's own subject (Subjects.Node): a Client
// publishes them there and drops one received on another node's subject.
func Sender(m Message) (string, bool) {
	switch m := m.(type) {
	case Join:
		return m.NodeID, true
	case Leave:
		return m.NodeID, true
	case Heartbeat:
		return m.NodeID, true
	case NeedParams:
		return m.NodeID, true
	case Contribution:
		return m.NodeID, true
	}
	return "", false
}

// Message is one of the message bodies of this package: Join, Leave,
// Heartbeat, NeedParams, RoundStart, Contribution, Params, Leader, Status or
// Control (values, not pointers). Handlers receive them as values; use a type switch.
type Message interface {
	// Type returns the message's wire type.
	Type() Type
	// RunName returns the run the message belongs to.
	RunName() string
}

// Join announces a node to the coordinator. ModelHash identifies the model
// specification the node runs (the coordinator refuses a node whose hash
// differs from its own). ShardSize is the node's number of examples; it is
// public configuration, not a per-step quantity.
//
// ShardIndex, ShardCount and ShardSeed say which part of the run's training
// set the node holds: part ShardIndex of ShardCount IID parts cut with
// ShardSeed. SeedPolicy says how the node draws its Poisson samples:
// seed.Crypto (keyed from crypto/rand) or seed.Seeded (predictable: NOT
// private), encoded as the policy's string. All are
// public configuration. They are optional fields (added in envelope version
// 1); the coordinator refuses a node that omits them (ShardCount 0 or an
// empty SeedPolicy).
//
// DataSchema, in a run whose nodes bring their own data, is the node's
// data schema (dataset.Schema's String: input shape, classes and a hash of
// the label names); the node then claims no shard (ShardIndex, ShardCount
// and ShardSeed 0) and ShardSize is its own example count. The leader
// refuses a node whose schema is not the run's. Omitted when empty.
//
// Weights, in a run started from a pretrained checkpoint, is the hex
// SHA-256 of the checkpoint weights the node's model starts from (its
// model.safetensors), "" for a model initialized from a seed. Two
// checkpoints of one architecture give the same ModelHash, so the leader
// compares the weights on their own and refuses a node whose weights are
// not the run's. The codec carries the value as given: a value that is
// not ValidWeights is never the run's, so the leader refuses it too.
// Omitted when empty.
//
// DataHash is the content hash of the examples the node trains on
// (dataset.Dataset.ContentHash, 64 lowercase hex digits): its own file in
// a run whose nodes bring their own data, else its shard of the run's
// training set. The leader binds a node ID to the first DataHash it
// admits it with, in the replicated state, and refuses the ID with any
// other later ("training_data"), so that a run resumed on other data of
// the same shape does not continue silently. Omitted when empty (older
// nodes, which are bound to nothing).
//
// Incarnation tells apart two processes that present the same NodeID: a
// random string the node draws once at start (from crypto/rand) and
// sends in its Join, Heartbeats and Leave. The coordinator gives a node
// ID one seat, held by one incarnation: another incarnation presenting the ID
// while the holder's seat is live is refused ("seat_taken"). It is no
// secret and no credential (any subscriber to the node's subject sees
// it); it only keeps a second process started by mistake with a node's
// ID from taking that node's place. At most 64 bytes; omitted when empty
// (older nodes, which all count as one incarnation).
type Join struct {
	Run         string      `msgpack:"run"`
	NodeID      string      `msgpack:"node"`
	ShardSize   int64       `msgpack:"shard"`
	ModelHash   string      `msgpack:"model"`
	ShardIndex  int         `msgpack:"shard_index"`
	ShardCount  int         `msgpack:"shard_count"`
	ShardSeed   uint64      `msgpack:"shard_seed"`
	SeedPolicy  seed.Policy `msgpack:"seed_policy"`
	DataSchema  string      `msgpack:"data_schema,omitempty"`
	Weights     string      `msgpack:"weights,omitempty"`
	Incarnation string      `msgpack:"incarnation,omitempty"`
	DataHash    string      `msgpack:"data_hash,omitempty"`
}

// Leave announces that a node stops taking part. Reason is free text for
// logs and must hold no private data. Incarnation is the leaving process's
// (Join.Incarnation): a Leave from an incarnation that does not hold the node's
// seat, such as a refused second process, does not free it. Omitted when
// empty.
type Leave struct {
	Run         string `msgpack:"run"`
	NodeID      string `msgpack:"node"`
	Reason      string `msgpack:"reason,omitempty"`
	Incarnation string `msgpack:"incarnation,omitempty"`
}

// Heartbeat tells the coordinator a node is alive. Step is the last step the
// node contributed to (0 if none). The other fields repeat the node's Join,
// so that a leader that missed the Join (it started later) learns them,
// and Incarnation says which process holds the node's seat (Join.Incarnation).
type Heartbeat struct {
	Run         string      `msgpack:"run"`
	NodeID      string      `msgpack:"node"`
	ShardSize   int64       `msgpack:"shard"`
	ModelHash   string      `msgpack:"model"`
	Step        uint64      `msgpack:"step"`
	ShardIndex  int         `msgpack:"shard_index"`
	ShardCount  int         `msgpack:"shard_count"`
	ShardSeed   uint64      `msgpack:"shard_seed"`
	SeedPolicy  seed.Policy `msgpack:"seed_policy"`
	DataSchema  string      `msgpack:"data_schema,omitempty"`
	Weights     string      `msgpack:"weights,omitempty"`
	Incarnation string      `msgpack:"incarnation,omitempty"`
	DataHash    string      `msgpack:"data_hash,omitempty"`
}

// MaxIncarnation is the longest Incarnation a coordinator accepts.
const MaxIncarnation = 64

// ValidWeights reports whether s can be a Join's or Heartbeat's Weights:
// "" (no checkpoint) or a SHA-256 as 64 lowercase hex digits, the form
// encoding/hex writes, so that equal weights give equal strings.
func ValidWeights(s string) bool {
	if s == "" {
		return true
	}
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// RoundStart opens round Step. RoundID is a fresh random nonce per round: a
// new leader that reopens the same step draws a new RoundID, so a
// contribution made for the old round cannot be counted in the new one.
// Term and Leader name the coordinator replica that opened the round; nodes
// ignore rounds from a term older than the newest Leader announcement they
// have seen. The nodes compute gradients at parameters ParamsVersion (a
// Params message with that Version); Params may also be carried inline.
// Deadline is the round's close time in Unix nanoseconds. SampleRate,
// ClipNorm and ModelHash are the run's q, C and model (ModelHash: an
// optional field added in envelope version 1); a node refuses a round whose
// values differ from those of the run it was configured with.
type RoundStart struct {
	Run           string  `msgpack:"run"`
	Step          uint64  `msgpack:"step"`
	RoundID       uint64  `msgpack:"round"`
	Term          uint64  `msgpack:"term"`
	Leader        string  `msgpack:"leader"`
	ParamsVersion uint64  `msgpack:"pver"`
	Deadline      int64   `msgpack:"deadline"`
	SampleRate    float64 `msgpack:"q"`
	ClipNorm      float64 `msgpack:"clip"`
	Params        Vector  `msgpack:"params,omitempty"`
	ModelHash     string  `msgpack:"model"`
}

// Contribution is one node's answer to a round: the sum of its clipped
// per-example gradients and the number of examples it sampled. Both are
// un-noised private data: never log or persist them.
type Contribution struct {
	Run     string `msgpack:"run"`
	Step    uint64 `msgpack:"step"`
	RoundID uint64 `msgpack:"round"`
	NodeID  string `msgpack:"node"`
	Count   int64  `msgpack:"count"`
	Sum     Vector `msgpack:"sum"`
}

// Params broadcasts committed parameters θ after step Step. Version
// increases by one with each committed update; Term is the Raft term of the
// leader that committed it.
type Params struct {
	Run     string `msgpack:"run"`
	Step    uint64 `msgpack:"step"`
	Version uint64 `msgpack:"version"`
	Term    uint64 `msgpack:"term"`
	Values  Vector `msgpack:"values"`
}

// Leader announces the current Raft leader of the coordinator group, so nodes
// find it over NATS with no static address. Step is the last committed step.
// A higher Term wins; within a term there is one leader.
type Leader struct {
	Run       string `msgpack:"run"`
	ReplicaID string `msgpack:"replica"`
	Term      uint64 `msgpack:"term"`
	Step      uint64 `msgpack:"step"`
	// ModelHash, SampleRate and ClipNorm name the run as a node knows it
	// (its model, q and C): a node does not follow, or obey, a leader
	// whose run is not its own, such as another replica group given the
	// same run name. Omitted when empty (older leaders), which nodes
	// accept.
	ModelHash  string  `msgpack:"model,omitempty"`
	SampleRate float64 `msgpack:"q,omitempty"`
	ClipNorm   float64 `msgpack:"clip,omitempty"`
}

// NeedParams is a node's request for the committed parameters of version
// Version, which a RoundStart named and the node never received whole;
// the leader answers by publishing that Params again (if Version is its
// current one).
type NeedParams struct {
	Run     string `msgpack:"run"`
	NodeID  string `msgpack:"node"`
	Version uint64 `msgpack:"version"`
}

// StatusCode classifies a Status message.
type StatusCode uint8

// Status codes. Codes 6 to 9 were used by envelope version 1 for node
// parameter requests (now NeedParams), replica reports and membership
// requests (now Control); they are never reused.
const (
	StatusRunning  StatusCode = 1 // training is running; Step is the open step
	StatusAccepted StatusCode = 2 // Node's contribution to Step was accepted
	StatusRejected StatusCode = 3 // Node's contribution to Step was rejected; Detail holds the reason name
	StatusDone     StatusCode = 4 // training finished normally
	StatusStopped  StatusCode = 5 // training stopped (budget exhausted, ledger failure); Detail says why
)

// Status reports the coordinator's verdicts and the run's state to nodes
// and observers. Only replicas publish it. Detail is a short public reason
// (an enum name), never values.
type Status struct {
	Run    string     `msgpack:"run"`
	From   string     `msgpack:"from"`
	Node   string     `msgpack:"node,omitempty"`
	Step   uint64     `msgpack:"step"`
	Code   StatusCode `msgpack:"code"`
	Detail string     `msgpack:"detail,omitempty"`
	// ModelHash names the sender's run by its model: a node ignores a
	// status of another run given the same name (Leader.ModelHash).
	// Omitted when empty (older replicas), which nodes accept.
	ModelHash string `msgpack:"model,omitempty"`
}

// ControlCode classifies a Control message.
type ControlCode uint8

// Control codes.
const (
	// ControlReplica is a coordinator replica's periodic report of its
	// state: From is the replica, Step its last applied step, and Term,
	// Role, Leader, Epsilon, Nodes and Blocked are set.
	ControlReplica ControlCode = 1
	// ControlJoin asks the coordinator leader to add replica From as a
	// Raft voter at address Addr. A replica started with --join sends it
	// until it is a member. With Raft over TLS the leader first checks
	// that Addr answers with a replica certificate for From.
	ControlJoin ControlCode = 2
	// ControlRemove asks the coordinator leader to remove replica Replica
	// from the Raft configuration.
	ControlRemove ControlCode = 3
)

// Control is the coordinator replicas' own traffic: replica reports and
// membership requests. Only replicas may publish it (with TLS, the NATS
// permissions of a replica certificate); observers may read it. All fields
// are public.
type Control struct {
	Run  string      `msgpack:"run"`
	From string      `msgpack:"from"`
	Code ControlCode `msgpack:"code"`
	// Replica is the replica to remove (ControlRemove).
	Replica string `msgpack:"replica,omitempty"`
	// Addr is the Raft address of the replica asking to join
	// (ControlJoin).
	Addr string `msgpack:"addr,omitempty"`

	// Replica state (ControlReplica): the last applied step, the Raft
	// term and role (leader, follower, candidate), the leader the replica
	// knows of, ε spent, and the number of live nodes it has registered.
	Step    uint64  `msgpack:"step,omitempty"`
	Term    uint64  `msgpack:"term,omitempty"`
	Role    string  `msgpack:"role,omitempty"`
	Leader  string  `msgpack:"leader,omitempty"`
	Epsilon float64 `msgpack:"eps,omitempty"`
	Nodes   int     `msgpack:"nodes,omitempty"`
	// Blocked is why the leader opens no round although enough nodes are
	// live: a reason name, a colon and a public detail ("shard_overlap:
	// nodes a and b both hold shard 0 of 3"). Empty when rounds are not
	// blocked.
	Blocked string `msgpack:"blocked,omitempty"`
	// Waiting (ControlReplica only; optional, envelope version 1) says the
	// leader opens no round for lack of live nodes: how many it has of how
	// many it needs, and the run's named nodes missing ("waiting for
	// nodes: 1 of 2, missing b"). Empty when it does not wait; absent
	// from older senders.
	Waiting string `msgpack:"waiting,omitempty"`
	// Standing (ControlReplica only; optional, envelope version 1) lists
	// the live nodes out of good standing, which the leader's rounds do
	// not wait for, each with why and since which step ("not waited for:
	// b (missed at step 3), c (refused at step 5: nan)"). Empty when there
	// are none, on a replica that does not lead, and from older senders.
	Standing string `msgpack:"standing,omitempty"`
	// Insecure (ControlReplica only; optional, envelope version 1) says the
	// replica runs without TLS, started with --insecure: the run's
	// transport is not protected. Absent (false) from older senders.
	Insecure bool `msgpack:"insecure,omitempty"`
	// History is the sender's replica group: the history ID of the run it
	// replicates (empty before its configuration is applied, and from a
	// replica asking to join, which has none yet). A replica ignores
	// control traffic of another history, and `coordinator
	// remove-replica` names the group it means (issue 27: a second group
	// under the same run name obeyed each other's requests). Optional,
	// envelope version 1; absent from older senders.
	History string `msgpack:"history,omitempty"`
	// Charged (ControlReplica only) is the last step the replica's
	// ledger charged, the step Epsilon runs through: Step, or Step+1 for
	// a step charged ahead of its g̃ (or never applied: the run ended
	// between its charge and its update). Optional, envelope version 1;
	// absent (0) from older senders, whose Epsilon may be one step ahead
	// of their Step.
	Charged uint64 `msgpack:"charged,omitempty"`
}

// Type implements Message.
func (Join) Type() Type { return TypeJoin }

// Type implements Message.
func (Leave) Type() Type { return TypeLeave }

// Type implements Message.
func (Heartbeat) Type() Type { return TypeHeartbeat }

// Type implements Message.
func (RoundStart) Type() Type { return TypeRoundStart }

// Type implements Message.
func (Contribution) Type() Type { return TypeContribution }

// Type implements Message.
func (Params) Type() Type { return TypeParams }

// Type implements Message.
func (Leader) Type() Type { return TypeLeader }

// Type implements Message.
func (Status) Type() Type { return TypeStatus }

// Type implements Message.
func (Control) Type() Type { return TypeControl }

// Type implements Message.
func (NeedParams) Type() Type { return TypeNeedParams }

// RunName implements Message.
func (m Join) RunName() string { return m.Run }

// RunName implements Message.
func (m Leave) RunName() string { return m.Run }

// RunName implements Message.
func (m Heartbeat) RunName() string { return m.Run }

// RunName implements Message.
func (m RoundStart) RunName() string { return m.Run }

// RunName implements Message.
func (m Contribution) RunName() string { return m.Run }

// RunName implements Message.
func (m Params) RunName() string { return m.Run }

// RunName implements Message.
func (m Leader) RunName() string { return m.Run }

// RunName implements Message.
func (m Status) RunName() string { return m.Run }

// RunName implements Message.
func (m Control) RunName() string { return m.Run }

// RunName implements Message.
func (m NeedParams) RunName() string { return m.Run }

// newBody returns a pointer to a zero body of type t, or nil if t is not a
// public message type.
func newBody(t Type) any {
	switch t {
	case TypeJoin:
		return new(Join)
	case TypeLeave:
		return new(Leave)
	case TypeHeartbeat:
		return new(Heartbeat)
	case TypeRoundStart:
		return new(RoundStart)
	case TypeContribution:
		return new(Contribution)
	case TypeParams:
		return new(Params)
	case TypeLeader:
		return new(Leader)
	case TypeStatus:
		return new(Status)
	case TypeControl:
		return new(Control)
	case TypeNeedParams:
		return new(NeedParams)
	}
	return nil
}

// deref turns the pointer made by newBody into the Message value.
func deref(p any) Message {
	switch v := p.(type) {
	case *Join:
		return *v
	case *Leave:
		return *v
	case *Heartbeat:
		return *v
	case *RoundStart:
		return *v
	case *Contribution:
		return *v
	case *Params:
		return *v
	case *Leader:
		return *v
	case *Status:
		return *v
	case *Control:
		return *v
	case *NeedParams:
		return *v
	}
	return nil
}

// sizeHint estimates the encoded size of m to size the encode buffer once.
func sizeHint(m Message) int {
	n := 256
	switch v := m.(type) {
	case RoundStart:
		n += 4 * len(v.Params)
	case Contribution:
		n += 4 * len(v.Sum)
	case Params:
		n += 4 * len(v.Values)
	}
	return n
}
