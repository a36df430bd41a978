package node_test

import (
	"context"
	"fmt"
	"time"

	"github.com/dpcluster/dpcluster/dataset"
	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/node"
	"github.com/dpcluster/dpcluster/transport"
)

// Example runs one node against a hand-played leader: the node joins, the
// leader announces itself, publishes θ₀ and opens round 1, the node answers,
// and the leader ends the run.
func Example() {
	ctx := context.Background()
	tcfg := transport.DefaultConfig()
	tcfg.Run = "example"
	tcfg.Embedded.Port = -1 // the leader side embeds the NATS server here
	leader, err := transport.Connect(ctx, tcfg, nil)
	if err != nil {
		panic(err)
	}
	defer leader.Close()
	ncfg := tcfg
	ncfg.URLs = []string{leader.ServerURL()} // a node always dials
	conn, err := transport.Connect(ctx, ncfg, nil)
	if err != nil {
		panic(err)
	}
	defer conn.Close()

	joined := make(chan transport.Join, 1)
	contributions := make(chan transport.Contribution, 1)
	leader.Subscribe(transport.TopicNodes, func(m transport.Message) {
		if j, ok := m.(transport.Join); ok {
			joined <- j
		}
	})
	leader.Subscribe(transport.TopicContributions, func(m transport.Message) {
		contributions <- m.(transport.Contribution)
	})

	// The node: logistic regression on a synthetic shard.
	m, err := model.New(model.LogReg([]int{8}, 3))
	if err != nil {
		panic(err)
	}
	shard, err := dataset.GaussianMixture(500, 8, 3, 3, 1)
	if err != nil {
		panic(err)
	}
	cfg := node.DefaultConfig()
	cfg.ID, cfg.Run = "node-1", "example"
	cfg.SampleRate, cfg.ClipNorm = 0.1, 1 // the run's q and C: rounds naming others are refused
	cfg.ShardIndex, cfg.ShardCount = 0, 1 // the whole training set
	w, err := node.NewWorker(cfg, m, shard, conn, nil)
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	j := <-joined
	fmt.Println("joined:", j.NodeID, j.ShardSize, j.ModelHash == m.Hash())

	theta := make([]float32, m.NumParams())
	if err := m.Init(theta, 1); err != nil {
		panic(err)
	}
	leader.Publish(ctx, transport.Leader{Run: "example", ReplicaID: "replica-1", Term: 1})
	leader.Publish(ctx, transport.Params{Run: "example", Version: 0, Term: 1, Values: theta})
	leader.Publish(ctx, transport.RoundStart{Run: "example", Step: 1, RoundID: 7, Term: 1, Leader: "replica-1",
		ParamsVersion: 0, Deadline: time.Now().Add(10 * time.Second).UnixNano(), SampleRate: 0.1, ClipNorm: 1,
		ModelHash: m.Hash()})
	c := <-contributions // Sum and Count are private: the leader adds noise before anything leaves it
	fmt.Println("contribution:", c.NodeID, c.Step, c.RoundID, len(c.Sum) == m.NumParams())

	leader.Publish(ctx, transport.Status{Run: "example", From: "replica-1", Code: transport.StatusDone})
	fmt.Println("Run:", <-done, "answered:", w.Stats().Answered)
	// Output:
	// joined: node-1 500 true
	// contribution: node-1 1 7 true
	// Run: <nil> answered: 1
}
