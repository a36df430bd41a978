package transport

import "fmt"

// Topic is a family of messages that share one NATS subject per run.
type Topic uint8

// Topics. Values are part of the wire format (chunks name their topic).
const (
	// TopicNodes carries Join, Leave and Heartbeat from nodes.
	TopicNodes Topic = 1
	// TopicRounds carries RoundStart from the leader.
	TopicRounds Topic = 2
	// TopicContributions carries Contribution from nodes to the leader.
	TopicContributions Topic = 3
	// TopicParams carries Params (committed θ) from the leader.
	TopicParams Topic = 4
	// TopicLeader carries Leader announcements from coordinator replicas.
	TopicLeader Topic = 5
	// TopicStatus carries Status from anyone.
	TopicStatus Topic = 6
)

func (t Topic) valid() bool { return t >= TopicNodes && t <= TopicStatus }

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
	}
	return fmt.Sprintf("topic(%d)", uint8(t))
}

// SubjectPrefix is the first token of every dpcluster subject.
const SubjectPrefix = "dpc"

// Subjects builds the NATS subjects of one run:
//
//	dpc.<run>.<topic>          nodes, rounds, contrib, params, leader, status
//	dpc.<run>.nack.<client>    retransmit requests to a sender
//	dpc.<run>.inbox.<client>   retransmitted chunks to a receiver
//
// A server ACL can therefore grant a node publish on dpc.<run>.nodes,
// dpc.<run>.contrib and dpc.<run>.nack.> and subscribe on the rest.
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

// Topic returns the subject of topic t.
func (s Subjects) Topic(t Topic) string { return SubjectPrefix + "." + s.run + "." + t.String() }

// Nack returns the subject on which client id receives retransmit requests.
func (s Subjects) Nack(id string) string { return SubjectPrefix + "." + s.run + ".nack." + id }

// Inbox returns the subject on which client id receives retransmitted chunks.
func (s Subjects) Inbox(id string) string { return SubjectPrefix + "." + s.run + ".inbox." + id }

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
