package aggregation_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dpcluster/dpcluster/aggregation"
)

func Example() {
	nodes := []string{"node-a", "node-b"}
	r, err := aggregation.NewRound(12, nodes, 3, 1.0, time.Now().Add(10*time.Second), aggregation.WithRoundID(777))
	if err != nil {
		panic(err)
	}
	contributions := []aggregation.Contribution{
		{NodeID: "node-b", Step: 12, RoundID: 777, Count: 2, Sum: []float32{1, 1, 0}},
		{NodeID: "node-x", Step: 12, RoundID: 777, Count: 1, Sum: []float32{0, 0, 0}},
		{NodeID: "node-a", Step: 12, RoundID: 777, Count: 1, Sum: []float32{0, 0, 5}},
		{NodeID: "node-a", Step: 12, RoundID: 777, Count: 1, Sum: []float32{0, 0.5, 0.5}},
	}
	for _, c := range contributions {
		if err := r.Add(c); err != nil {
			// Log the node and the reason, never the values.
			fmt.Println("rejected:", c.NodeID, aggregation.ReasonOf(err), errors.Is(err, aggregation.ErrNormBound))
		}
	}
	res, err := r.Wait(context.Background())
	if err != nil {
		panic(err)
	}
	fmt.Println("closed by:", res.ClosedBy, "accepted:", res.Accepted)
	fmt.Println("sum:", res.Sum)
	// Output:
	// rejected: node-x unknown_node false
	// rejected: node-a norm_bound true
	// closed by: all_answered accepted: [node-a node-b]
	// sum: [1 1.5 0.5]
}
