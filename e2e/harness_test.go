//go:build unix

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/ledger"
	"github.com/dpcluster/dpcluster/pki"
)

// The harness: binaries built once, processes with log files, waiting by
// polling, signals, restarts, and a cleanup that kills every child.
//
// Every method that can fail the test (Harness.Start, Proc.Kill, WaitFor,
// ...) must be called from the test's goroutine, as t.Fatal requires. The
// read-only methods (Proc.Running, Proc.Exited, Proc.Logs, Scrape) may be
// called from any goroutine.

// Timeouts of the harness's own waits. They bound how long a broken run
// takes to fail, not how long a good one takes.
const (
	buildTimeout = 5 * time.Minute
	exitTimeout  = 10 * time.Second // a SIGKILLed process to be reaped
	pollEvery    = 20 * time.Millisecond
	tailLines    = 40 // log lines per process attached to a failure
)

const modulePath = "github.com/dpcluster/dpcluster"

// Binaries are the absolute paths of the programs the harness runs.
type Binaries struct {
	Coordinator string // cmd/coordinator
	Node        string // cmd/node
	NATSServer  string // e2e/natsserver
}

// binDir is where the binaries are built (set by TestMain); build holds
// the one build of this test binary run.
var (
	binDir string
	build  struct {
		once sync.Once
		bins Binaries
		err  error
	}
)

// binaries returns the built binaries, building them on the first call:
// one `go build -o DIR/` of the three main packages (shared dependencies
// compile once), without -race and without DWARF (-ldflags=-w: a faster
// link; panics still print symbolized stacks). A build failure fails
// every caller.
func binaries(t testing.TB) Binaries {
	t.Helper()
	build.once.Do(func() {
		start := time.Now()
		build.bins, build.err = buildBinaries(binDir)
		if build.err == nil {
			t.Logf("built the coordinator, node and natsserver binaries in %v", time.Since(start).Round(time.Millisecond))
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.bins
}

func buildBinaries(dir string) (Binaries, error) {
	if dir == "" {
		return Binaries{}, errors.New("e2e: no binary directory (TestMain sets it)")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		return Binaries{}, fmt.Errorf("e2e: the process tests build the binaries with the go tool: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	// -tags dpcrashpoints: the coordinator can kill itself at a point of
	// its commit path when coordinator.CrashAtEnv asks (only
	// TestProcessLeaderKilledOnTheCommitPath sets it).
	cmd := exec.CommandContext(ctx, goTool, "build", "-tags", "dpcrashpoints", "-ldflags=-w", "-o", dir+string(filepath.Separator),
		modulePath+"/cmd/coordinator", modulePath+"/cmd/node", modulePath+"/e2e/natsserver")
	// The test binary's own -race is not in the environment, but a
	// GOFLAGS=-race would be; the binaries are built without it (faster).
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("e2e: go build: %w\n%s", err, out)
	}
	return Binaries{
		Coordinator: filepath.Join(dir, "coordinator"),
		Node:        filepath.Join(dir, "node"),
		NATSServer:  filepath.Join(dir, "natsserver"),
	}, nil
}

// Harness runs one test's processes. New registers a cleanup that
// SIGKILLs every process still running and, if the test failed, logs the
// last lines of every process's logs.
type Harness struct {
	t   testing.TB
	Bin Binaries
	dir string // the test's temporary directory

	mu     sync.Mutex
	procs  []*Proc
	dumped bool // the log tails were already attached to a failure
}

// New builds the binaries (once per test binary run) and returns a
// harness whose processes live no longer than t.
func New(t testing.TB) *Harness {
	t.Helper()
	h := &Harness{t: t, Bin: binaries(t), dir: t.TempDir()}
	if err := os.Mkdir(filepath.Join(h.dir, "logs"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Registered after t.TempDir's removal, so it runs before it: the
	// processes are dead before their files are removed.
	t.Cleanup(h.cleanup)
	return h
}

// Dir returns a new directory under the test's temporary directory.
func (h *Harness) Dir(name string) string {
	h.t.Helper()
	d := filepath.Join(h.dir, name)
	if err := os.Mkdir(d, 0o755); err != nil {
		h.t.Fatal(err)
	}
	return d
}

// Start starts path with args as a process named name (unique in the
// test; it names the log files). Its stdout and stderr go to one log file
// per incarnation, logs/NAME.N.log (N = 0, then 1, ... after restarts).
func (h *Harness) Start(name, path string, args ...string) *Proc {
	h.t.Helper()
	h.mu.Lock()
	for _, p := range h.procs {
		if p.name == name {
			h.mu.Unlock()
			h.t.Fatalf("e2e: process name %q used twice", name)
		}
	}
	p := &Proc{h: h, name: name, path: path, args: args}
	h.procs = append(h.procs, p)
	h.mu.Unlock()
	if err := p.start(); err != nil {
		h.Fatalf("e2e: starting %s: %v", name, err)
	}
	return p
}

// StartNATS starts a NATS server process named name on a free loopback
// port, waits until it accepts connections, and returns it with its
// client URL. A restart listens on the same port. args are more
// natsserver flags; with its TLS flags (--run RUN --tls-ca --tls-cert
// --tls-key, see TLSArgs) the URL is tls://.
func (h *Harness) StartNATS(name string, args ...string) (*Proc, string) {
	h.t.Helper()
	addr := FreeAddr(h.t)
	p := h.Start(name, h.Bin.NATSServer, append([]string{"--listen", addr}, args...)...)
	url := "nats://" + addr
	if slices.Contains(args, "--tls-cert") {
		url = "tls://" + addr
	}
	h.WaitFor(30*time.Second, name+" to accept connections", func() (bool, error) {
		if err := p.exitedErr(); err != nil {
			return false, err
		}
		return strings.Contains(p.Logs(), "nats server ready"), nil
	})
	return p, url
}

// Certs writes a run's PKI (pki.Init, as coordinator certs init does) for
// the replica, node and observer IDs into a new directory named certs and
// returns it. The certificates are valid for localhost and 127.0.0.1.
func (h *Harness) Certs(replicas, nodes, observers []string) string {
	h.t.Helper()
	var names []pki.Name
	for _, g := range []struct {
		role pki.Role
		ids  []string
	}{{pki.RoleReplica, replicas}, {pki.RoleNode, nodes}, {pki.RoleObserver, observers}} {
		for _, id := range g.ids {
			names = append(names, pki.Name{Role: g.role, ID: id})
		}
	}
	dir := filepath.Join(h.dir, "certs")
	if _, err := pki.Init(dir, names, nil, 1); err != nil {
		h.t.Fatalf("e2e: certificates: %v", err)
	}
	return dir
}

// TLSArgs returns the --tls-ca, --tls-cert and --tls-key flags of id's
// certificate in dir (made by Certs), for coordinator serve, node,
// status, remove-replica and natsserver.
func TLSArgs(dir, id string) []string {
	return []string{"--tls-ca", filepath.Join(dir, pki.CACertFile),
		"--tls-cert", filepath.Join(dir, id+".crt"), "--tls-key", filepath.Join(dir, id+".key")}
}

// WaitFor polls cond every 20 ms until it reports true, and fails the
// test if it returns an error or timeout passes first. The failure
// message names what and carries the processes' log tails.
func (h *Harness) WaitFor(timeout time.Duration, what string, cond func() (bool, error)) {
	h.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			h.Fatalf("e2e: waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		select {
		case <-deadline.C:
			h.Fatalf("e2e: timed out after %v waiting for %s", timeout, what)
		case <-tick.C:
		}
	}
}

// Fatalf fails the test now with the message and the last lines of every
// process's logs.
func (h *Harness) Fatalf(format string, args ...any) {
	h.t.Helper()
	h.mu.Lock()
	h.dumped = true
	h.mu.Unlock()
	h.t.Fatalf("%s\n%s", fmt.Sprintf(format, args...), h.LogTails(tailLines))
}

// LogTails returns the last n lines of every incarnation's log of every
// process, each under a header naming the process, its pid and its state.
func (h *Harness) LogTails(n int) string {
	h.mu.Lock()
	procs := append([]*Proc(nil), h.procs...)
	h.mu.Unlock()
	var b strings.Builder
	for _, p := range procs {
		for i, r := range p.incarnations() {
			fmt.Fprintf(&b, "---- %s #%d (pid %d, %s): last %d lines of %s\n", p.name, i, r.pid, r.status(), n, r.log)
			b.WriteString(tail(r.log, n))
		}
	}
	return b.String()
}

func (h *Harness) cleanup() {
	h.mu.Lock()
	procs := append([]*Proc(nil), h.procs...)
	dumped := h.dumped
	h.mu.Unlock()
	for _, p := range procs {
		if r := p.current(); r != nil && !r.exited() {
			_ = r.cmd.Process.Signal(syscall.SIGKILL)
			select {
			case <-r.done:
			case <-time.After(exitTimeout):
				h.t.Errorf("e2e: %s (pid %d) not reaped %v after SIGKILL", p.name, r.pid, exitTimeout)
			}
		}
	}
	if h.t.Failed() && !dumped {
		h.t.Log("e2e: process logs\n" + h.LogTails(tailLines))
	}
	if keep := os.Getenv("DPCLUSTER_E2E_KEEP_LOGS"); keep != "" {
		h.keepLogs(keep)
	}
}

// keepLogs copies the test's process logs into dir/TEST-NAME/ (the test's
// temporary directory, logs included, is removed when it ends): set
// DPCLUSTER_E2E_KEEP_LOGS=dir to read a passing run's logs, a soak's slow
// failovers for example.
func (h *Harness) keepLogs(dir string) {
	dst := filepath.Join(dir, strings.ReplaceAll(h.t.Name(), "/", "_"))
	src := filepath.Join(h.dir, "logs")
	err := os.MkdirAll(dst, 0o755)
	if err == nil {
		err = os.CopyFS(dst, os.DirFS(src))
	}
	if err != nil {
		h.t.Errorf("e2e: keeping the logs in %s: %v", dst, err)
		return
	}
	h.t.Logf("e2e: process logs kept in %s", dst)
}

// Proc is one process of a test, across its restarts: the same binary
// and arguments, a new OS process and log file each incarnation.
type Proc struct {
	h          *Harness
	name, path string
	args       []string

	mu   sync.Mutex
	runs []*incarnation // the last one is current
}

// incarnation is one OS process. Its fields are written before done is
// closed (state) or before it is published in Proc.runs (the rest).
type incarnation struct {
	cmd   *exec.Cmd
	pid   int
	log   string
	done  chan struct{} // closed once the process has been reaped
	state *os.ProcessState
	err   error // from Wait, other than a non-zero exit
}

func (r *incarnation) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *incarnation) status() string {
	if !r.exited() {
		return "running"
	}
	if r.state == nil {
		return fmt.Sprintf("wait error: %v", r.err)
	}
	return r.state.String()
}

// start starts a new incarnation; the process must not be running.
func (p *Proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.runs); n > 0 && !p.runs[n-1].exited() {
		return fmt.Errorf("%s is still running (pid %d)", p.name, p.runs[n-1].pid)
	}
	logPath := filepath.Join(p.h.dir, "logs", fmt.Sprintf("%s.%d.log", p.name, len(p.runs)))
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer f.Close() // the child has its own descriptor
	fmt.Fprintf(f, "# %s %s\n", p.path, strings.Join(p.args, " "))
	cmd := exec.Command(p.path, p.args...)
	cmd.Stdout, cmd.Stderr = f, f // an *os.File: no copying goroutine
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	r := &incarnation{cmd: cmd, pid: cmd.Process.Pid, log: logPath, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		r.state = cmd.ProcessState
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			r.err = err
		}
		close(r.done)
	}()
	p.runs = append(p.runs, r)
	return nil
}

func (p *Proc) current() *incarnation {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.runs) == 0 {
		return nil
	}
	return p.runs[len(p.runs)-1]
}

func (p *Proc) incarnations() []*incarnation {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*incarnation(nil), p.runs...)
}

// Name returns the process's name in the test.
func (p *Proc) Name() string { return p.name }

// Pid returns the current incarnation's process ID.
func (p *Proc) Pid() int { return p.current().pid }

// Incarnation returns the current incarnation's number: 0, then one more
// per Restart.
func (p *Proc) Incarnation() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.runs) - 1
}

// LogPath returns the current incarnation's log file.
func (p *Proc) LogPath() string { return p.current().log }

// Logs returns the current incarnation's log so far.
func (p *Proc) Logs() string {
	b, _ := os.ReadFile(p.current().log)
	return string(b)
}

// Running reports whether the current incarnation has not exited.
func (p *Proc) Running() bool { return !p.current().exited() }

// Exited returns a channel closed when the current incarnation has exited
// and been reaped.
func (p *Proc) Exited() <-chan struct{} { return p.current().done }

// exitedErr is an error if the current incarnation has exited: for
// WaitFor conditions on processes that must stay up.
func (p *Proc) exitedErr() error {
	if r := p.current(); r.exited() {
		return fmt.Errorf("%s exited early: %s", p.name, r.status())
	}
	return nil
}

// Wait waits up to timeout for the current incarnation to exit and
// returns its state; it fails the test on timeout.
func (p *Proc) Wait(timeout time.Duration) *os.ProcessState {
	p.h.t.Helper()
	r := p.current()
	select {
	case <-r.done:
	case <-time.After(timeout):
		p.h.Fatalf("e2e: %s (pid %d) still running after %v", p.name, r.pid, timeout)
	}
	if r.state == nil {
		p.h.Fatalf("e2e: waiting for %s: %v", p.name, r.err)
	}
	return r.state
}

// Signal sends sig to the current incarnation; it fails the test if the
// process has already exited.
func (p *Proc) Signal(sig os.Signal) {
	p.h.t.Helper()
	r := p.current()
	if r.exited() {
		p.h.Fatalf("e2e: signal %v to %s: it has exited (%s)", sig, p.name, r.status())
	}
	if err := r.cmd.Process.Signal(sig); err != nil {
		p.h.Fatalf("e2e: signal %v to %s (pid %d): %v", sig, p.name, r.pid, err)
	}
}

// Kill sends SIGKILL and waits until the process has been reaped.
func (p *Proc) Kill() *os.ProcessState {
	p.h.t.Helper()
	p.Signal(syscall.SIGKILL)
	return p.Wait(exitTimeout)
}

// Stop pauses the process with SIGSTOP (Cont resumes it) and returns once
// it is stopped. A stopped process holds its sockets open but answers
// nothing, like a hung one.
//
// kill(2) returns when the signal is queued, not when every thread has
// stopped: a thread running on another CPU, or one finishing a system
// call, goes on for a moment. Under load that moment was long enough for
// the NATS server to greet a client dialed "after" Stop, so Stop waits
// until every thread of the process reports the stopped state.
func (p *Proc) Stop() {
	p.h.t.Helper()
	p.Signal(syscall.SIGSTOP)
	pid := p.Pid()
	deadline := time.Now().Add(exitTimeout)
	for {
		stopped, err := threadsStopped(pid)
		if err != nil {
			p.h.Fatalf("e2e: waiting for %s (pid %d) to stop: %v", p.name, pid, err)
		}
		if stopped {
			return
		}
		if time.Now().After(deadline) {
			p.h.Fatalf("e2e: %s (pid %d) not stopped %v after SIGSTOP", p.name, pid, exitTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// threadsStopped reports whether every thread of pid is in the stopped
// state ("T", or "t" under a tracer), from /proc/<pid>/task/*/stat. Where
// there is no /proc (a unix other than Linux) it reports true: the caller
// then has only kill(2)'s weaker promise.
func threadsStopped(pid int) (bool, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if errors.Is(err, os.ErrNotExist) {
		if _, err := os.Stat("/proc/self"); errors.Is(err, os.ErrNotExist) {
			return true, nil // no procfs
		}
		return false, fmt.Errorf("no /proc/%d: the process has gone", pid)
	}
	if err != nil {
		return false, err
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue // the thread exited while we listed them
		}
		if err != nil {
			return false, err
		}
		// The state is the first field after the command name, which is in
		// parentheses and may itself contain ") ".
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return false, fmt.Errorf("unparsable %s stat %q", task.Name(), b)
		}
		if st := b[i+2]; st != 'T' && st != 't' {
			return false, nil
		}
	}
	return true, nil
}

// Cont resumes a process paused by Stop.
func (p *Proc) Cont() { p.h.t.Helper(); p.Signal(syscall.SIGCONT) }

// Restart starts a new incarnation with the same binary and arguments
// (and so the same ports and data directories). The previous incarnation
// must have exited: Kill it first.
func (p *Proc) Restart() {
	p.h.t.Helper()
	if err := p.start(); err != nil {
		p.h.Fatalf("e2e: restarting %s: %v", p.name, err)
	}
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)\n", err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	out := strings.Join(lines, "")
	if out != "" && !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	return out
}

// FreeAddr returns a loopback host:port that was free a moment ago, for a
// process the test starts to listen on. It picks at random from
// [20000, 32000), below Linux's ephemeral range (32768-60999): a port the
// kernel hands out for ":0" listeners is also one it hands out as the
// local port of outgoing connections (NATS clients, Raft dials), which
// took a picked port before its process bound it often enough to fail CI
// ("bind: address already in use"). It never hands out a port twice in
// one test binary: a test picks 30-40 ports before its processes bind
// them, so repeats among its own picks were likely (a few percent a run;
// TestProcessNetworkSoak failed CI on one). Another test binary could
// still take the port first; that is rare enough.
func FreeAddr(t testing.TB) string {
	t.Helper()
	picked.Lock()
	defer picked.Unlock()
	for range 100 {
		port := 20000 + rand.IntN(12000)
		if picked.ports[port] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // taken
		}
		picked.ports[port] = true
		addr := ln.Addr().String()
		if err := ln.Close(); err != nil {
			t.Fatal(err)
		}
		return addr
	}
	t.Fatal("e2e: no free loopback port in [20000, 32000) after 100 tries")
	return ""
}

// picked holds the ports FreeAddr has handed out in this test binary.
var picked = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// Metrics are one scrape of a Prometheus text endpoint: each sample's
// value under its name with labels as exposed (name{a="b"}) and, for the
// first sample of a name, also under the bare name.
type Metrics map[string]float64

// Value returns the sample called name (bare, or with its labels).
func (m Metrics) Value(name string) (float64, bool) {
	v, ok := m[name]
	return v, ok
}

var scrapeClient = &http.Client{Timeout: 2 * time.Second}

// Scrape fetches http://addr/metrics. Any error (not yet listening, gone)
// is returned; WaitFor conditions usually treat it as "not yet".
func Scrape(addr string) (Metrics, error) {
	resp, err := scrapeClient.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", addr, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the Prometheus text format's sample lines
// (`name{labels} value [timestamp]`); label values here never hold spaces.
func parseMetrics(r io.Reader) (Metrics, error) {
	m := Metrics{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		key, rest, ok := strings.Cut(line, " ")
		if i := strings.LastIndexByte(line, '}'); i >= 0 {
			key, rest, ok = line[:i+1], strings.TrimSpace(line[i+1:]), true
		}
		if !ok {
			return nil, fmt.Errorf("metrics: bad line %q", line)
		}
		val, _, _ := strings.Cut(rest, " ")
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: bad value in %q", line)
		}
		m[key] = v
		if name, _, _ := strings.Cut(key, "{"); name != key {
			if _, seen := m[name]; !seen {
				m[name] = v
			}
		}
	}
	return m, sc.Err()
}

// AuditReport is the report `coordinator ledger audit --json` prints.
type AuditReport = ledger.AuditReport

// Audit runs `coordinator ledger audit DIR --json --expect-steps N` and
// returns its report, exit code and combined output.
func (h *Harness) Audit(dataDir string, expectSteps int) (AuditReport, int, string) {
	h.t.Helper()
	out, code := h.run(h.Bin.Coordinator, "ledger", "audit", dataDir, "--json", "--expect-steps", strconv.Itoa(expectSteps))
	var rep AuditReport
	if err := json.Unmarshal(jsonPart(out), &rep); err != nil {
		h.Fatalf("e2e: ledger audit %s (exit %d): %v\n%s", dataDir, code, err, out)
	}
	return rep, code, string(out)
}

// LedgerRecord is the part of a `coordinator ledger show --json` record
// the tests check.
type LedgerRecord struct {
	Seq    uint64 `json:"seq"`
	Kind   string `json:"kind"`
	Step   int64  `json:"step"`
	Replay bool   `json:"replay"`
}

// LedgerRecords runs `coordinator ledger show DIR --json` and returns the
// records; a non-zero exit fails the test.
func (h *Harness) LedgerRecords(dataDir string) []LedgerRecord {
	h.t.Helper()
	out, code := h.run(h.Bin.Coordinator, "ledger", "show", dataDir, "--json")
	var res struct {
		Records []LedgerRecord `json:"records"`
	}
	if code != 0 {
		h.Fatalf("e2e: ledger show %s: exit %d\n%s", dataDir, code, out)
	}
	if err := json.Unmarshal(jsonPart(out), &res); err != nil {
		h.Fatalf("e2e: ledger show %s: %v\n%s", dataDir, err, out)
	}
	return res.Records
}

// run runs a short command to completion (1 minute at most) and returns
// its stdout and exit code; stderr is appended to the output when the
// command fails.
func (h *Harness) run(path string, args ...string) ([]byte, int) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return append(out, stderr.Bytes()...), exit.ExitCode()
	case err != nil:
		h.Fatalf("e2e: %s %s: %v", filepath.Base(path), strings.Join(args, " "), err)
	}
	return out, 0
}

// jsonPart returns out from its first '{' on: the JSON report, without
// anything a command printed before it.
func jsonPart(out []byte) []byte {
	if i := bytes.IndexByte(out, '{'); i > 0 {
		return out[i:]
	}
	return out
}

// logField returns the value of key=VALUE in the last line of log text
// that contains msg (slog's text format), and whether there is one.
func logField(log, msg, key string) (string, bool) {
	re := regexp.MustCompile(`(?:^|\s)` + regexp.QuoteMeta(key) + `=("(?:[^"\\]|\\.)*"|\S*)`)
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if !strings.Contains(lines[i], msg) {
			continue
		}
		if m := re.FindStringSubmatch(lines[i]); m != nil {
			if v, err := strconv.Unquote(m[1]); err == nil {
				return v, true
			}
			return m[1], true
		}
	}
	return "", false
}
