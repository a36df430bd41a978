package transport

import (
	"fmt"
	"strings"

	"github.com/dpcluster/dpcluster/pki"
)

// Topic is a family of messages that share one NATS subject per run.
type Topic uint8

// Topics. Values are part of the wire format (chunks name their topic).
const (
	// TopicNodes carries Join, Leave, Heartbeat and NeedParams from nodes,
	// each on its node's own subject (Subjects.Node).
	TopicNodes Topic = 1
	// TopicRounds carries RoundStart from the leader.
	TopicRounds Topic = 2
	// TopicContributions carries Contribution from nodes to the leader,
	// each on its node's own subject (Subjects.Node).
	TopicContributions Topic = 3
	// TopicParams carries Params (committed θ) from the leader.
	TopicParams Topic = 4
	// TopicLeader carries Leader announcements from coordinator replicas.
	TopicLeader Topic = 5
	// TopicStatus carries Status from coordinator replicas to nodes and
	// observers.
	TopicStatus Topic = 6
	// TopicControl carries Control between coordinator replicas: replica
	// reports and membership requests.
	TopicControl Topic = 7
)

func (t Topic) valid() bool { return t >= TopicNodes && t <= TopicControl }

// PerNode reports whether t is a per-node topic: its messages name the
// node that sent them (Sender), and node ID publishes them only on its own
// subject, Subjects.Node(t, ID).
func (t Topic) PerNode() bool { return t == TopicNodes || t == TopicContributions }

// String returns the topic's subject token.
func (t Topic) String() string {
	switch t {
	case TopicNodes:
		return "nodes"
	case TopicRounds:
		return "rounds"
	case TopicContributions:
		return "contrib"
	case TopicParams:
		return "params"
	case TopicLeader:
		return "leader"
	case TopicStatus:
		return "status"
	case TopicControl:
		return "control"
	}
	return fmt.Sprintf("topic(%d)", uint8(t))
}

// SubjectPrefix is the first token of every dpcluster subject.
const SubjectPrefix = "dpc"

// Subjects builds the NATS subjects of one run, and says who may use
// them. NODE is a node ID. CLIENT, SENDER and RECEIVER are client IDs,
// ROLE.ID.NONCE (see ClientID): the role and ID of a client's certificate
// and a random nonce.
//
//	subject                        publish                      subscribe
//	dpc.RUN.nodes.NODE             node NODE only               replicas, observers (nodes.*)
//	dpc.RUN.contrib.NODE           node NODE only               replicas (contrib.*)
//	dpc.RUN.rounds                 replicas                     nodes
//	dpc.RUN.params                 replicas                     nodes
//	dpc.RUN.leader                 replicas                     nodes, observers
//	dpc.RUN.status                 replicas                     nodes, observers
//	dpc.RUN.control                replicas                     observers
//	dpc.RUN.nack.SENDER.RECEIVER   node, observer ID: only      node, observer ID: only
//	                               RECEIVER ROLE.ID.*, its      SENDER ROLE.ID.*, its own
//	                               own, to a replica SENDER
//	dpc.RUN.inbox.CLIENT           nodes: only a replica's      node, observer ID: only
//	                               CLIENT                       CLIENT ROLE.ID.*, its own
//
// Replicas may publish and subscribe to everything under dpc.RUN, and
// nobody to anything else (Permissions). With TLS, an embedded server
// (StartServer) enforces this table as the NATS permissions of the user
// each client certificate maps to; without TLS nothing is enforced. A
// Client publishes a Join, Leave, Heartbeat, NeedParams or Contribution on
// the subject of the node it names (Sender), whole or in chunks, and drops
// one received on another node's subject (ErrWrongSender), so with TLS a
// node can speak only for itself. A sender resends chunks only to the
// inbox of the RECEIVER its NACK's subject names, so a node can have
// chunks resent only to its own inbox, and only replicas receive a node's
// retransmissions. docs/PROTOCOL.md, "Subjects", is the same table.
type Subjects struct{ run string }

// NewSubjects returns the subjects of run, which must be a valid subject
// token (see ValidRunName).
func NewSubjects(run string) (Subjects, error) {
	if !validToken(run) {
		return Subjects{}, fmt.Errorf("%w: run name %q must be 1-64 of [A-Za-z0-9_-]", ErrInvalidConfig, run)
	}
	return Subjects{run: run}, nil
}

// Run returns the run name.
func (s Subjects) Run() string { return s.run }

func (s Subjects) prefix() string { return SubjectPrefix + "." + s.run + "." }

// Topic returns the subject of topic t. For a per-node topic (PerNode) it
// is the prefix of the nodes' subjects, on which nothing is published: see
// Node and Pattern.
func (s Subjects) Topic(t Topic) string { return s.prefix() + t.String() }

// Node returns the subject on which node id publishes the messages of
// per-node topic t: Topic(t).id. It fails with ErrWrongSender if t is not
// a per-node topic or id is not a valid node ID (pki.ValidID: one subject
// token).
func (s Subjects) Node(t Topic, id string) (string, error) {
	if !t.PerNode() {
		return "", fmt.Errorf("%w: %v is not a per-node topic", ErrWrongSender, t)
	}
	if !pki.ValidID(id) {
		return "", fmt.Errorf("%w: node ID %q must be 1-64 of [A-Za-z0-9_-]", ErrWrongSender, id)
	}
	return s.Topic(t) + "." + id, nil
}

// Pattern returns the subject pattern that receives every message of
// topic t: Topic(t), or Topic(t).* for a per-node topic.
func (s Subjects) Pattern(t Topic) string {
	if t.PerNode() {
		return s.Topic(t) + ".*"
	}
	return s.Topic(t)
}

// nodeOf returns the node ID that subject, on which a message of per-node
// topic t arrived, belongs to.
func (s Subjects) nodeOf(t Topic, subject string) (string, bool) {
	id, ok := strings.CutPrefix(subject, s.Topic(t)+".")
	return id, ok && pki.ValidID(id)
}

// Nack returns the subject on which receiver asks sender (both client
// IDs) to resend chunks; the chunks go to Inbox(receiver).
func (s Subjects) Nack(sender, receiver string) string {
	return s.prefix() + "nack." + sender + "." + receiver
}

// nackPattern matches every NACK addressed to sender.
func (s Subjects) nackPattern(sender string) string { return s.Nack(sender, "*.*.*") }

// nackReceiver returns the receiver a NACK subject names, if subject is a
// NACK to sender.
func (s Subjects) nackReceiver(sender, subject string) (string, bool) {
	rcv, ok := strings.CutPrefix(subject, s.Nack(sender, ""))
	return rcv, ok && validClientID(rcv)
}

// Inbox returns the subject on which client id receives retransmitted
// chunks.
func (s Subjects) Inbox(id string) string { return s.prefix() + "inbox." + id }

// Permissions returns the subjects a client holding a certificate for
// role and id may publish and subscribe to (NATS subject patterns): the
// table of Subjects, for one identity. It is the one definition of who may
// do what; the embedded server installs it for every TLS client. An id
// that is not a valid ID (pki.ValidID), or an unknown role, gets nothing.
func (s Subjects) Permissions(role pki.Role, id string) (publish, subscribe []string) {
	if !pki.ValidID(id) {
		return nil, nil
	}
	p := s.prefix()
	switch role {
	case pki.RoleReplica:
		return []string{p + ">"}, []string{p + ">"}
	case pki.RoleNode:
		self := ClientID(role, id, "*")
		nodes, _ := s.Node(TopicNodes, id)
		contrib, _ := s.Node(TopicContributions, id)
		return []string{
				nodes, contrib,
				s.Nack(ClientID(pki.RoleReplica, "*", "*"), self),
				s.Inbox(ClientID(pki.RoleReplica, "*", "*")),
			}, []string{
				s.Topic(TopicRounds), s.Topic(TopicParams), s.Topic(TopicLeader), s.Topic(TopicStatus),
				s.Inbox(self), s.Nack(self, ">"),
			}
	case pki.RoleObserver:
		self := ClientID(role, id, "*")
		return []string{
				s.Nack(ClientID(pki.RoleReplica, "*", "*"), self),
			}, []string{
				s.Pattern(TopicNodes), s.Topic(TopicLeader), s.Topic(TopicStatus), s.Topic(TopicControl),
				s.Inbox(self), s.Nack(self, ">"),
			}
	}
	return nil, nil
}

// anonymous is the role and ID token of a client without a certificate
// and without ClientConfig.Role or Name.
const anonymous = "anon"

// nonceLen is the length of a client ID's random suffix (hex digits).
const nonceLen = 16

// maxClientID bounds a client ID's length: "observer", an ID of 64, a
// nonce of 16 and two dots.
const maxClientID = len(pki.RoleObserver) + 1 + 64 + 1 + nonceLen

// ClientID returns the client ID ROLE.ID.NONCE: a client's address in the
// subjects (its inbox and NACK subjects), three subject tokens. role is
// the client's role (pki.Role, or "anon" without one), id its replica,
// node or observer ID, nonce its random suffix (a wildcard "*" in
// permissions).
func ClientID(role pki.Role, id, nonce string) string {
	return string(role) + "." + id + "." + nonce
}

// validClientID reports whether s is a client ID: a role (replica, node,
// observer or anon), an ID (a subject token of at most 64 characters) and
// a nonce of 16 lowercase hex digits, joined by dots.
func validClientID(s string) bool {
	if len(s) > maxClientID {
		return false
	}
	role, rest, ok := strings.Cut(s, ".")
	if !ok || !(pki.Role(role).Valid() || role == anonymous) {
		return false
	}
	id, nonce, ok := strings.Cut(rest, ".")
	if !ok || !validToken(id) || len(nonce) != nonceLen {
		return false
	}
	for i := 0; i < len(nonce); i++ {
		if c := nonce[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// ValidRunName reports whether run can name a run: 1 to 64 ASCII letters,
// digits, '-' or '_', so it is one NATS subject token.
func ValidRunName(run string) bool { return validToken(run) }

func validToken(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
