//go:build unix

package e2e

import (
	"bufio"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHarnessSignals checks the harness's process control on the NATS
// server binary: a stopped server accepts TCP connections (the kernel
// does) but sends no INFO until it is continued; a SIGKILLed one restarts
// on the same port with a new log file; SIGTERM stops it cleanly.
func TestHarnessSignals(t *testing.T) {
	h := New(t)
	nats, url := h.StartNATS("nats")
	addr := strings.TrimPrefix(url, "nats://")

	nats.Stop()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		h.Fatalf("dialing a stopped server: %v", err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if line, err := r.ReadString('\n'); !errors.Is(err, os.ErrDeadlineExceeded) {
		h.Fatalf("a stopped server answered %q, %v; want no INFO until SIGCONT", line, err)
	}
	nats.Cont()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "INFO ") {
		h.Fatalf("after SIGCONT: %q, %v; want the server's INFO", line, err)
	}

	ps := nats.Kill()
	if ws := ps.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		h.Fatalf("after Kill: %v, want killed by SIGKILL", ps)
	}
	first := nats.LogPath()
	nats.Restart()
	if nats.Incarnation() != 1 || nats.LogPath() == first {
		h.Fatalf("after Restart: incarnation %d, log %s (first %s)", nats.Incarnation(), nats.LogPath(), first)
	}
	h.WaitFor(30*time.Second, "the restarted server to be ready", func() (bool, error) {
		if err := nats.exitedErr(); err != nil {
			return false, err
		}
		return strings.Contains(nats.Logs(), "url="+url), nil
	})
	nats.Signal(syscall.SIGTERM)
	if ps := nats.Wait(10 * time.Second); ps.ExitCode() != 0 {
		h.Fatalf("after SIGTERM: %v, want exit 0", ps)
	}
}
