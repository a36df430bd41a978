// Command coordinator runs dpcluster's replicated coordinator and its tools:
// privacy accounting, ledger audit, and single-process local training.
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/dpcluster/dpcluster/cli"
)

func main() {
	if err := cli.NewCoordinatorCmd().Execute(); err != nil {
		msg := err.Error()
		if !strings.HasPrefix(msg, "coordinator: ") { // the package's own errors say it already
			msg = "coordinator: " + msg
		}
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(1)
	}
}
