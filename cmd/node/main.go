// Command node is a dpcluster worker: it holds a private shard and sends
// clipped gradient sums to the coordinator each round.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "node: not implemented yet (see issue 5)")
	os.Exit(2)
}
