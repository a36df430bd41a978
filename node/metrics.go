package node

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpcluster/dpcluster/model"
)

// metrics are the Worker's Prometheus collectors. They hold only public
// quantities: how many rounds were answered or skipped and why, the last
// step answered, how long computing took, the parameter version held and
// the device computing. Batch sizes, sums and counts are private and never
// exported.
//
//	dpcluster_node_rounds_total{node, result}  counter; result is "answered" or "skipped_<reason>"
//	dpcluster_node_last_step{node}             gauge: last step this node contributed to
//	dpcluster_node_compute_seconds{node}       histogram: time to sample and compute one clipped sum
//	dpcluster_node_params_version{node}        gauge: highest Params version received
//	dpcluster_node_device_info{node, device, name, compute_capability}
//	                                           gauge, always 1: the device computing (model.DeviceInfo;
//	                                           device "cpu" or "cuda:N", compute_capability "" on the CPU)
//	dpcluster_node_device_memory_bytes{node}   gauge: the device's total memory (0 for the CPU)
type metrics struct {
	rounds        *prometheus.CounterVec
	lastStep      prometheus.Gauge
	compute       prometheus.Histogram
	paramsVersion prometheus.Gauge
	deviceInfo    *prometheus.GaugeVec
	deviceMemory  prometheus.Gauge
}

// newMetrics registers the collectors on reg with the constant labels
// run and node=id (the coordinator's series carry run too). A collector
// already registered under the same name and labels (a Worker with the
// same ID built again on the same registry) is reused. A nil reg returns
// nil: no metrics.
func newMetrics(reg prometheus.Registerer, run, id string) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	labels := prometheus.Labels{"run": run, "node": id}
	m := &metrics{
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dpcluster", Subsystem: "node", Name: "rounds_total",
			Help:        `Rounds this node saw, by result: "answered" or "skipped_<reason>".`,
			ConstLabels: labels,
		}, []string{"result"}),
		lastStep: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "dpcluster", Subsystem: "node", Name: "last_step",
			Help:        "Last training step this node contributed to.",
			ConstLabels: labels,
		}),
		compute: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "dpcluster", Subsystem: "node", Name: "compute_seconds",
			Help:        "Time to sample the shard and compute one clipped gradient sum.",
			ConstLabels: labels,
			Buckets:     prometheus.ExponentialBuckets(0.001, 2, 16), // 1 ms … 33 s
		}),
		paramsVersion: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "dpcluster", Subsystem: "node", Name: "params_version",
			Help:        "Highest parameter version this node has received.",
			ConstLabels: labels,
		}),
		deviceInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "dpcluster", Subsystem: "node", Name: "device_info",
			Help:        `The device computing this node's clipped sums (always 1): "cpu" or "cuda:N", its name and CUDA compute capability.`,
			ConstLabels: labels,
		}, []string{"device", "name", "compute_capability"}),
		deviceMemory: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "dpcluster", Subsystem: "node", Name: "device_memory_bytes",
			Help:        "Total memory of the device computing this node's clipped sums (0 for the CPU).",
			ConstLabels: labels,
		}),
	}
	var err error
	if m.rounds, err = register(reg, m.rounds); err != nil {
		return nil, err
	}
	if m.lastStep, err = register(reg, m.lastStep); err != nil {
		return nil, err
	}
	if m.compute, err = register(reg, m.compute); err != nil {
		return nil, err
	}
	if m.paramsVersion, err = register(reg, m.paramsVersion); err != nil {
		return nil, err
	}
	if m.deviceInfo, err = register(reg, m.deviceInfo); err != nil {
		return nil, err
	}
	if m.deviceMemory, err = register(reg, m.deviceMemory); err != nil {
		return nil, err
	}
	m.rounds.WithLabelValues("answered")
	for _, r := range skipReasons {
		m.rounds.WithLabelValues(r.label())
	}
	return m, nil
}

// register registers c, or returns the identical collector registered
// before.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if old, ok := are.ExistingCollector.(C); ok {
			return old, nil
		}
	}
	return c, fmt.Errorf("node: registering metrics: %w", err)
}

func (m *metrics) answered(step uint64) {
	if m == nil {
		return
	}
	m.rounds.WithLabelValues("answered").Inc()
	m.lastStep.Set(float64(step))
}

func (m *metrics) computed(seconds float64) {
	if m == nil {
		return
	}
	m.compute.Observe(seconds)
}

func (m *metrics) skipped(r SkipReason) {
	if m == nil {
		return
	}
	m.rounds.WithLabelValues(r.label()).Inc()
}

func (m *metrics) params(version uint64) {
	if m == nil {
		return
	}
	m.paramsVersion.Set(float64(version))
}

// device records the device computing. A Worker built again with the same
// ID on the same registry replaces the previous one's device.
func (m *metrics) device(d model.DeviceInfo) {
	if m == nil {
		return
	}
	m.deviceInfo.Reset()
	m.deviceInfo.WithLabelValues(d.ID, d.Name, d.ComputeCapability).Set(1)
	m.deviceMemory.Set(float64(d.MemoryBytes))
}
