package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/model"
)

// TestLocalMemoryDoesNotGrowWithSteps runs `coordinator local` (embedded
// NATS, a Raft replica with its durable log and ledger, three in-process
// nodes) for many steps and compares the live heap after a collection at
// an early step with the same at the last step: a process whose memory
// grows with the run's length (messages retained, logs or history kept in
// memory, per-step buffers never released) fails.
//
// In CI: a 784-32-10 MLP (25,450 parameters, messages of about 100 KB,
// sent whole), 1000 steps, compared at step 250 (about 5 s). With
// DPC_LONG_MEMORY=1 also a 784-400-10 MLP (318,010 parameters: every θ and
// every sum is over NATS's 1 MiB payload, so it is chunked and the sender
// keeps it for retransmission), 2000 steps compared at step 500, about
// 1.5–2 minutes. Before the transport kept only the last chunked message
// per subject (ClientConfig.RetainPerSubject) the long case failed: the
// live heap went from 1311 MB at step 250 to 2443 MB at step 1000, all of
// it the retransmission cache (up to 1 GiB for 30 s per client); with the
// bound it stayed at 97.0 MB at step 500 and 95.6 MB at step 2000.
func TestLocalMemoryDoesNotGrowWithSteps(t *testing.T) {
	if testing.Short() {
		t.Skip("long runs; -short skips them")
	}
	t.Run("unchunked", func(t *testing.T) { checkLocalMemory(t, 32, 100, 250, 1000) })
	t.Run("chunked", func(t *testing.T) {
		if os.Getenv("DPC_LONG_MEMORY") == "" {
			t.Skip("set DPC_LONG_MEMORY=1 for 2000 steps with chunked messages")
		}
		checkLocalMemory(t, 400, 20, 500, 2000)
	})
}

// checkLocalMemory runs local with a 784-hidden-10 MLP on the gaussian
// data, expected batch size batch, for total steps, and fails if the live
// heap at the last step exceeds 1.2× the live heap at step early.
func checkLocalMemory(t *testing.T, hidden, batch int, early, total int64) {
	dir := t.TempDir()
	spec, err := json.Marshal(model.MLP([]int{1, 28, 28}, []int{hidden}, 10))
	if err != nil {
		t.Fatal(err)
	}
	specFile := filepath.Join(dir, "model.json")
	writeFile(t, specFile, string(spec))

	var (
		mu   sync.Mutex
		heap = map[int64]uint64{}
	)
	onStep := func(p coordinator.Progress) {
		if p.Step != early && p.Step != total {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if _, done := heap[p.Step]; done {
			return // the final evaluation's callback
		}
		// On the leader's loop: no round is open, the nodes are idle.
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		heap[p.Step] = ms.HeapAlloc
	}
	args := []string{"--dataset", "gaussian", "--model-spec", specFile, "--nodes", "3",
		"--batch-size", strconv.Itoa(batch), "--max-steps", strconv.FormatInt(total, 10), "--eval-every", "0",
		"--round-timeout", "20s", "--data-dir", filepath.Join(dir, "data"), "--progress", "off", "--run", "t-memory"}
	// Logs go nowhere: a buffer would itself grow with the run.
	if err := RunLocal(context.Background(), args, io.Discard, io.Discard, LocalHooks{OnStep: onStep}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	a, b := heap[early], heap[total]
	if a == 0 || b == 0 {
		t.Fatalf("no heap measured at steps %d and %d: %v", early, total, heap)
	}
	mb := func(v uint64) string { return fmt.Sprintf("%.1f MB", float64(v)/(1<<20)) }
	t.Logf("live heap after GC: step %d %s, step %d %s (%.2f×)", early, mb(a), total, mb(b), float64(b)/float64(a))
	// 20% slack for noise; retaining each step's messages would add
	// hundreds of MB by the last step.
	if float64(b) > 1.2*float64(a) {
		t.Errorf("live heap grew from %s at step %d to %s at step %d", mb(a), early, mb(b), total)
	}
}
