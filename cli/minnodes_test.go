package cli

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// TestRunFileMinNodes: a run file naming its nodes (node_ids) waits for
// all of them by default, so the budget is not spent on the first site's
// data alone; an explicit min_nodes (key or flag) below their number is
// kept, and one above it, which no round could ever meet, is refused.
func TestRunFileMinNodes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lines []string
		flags []string
		want  int    // MinNodes, when accepted
		err   string // a fragment of the error, when refused
	}{
		{"no node_ids", nil, nil, 1, ""},
		{"node_ids", []string{"node_ids: [a, b, c]"}, nil, 3, ""},
		{"node_ids and lower min_nodes", []string{"node_ids: [a, b, c]", "min_nodes: 2"}, nil, 2, ""},
		{"node_ids and lower --min-nodes", []string{"node_ids: [a, b, c]"}, []string{"--min-nodes", "1"}, 1, ""},
		{"--node-ids", nil, []string{"--node-ids", "a,b"}, 2, ""},
		{"min_nodes above node_ids", []string{"node_ids: [a, b, c]", "min_nodes: 4"}, nil, 0, "--min-nodes 4"},
		{"--min-nodes above node_ids", []string{"node_ids: [a, b]"}, []string{"--min-nodes", "3"}, 0, "only the 2 nodes of node_ids"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := defaultRunSpec()
			fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
			s.bind(fs)
			if err := fs.Parse(tc.flags); err != nil {
				t.Fatal(err)
			}
			err := loadRunSpec(&s, writeRunFile(t, tc.lines...), fs)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := s.serverConfig().MinNodes; got != tc.want {
				t.Errorf("min nodes = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestServeOwnDataNeedsMinNodes: a run whose nodes bring their own data
// and that names neither its nodes nor how many a round needs would start
// with the first node to join; serve refuses it in one line naming both
// ways to say it.
func TestServeOwnDataNeedsMinNodes(t *testing.T) {
	base := []string{"run: clinics", "dataset: local", "input_shape: [4]", "classes: 2", "total_examples: 1000"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := NewCoordinatorCmd()
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"serve", "--config", writeRunFile(t, base...), "--data-dir", t.TempDir(), "--bootstrap",
		"--raft-addr", freeAddrString(t), "--nats-listen", freeAddrString(t)})
	err := cmd.ExecuteContext(ctx)
	if err == nil || !strings.Contains(err.Error(), "min_nodes: N") || !strings.Contains(err.Error(), "node_ids") ||
		strings.Contains(err.Error(), "\n") {
		t.Fatalf("serve, own data, no node_ids nor min_nodes: err = %v, want one line naming min_nodes: N and node_ids", err)
	}
	// Either one satisfies the check: the spec is accepted.
	for _, extra := range []string{"min_nodes: 3", "node_ids: [a, b]"} {
		s := defaultRunSpec()
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		s.bind(fs)
		if err := loadRunSpec(&s, writeRunFile(t, append(base, extra)...), fs); err != nil {
			t.Fatalf("%s: %v", extra, err)
		}
		if err := s.checkOwnDataMinNodes(); err != nil {
			t.Errorf("%s: %v", extra, err)
		}
	}
}

// TestPrintStatusWaiting: `coordinator status` shows a leader's wait for
// nodes, as its replica report gives it, on a line of its own.
func TestPrintStatusWaiting(t *testing.T) {
	var b strings.Builder
	printStatus(&b, statusReport{Run: "clinics", Leader: "r1", Replicas: []replicaStatus{
		{ID: "r1", Role: "leader", Waiting: "waiting for nodes: 1 of 2, missing site-b"}, {ID: "r2", Role: "follower"}}})
	if want := "NO ROUND YET: leader r1 is waiting for nodes: 1 of 2, missing site-b\n"; !strings.Contains(b.String(), want) {
		t.Errorf("status text:\n%s\nwant the line %q", b.String(), want)
	}
}

// TestPrintStatusStanding: `coordinator status` shows the nodes a leader's
// rounds do not wait for, as its replica report gives them, on a line of
// their own.
func TestPrintStatusStanding(t *testing.T) {
	var b strings.Builder
	printStatus(&b, statusReport{Run: "clinics", Leader: "r1", Replicas: []replicaStatus{
		{ID: "r1", Role: "leader", Standing: "not waited for: site-b (missed at step 3)"}, {ID: "r2", Role: "follower"}}})
	if want := "NODES OUT OF GOOD STANDING at leader r1: not waited for: site-b (missed at step 3)\n"; !strings.Contains(b.String(), want) {
		t.Errorf("status text:\n%s\nwant the line %q", b.String(), want)
	}
}
