package cli

import (
	"context"
	"testing"

	"github.com/dpcluster/dpcluster/transport"
)

// TestTransportMetrics: what the transport and its embedded server refuse,
// and what the server delivers, is exported, per run, as counters.
func TestTransportMetrics(t *testing.T) {
	cfg := transport.DefaultConfig()
	cfg.Run = "t-metrics"
	cfg.Embedded.Port = -1
	conn, err := transport.Connect(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reg := newRegistry()
	if err := registerTransport(reg, conn, cfg.Run); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{
		"dpcluster_transport_frames_rejected_total": false, "dpcluster_transport_wrong_sender_total": false,
		"dpcluster_transport_too_large_total": false, "dpcluster_transport_tls_refused_total": false,
		"dpcluster_transport_permission_refused_total": false, "dpcluster_transport_delivered_messages_total": false,
		"dpcluster_transport_delivered_bytes_total": false,
	}
	for _, mf := range mfs {
		if _, ok := want[mf.GetName()]; !ok {
			continue
		}
		m := mf.GetMetric()
		if len(m) != 1 || m[0].GetCounter() == nil || len(m[0].GetLabel()) != 1 || m[0].GetLabel()[0].GetValue() != cfg.Run {
			t.Errorf("%s: %v, want one counter labelled run=%s", mf.GetName(), m, cfg.Run)
		}
		want[mf.GetName()] = true
	}
	for name, seen := range want {
		if !seen {
			t.Errorf("%s not exported", name)
		}
	}
}
