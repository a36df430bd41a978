package cli

import (
	"context"
	"io"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpcluster/dpcluster/coordinator"
	"github.com/dpcluster/dpcluster/model"
)

// LocalHooks let a program that runs `coordinator local` inside its own
// process (bench/step, which times the distributed step) observe the run,
// and give its nodes a device of its own.
// The command line sets none.
type LocalHooks struct {
	// Registry, if not nil, receives the run's metrics, the replica's and
	// every in-process node's (dpcluster_node_compute_seconds), instead
	// of a registry of the run's own.
	Registry *prometheus.Registry
	// OnStep, if not nil, is called on the leader's loop after each
	// applied step and each evaluation (coordinator.ServerConfig.OnStep),
	// after the progress bar's update. It must not block.
	OnStep func(coordinator.Progress)
	// Device, if not nil, is where the in-process nodes compute instead of
	// --device's device (a benchmark's engine that costs nothing, say); the
	// caller closes it after RunLocal returns.
	Device model.Device
}

// RunLocal runs `coordinator local` with the flags args in this process,
// as the command line would, writing its output to stdout and stderr, and
// reports to hooks. It returns when the run has stopped (or ctx is
// cancelled: an interrupted run, resumable with the same --data-dir).
func RunLocal(ctx context.Context, args []string, stdout, stderr io.Writer, hooks LocalHooks) error {
	cmd := newLocalCmdHooks(hooks)
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	return cmd.ExecuteContext(ctx)
}
