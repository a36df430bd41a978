package transport_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/dpcluster/dpcluster/transport"
)

// TestEmbeddedCluster: two embedded servers routed into one cluster carry
// a message, chunked, from a client of one to a client of the other; and
// a client given both URLs keeps working when its server goes away.
func TestEmbeddedCluster(t *testing.T) {
	start := func(routes ...string) *transport.Server {
		t.Helper()
		cfg := transport.DefaultEmbeddedServerConfig()
		cfg.Port, cfg.ClusterName, cfg.ClusterHost, cfg.ClusterPort, cfg.Routes = -1, "dpc", "127.0.0.1", -1, routes
		cfg.MaxPayload = 64 << 10
		s, err := transport.StartServer(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a := start()
	defer a.Shutdown()
	b := start("nats-route://" + a.ClusterAddr())
	bDown := false
	defer func() {
		if !bDown {
			b.Shutdown()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for a.NumRoutes() == 0 || b.NumRoutes() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the servers did not route to each other")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dial := func(urls ...string) *transport.Client {
		t.Helper()
		cfg := transport.DefaultConfig()
		cfg.Run, cfg.URLs, cfg.ReconnectWait, cfg.MaxReconnectWait = "cl", urls, 20*time.Millisecond, 100*time.Millisecond
		c, err := transport.Connect(ctx, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	sub := dial(a.URL())
	got := make(chan transport.Params, 4)
	if _, err := sub.Subscribe(transport.TopicParams, func(m transport.Message) { got <- m.(transport.Params) }); err != nil {
		t.Fatal(err)
	}
	pub := dial(b.URL(), a.URL())
	values := make(transport.Vector, 100_000) // 400 kB: chunked at 64 KiB
	for i := range values {
		values[i] = float32(i)
	}
	// Subscriptions propagate across the route asynchronously: publish
	// until the first copy arrives.
	recv := func(step uint64) {
		t.Helper()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if err := pub.Publish(ctx, transport.Params{Run: "cl", Step: step, Values: values}); err != nil && ctx.Err() == nil {
				t.Logf("publish: %v", err)
			}
			select {
			case p := <-got:
				if p.Step == step && len(p.Values) == len(values) && p.Values[99_999] == 99_999 {
					return
				}
			case <-tick.C:
			case <-ctx.Done():
				t.Fatalf("step %d never crossed the cluster", step)
			}
		}
	}
	recv(1)
	// The publisher's server dies; its client reconnects to the other.
	b.Shutdown()
	bDown = true
	recv(2)
}

func TestEmbeddedServerConfigClusterValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*transport.EmbeddedServerConfig)
		ok   bool
	}{
		{"standalone", func(*transport.EmbeddedServerConfig) {}, true},
		{"member", func(c *transport.EmbeddedServerConfig) {
			c.ClusterName, c.ClusterHost, c.ClusterPort = "x", "127.0.0.1", 6222
		}, true},
		{"routes without port", func(c *transport.EmbeddedServerConfig) { c.Routes = []string{"nats-route://a:1"} }, false},
		{"member without name", func(c *transport.EmbeddedServerConfig) { c.ClusterHost, c.ClusterPort = "h", 6222 }, false},
		{"bad port", func(c *transport.EmbeddedServerConfig) { c.ClusterName, c.ClusterHost, c.ClusterPort = "x", "h", 70000 }, false},
		{"advertised", func(c *transport.EmbeddedServerConfig) {
			c.ClusterName, c.ClusterHost, c.ClusterPort = "x", "127.0.0.1", 6222
			c.ClientAdvertise, c.ClusterAdvertise = "127.0.0.1:5000", "127.0.0.1:5001"
		}, true},
		{"cluster advertise without port", func(c *transport.EmbeddedServerConfig) { c.ClusterAdvertise = "127.0.0.1:5001" }, false},
		{"client advertise without port number", func(c *transport.EmbeddedServerConfig) { c.ClientAdvertise = "127.0.0.1" }, false},
	} {
		cfg := transport.DefaultEmbeddedServerConfig()
		tc.mod(&cfg)
		if err := cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v", tc.name, err)
		}
	}
}

// TestControlRoundTrip: a replica report survives the codec, and a
// Control with only the required fields (a membership request) decodes
// with the report's fields zero.
func TestControlRoundTrip(t *testing.T) {
	in := transport.Control{Run: "r", From: "r2", Step: 41, Code: transport.ControlReplica,
		Term: 3, Role: "follower", Leader: "r1", Epsilon: 1.25, Nodes: 3}
	b, err := transport.Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := transport.Decode(b)
	if err != nil || out.(transport.Control) != in {
		t.Fatalf("round trip: %+v, %v", out, err)
	}
	join := transport.Control{Run: "r", From: "r4", Code: transport.ControlJoin, Addr: "h:7000"}
	b, _ = transport.Encode(join)
	if out, err := transport.Decode(b); err != nil || out.(transport.Control) != join {
		t.Fatalf("join request: %+v, %v", out, err)
	}
}

// TestConnectRetry: with RetryConnect, Connect waits for a server that
// starts later; without it, it fails at once; a cancelled context ends the
// wait with the context's error.
func TestConnectRetry(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cfg := transport.DefaultConfig()
	cfg.Run, cfg.URLs = "retry", []string{fmt.Sprintf("nats://127.0.0.1:%d", port)}
	cfg.ReconnectWait, cfg.MaxReconnectWait = 20*time.Millisecond, 50*time.Millisecond
	if _, err := transport.Connect(context.Background(), cfg, nil); err == nil {
		t.Fatal("Connect without a server and without RetryConnect succeeded")
	}

	cfg.RetryConnect = true
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	_, err = transport.Connect(ctx, cfg, nil)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Connect with an expiring context = %v, want deadline exceeded", err)
	}

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := transport.Connect(ctx, cfg, nil)
		if err == nil {
			c.Close()
		}
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // Connect is retrying now
	scfg := transport.DefaultEmbeddedServerConfig()
	scfg.Port = port
	srv, err := transport.StartServer(scfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	if err := <-done; err != nil {
		t.Fatalf("Connect with RetryConnect: %v", err)
	}
}
