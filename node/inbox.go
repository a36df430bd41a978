package node

import (
	"github.com/dpcluster/dpcluster/internal/handoff"
	"github.com/dpcluster/dpcluster/transport"
)

// inbox carries messages from the subscription handlers (one goroutine per
// topic, owned by the transport) to the Run loop. close makes every handler
// call return promptly and waits for those in progress (handoff.Gate).
type inbox struct {
	leaders chan transport.Leader
	rounds  chan transport.RoundStart
	params  chan transport.Params
	status  chan transport.Status
	gate    *handoff.Gate
}

func newInbox() *inbox {
	return &inbox{
		leaders: make(chan transport.Leader, 16),
		rounds:  make(chan transport.RoundStart, 16),
		params:  make(chan transport.Params, 4),
		status:  make(chan transport.Status, 16),
		gate:    handoff.NewGate(),
	}
}

// deliver is the transport.Handler of every subscription.
func (in *inbox) deliver(m transport.Message) {
	if !in.gate.Enter() {
		return
	}
	defer in.gate.Leave()
	switch v := m.(type) {
	case transport.Leader:
		handoff.Send(in.gate, in.leaders, v)
	case transport.RoundStart:
		handoff.Send(in.gate, in.rounds, v)
	case transport.Params:
		handoff.Send(in.gate, in.params, v)
	case transport.Status:
		handoff.Send(in.gate, in.status, v)
	}
}

func (in *inbox) close() { in.gate.Close() }
