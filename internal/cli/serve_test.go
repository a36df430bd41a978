package cli

import (
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/transport"
)

// TestServeWithNodeCommands runs `coordinator serve` against a NATS server
// of the test's own, with two `node` commands as its workers, all in this
// process but through the same code paths as separate binaries. The run
// finishes at --max-steps, serve exits 0, the nodes exit by themselves on
// the done status, and the ledger audits clean with one charge per step.
func TestServeWithNodeCommands(t *testing.T) {
	scfg := transport.DefaultServerConfig()
	scfg.Port = -1
	srv, err := transport.StartServer(scfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	const runName = "t-serve"
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	nodeDone := make(chan error, 2)
	for i := range 2 {
		go func() {
			nodeDone <- runNodeCmd(ctx, io.Discard, "--nats", srv.URL(), "--run", runName, "--id", "n"+string(rune('0'+i)),
				"--model", "logreg", "--dataset", "gaussian", "--shard-index", string(rune('0'+i)), "--shard-count", "2",
				"--insecure-seed", "9")
		}()
	}
	type result struct {
		out string
		err error
	}
	served := make(chan result, 1)
	go func() {
		out, err := run(t, "serve", "--nats", srv.URL(), "--run", runName, "--id", "r1", "--raft-addr", freeAddrString(t),
			"--data-dir", dir, "--bootstrap", "--model", "logreg", "--dataset", "gaussian", "--batch-size", "100",
			"--max-steps", "400", "--min-nodes", "2", "--round-timeout", "20s", "--insecure-seed", "4")
		served <- result{out, err}
	}()
	// While it trains, `coordinator status` sees the replica lead, with
	// both nodes.
	var st statusReport
	for deadline := time.Now().Add(time.Minute); ; {
		sout, _ := run(t, "status", "--nats", srv.URL(), "--run", runName, "--wait", "1200ms", "--json")
		if json.Unmarshal([]byte(sout), &st) == nil && len(st.Replicas) == 1 && st.Replicas[0].Role == "leader" &&
			st.Replicas[0].Nodes == 2 && len(st.Nodes) == 2 && st.Leader == "r1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed r1 leading with 2 nodes; last: %s", sout)
		}
	}
	if r := st.Replicas[0]; r.ID != "r1" || r.Term == 0 || r.Term != st.Term {
		t.Errorf("status %+v", st)
	}
	res := <-served
	out, err := res.out, res.err
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "finished after 400 steps (max steps reached)") || !strings.Contains(out, "test accuracy") {
		t.Errorf("serve output: %q", out)
	}
	for range 2 {
		select {
		case err := <-nodeDone:
			if err != nil {
				t.Errorf("node: %v", err)
			}
		case <-ctx.Done():
			t.Fatal("nodes did not stop after the run finished")
		}
	}
	aout, err := run(t, "ledger", "audit", dir, "--json", "--expect-steps", "400")
	if err != nil {
		t.Fatalf("audit: %v\n%s", err, aout)
	}
	var rep ledger.AuditReport
	if err := json.Unmarshal([]byte(aout), &rep); err != nil || rep.Run != runName {
		t.Errorf("audit report %+v, %v", rep, err)
	}
	// The replica's Raft log is under the data dir, next to the ledger.
	if segs, _ := filepath.Glob(filepath.Join(dir, "raft", "log.db")); len(segs) == 0 {
		t.Error("no Raft log segment under the data dir")
	}
}

func TestServeFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "--data-dir"},
		{[]string{"--data-dir", t.TempDir(), "--peers", "r1"}, "--peers"},
		{[]string{"--data-dir", t.TempDir(), "--peers", "r1=a:1,r1=b:2"}, "twice"},
		{[]string{"--data-dir", t.TempDir(), "--dataset", "none"}, "total-examples"},
		{[]string{"--data-dir", t.TempDir(), "--nats-listen", "localhost"}, "--nats-listen"},
		{[]string{"--data-dir", t.TempDir(), "--log-format", "xml"}, "--log-format"},
		{[]string{"--data-dir", t.TempDir(), "--nats-routes", "nats-route://a:1"}, "--nats-cluster"},
		{[]string{"--data-dir", t.TempDir(), "--nats", "nats://a:1", "--nats-cluster", "a:2"}, "do not go with --nats"},
	} {
		_, err := run(t, append([]string{"serve", "--model", "logreg", "--dataset", "gaussian"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it to mention %q", tc.args, err, tc.want)
		}
	}
}

func TestParsePeers(t *testing.T) {
	got, err := parsePeers("r1=127.0.0.1:7000, r2=127.0.0.1:7001")
	want := []raft.Server{{ID: "r1", Address: "127.0.0.1:7000"}, {ID: "r2", Address: "127.0.0.1:7001"}}
	if err != nil || len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("parsePeers = %v, %v", got, err)
	}
	if got, err := parsePeers(""); got != nil || err != nil {
		t.Errorf("empty: %v, %v", got, err)
	}
}

func freeAddrString(t *testing.T) string {
	t.Helper()
	a, err := freeLoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}
