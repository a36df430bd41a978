package fake_test

import (
	"context"
	"fmt"

	"github.com/dpcluster/dpcluster/transport"
	"github.com/dpcluster/dpcluster/transport/fake"
)

func Example() {
	net := fake.NewNetwork(1, fake.Options{MaxPayload: 4096})
	cfg := transport.DefaultClientConfig()
	cfg.Run = "demo"
	coord, _ := transport.NewClient(net.Link("coord"), cfg, nil)
	defer coord.Close()
	node, _ := transport.NewClient(net.Link("node"), cfg, nil)
	defer node.Close()

	got := make(chan transport.Message, 1)
	if _, err := node.Subscribe(transport.TopicParams, func(m transport.Message) { got <- m }); err != nil {
		panic(err)
	}
	// Lose a quarter of all deliveries; the 8 kB tensor travels in chunks
	// and the lost ones are NACKed and resent.
	net.SetFaults(fake.Faults{Drop: 0.25})
	theta := make(transport.Vector, 2000)
	theta[1999] = 3
	if err := coord.Publish(context.Background(), transport.Params{Run: "demo", Step: 1, Version: 1, Values: theta}); err != nil {
		panic(err)
	}
	p := (<-got).(transport.Params)
	fmt.Println(p.Version, len(p.Values), p.Values[1999])
	// Output: 1 2000 3
}
