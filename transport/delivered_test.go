package transport

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestServerDelivered: the embedded server counts every subscriber's copy
// of a message, in bytes as published.
func TestServerDelivered(t *testing.T) {
	cfg := DefaultEmbeddedServerConfig()
	cfg.Port = -1
	srv, err := StartServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	const subs, size = 3, 100_000
	got := make(chan struct{}, subs)
	for range subs {
		c, err := nats.Connect(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Subscribe("delivered", func(*nats.Msg) { got <- struct{}{} }); err != nil {
			t.Fatal(err)
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	pub, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	msgs0, bytes0 := srv.Delivered()
	if err := pub.Publish("delivered", make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	for range subs {
		select {
		case <-got:
		case <-time.After(10 * time.Second):
			t.Fatal("not delivered")
		}
	}
	msgs, bytes := srv.Delivered()
	if msgs-msgs0 != subs || bytes-bytes0 != subs*size {
		t.Fatalf("delivered %d messages, %d bytes; want %d, %d", msgs-msgs0, bytes-bytes0, subs, subs*size)
	}
}
