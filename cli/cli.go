// Package cli holds the cobra command trees of the dpcluster binaries, so
// that cmd/coordinator and cmd/node stay thin and the commands can be tested
// in-process.
package cli

import (
	"github.com/spf13/cobra"
)

// NewCoordinatorCmd returns the root command of the coordinator binary.
func NewCoordinatorCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "coordinator",
		Short:         "dpcluster coordinator: differentially private training across machines",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newPrivacyCmd())
	root.AddCommand(newLedgerCmd())
	root.AddCommand(newExportCmd())
	root.AddCommand(newPredictCmd())
	root.AddCommand(newLocalCmd())
	root.AddCommand(newAuditPrivacyCmd())
	root.AddCommand(newServeCmd())
	root.AddCommand(newStatusCmd())
	root.AddCommand(newRemoveReplicaCmd())
	root.AddCommand(newCertsCmd())
	return root
}
