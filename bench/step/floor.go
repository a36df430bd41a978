package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dpcluster/dpcluster/transport"
)

// The floor of a step: what the chain must carry, measured in the same
// process on the same machine as the run. A step moves θ (4·d bytes) from
// the leader to every node and one clipped sum (4·d bytes) from every node
// back, through the embedded NATS server, and makes one small write
// durable (the charge). measureFloor times exactly that and nothing else:
// an embedded server with the run's configuration
// (transport.DefaultEmbeddedServerConfig on a free loopback port), one
// leader connection and k node connections (nats.go), θ published once in
// messages of the server's max payload and delivered to all k nodes, then
// the k sums published at once to the leader, then one 64-byte write and
// fsync in dir. Flow control keeps at most floorWindow messages per
// receiver in flight, as the server's per-client buffer requires for large
// models. The result is the median of reps repetitions, in ms.

// floorWindow is the number of messages a sender may be ahead of its
// slowest receiver.
const floorWindow = 64

func measureFloor(d, k int, dir string, reps int) (float64, error) {
	cfg := transport.DefaultEmbeddedServerConfig()
	cfg.Port = -1
	srv, err := transport.StartServer(cfg)
	if err != nil {
		return 0, err
	}
	defer srv.Shutdown()
	conns := make([]*nats.Conn, k+1) // conns[0]: the leader
	for i := range conns {
		if conns[i], err = nats.Connect(srv.URL(), nats.Name(fmt.Sprintf("floor-%d", i))); err != nil {
			return 0, err
		}
		defer conns[i].Close()
	}
	msg := int(cfg.MaxPayload) - 1024 // room for the transport's headers
	bytes := 4 * d
	nmsg := (bytes + msg - 1) / msg
	payload := make([]byte, msg)

	// got[i] counts messages received: got[1..k] θ at node i, got[k+1+i]
	// node i's sum at the leader; notify wakes a waiting sender.
	got := make([]atomic.Int64, 2*k+1)
	notify := make(chan struct{}, 1)
	count := func(i int) nats.MsgHandler {
		return func(*nats.Msg) {
			got[i].Add(1)
			select {
			case notify <- struct{}{}:
			default:
			}
		}
	}
	for i := 1; i <= k; i++ {
		sub, err := conns[i].Subscribe("floor.theta", count(i))
		if err != nil {
			return 0, err
		}
		sub.SetPendingLimits(-1, -1)
		sub, err = conns[0].Subscribe(fmt.Sprintf("floor.sum.%d", i), count(k+i))
		if err != nil {
			return 0, err
		}
		sub.SetPendingLimits(-1, -1)
	}
	for _, c := range conns {
		if err := c.Flush(); err != nil {
			return 0, err
		}
	}
	// wait blocks until every counter in ids has reached n.
	wait := func(ids []int, n int64) error {
		deadline := time.After(5 * time.Minute)
		for {
			done := true
			for _, i := range ids {
				if got[i].Load() < n {
					done = false
				}
			}
			if done {
				return nil
			}
			select {
			case <-notify:
			case <-time.After(time.Millisecond):
			case <-deadline:
				return fmt.Errorf("floor: messages not delivered within 5 minutes")
			}
		}
	}
	// send publishes nmsg messages on subject from c, never more than
	// floorWindow ahead of the receivers ids, whose counters start at base.
	send := func(c *nats.Conn, subject string, ids []int, base int64) error {
		for m := 0; m < nmsg; m++ {
			if m >= floorWindow {
				if err := wait(ids, base+int64(m-floorWindow)); err != nil {
					return err
				}
			}
			n := min(msg, bytes-m*msg)
			if err := c.Publish(subject, payload[:n]); err != nil {
				return err
			}
		}
		return c.Flush()
	}
	nodes := make([]int, k)
	for i := range nodes {
		nodes[i] = 1 + i
	}
	path := filepath.Join(dir, "floor-record")
	defer os.Remove(path)
	var times []float64
	for r := 0; r < reps; r++ {
		base := int64(r * nmsg)
		start := time.Now()
		if err := send(conns[0], "floor.theta", nodes, base); err != nil {
			return 0, err
		}
		if err := wait(nodes, base+int64(nmsg)); err != nil {
			return 0, err
		}
		var wg sync.WaitGroup
		errs := make([]error, k)
		for i := 1; i <= k; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i-1] = send(conns[i], fmt.Sprintf("floor.sum.%d", i), []int{k + i}, base)
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return 0, err
			}
		}
		sums := make([]int, k)
		for i := range sums {
			sums[i] = k + 1 + i
		}
		if err := wait(sums, base+int64(nmsg)); err != nil {
			return 0, err
		}
		if err := syncRecord(path); err != nil {
			return 0, err
		}
		times = append(times, time.Since(start).Seconds()*1e3)
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}

// syncRecord writes a 64-byte record to path and fsyncs it: the charge.
func syncRecord(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(make([]byte, 64)); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
