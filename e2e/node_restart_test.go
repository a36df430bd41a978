//go:build unix

package e2e

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/model"
)

// runConfig is a small, fast training run shared by the process tests:
// logistic regression on the fixed synthetic gaussian data (N = 10000
// training rows), B = 100 (q = 0.01), σ calibrated to the default ε = 3 at
// maxSteps, seeded noise and sampling (reproducible, NOT private: fine in
// tests). A round closes after roundTimeout, so a dead node delays a round
// by at most that; rounds open only with all nodes live. Replicas and nodes
// are given the same run file (writeRunFile), as an operator would.
type runConfig struct {
	run          string
	maxSteps     int
	nodes        int
	roundTimeout time.Duration
	// hidden, if set, trains an MLP with these hidden widths on the
	// 784-feature data (model_spec) instead of logreg: 2048,1024 is 3.7M
	// parameters.
	hidden []int
	// minNodes is the run's min_nodes (0: all nodes).
	minNodes int
	// lora, if set, fine-tunes the checkpoint package's tiny BERT with
	// LoRA adapters (rank 2 on the query and value, the classifier
	// trained) on two categories of generated fortunes (writeLoRAData)
	// instead of the gaussian data.
	lora bool
	file string // the run file, once written
}

// writeRunFile writes the run definition to a YAML run file under the
// test's directory, for replicas and nodes alike.
func (c *runConfig) writeRunFile(h *Harness) {
	h.t.Helper()
	dir := h.Dir("run")
	c.file = filepath.Join(dir, "run.yaml")
	modelLine := "model: logreg"
	if len(c.hidden) > 0 {
		spec, err := json.Marshal(model.MLP([]int{1, 28, 28}, c.hidden, 10))
		if err != nil {
			h.t.Fatal(err)
		}
		specFile := filepath.Join(dir, "model.json")
		if err := os.WriteFile(specFile, spec, 0o644); err != nil {
			h.t.Fatal(err)
		}
		modelLine = "model_spec: " + specFile
	}
	data := "dataset: gaussian\n" + modelLine
	if c.lora {
		ckpt, fortunes := writeLoRAData(h, dir)
		data = fmt.Sprintf("dataset: fortunes-category\ndata: %s\ninit_from: %s\nseq_len: 8\n"+
			"lora: {rank: 2, alpha: 4}\ntrainable: [classifier.*]", fortunes, ckpt)
	}
	body := fmt.Sprintf("run: %s\n%s\nbatch_size: 100\nmax_steps: %d\n"+
		"round_timeout: %s\nmin_nodes: %d\neval_every: 0\n", c.run, data, c.maxSteps, c.roundTimeout, cmp.Or(c.minNodes, c.nodes))
	if err := os.WriteFile(c.file, []byte(body), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

// writeLoRAData writes, under dir, the checkpoint package's tiny BERT
// (width 8, 2 blocks) with a WordPiece vocabulary of 24 tokens, and a
// fortunes folder of two categories of 1500 fortunes each, each fortune
// three of its category's four words; it returns both folders.
func writeLoRAData(h *Harness, dir string) (ckpt, fortunes string) {
	h.t.Helper()
	ckpt, fortunes = filepath.Join(dir, "tiny-bert"), filepath.Join(dir, "fortunes")
	for _, d := range []string{ckpt, fortunes} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			h.t.Fatal(err)
		}
	}
	for _, f := range []string{"config.json", "model.safetensors"} {
		b, err := os.ReadFile(filepath.Join("..", "checkpoint", "testdata", "tiny-bert", f))
		if err != nil {
			h.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ckpt, f), b, 0o644); err != nil {
			h.t.Fatal(err)
		}
	}
	words := map[string][]string{"science": {"atom", "energy", "quark", "photon"}, "food": {"bread", "cheese", "apple", "soup"}}
	vocab := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]"}
	for _, cat := range []string{"science", "food"} {
		vocab = append(vocab, words[cat]...)
		var b strings.Builder
		for i := range 1500 {
			w := words[cat]
			fmt.Fprintf(&b, "%s %s %s\n%%\n", w[i%4], w[(i+1)%4], w[(i+2)%4])
		}
		if err := os.WriteFile(filepath.Join(fortunes, cat), []byte(b.String()), 0o644); err != nil {
			h.t.Fatal(err)
		}
	}
	for len(vocab) < 24 {
		vocab = append(vocab, fmt.Sprintf("filler%d", len(vocab)))
	}
	if err := os.WriteFile(filepath.Join(ckpt, "vocab.txt"), []byte(strings.Join(vocab, "\n")+"\n"), 0o644); err != nil {
		h.t.Fatal(err)
	}
	return ckpt, fortunes
}

// serveArgs are the arguments of `coordinator serve` for replica id,
// bootstrapping a one-replica cluster.
func (c runConfig) serveArgs(id, raftAddr, dataDir, natsURL, metricsAddr string) []string {
	return []string{"serve",
		"--id", id, "--raft-addr", raftAddr, "--data-dir", dataDir, "--bootstrap",
		"--nats", natsURL, "--metrics-addr", metricsAddr,
		"--config", c.file, "--insecure-seed", "7",
	}
}

// nodeArgs are the arguments of node i: the run file and its shard.
func (c runConfig) nodeArgs(i int, natsURL string) []string {
	return []string{
		"--config", c.file, "--nats", natsURL, "--id", nodeID(i),
		"--shard-index", strconv.Itoa(i), "--shard-count", strconv.Itoa(c.nodes),
		"--insecure-seed", strconv.Itoa(101 + i),
	}
}

func nodeID(i int) string { return fmt.Sprintf("n-%d", i) }

// coordinatorState is what the tests read from a replica's /metrics.
type coordinatorState struct {
	step, participants float64
}

func scrapeCoordinator(addr string) (coordinatorState, error) {
	m, err := Scrape(addr)
	if err != nil {
		return coordinatorState{}, err
	}
	step, ok1 := m.Value("dpcluster_coordinator_step")
	parts, ok2 := m.Value("dpcluster_coordinator_round_participants")
	if !ok1 || !ok2 {
		return coordinatorState{}, errors.New("no dpcluster_coordinator_step or _round_participants")
	}
	return coordinatorState{step: step, participants: parts}, nil
}

// TestProcessNodeRestart is issue 5's integration test: a NATS server, one
// `coordinator serve` and three nodes, each its own OS process; node 1 is
// SIGKILLed around step 40 and restarted with the same arguments. The run
// must finish its 120 steps, the restarted node must contribute again, all
// nodes must exit by themselves when the leader announces the end, and the
// replica's ledger must pass `coordinator ledger audit` with exactly one
// charge per applied step.
func TestProcessNodeRestart(t *testing.T) {
	const killAt = 40
	cfg := runConfig{run: "e2e-node-restart", maxSteps: 120, nodes: 3, roundTimeout: 2 * time.Second}
	h := New(t)
	start := time.Now()
	cfg.writeRunFile(h)

	_, natsURL := h.StartNATS("nats")
	dataDir := h.Dir("r1")
	metricsAddr := FreeAddr(t)
	serve := h.Start("serve", h.Bin.Coordinator, cfg.serveArgs("r1", FreeAddr(t), dataDir, natsURL, metricsAddr)...)
	nodes := make([]*Proc, cfg.nodes)
	for i := range nodes {
		nodes[i] = h.Start("node-"+strconv.Itoa(i), h.Bin.Node, cfg.nodeArgs(i, natsURL)...)
	}

	// 1. Let the run reach step killAt with every node in the last round,
	// then SIGKILL node 1: no Leave, its round times out without it.
	var st coordinatorState
	h.WaitFor(60*time.Second, fmt.Sprintf("step ≥ %d with %d participants", killAt, cfg.nodes), func() (bool, error) {
		if err := serve.exitedErr(); err != nil {
			return false, err
		}
		var err error
		if st, err = scrapeCoordinator(metricsAddr); err != nil {
			return false, nil // not serving yet
		}
		if st.step >= float64(cfg.maxSteps) {
			return false, fmt.Errorf("the run finished (step %v) before the kill", st.step)
		}
		return st.step >= killAt && st.participants == float64(cfg.nodes), nil
	})
	victim := nodes[1]
	ps := victim.Kill()
	if ws, ok := ps.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		h.Fatalf("%s: %v, want killed by SIGKILL", victim.Name(), ps)
	}
	killedAt := int64(st.step)
	t.Logf("killed %s (%s) at step %d, %v into the test", victim.Name(), nodeID(1), killedAt, time.Since(start).Round(time.Millisecond))

	// 2. Restart it with the same arguments. It must contribute again: a
	// round with every node in it, opened after the restart. Rounds are
	// sequential, so if step s was the last applied one at some moment
	// after the restart, round s+2 opened after it.
	victim.Restart()
	st, err := scrapeCoordinator(metricsAddr)
	if err != nil {
		h.Fatalf("scraping the coordinator after the restart: %v", err)
	}
	after := int64(st.step)
	h.WaitFor(60*time.Second, fmt.Sprintf("a round after step %d with %d participants", after+1, cfg.nodes), func() (bool, error) {
		if err := serve.exitedErr(); err != nil {
			return false, err
		}
		if err := victim.exitedErr(); err != nil {
			return false, err
		}
		var err error
		if st, err = scrapeCoordinator(metricsAddr); err != nil {
			return false, err
		}
		if int64(st.step) >= int64(cfg.maxSteps) && st.participants != float64(cfg.nodes) {
			return false, fmt.Errorf("the run finished, the last round with %v participants", st.participants)
		}
		return int64(st.step) >= after+2 && st.participants == float64(cfg.nodes), nil
	})
	t.Logf("%s contributes again: step %v with %v participants", victim.Name(), st.step, st.participants)

	// 3. The run finishes: serve exits 0 after max steps, and every node
	// exits 0 on its own once it hears the leader's Done.
	if ps := serve.Wait(2 * time.Minute); ps.ExitCode() != 0 {
		h.Fatalf("serve: %v, want exit 0", ps)
	}
	wantFinished := fmt.Sprintf("run %s finished after %d steps (max steps reached)", cfg.run, cfg.maxSteps)
	if logs := serve.Logs(); !strings.Contains(logs, wantFinished) {
		h.Fatalf("serve's output lacks %q", wantFinished)
	}
	for _, n := range nodes {
		if ps := n.Wait(20 * time.Second); ps.ExitCode() != 0 {
			h.Fatalf("%s: %v, want exit 0 after the run", n.Name(), ps)
		}
		reason, _ := logField(n.Logs(), `msg="node: stop"`, "reason")
		if reason != "done" {
			h.Fatalf("%s stopped with reason %q, want done", n.Name(), reason)
		}
	}
	// The restarted incarnation's last contribution came after the kill
	// (node: stop reports the last step it contributed to).
	last, _ := logField(victim.Logs(), `msg="node: stop"`, "last_step")
	if n, err := strconv.ParseInt(last, 10, 64); err != nil || n <= killedAt {
		h.Fatalf("restarted %s: last_step %q, want a step after %d", victim.Name(), last, killedAt)
	}

	// 4. The ledger: audit passes with exactly maxSteps applied charges and
	// no replay, and it holds one run record, one charge for each step
	// 1..maxSteps and the end record (after step maxSteps).
	rep, code, out := h.Audit(dataDir, cfg.maxSteps)
	if code != 0 || !rep.OK || len(rep.Problems) != 0 {
		h.Fatalf("ledger audit: exit %d, ok %v, problems %q\n%s", code, rep.OK, rep.Problems, out)
	}
	if rep.Charges != cfg.maxSteps || rep.Applied != cfg.maxSteps || rep.Replays != 0 || rep.LastStep != int64(cfg.maxSteps) || rep.Run != cfg.run ||
		!rep.Ended || rep.EndStep != int64(cfg.maxSteps) {
		h.Fatalf("ledger audit: run %q, %d charges, %d applied, %d replays, last step %d; want run %q, %d, %d, 0, %d\n%s",
			rep.Run, rep.Charges, rep.Applied, rep.Replays, rep.LastStep, cfg.run, cfg.maxSteps, cfg.maxSteps, cfg.maxSteps, out)
	}
	recs := h.LedgerRecords(dataDir)
	if len(recs) != cfg.maxSteps+2 || recs[0].Kind != "run" || recs[len(recs)-1].Kind != "end" {
		h.Fatalf("ledger: %d records (first %+v), want a run record, %d charges and the end", len(recs), recs[0], cfg.maxSteps)
	}
	for i, r := range recs[1 : len(recs)-1] {
		if r.Kind != "charge" || r.Step != int64(i+1) || r.Replay {
			h.Fatalf("ledger record %d: %+v, want the charge of step %d, not a replay", i+1, r, i+1)
		}
	}
	t.Logf("run of %d steps with a node restart: %v; ledger at %s", cfg.maxSteps, time.Since(start).Round(time.Millisecond),
		filepath.Join(dataDir, "ledger.log"))
}
