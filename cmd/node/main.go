// Command node is a dpcluster worker: it holds a private shard and sends
// clipped gradient sums to the coordinator each round. See
// cli/node.go for its flags (node --help).
package main

import (
	"fmt"
	"os"

	"github.com/dpcluster/dpcluster/cli"
)

func main() {
	if err := cli.NewNodeCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "node:", err)
		os.Exit(1)
	}
}
