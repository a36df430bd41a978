package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/ledger"
)

// TestLocalResumeOnOtherDataRefused: the run binds each node to its
// data's content. `local` interrupted after a few steps, then run again on
// the same data dir with the data file changed but of the same shape (the
// same run configuration), is refused, naming the hash the node trained
// on and the new one, instead of continuing on the new data. The same
// data resumes as before.
func TestLocalResumeOnOtherDataRefused(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "sites.csv")
	csv := func(flip int) string {
		var b strings.Builder
		b.WriteString("a,b,label\n")
		for i := range 300 {
			fmt.Fprintf(&b, "%d,%d,%d\n", (i+flip)%7, i%5, i%2)
		}
		return b.String()
	}
	writeFile(t, data, csv(0))
	args := func(dataDir string) []string {
		return []string{"local", "--data-path", data, "--label-column", "label", "--model", "logreg", "--batch-size", "30",
			"--max-steps", "0", "--sigma", "5", "--data-dir", dataDir, "--progress", "off", "--round-timeout", "20s", "--nodes", "2"}
	}
	dataDir := filepath.Join(dir, "run")
	hashOf := func() []string { // the nodes' shards, as local cuts them
		d, err := dataset.ReadFile(data, dataset.FileOptions{LabelColumn: "label"})
		if err != nil {
			t.Fatal(err)
		}
		views, err := dataset.ShardViewsIID(d, 2, 1)
		if err != nil {
			t.Fatal(err)
		}
		var h []string
		for _, v := range views {
			h = append(h, v.Data.Subset(v.Rows).ContentHash())
		}
		return h
	}
	trained := hashOf()

	// Train a few steps, then interrupt (what SIGINT does).
	interruptAfter := func(steps int) error {
		cmd := NewCoordinatorCmd()
		cmd.SetOut(io.Discard)
		var errOut bytes.Buffer
		cmd.SetErr(&errOut)
		cmd.SetArgs(args(dataDir))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- cmd.ExecuteContext(ctx) }()
		path := filepath.Join(dataDir, coordinator.LedgerFile)
		for {
			select {
			case err := <-done:
				return err
			case <-time.After(20 * time.Millisecond):
			}
			if rep, err := ledger.Audit(path); err == nil && rep.Applied >= steps {
				cancel()
				return <-done
			}
		}
	}
	if err := interruptAfter(3); err != nil {
		t.Fatalf("first run: %v", err)
	}
	// The same data resumes: it trains on (interrupted once it applied
	// steps of its own, so that it is past its start).
	rep, err := ledger.Audit(filepath.Join(dataDir, coordinator.LedgerFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := interruptAfter(rep.Applied + 2); err != nil {
		t.Fatalf("resumed on the same data: %v", err)
	}

	writeFile(t, data, csv(1)) // same shape and labels, other features
	changed := hashOf()
	if changed[0] == trained[0] && changed[1] == trained[1] {
		t.Fatal("the changed file has the same shards")
	}
	err = interruptAfter(1 << 30) // refused before any step, or it times out
	if err == nil {
		t.Fatal("a resume on other data of the same shape was not refused")
	}
	msg := err.Error()
	named := false
	for i := range trained {
		if trained[i] != changed[i] && strings.Contains(msg, trained[i]) && strings.Contains(msg, changed[i]) {
			named = true
		}
	}
	if !named || !strings.Contains(msg, "new run") || strings.Contains(msg, "\n") {
		t.Errorf("refusal %q: want one line naming a node's trained and new data hashes and what to do", msg)
	}
}
