//go:build unix

package e2e

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/pki"
	"github.com/dpcluster/dpcluster/transport"
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

// TestHarnessNATSOverTLS: with TLS flags the NATS server binary requires
// mutual TLS: a client presenting a node certificate of the run connects,
// one without a certificate does not.
func TestHarnessNATSOverTLS(t *testing.T) {
	h := New(t)
	certs := h.Certs([]string{"r1"}, []string{"node-0"}, nil)
	_, url := h.StartNATS("nats", append([]string{"--run", "e2e"}, TLSArgs(certs, "r1")...)...)
	if !strings.HasPrefix(url, "tls://") {
		h.Fatalf("TLS server URL %s", url)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := transport.DefaultConfig()
	cfg.Run, cfg.URLs = "e2e", []string{url}
	if c, err := transport.Connect(ctx, cfg, nil); err == nil {
		c.Close()
		h.Fatalf("a client without a certificate connected to %s", url)
	}
	cfg.TLS = transport.TLSConfig{CAFile: filepath.Join(certs, pki.CACertFile),
		CertFile: filepath.Join(certs, "node-0.crt"), KeyFile: filepath.Join(certs, "node-0.key")}
	c, err := transport.Connect(ctx, cfg, nil)
	if err != nil {
		h.Fatalf("node-0 over TLS: %v", err)
	}
	c.Close()
}
