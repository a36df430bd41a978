package coordinator_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"time"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/dpadam"
	"github.com/dpcluster/dpcluster/seed"
)

// Example runs one replica (a real Raft node with durable stores), configures
// a run and commits two noisy steps by hand — what a Server's leader does
// after each round. Every committed step is charged to the ledger before θ
// moves.
func Example() {
	dir, _ := os.MkdirTemp("", "dpc-example")
	defer os.RemoveAll(dir)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()

	cfg := coordinator.DefaultReplicaConfig()
	cfg.ID, cfg.RaftAddr, cfg.DataDir, cfg.Bootstrap = "r1", addr, dir, true
	init := func(c coordinator.RunConfig) ([]float32, error) { return make([]float32, c.Dim), nil } // θ₀ = 0
	r, err := coordinator.OpenReplica(cfg, init)
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	for !r.IsLeader() {
		time.Sleep(10 * time.Millisecond)
	}
	ctx := context.Background()
	if err := r.Barrier(ctx); err != nil {
		log.Fatal(err)
	}

	opt := dpadam.DefaultConfig() // DP-AdamBC
	opt.NoiseMultiplier, opt.ClipNorm, opt.ExpectedBatchSize = 1, 1, 100
	run := coordinator.RunConfig{
		Run: "example", Dim: 4, TotalExamples: 10000, SampleRate: 0.01, Optimizer: opt,
		TargetEpsilon: 3, Delta: 1e-5, SeedPolicy: seed.Crypto,
	}
	if err := r.Configure(ctx, run); err != nil {
		log.Fatal(err)
	}
	for step, g := range [][]float32{{0.1, -0.2, 0, 0.3}, {0.2, -0.1, 0.1, 0}} { // two g̃ = (S+z)/B
		res, err := r.ProposeStep(ctx, int64(step+1), run.Event(), g, "example")
		if err != nil || !res.Applied {
			log.Fatal(res, err)
		}
		fmt.Printf("step %d applied, ε = %.3f\n", res.Step, res.Epsilon)
	}
	theta, step := r.FSM().Params(nil)
	fmt.Printf("θ after step %d has %d values\n", step, len(theta))
	// Output:
	// step 1 applied, ε = 0.956
	// step 2 applied, ε = 0.977
	// θ after step 2 has 4 values
}
