package transport_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

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
	round := roundRig(b, n, payload)
	b.SetBytes(int64(2 * benchNodes * 4 * n))
	b.ResetTimer()
	for range b.N {
		round()
	}
}

// benchClients starts an embedded server with the given max payload and
// returns a function that connects a client named name to it; the server
// and the clients close when the benchmark ends.
func benchClients(b *testing.B, payload int32) func(name string) *transport.Client {
	scfg := transport.DefaultEmbeddedServerConfig()
	scfg.Port = -1
	scfg.MaxPayload = payload
	srv, err := transport.StartServer(scfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Shutdown)
	return func(name string) *transport.Client {
		cfg := transport.DefaultConfig()
		cfg.Run, cfg.Name, cfg.URLs = "bench", name, []string{srv.URL()}
		c, err := transport.Connect(context.Background(), cfg, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return c
	}
}

// roundRig starts an embedded server with the given max payload, a
// coordinator client and benchNodes node clients, and returns an op that
// runs one round (broadcast n floats, collect benchNodes contributions of
// n floats). It reports retransmits/op when the benchmark ends.
func roundRig(b *testing.B, n int, payload int32) func() {
	mk := benchClients(b, payload)
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
	step := uint64(0)
	b.Cleanup(func() {
		if step > 0 {
			b.ReportMetric(float64(coord.Stats().Retransmitted)/float64(step), "retransmits/op")
		}
	})
	return func() {
		step++
		p := transport.Params{Run: "bench", Step: step, Version: step, Values: theta}
		if err := coord.Publish(context.Background(), p); err != nil {
			b.Fatal(err)
		}
		for range benchNodes {
			c := <-got
			if c.Step != step || len(c.Sum) != n {
				b.Fatalf("contribution step %d len %d", c.Step, len(c.Sum))
			}
		}
	}
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
	copyOp := tcpRig(b, n)
	b.SetBytes(int64(2 * benchNodes * 4 * n))
	b.ResetTimer()
	for range b.N {
		copyOp()
	}
}

// tcpRig opens one TCP loopback connection and returns an op that writes
// the bytes of one round (2·benchNodes vectors of n float32) and waits for
// the reader's one-byte acknowledgement.
func tcpRig(b *testing.B, n int) func() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
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
	b.Cleanup(func() { c.Close(); <-done })
	data := make([]byte, 4*n)
	for i := range data {
		data[i] = byte(i)
	}
	ack := make([]byte, 1)
	return func() {
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

// BenchmarkRoundVsTCP is the must-show comparison of docs/BENCHMARKS.md:
// every iteration runs one BenchmarkRound round and one BenchmarkTCPLoopback
// copy of the same bytes and times each, so both see the same load on a
// shared machine. It reports both effective
// GB/s (10⁹ bytes delivered per second: 2·4 vectors of n float32) and
// ratio = round GB/s ÷ TCP GB/s (the target is at least 0.5). A third op,
// BenchmarkRawNATS's with messages of the same max payload, shows the
// ceiling of any transport through a NATS server (ratio-rawnats = round
// GB/s ÷ raw NATS GB/s). The order of the three rotates every iteration;
// ns/op is the three plus three forced collections.
func BenchmarkRoundVsTCP(b *testing.B) {
	for _, payload := range []int32{1 << 20, 8 << 20} {
		for _, n := range benchSizes {
			b.Run(fmt.Sprintf("payload=%dMiB/floats=%dM", payload>>20, n>>20), func(b *testing.B) {
				round, copyOp, raw := roundRig(b, n, payload), tcpRig(b, n), rawRig(b, n, payload)
				round() // warm-up: connections, buffers, first-touch of the reassembly memory
				copyOp()
				raw()
				// Each op is followed by an untimed garbage collection, so
				// the round's garbage (its 40 MB buffers at 10M floats) is
				// not collected while the next op is timed. The allocation
				// and first touch of those buffers stay in the round's time.
				timed := func(op func()) time.Duration {
					t0 := time.Now()
					op()
					d := time.Since(t0)
					runtime.GC()
					return d
				}
				var tRound, tTCP, tRaw time.Duration
				iters := 0
				for b.Loop() {
					switch iters % 3 { // rotate the order
					case 0:
						tRound += timed(round)
						tTCP += timed(copyOp)
						tRaw += timed(raw)
					case 1:
						tTCP += timed(copyOp)
						tRaw += timed(raw)
						tRound += timed(round)
					case 2:
						tRaw += timed(raw)
						tRound += timed(round)
						tTCP += timed(copyOp)
					}
					iters++
				}
				bytes := float64(2*benchNodes*4*n) * float64(iters)
				b.ReportMetric(bytes/float64(tRound.Nanoseconds()), "round-GB/s")
				b.ReportMetric(bytes/float64(tTCP.Nanoseconds()), "tcp-GB/s")
				b.ReportMetric(bytes/float64(tRaw.Nanoseconds()), "rawnats-GB/s")
				b.ReportMetric(tTCP.Seconds()/tRound.Seconds(), "ratio")
				b.ReportMetric(tRaw.Seconds()/tRound.Seconds(), "ratio-rawnats")
			})
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
	raw := rawRig(b, n, 1<<20)
	b.SetBytes(int64(2 * benchNodes * 4 * n))
	b.ResetTimer()
	for range b.N {
		raw()
	}
}

// rawRig starts an embedded server with the given max payload and returns
// an op that moves one round's bytes with bare nats.go, each vector in
// messages of at most payload bytes.
func rawRig(b *testing.B, n int, payload int32) func() {
	scfg := transport.DefaultEmbeddedServerConfig()
	scfg.Port = -1
	scfg.MaxPayload = payload
	srv, err := transport.StartServer(scfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Shutdown)
	dial := func() *nats.Conn {
		nc, err := nats.Connect(srv.URL())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		return nc
	}
	msg := int(payload) // NATS's max payload counts the payload only
	msgs := (4*n + msg - 1) / msg
	vec := make([]byte, 4*n)
	// send publishes one vector of 4n bytes in msgs messages.
	send := func(nc *nats.Conn, subject string) error {
		for off := 0; off < len(vec); off += msg {
			if err := nc.Publish(subject, vec[off:min(off+msg, len(vec))]); err != nil {
				return err
			}
		}
		return nil
	}
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
				_ = send(nc, "raw.contrib")
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
	return func() {
		if err := send(coord, "raw.params"); err != nil {
			b.Fatal(err)
		}
		_ = coord.Flush()
		for range benchNodes {
			<-done
		}
	}
}

// BenchmarkParamsOneWay measures one model-sized message one way: a Params
// of 3.7M float32 (θ of the 3.7M-parameter model of issue 15, 15 MB) from
// one client to another through an embedded NATS server on loopback. The
// op is the sender's Publish and ends when the receiver's handler has the
// decoded message; MB/s counts the tensor's bytes.
func BenchmarkParamsOneWay(b *testing.B) {
	const n = 3_700_000
	for _, payload := range []int32{1 << 20, 8 << 20} {
		b.Run(fmt.Sprintf("payload=%dMiB", payload>>20), func(b *testing.B) {
			mk := benchClients(b, payload)
			sender, receiver := mk("coord"), mk("node0")
			got := make(chan transport.Params, 1)
			if _, err := receiver.Subscribe(transport.TopicParams, func(m transport.Message) {
				got <- m.(transport.Params)
			}); err != nil {
				b.Fatal(err)
			}
			theta := make(transport.Vector, n)
			for j := range theta {
				theta[j] = float32(j) * 1e-3
			}
			step := uint64(0)
			b.SetBytes(4 * n)
			for b.Loop() {
				step++
				if err := sender.Publish(context.Background(), transport.Params{Run: "bench", Step: step, Version: step, Values: theta}); err != nil {
					b.Fatal(err)
				}
				if p := <-got; p.Step != step || len(p.Values) != n {
					b.Fatalf("params step %d len %d", p.Step, len(p.Values))
				}
			}
		})
	}
}
