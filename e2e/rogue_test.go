//go:build unix

package e2e

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dpcluster/dpcluster/pki"
	"github.com/dpcluster/dpcluster/transport"
)

// A rogue node (issue 27, findings 1 and 2 at process level): an
// authorized node — a second connection with node rogueID's certificate,
// as a compromised or buggy node process would have — that, while the
// real nodes train, keeps publishing on its own subjects
//
//   - chunk bombs: the first chunk of a contribution announcing
//     bombBytes, which every replica used to reserve at once until the
//     shared reassembly budget was full, and
//   - shard claims: node victimID's own heartbeat, copied as a replica
//     sees it, with rogueID's name: a claim on victimID's shard, which
//     used to make the leader stop opening rounds (shard_overlap).
//
// rogue holds what it did; stop ends it.
type rogue struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	bombs  int
	claims int
	err    error
}

// bombBytes is what each bomb announces: 1 GiB in the probe that found
// it; 4 MiB here (its first chunk is cut from the whole encoded
// contribution, so a bigger one only costs the rogue more), 130 times a
// logreg contribution.
const bombBytes = 4 << 20

// startRogue starts the rogue against the run of the TLS cluster whose
// NATS URLs are urls and whose certificates are in certs; observerID is a
// replica certificate used only to read victimID's heartbeat.
func startRogue(t *testing.T, run, certs string, urls []string, observerID, rogueID, victimID string) *rogue {
	t.Helper()
	subjects, err := transport.NewSubjects(run)
	if err != nil {
		t.Fatal(err)
	}
	// The victim's heartbeat, as a replica receives it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := transport.DefaultConfig()
	cfg.Run, cfg.URLs = run, urls
	cfg.TLS = transport.TLSConfig{CAFile: filepath.Join(certs, pki.CACertFile),
		CertFile: filepath.Join(certs, observerID+".crt"), KeyFile: filepath.Join(certs, observerID+".key")}
	obs, err := transport.Connect(ctx, cfg, nil)
	if err != nil {
		t.Fatalf("rogue: observer %s connects: %v", observerID, err)
	}
	defer obs.Close()
	beats := make(chan transport.Heartbeat, 1)
	if _, err := obs.Subscribe(transport.TopicNodes, func(m transport.Message) {
		if hb, ok := m.(transport.Heartbeat); ok && hb.NodeID == victimID {
			select {
			case beats <- hb:
			default:
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	var claim transport.Heartbeat
	select {
	case claim = <-beats:
	case <-ctx.Done():
		t.Fatalf("rogue: no heartbeat of %s within 30 s", victimID)
	}
	claim.NodeID = rogueID
	beat, err := transport.Encode(claim)
	if err != nil {
		t.Fatal(err)
	}
	nodesSubject, err1 := subjects.Node(transport.TopicNodes, rogueID)
	contribSubject, err2 := subjects.Node(transport.TopicContributions, rogueID)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(urls[0], nats.RootCAs(filepath.Join(certs, pki.CACertFile)),
		nats.ClientCert(filepath.Join(certs, rogueID+".crt"), filepath.Join(certs, rogueID+".key")),
		nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("rogue: %s connects: %v", rogueID, err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	r := &rogue{cancel: rcancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		defer nc.Close()
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for i := uint64(1); ; i++ {
			select {
			case <-rctx.Done():
				return
			case <-tick.C:
			}
			if err := nc.Publish(nodesSubject, beat); err != nil {
				r.fail(err)
				return
			}
			bomb := transport.Contribution{Run: run, Step: claim.Step + 1, NodeID: rogueID, Count: 1,
				Sum: make(transport.Vector, bombBytes/4)}
			frames, err := transport.SplitFrames(bomb, transport.ClientID(pki.RoleNode, rogueID, "0123456789abcdef"), 1000+i, 64<<10)
			if err != nil {
				r.fail(err)
				return
			}
			if err := nc.Publish(contribSubject, frames[0]); err != nil {
				r.fail(err)
				return
			}
			r.mu.Lock()
			r.claims++
			r.bombs++
			r.mu.Unlock()
		}
	}()
	return r
}

func (r *rogue) fail(err error) {
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
}

// stop ends the rogue and reports how many bombs and claims it sent.
func (r *rogue) stop() (bombs, claims int, err error) {
	r.cancel()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bombs, r.claims, r.err
}
