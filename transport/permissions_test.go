package transport_test

import (
	"slices"
	"testing"

	"github.com/dpcluster/dpcluster/pki"
	"github.com/dpcluster/dpcluster/transport"
	"github.com/dpcluster/dpcluster/transport/fake"
)

// TestPermissions checks Subjects.Permissions against the table of
// docs/PROTOCOL.md ("Subjects"), row by row, with NATS subject matching.
// The server enforcing them is tested in tls_test.go.
func TestPermissions(t *testing.T) {
	s, err := transport.NewSubjects("run")
	if err != nil {
		t.Fatal(err)
	}
	topic := s.Topic
	node := func(t transport.Topic, id string) string {
		subject, err := s.Node(t, id)
		if err != nil {
			panic(err)
		}
		return subject
	}
	const n1, n2 = "0123456789abcdef", "fedcba9876543210"
	r1, r2 := transport.ClientID(pki.RoleReplica, "r1", n1), transport.ClientID(pki.RoleReplica, "r2", n2)
	node0, node1 := transport.ClientID(pki.RoleNode, "node-0", n1), transport.ClientID(pki.RoleNode, "node-1", n2)
	ops := transport.ClientID(pki.RoleObserver, "ops", n1)
	type row struct {
		subject  string
		pub, sub []pki.Role // who may; the IDs are node-0 and ops
	}
	R, N, O := pki.RoleReplica, pki.RoleNode, pki.RoleObserver
	rows := []row{
		// Per-node subjects: node-0 publishes on its own only.
		{node(transport.TopicNodes, "node-0"), []pki.Role{R, N}, []pki.Role{R, O}},
		{node(transport.TopicContributions, "node-0"), []pki.Role{R, N}, []pki.Role{R}},
		{node(transport.TopicNodes, "node-1"), []pki.Role{R}, []pki.Role{R, O}},
		{node(transport.TopicContributions, "node-1"), []pki.Role{R}, []pki.Role{R}},
		{s.Pattern(transport.TopicNodes), []pki.Role{R}, []pki.Role{R, O}}, // the subscription
		{s.Pattern(transport.TopicContributions), []pki.Role{R}, []pki.Role{R}},
		{topic(transport.TopicNodes), []pki.Role{R}, []pki.Role{R}}, // the bare topics: nobody but replicas
		{topic(transport.TopicContributions), []pki.Role{R}, []pki.Role{R}},
		{topic(transport.TopicContributions) + ".node-0.x", []pki.Role{R}, []pki.Role{R}},
		{topic(transport.TopicRounds), []pki.Role{R}, []pki.Role{R, N}},
		{topic(transport.TopicParams), []pki.Role{R}, []pki.Role{R, N}},
		{topic(transport.TopicLeader), []pki.Role{R}, []pki.Role{R, N, O}},
		{topic(transport.TopicStatus), []pki.Role{R}, []pki.Role{R, N, O}},
		{topic(transport.TopicControl), []pki.Role{R}, []pki.Role{R, O}},
		// NACKs: to a replica, as itself.
		{s.Nack(r1, node0), []pki.Role{R, N}, []pki.Role{R}},
		{s.Nack(r1, ops), []pki.Role{R, O}, []pki.Role{R}},
		{s.Nack(r1, node1), []pki.Role{R}, []pki.Role{R}},    // as another node
		{s.Nack(node1, node0), []pki.Role{R}, []pki.Role{R}}, // to a node
		{s.Nack(node0, r2), []pki.Role{R}, []pki.Role{R, N}}, // to node-0: only it reads
		{s.Nack(ops, r2), []pki.Role{R}, []pki.Role{R, O}},   // to ops
		{s.Inbox(node0), []pki.Role{R}, []pki.Role{R, N}},    // node-0's inbox
		{s.Inbox(node1), []pki.Role{R}, []pki.Role{R}},       // another node's
		{s.Inbox(ops), []pki.Role{R}, []pki.Role{R, O}},      // ops's inbox
		{s.Inbox(r2), []pki.Role{R, N}, []pki.Role{R}},       // a replica's: nodes resend there
		{"dpc.other.contrib", nil, nil},                      // another run
		{"_INBOX.x", nil, nil},                               // request/reply is not used
	}
	ids := map[pki.Role]string{R: "r1", N: "node-0", O: "ops"}
	allowed := func(patterns []string, subject string) bool {
		for _, p := range patterns {
			if fake.Match(p, subject) {
				return true
			}
		}
		return false
	}
	for _, r := range rows {
		for _, role := range []pki.Role{R, N, O} {
			pub, sub := s.Permissions(role, ids[role])
			if got, want := allowed(pub, r.subject), slices.Contains(r.pub, role); got != want {
				t.Errorf("%s %s may publish on %s: %v, want %v", role, ids[role], r.subject, got, want)
			}
			if got, want := allowed(sub, r.subject), slices.Contains(r.sub, role); got != want {
				t.Errorf("%s %s may subscribe to %s: %v, want %v", role, ids[role], r.subject, got, want)
			}
		}
	}
	if pub, sub := s.Permissions("admin", "x"); pub != nil || sub != nil {
		t.Errorf("an unknown role gets %v, %v", pub, sub)
	}
	for _, id := range []string{"*", ">", "a.b", "", "node-0.>"} {
		if pub, sub := s.Permissions(N, id); pub != nil || sub != nil {
			t.Errorf("node ID %q, not a subject token, gets %v, %v", id, pub, sub)
		}
	}
}

// TestMatch: the fake's subject matching follows NATS's wildcards.
func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, subject string
		want             bool
	}{
		{"a.b", "a.b", true}, {"a.b", "a.c", false}, {"a.*", "a.b", true}, {"a.*", "a.b.c", false},
		{"a.>", "a.b.c", true}, {"a.>", "a", false}, {"*.b.>", "x.b.y", true}, {"a.*.c", "a.b", false},
		{">", "a", true}, {"a.b.c", "a.b", false},
	} {
		if got := fake.Match(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("Match(%q, %q) = %v, want %v", tc.pattern, tc.subject, got, tc.want)
		}
	}
}
