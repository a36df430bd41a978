package transport_test

import (
	"context"
	"fmt"

	"github.com/dpcluster/dpcluster/transport"
)

func Example() {
	ctx := context.Background()
	// The coordinator starts an embedded NATS server (URLs empty).
	cfg := transport.DefaultConfig()
	cfg.Run = "mnist-1"
	cfg.Embedded.Port = -1 // any free port; production uses a fixed one
	coord, err := transport.Connect(ctx, cfg, nil)
	if err != nil {
		panic(err)
	}
	defer coord.Close()

	// A node dials it (here: the same server, through a second client).
	nodeCfg := cfg
	nodeCfg.URLs = []string{coord.ServerURL()}
	node, err := transport.Connect(ctx, nodeCfg, nil)
	if err != nil {
		panic(err)
	}
	defer node.Close()

	got := make(chan transport.Message, 1)
	if _, err := coord.Subscribe(transport.TopicContributions, func(m transport.Message) { got <- m }); err != nil {
		panic(err)
	}
	// 300k floats is 1.2 MB: larger than NATS's 1 MiB payload, so it
	// travels in chunks and arrives reassembled.
	sum := make(transport.Vector, 300_000)
	sum[299_999] = 0.5
	if err := node.Publish(ctx, transport.Contribution{Run: "mnist-1", Step: 1, RoundID: 42, NodeID: "node-a", Count: 3, Sum: sum}); err != nil {
		panic(err)
	}
	c := (<-got).(transport.Contribution)
	fmt.Println(c.NodeID, c.Step, len(c.Sum), c.Sum[299_999], node.Stats().ChunkedSent)
	// Output: node-a 1 300000 0.5 1
}
