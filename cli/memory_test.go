package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/internal/procstat"
	"github.com/dpcluster/dpcluster/model"
)

// TestLocalMemoryDoesNotGrowWithSteps runs `coordinator local` (embedded
// NATS, a Raft replica with its durable log and ledger, three in-process
// nodes) for many steps, in a child process of its own (so that the peak
// RSS is the run's), and compares, at an early step and at the last one,
// the live heap after a collection and the process's peak RSS (VmHWM,
// Linux): a process whose memory grows with the run's length (messages
// retained, logs or history kept in memory, per-step buffers never
// released, a heap that keeps growing between collections) fails.
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
	skipUnderRace(t)
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

// memoryChildEnv, when set (to "hidden,batch,early,total"), makes the test
// binary run one localMemory run and print its result instead of its
// tests (TestMain).
const memoryChildEnv = "DPC_MEMORY_CHILD"

// memoryResult is what a child reports: the live heap after GC and VmHWM
// at step early and at the last step (0 where /proc is not there).
type memoryResult struct {
	HeapEarly, HeapLast uint64
	PeakEarly, PeakLast int64
}

const memoryResultPrefix = "MEMORY-RESULT "

func TestMain(m *testing.M) {
	if v := os.Getenv(memoryChildEnv); v != "" {
		var hidden, batch int
		var early, total int64
		if _, err := fmt.Sscanf(v, "%d,%d,%d,%d", &hidden, &batch, &early, &total); err != nil {
			fmt.Fprintln(os.Stderr, "bad", memoryChildEnv, v, err)
			os.Exit(2)
		}
		res, err := localMemory(hidden, batch, early, total)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		b, _ := json.Marshal(res)
		fmt.Println(memoryResultPrefix + string(b))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// checkLocalMemory runs localMemory in a child process and fails if the
// live heap at the last step exceeds 1.2× the live heap at step early, or
// the peak RSS at the last step exceeds 1.2× the peak at step early plus
// 32 MB.
func checkLocalMemory(t *testing.T, hidden, batch int, early, total int64) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d,%d,%d,%d", memoryChildEnv, hidden, batch, early, total))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child run: %v\n%s", err, out)
	}
	var res memoryResult
	found := false
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, memoryResultPrefix); ok {
			if err := json.Unmarshal([]byte(v), &res); err != nil {
				t.Fatal(err)
			}
			found = true
		}
	}
	if !found {
		t.Fatalf("no result from the child run:\n%s", out)
	}
	mb := func(v float64) string { return fmt.Sprintf("%.1f MB", v/(1<<20)) }
	a, b := float64(res.HeapEarly), float64(res.HeapLast)
	t.Logf("live heap after GC: step %d %s, step %d %s (%.2f×)", early, mb(a), total, mb(b), b/a)
	// 20% slack for noise; retaining each step's messages would add
	// hundreds of MB by the last step.
	if b > 1.2*a {
		t.Errorf("live heap grew from %s at step %d to %s at step %d", mb(a), early, mb(b), total)
	}
	if res.PeakEarly == 0 {
		t.Log("no VmHWM on this system: peak RSS not checked")
		return
	}
	p, q := float64(res.PeakEarly), float64(res.PeakLast)
	t.Logf("peak RSS: by step %d %s, by step %d %s (%.2f×)", early, mb(p), total, mb(q), q/p)
	if q > 1.2*p+32<<20 {
		t.Errorf("peak RSS grew from %s by step %d to %s by step %d", mb(p), early, mb(q), total)
	}
}

// localMemory runs local with a 784-hidden-10 MLP on the gaussian data,
// expected batch size batch, for total steps, and measures the live heap
// after a collection and the peak RSS at step early and at the last step.
func localMemory(hidden, batch int, early, total int64) (memoryResult, error) {
	var res memoryResult
	dir, err := os.MkdirTemp("", "dpcluster-memory-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	spec, err := json.Marshal(model.MLP([]int{1, 28, 28}, []int{hidden}, 10))
	if err != nil {
		return res, err
	}
	specFile := filepath.Join(dir, "model.json")
	if err := os.WriteFile(specFile, spec, 0o644); err != nil {
		return res, err
	}
	var (
		mu   sync.Mutex
		seen = map[int64]bool{}
	)
	onStep := func(p coordinator.Progress) {
		if p.Step != early && p.Step != total {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if seen[p.Step] {
			return // the final evaluation's callback
		}
		seen[p.Step] = true
		// On the leader's loop: no round is open, the nodes are idle.
		peak := vmHWM()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		if p.Step == early {
			res.HeapEarly, res.PeakEarly = ms.HeapAlloc, peak
		} else {
			res.HeapLast, res.PeakLast = ms.HeapAlloc, peak
		}
	}
	args := []string{"--dataset", "gaussian", "--model-spec", specFile, "--nodes", "3",
		"--batch-size", strconv.Itoa(batch), "--max-steps", strconv.FormatInt(total, 10), "--eval-every", "0",
		"--round-timeout", "20s", "--data-dir", filepath.Join(dir, "data"), "--progress", "off", "--run", "t-memory"}
	// Logs go nowhere: a buffer would itself grow with the run.
	if err := RunLocal(context.Background(), args, io.Discard, io.Discard, LocalHooks{OnStep: onStep}); err != nil {
		return res, err
	}
	mu.Lock()
	defer mu.Unlock()
	if res.HeapEarly == 0 || res.HeapLast == 0 {
		return res, fmt.Errorf("no heap measured at steps %d and %d", early, total)
	}
	return res, nil
}

// vmHWM is this process's peak RSS (VmHWM) in bytes, or 0 where
// /proc/self/status does not say.
func vmHWM() int64 {
	peak, err := procstat.PeakRSS()
	if err != nil {
		return 0
	}
	return peak
}
