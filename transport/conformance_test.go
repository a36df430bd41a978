package transport_test

import (
	"context"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/dpcluster/dpcluster/transport"
	"github.com/dpcluster/dpcluster/transport/fake"
	"github.com/dpcluster/dpcluster/transport/transporttest"
)

// testServer starts an embedded NATS server on a random loopback port,
// stopped at the end of the test.
func testServer(t testing.TB) *transport.Server {
	t.Helper()
	cfg := transport.DefaultEmbeddedServerConfig()
	cfg.Port = -1
	srv, err := transport.StartServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

func natsHarness(t *testing.T, cfg transport.ClientConfig, n int) transporttest.Harness {
	t.Helper()
	cfgServer := transport.DefaultEmbeddedServerConfig()
	cfgServer.Port = -1
	srv, err := transport.StartServer(cfgServer)
	if err != nil {
		t.Fatal(err)
	}
	var conns []transport.Conn
	for range n {
		c := transport.DefaultConfig()
		c.ClientConfig = cfg
		c.URLs = []string{srv.URL()}
		conn, err := transport.Connect(context.Background(), c, nil)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
	}
	raw, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	closeAll := func() {
		once.Do(func() {
			for _, c := range conns {
				_ = c.Close()
			}
			raw.Close()
			srv.Shutdown()
		})
	}
	t.Cleanup(closeAll)
	return transporttest.Harness{
		Conns: conns,
		Inject: func(subject string, data []byte) error {
			if err := raw.Publish(subject, data); err != nil {
				return err
			}
			return raw.Flush()
		},
		MaxPayload: int(raw.MaxPayload()),
		Close:      closeAll,
	}
}

func fakeHarness(t *testing.T, cfg transport.ClientConfig, n int) transporttest.Harness {
	t.Helper()
	net := fake.NewNetwork(1, fake.Options{MaxPayload: 64 << 10})
	var conns []transport.Conn
	for range n {
		c, err := transport.NewClient(net.Link("peer"), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	inj := net.Link("injector")
	var once sync.Once
	closeAll := func() {
		once.Do(func() {
			for _, c := range conns {
				_ = c.Close()
			}
			_ = inj.Close()
		})
	}
	t.Cleanup(closeAll)
	return transporttest.Harness{Conns: conns, Inject: inj.Publish, MaxPayload: inj.MaxPayload(), Close: closeAll}
}

func TestConformanceNATS(t *testing.T) { transporttest.Run(t, natsHarness) }

func TestConformanceFake(t *testing.T) { transporttest.Run(t, fakeHarness) }
