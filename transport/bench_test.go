package transport_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/dpcluster/dpcluster/transport"
)

var benchSizes = []int{1 << 20, 10 << 20} // floats: 1M and 10M (4 and 40 MB)

const benchNodes = 4

// BenchmarkRound measures one round's traffic through an embedded NATS
// server on loopback: the coordinator broadcasts a parameter vector of n
// float32 to 4 nodes, each answers with a contribution of n float32, and
// the op ends when the coordinator has all 4. Bytes per op count the 8
// vectors delivered (4 broadcast copies + 4 contributions); compare the
// MB/s with BenchmarkTCPLoopback's for the same n.
//
// The payload=8MiB variants raise the embedded server's max payload (NATS
// allows up to 64 MiB) so tensors travel in fewer, larger chunks.
func BenchmarkRound(b *testing.B) {
	for _, payload := range []int32{1 << 20, 8 << 20} {
		for _, n := range benchSizes {
			b.Run(fmt.Sprintf("payload=%dMiB/floats=%dM", payload>>20, n>>20), func(b *testing.B) { benchRound(b, n, payload) })
		}
	}
}

func benchRound(b *testing.B, n int, payload int32) {
	scfg := transport.DefaultServerConfig()
	scfg.Port = -1
	scfg.MaxPayload = payload
	srv, err := transport.StartServer(scfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Shutdown)
	mk := func(name string) *transport.Client {
		cfg := transport.DefaultConfig()
		cfg.Run = "bench"
		cfg.Name = name
		cfg.URLs = []string{srv.URL()}
		c, err := transport.Connect(context.Background(), cfg, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return c
	}
	coord := mk("coord")
	got := make(chan transport.Contribution, benchNodes)
	if _, err := coord.Subscribe(transport.TopicContributions, func(m transport.Message) {
		got <- m.(transport.Contribution)
	}); err != nil {
		b.Fatal(err)
	}
	for i := range benchNodes {
		node := mk(fmt.Sprintf("node%d", i))
		sum := make(transport.Vector, n)
		for j := range sum {
			sum[j] = float32(i + j)
		}
		id := fmt.Sprintf("node-%d", i)
		if _, err := node.Subscribe(transport.TopicParams, func(m transport.Message) {
			p := m.(transport.Params)
			if len(p.Values) != n {
				b.Errorf("params of %d floats, want %d", len(p.Values), n)
			}
			c := transport.Contribution{Run: "bench", Step: p.Step, NodeID: id, Count: 1, Sum: sum}
			if err := node.Publish(context.Background(), c); err != nil {
				b.Error(err)
			}
		}); err != nil {
			b.Fatal(err)
		}
	}
	theta := make(transport.Vector, n)
	for j := range theta {
		theta[j] = float32(j) * 1e-3
	}
	b.SetBytes(int64(2 * benchNodes * 4 * n))
	b.ResetTimer()
	for i := range b.N {
		p := transport.Params{Run: "bench", Step: uint64(i + 1), Version: uint64(i + 1), Values: theta}
		if err := coord.Publish(context.Background(), p); err != nil {
			b.Fatal(err)
		}
		for range benchNodes {
			c := <-got
			if c.Step != uint64(i+1) || len(c.Sum) != n {
				b.Fatalf("contribution step %d len %d", c.Step, len(c.Sum))
			}
		}
	}
	b.StopTimer()
	var rt uint64
	for _, c := range []*transport.Client{coord} {
		rt += c.Stats().Retransmitted
	}
	b.ReportMetric(float64(rt)/float64(b.N), "retransmits/op")
}

// BenchmarkTCPLoopback copies the same bytes as BenchmarkRound (8 vectors
// of n float32 per op) over one plain TCP loopback connection, as the
// reference for BenchmarkRound's throughput.
func BenchmarkTCPLoopback(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("floats=%dM", n>>20), func(b *testing.B) { benchTCP(b, n) })
	}
}

func benchTCP(b *testing.B, n int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	perOp := int64(2 * benchNodes * 4 * n)
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		buf := make([]byte, 1<<20)
		for {
			got, err := io.CopyBuffer(io.Discard, io.LimitReader(c, perOp), buf)
			if err != nil || got < perOp { // error, or the client closed
				done <- err
				return
			}
			if _, err := c.Write([]byte{1}); err != nil { // op done
				done <- nil
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer func() { c.Close(); <-done }()
	data := make([]byte, 4*n)
	ack := make([]byte, 1)
	b.SetBytes(perOp)
	b.ResetTimer()
	for range b.N {
		for range 2 * benchNodes {
			if _, err := c.Write(data); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := io.ReadFull(c, ack); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRawNATS moves the same bytes as BenchmarkRound through the same
// kind of embedded server with bare nats.go (1 MiB messages, no codec, no
// chunk headers or CRCs, no reassembly): the ceiling for any NATS-based
// transport on this machine.
func BenchmarkRawNATS(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("floats=%dM", n>>20), func(b *testing.B) { benchRawNATS(b, n) })
	}
}

func benchRawNATS(b *testing.B, n int) {
	srv := testServer(b)
	dial := func() *nats.Conn {
		nc, err := nats.Connect(srv.URL())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		return nc
	}
	const msg = 1 << 20
	msgs := (4*n + msg - 1) / msg
	payload := make([]byte, msg)
	coord := dial()
	done := make(chan struct{}, benchNodes)
	got := 0
	sub, err := coord.Subscribe("raw.contrib", func(m *nats.Msg) {
		got++
		if got%msgs == 0 {
			done <- struct{}{}
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, 1<<30)
	for range benchNodes {
		nc := dial()
		seen := 0
		s, err := nc.Subscribe("raw.params", func(m *nats.Msg) {
			seen++
			if seen%msgs == 0 {
				for range msgs {
					_ = nc.Publish("raw.contrib", payload)
				}
				_ = nc.Flush()
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		_ = s.SetPendingLimits(-1, 1<<30)
		_ = nc.Flush()
	}
	_ = coord.Flush()
	b.SetBytes(int64(2 * benchNodes * 4 * n))
	b.ResetTimer()
	for range b.N {
		for range msgs {
			if err := coord.Publish("raw.params", payload); err != nil {
				b.Fatal(err)
			}
		}
		_ = coord.Flush()
		for range benchNodes {
			<-done
		}
	}
}
