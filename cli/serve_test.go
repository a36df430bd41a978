package cli

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/pki"
	"github.com/dpcluster/dpcluster/seed"
	"github.com/dpcluster/dpcluster/transport"
)

// TestServeWithNodeCommands runs `coordinator serve` against a NATS server
// of the test's own, with two `node` commands as its workers, all in this
// process but through the same code paths as separate binaries, all given
// the same run file. q = B/N = 300/10000 is not a binary fraction: the
// nodes refuse any round whose q is not theirs bit for bit, so the run
// finishing shows they derive it as the replica does. The run finishes at
// max steps, serve exits 0, the nodes exit by themselves on the done
// status, and the ledger audits clean with one charge per step and, the
// noise and sampling being seeded, says the run is not private.
func TestServeWithNodeCommands(t *testing.T) {
	srv := startTestNATS(t)
	const runName = "t-serve"
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runFile := writeRunFile(t, "run: "+runName, "batch_size: 300", "max_steps: 400", "min_nodes: 2", "round_timeout: 20s")

	nodeDone := make(chan error, 2)
	for i := range 2 {
		go func() {
			nodeDone <- runNodeCmd(ctx, io.Discard, "--config", runFile, "--nats", srv.URL(), "--id", "n"+string(rune('0'+i)),
				"--shard-index", string(rune('0'+i)), "--shard-count", "2", "--insecure-seed", "9")
		}()
	}
	type result struct {
		out string
		err error
	}
	served := make(chan result, 1)
	go func() {
		out, err := run(t, "serve", "--config", runFile, "--nats", srv.URL(), "--id", "r1", "--raft-addr", freeAddrString(t),
			"--data-dir", dir, "--bootstrap", "--insecure-seed", "4")
		served <- result{out, err}
	}()
	// While it trains, `coordinator status` sees the replica lead, with
	// both nodes and the shards and seed policy they report, and the step
	// its ε runs through: the applied step or the next, charged ahead.
	var st statusReport
	var sout string
	for deadline := time.Now().Add(time.Minute); ; {
		sout, _ = run(t, "status", "--nats", srv.URL(), "--run", runName, "--wait", "1200ms", "--json")
		if json.Unmarshal([]byte(sout), &st) == nil && len(st.Replicas) == 1 && st.Replicas[0].Role == "leader" &&
			st.Replicas[0].Nodes == 2 && len(st.Nodes) == 2 && st.Leader == "r1" && st.Replicas[0].Applied > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed r1 leading with 2 nodes after a step; last: %s", sout)
		}
	}
	if r := st.Replicas[0]; r.ID != "r1" || r.Term == 0 || r.Term != st.Term || r.Blocked != "" ||
		r.Charged < r.Applied || r.Charged > r.Applied+1 || !strings.Contains(sout, `"charged_step"`) {
		t.Errorf("status %+v: want charged_step the applied step or the next\n%s", st, sout)
	}
	for i, n := range st.NodeShards {
		want := nodeShard{ID: "n" + string(rune('0'+i)), ShardIndex: i, ShardCount: 2, ShardSeed: 1, ShardSize: 5000,
			SeedPolicy: seed.Seeded}
		if n != want {
			t.Errorf("status node %d: %+v, want %+v", i, n, want)
		}
	}
	res := <-served
	out, err := res.out, res.err
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "finished after 400 steps (max steps reached)") || !strings.Contains(out, "test accuracy") {
		t.Errorf("serve output: %q", out)
	}
	// The finished replica left the model beside its ledger: θ of the
	// state whose digest it printed, labelled not private (seeded noise).
	_, _, meta := readModelFile(t, filepath.Join(dir, ModelFile))
	if !strings.Contains(out, "state sha256 "+meta["state_sha256"]+" ") || meta["step"] != "400" || meta["private"] != "false" {
		t.Errorf("model metadata %v; serve output %q", meta, out)
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
	if rep.Private || rep.Noise != seed.Seeded {
		t.Errorf("audit of a seeded run: private %v, noise %q; want false, %q", rep.Private, rep.Noise, seed.Seeded)
	}
	if text, _ := run(t, "ledger", "audit", dir); !strings.Contains(text, "NOT differentially private") {
		t.Errorf("the audit of a seeded run does not say it is not private:\n%s", text)
	}
	// The replica's Raft log is under the data dir, next to the ledger.
	if segs, _ := filepath.Glob(filepath.Join(dir, "raft", "wal", "*.seg")); len(segs) == 0 {
		t.Error("no Raft log segment under the data dir")
	}
}

// TestServeBlocksOverlappingNodes: two `node` commands started without
// --shard-count both hold the whole training set. The replica opens no
// round, and `coordinator status` says why and shows the nodes' shards
// (issue 11, item 6).
func TestServeBlocksOverlappingNodes(t *testing.T) {
	srv := startTestNATS(t)
	const runName = "t-overlap"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runFile := writeRunFile(t, "run: "+runName, "min_nodes: 2")
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := runNodeCmd(ctx, io.Discard, "--config", runFile, "--nats", srv.URL(), "--id", "n"+string(rune('0'+i)), "--insecure-seed", "9"); err != nil {
				t.Errorf("node: %v", err)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		cmd := NewCoordinatorCmd()
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		cmd.SetArgs([]string{"serve", "--config", runFile, "--nats", srv.URL(), "--id", "r1", "--raft-addr", freeAddrString(t),
			"--data-dir", t.TempDir(), "--bootstrap", "--insecure-seed", "4"})
		if err := cmd.ExecuteContext(ctx); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	var st statusReport
	var text string
	for deadline := time.Now().Add(time.Minute); ; {
		sout, _ := run(t, "status", "--nats", srv.URL(), "--run", runName, "--wait", "1200ms", "--json")
		if json.Unmarshal([]byte(sout), &st) == nil && len(st.Replicas) == 1 && st.Replicas[0].Blocked != "" && len(st.NodeShards) == 2 {
			text, _ = run(t, "status", "--nats", srv.URL(), "--run", runName, "--wait", "1200ms")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed rounds blocked with 2 nodes; last: %s", sout)
		}
	}
	r := st.Replicas[0]
	// Both claim the whole set: the later one is left out, so with
	// min_nodes 2 no round opens.
	if want := "shard_overlap: nodes n"; !strings.HasPrefix(r.Blocked, want) || !strings.Contains(r.Blocked, "both hold shard 0 of 1") ||
		!strings.HasSuffix(r.Blocked, ", the later claim, left out") || r.Applied != 0 {
		t.Errorf("replica status %+v, want one of n0 and n1 left out for shard_overlap at step 0", r)
	}
	for _, n := range st.NodeShards {
		if n.ShardIndex != 0 || n.ShardCount != 1 || n.ShardSize != 10000 {
			t.Errorf("node %+v, want the whole training set (shard 0 of 1, 10000 examples)", n)
		}
	}
	if !strings.Contains(text, "NODES LEFT OUT by r1: shard_overlap") || !strings.Contains(text, "SEEDED: NOT private") {
		t.Errorf("status text does not show the block and the seeded nodes:\n%s", text)
	}
}

func TestServeFlagErrors(t *testing.T) {
	certs := filepath.Join(t.TempDir(), "certs")
	if _, err := pki.Init(certs, []pki.Name{{Role: pki.RoleReplica, ID: "r1"}, {Role: pki.RoleReplica, ID: "r2"}, {Role: pki.RoleNode, ID: "node-0"}}, nil, 1); err != nil {
		t.Fatal(err)
	}
	r3Dir := t.TempDir()
	writeFile(t, filepath.Join(r3Dir, coordinator.ReplicaIDFile), "r3\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "--data-dir"},
		{[]string{"--data-dir", t.TempDir(), "--peers", "r1"}, "--peers"},
		{[]string{"--data-dir", t.TempDir(), "--peers", "r1=a:1,r1=b:2"}, "twice"},
		{[]string{"--data-dir", t.TempDir(), "--dataset", "none"}, "total_examples"},
		{[]string{"--data-dir", t.TempDir(), "--nats-listen", "localhost"}, "--nats-listen"},
		{[]string{"--data-dir", t.TempDir(), "--log-format", "xml"}, "--log-format"},
		{[]string{"--data-dir", t.TempDir(), "--nats-routes", "nats-route://127.0.0.1:1"}, "--nats-cluster"},
		{[]string{"--data-dir", t.TempDir(), "--nats", "nats://127.0.0.1:1", "--nats-cluster", "127.0.0.1:2"}, "do not go with --nats"},
		{[]string{"--data-dir", t.TempDir(), "--tls-ca", "ca.crt"}, "--tls-ca, --tls-cert and --tls-key go together"},
		{[]string{"--data-dir", t.TempDir(), "--tls-cert", "r1.crt", "--tls-key", "r1.key"}, "go together"},
		{[]string{"--data-dir", t.TempDir(), "--tls-ca", certs + "/ca.crt", "--tls-cert", certs + "/node-0.crt", "--tls-key", certs + "/node-0.key"}, "a node certificate"},
		{[]string{"--data-dir", t.TempDir(), "--tls-ca", certs + "/ca.crt", "--tls-cert", certs + "/r2.crt", "--tls-key", certs + "/r2.key"}, "replica r2's certificate"},
		{[]string{"--data-dir", t.TempDir(), "--tls-ca", certs + "/nope.crt", "--tls-cert", certs + "/r1.crt", "--tls-key", certs + "/r1.key"}, "nope.crt"},
		// Issue 27, finding 6: another replica's data dir, refused up front.
		{[]string{"--data-dir", r3Dir, "--id", "r2", "--raft-addr", "127.0.0.1:7000"}, `belongs to replica "r3"`},
	} {
		_, err := run(t, append([]string{"serve", "--model", "logreg", "--dataset", "gaussian", "--bootstrap"}, tc.args...)...)
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

// TestReplicaGroup: remove-replica learns the replica group it means from
// the replicas' reports, and refuses to guess when two groups answer under
// the run's name (issue 27's finding 4: a second group obeyed the first
// one's removals).
func TestReplicaGroup(t *testing.T) {
	srv := startTestNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	connect := func(name string) *transport.Client {
		cfg := transport.DefaultConfig()
		cfg.Run, cfg.URLs, cfg.Name = "t-group", []string{srv.URL()}, name
		c, err := transport.Connect(ctx, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	admin := connect("admin")
	report := func(c *transport.Client, from, history string) {
		for ctx.Err() == nil {
			if err := c.Publish(ctx, transport.Control{Run: "t-group", From: from, Code: transport.ControlReplica, History: history}); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if h, err := replicaGroup(ctx, admin, "t-group", 200*time.Millisecond); h != "" || err != nil {
		t.Fatalf("no replicas: %q, %v", h, err)
	}
	a := connect("r1")
	go report(a, "r1", "aaaa")
	if h, err := replicaGroup(ctx, admin, "t-group", 300*time.Millisecond); h != "aaaa" || err != nil {
		t.Fatalf("one group: %q, %v", h, err)
	}
	b := connect("r1b")
	go report(b, "r1", "bbbb")
	_, err := replicaGroup(ctx, admin, "t-group", 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "aaaa (r1); bbbb (r1)") || !strings.Contains(err.Error(), "--history") {
		t.Fatalf("two groups: %v", err)
	}
}

// startTestNATS starts an embedded NATS server on a free loopback port for
// the test's duration.
func startTestNATS(t *testing.T) *transport.Server {
	t.Helper()
	scfg := transport.DefaultEmbeddedServerConfig()
	scfg.Port = -1
	srv, err := transport.StartServer(scfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// TestServeNeedsBootstrapOnNewDataDir: serve on a data dir without Raft
// state and with neither --bootstrap, --peers nor --join has no cluster
// to elect a leader in; it fails at once with an error naming the flags
// that give it one, instead of waiting forever. A data dir with Raft state
// starts without --bootstrap, as a restart does.
func TestServeNeedsBootstrapOnNewDataDir(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var logs strings.Builder
	start := time.Now()
	err := runServeCmd(ctx, &logs, "--id", "r1", "--raft-addr", freeAddrString(t), "--data-dir", t.TempDir(), "--nats-listen", freeAddrString(t))
	if err == nil || !strings.Contains(err.Error(), "--bootstrap") || !strings.Contains(err.Error(), "--join") {
		t.Fatalf("serve on a new data dir without --bootstrap: err = %v after %v, want one naming --bootstrap and --join\nlogs:\n%s",
			err, time.Since(start), logs.String())
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error is more than one line: %q", err)
	}

	// A data dir some replica r1 bootstrapped: serve resumes on it, leads
	// and runs until its context ends.
	dir := t.TempDir()
	rcfg := coordinator.DefaultReplicaConfig()
	rcfg.ID, rcfg.RaftAddr, rcfg.DataDir, rcfg.Bootstrap = "r1", freeAddrString(t), dir, true
	r, err := coordinator.OpenReplica(rcfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	// It is stopped once it leads (the start, σ's calibration among it,
	// takes seconds on a loaded machine).
	ctx2, cancel2 := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel2()
	var logs2 lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- runServeCmd(ctx2, &logs2, "--id", "r1", "--raft-addr", freeAddrString(t), "--data-dir", dir, "--nats-listen", freeAddrString(t))
	}()
	for !strings.Contains(logs2.String(), "msg=leading") && ctx2.Err() == nil {
		select {
		case err := <-done:
			t.Fatalf("serve on a bootstrapped data dir without --bootstrap ended before leading: %v\nlogs:\n%s", err, logs2.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel2()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("serve on a bootstrapped data dir without --bootstrap, stopped as a signal stops it: %v\nlogs:\n%s", err, logs2.String())
	}
}
