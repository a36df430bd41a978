package cli

import (
	"fmt"
	"log/slog"

	"github.com/dpcluster/dpcluster/model"
)

// deviceFlagUsage is the --device flag's help, for node and local.
const deviceFlagUsage = "compute device for the clipped gradient sums: cpu, or cuda:N in a binary built with -tags cuda (docs/GPU.md)"

// openDevice opens the --device flag's device (model.OpenDevice) and logs
// what it is. A name this binary cannot use is an error that says why (a
// CUDA device in a binary built without CUDA names the build tag). The
// caller closes the device with closeDevice after every engine on it is
// released.
func openDevice(name string, log *slog.Logger) (model.Device, error) {
	dev, err := model.OpenDevice(name)
	if err != nil {
		return nil, fmt.Errorf("--device %s: %w", name, err)
	}
	log.Info("compute device", deviceAttrs(dev.Info())...)
	return dev, nil
}

// closeDevice closes dev, logging a failure: the run's result stands.
func closeDevice(dev model.Device, log *slog.Logger) {
	if err := dev.Close(); err != nil {
		log.Warn("closing the compute device", "device", dev.Info().ID, "err", err)
	}
}

// deviceAttrs are a device's log fields: ID, name, total memory in bytes
// (0 for the CPU) and CUDA compute capability ("" for the CPU).
func deviceAttrs(d model.DeviceInfo) []any {
	return []any{"device", d.ID, "device_name", d.Name, "device_memory_bytes", d.MemoryBytes,
		"compute_capability", d.ComputeCapability}
}
