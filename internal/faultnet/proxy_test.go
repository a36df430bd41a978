package faultnet_test

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/internal/faultnet"
)

// echoServer accepts connections on a loopback port and echoes what each
// sends; it stops (closing its connections) in t.Cleanup.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); defer c.Close(); io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// proxy starts a proxy to target, closed in t.Cleanup.
func proxy(t *testing.T, target string) *faultnet.Proxy {
	t.Helper()
	p, err := faultnet.Listen("127.0.0.1:0", target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads as many bytes back within timeout.
func roundTrip(c net.Conn, msg []byte, timeout time.Duration) ([]byte, error) {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	errc := make(chan error, 1)
	go func() { _, err := c.Write(msg); errc <- err }()
	got := make([]byte, len(msg))
	_, err := io.ReadFull(c, got)
	if werr := <-errc; err == nil {
		err = werr
	}
	return got, err
}

// noEcho checks that nothing comes back on c within wait, and that c is
// still open (a read deadline, not EOF or a reset).
func noEcho(t *testing.T, c net.Conn, wait time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(wait))
	defer c.SetReadDeadline(time.Time{})
	var b [1]byte
	if n, err := c.Read(b[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %d bytes, %v; want nothing and the connection still open", n, err)
	}
}

func TestProxyForwards(t *testing.T) {
	p := proxy(t, echoServer(t))
	msg := make([]byte, 1<<20) // many chunks each way
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range msg {
		msg[i] = byte(rng.Uint32())
	}
	for range 3 {
		c := dial(t, p.Addr())
		got, err := roundTrip(c, msg, 10*time.Second)
		if err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("echo through the proxy: equal %v, %v", bytes.Equal(got, msg), err)
		}
	}
	if got := p.Stats().Accepted; got != 3 {
		t.Errorf("accepted %d connections, want 3", got)
	}
}

func TestProxyCut(t *testing.T) {
	p := proxy(t, echoServer(t))
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, []byte("before"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	// The open connection is closed.
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on a cut connection: %d bytes, %v; want EOF or a reset", n, err)
	}
	// A new one is accepted and reset at once: the dial or the first
	// read fails.
	if c2, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second); err == nil {
		defer c2.Close()
		if _, err := roundTrip(c2, []byte("during"), 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a connection made while cut echoed or hung: %v; want it closed", err)
		}
	}
	if st := p.Stats(); st.Cut != 1 || st.Refused != 1 {
		t.Errorf("stats %+v, want 1 cut and 1 refused", st)
	}
	p.Heal()
	c3 := dial(t, p.Addr())
	if got, err := roundTrip(c3, []byte("after"), 5*time.Second); err != nil || string(got) != "after" {
		t.Fatalf("after Heal: %q, %v", got, err)
	}
}

func TestProxyDelay(t *testing.T) {
	p := proxy(t, echoServer(t))
	c := dial(t, p.Addr())
	const d = 100 * time.Millisecond
	p.Delay(d)
	start := time.Now()
	if got, err := roundTrip(c, []byte("x"), 5*time.Second); err != nil || string(got) != "x" {
		t.Fatalf("delayed echo: %q, %v", got, err)
	}
	// One chunk each way, each held d: the round trip takes at least 2d.
	if rtt := time.Since(start); rtt < 2*d {
		t.Errorf("round trip %v with a %v delay each way, want ≥ %v", rtt, d, 2*d)
	}
	p.Heal()
	if got, err := roundTrip(c, []byte("y"), 5*time.Second); err != nil || string(got) != "y" {
		t.Fatalf("after Heal: %q, %v", got, err)
	}
}

func TestProxyHalfOpen(t *testing.T) {
	for _, dir := range []faultnet.Direction{faultnet.Upstream, faultnet.Downstream, faultnet.Both} {
		t.Run(dir.String(), func(t *testing.T) {
			p := proxy(t, echoServer(t))
			c := dial(t, p.Addr())
			if _, err := roundTrip(c, []byte("open"), 5*time.Second); err != nil {
				t.Fatal(err)
			}
			p.HalfOpen(dir)
			if _, err := c.Write([]byte("held")); err != nil {
				t.Fatal(err)
			}
			noEcho(t, c, 300*time.Millisecond)
			// A new connection is accepted and dialed, but halted too.
			c2 := dial(t, p.Addr())
			if _, err := c2.Write([]byte("new")); err != nil {
				t.Fatal(err)
			}
			noEcho(t, c2, 300*time.Millisecond)
			if n := p.Conns(); n != 2 {
				t.Errorf("%d connections open while half-open, want 2", n)
			}
			// Heal delivers what was held, in order.
			p.Heal()
			for _, tc := range []struct {
				c    net.Conn
				want string
			}{{c, "held"}, {c2, "new"}} {
				tc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
				got := make([]byte, len(tc.want))
				if _, err := io.ReadFull(tc.c, got); err != nil || string(got) != tc.want {
					t.Fatalf("after Heal: %q, %v; want %q", got, err, tc.want)
				}
			}
		})
	}
}

// TestProxyCloseStopsEverything closes a proxy with connections blocked in
// every state (halted, delayed, idle) and checks that Close returns, the
// connections are closed and no goroutine of the proxy is left.
func TestProxyCloseStopsEverything(t *testing.T) {
	target := echoServer(t)
	before := runtime.NumGoroutine()
	p, err := faultnet.Listen("127.0.0.1:0", target)
	if err != nil {
		t.Fatal(err)
	}
	idle := dial(t, p.Addr())
	if _, err := roundTrip(idle, []byte("a"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Delay(time.Hour)
	delayed := dial(t, p.Addr())
	delayed.Write([]byte("b"))
	p.Delay(0)
	p.HalfOpen(faultnet.Both)
	halted := dial(t, p.Addr())
	halted.Write([]byte("c"))
	time.Sleep(100 * time.Millisecond) // let the chunks reach hold

	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return with connections held")
	}
	if err := p.Close(); !errors.Is(err, faultnet.ErrClosed) {
		t.Errorf("second Close: %v, want ErrClosed", err)
	}
	for _, c := range []net.Conn{idle, delayed, halted} {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("read after Close: %d bytes, %v; want the connection closed", n, err)
		}
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Error("the proxy still accepts connections after Close")
	}
	// The echo server's goroutines end when their connections close; poll
	// until the count is back (no proxy goroutine is left: Close waited).
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines, %d before the proxy:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestListenBadTarget(t *testing.T) {
	if _, err := faultnet.Listen("127.0.0.1:0", "no-port"); err == nil {
		t.Fatal("Listen accepted a target without a port")
	}
}
