package transport

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig invalid: %v", err)
	}
	cases := []struct {
		name   string
		mutate func(c *Config)
	}{
		{"bad run", func(c *Config) { c.Run = "a.b" }},
		{"bad name", func(c *Config) { c.Name = "x y" }},
		{"zero max message", func(c *Config) { c.MaxMessageBytes = 0 }},
		{"reassembly below message", func(c *Config) { c.MaxReassemblyBytes = c.MaxMessageBytes - 1 }},
		{"zero queue", func(c *Config) { c.QueueLen = 0 }},
		{"timeout below nack", func(c *Config) { c.TransferTimeout = c.NackAfter }},
		{"retain below timeout", func(c *Config) { c.RetainFor = c.TransferTimeout - 1 }},
		{"token with embedded", func(c *Config) { c.Token = "t" }},
		{"TLS with embedded", func(c *Config) { c.TLS.CAFile = "ca.pem" }},
		{"two auth methods", func(c *Config) { c.URLs = []string{"nats://x"}; c.Token = "t"; c.NKeySeedFile = "s" }},
		{"cert without key", func(c *Config) { c.URLs = []string{"nats://x"}; c.TLS.CertFile = "c.pem" }},
		{"empty URL", func(c *Config) { c.URLs = []string{""} }},
		{"bad port", func(c *Config) { c.Embedded.Port = 70000 }},
		{"small payload", func(c *Config) { c.Embedded.MaxPayload = 100 }},
		{"backoff order", func(c *Config) { c.MaxReconnectWait = c.ReconnectWait / 2 }},
		{"pending below window", func(c *Config) { c.PendingBytes = c.WindowBytes - 1 }},
	}
	for _, tc := range cases {
		c := DefaultConfig()
		tc.mutate(&c)
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: Validate() = %v, want ErrInvalidConfig", tc.name, err)
		}
	}
	ok := DefaultConfig()
	ok.URLs = []string{"tls://a:4222", "tls://b:4222"}
	ok.TLS = TLSConfig{CAFile: "ca.pem", CertFile: "c.pem", KeyFile: "k.pem"}
	ok.CredentialsFile = "user.creds"
	if err := ok.Validate(); err != nil {
		t.Errorf("TLS + creds config: %v", err)
	}
}

func TestBackoff(t *testing.T) {
	f := backoff(100*time.Millisecond, time.Second)
	prevMin := time.Duration(0)
	for a := 1; a < 10; a++ {
		d := f(a)
		base := min(100*time.Millisecond<<(a-1), time.Second)
		if d < base || d > base+base/4 {
			t.Errorf("attempt %d: delay %v outside [%v, %v]", a, d, base, base+base/4)
		}
		if base < prevMin {
			t.Errorf("attempt %d: base decreased", a)
		}
		prevMin = base
	}
}

// Connect with no URLs starts an embedded server that Close stops.
func TestConnectEmbeddedOwnsServer(t *testing.T) {
	before := runtime.NumGoroutine()
	cfg := DefaultConfig()
	cfg.Embedded.Port = -1
	c, err := Connect(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.ServerURL() == "" {
		t.Fatal("no embedded server URL")
	}
	if c.link.MaxPayload() != 1<<20 {
		t.Errorf("MaxPayload = %d, want 1 MiB", c.link.MaxPayload())
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after Close, %d before", runtime.NumGoroutine(), before)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Nothing listens any more.
	cfg2 := DefaultConfig()
	cfg2.URLs = []string{c.ServerURL()}
	cfg2.ConnectTimeout = 200 * time.Millisecond
	if c2, err := Connect(context.Background(), cfg2, nil); err == nil {
		c2.Close()
		t.Fatal("connected to a shut-down server")
	}
}

func TestConnectCanceledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cfg := DefaultConfig()
	cfg.Embedded.Port = -1
	if _, err := Connect(ctx, cfg, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Connect: %v", err)
	}
	if _, err := Connect(context.Background(), Config{}, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Connect(zero config): %v", err)
	}
}
