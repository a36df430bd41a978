// Command coordinator runs dpcluster's replicated coordinator and its tools:
// privacy accounting, ledger audit, and single-process local training.
package main

import (
	"fmt"
	"os"

	"github.com/dpcluster/dpcluster/internal/cli"
)

func main() {
	if err := cli.NewCoordinatorCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "coordinator:", err)
		os.Exit(1)
	}
}
