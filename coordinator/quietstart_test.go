package coordinator

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// recordHandler is a slog.Handler that keeps every record it is given.
type recordHandler struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordHandler) WithGroup(string) slog.Handler            { return h }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}

// lines returns "LEVEL msg line=..." for every record at or above min.
func (h *recordHandler) lines(min slog.Level) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.recs {
		if r.Level < min {
			continue
		}
		s := r.Level.String() + " " + r.Message
		r.Attrs(func(a slog.Attr) bool {
			s += " " + a.String()
			return true
		})
		out = append(out, s)
	}
	return out
}

// TestSingleReplicaStartIsQuiet: a normal start of a single replica (the
// bootstrap of a new cluster, and a restart from its data dir) logs no
// warning: the first election of a one-voter configuration is how every
// such replica becomes leader, not a fault.
func TestSingleReplicaStartIsQuiet(t *testing.T) {
	dir, addr := t.TempDir(), freeAddr(t)
	for _, start := range []string{"bootstrap", "restart"} {
		h := &recordHandler{}
		cfg := DefaultReplicaConfig()
		cfg.ID, cfg.RaftAddr, cfg.DataDir, cfg.Bootstrap = "r1", addr, dir, true
		cfg.Logger = slog.New(h)
		r, err := OpenReplica(cfg, testInit)
		if err != nil {
			t.Fatal(err)
		}
		waitLeader(t, r)
		if start == "bootstrap" {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err = r.Configure(ctx, testRunConfig())
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		if warns := h.lines(slog.LevelWarn); len(warns) > 0 {
			t.Errorf("%s: warnings on a normal single-replica start:\n%s", start, strings.Join(warns, "\n"))
		}
		if infos := h.lines(slog.LevelInfo); !containsLine(infos, "heartbeat timeout reached, starting election") {
			t.Errorf("%s: the first election is not logged at INFO; logged:\n%s", start, strings.Join(infos, "\n"))
		}
	}
}

func containsLine(lines []string, sub string) bool {
	for _, l := range lines {
		if strings.Contains(l, sub) {
			return true
		}
	}
	return false
}

// TestRaftLogWriterLevels: only the first election line of a one-voter
// configuration is downgraded; a later election (the leader was lost),
// an election among several voters, one before Raft exists, and every
// other warning keep their level. The lines come from a real hclog logger,
// as Raft writes them.
func TestRaftLogWriterLevels(t *testing.T) {
	self := raft.Server{ID: "r1", Address: "a1", Suffrage: raft.Voter}
	other := raft.Server{ID: "r2", Address: "a2", Suffrage: raft.Voter}
	learner := raft.Server{ID: "r2", Address: "a2", Suffrage: raft.Nonvoter}
	election := func(l hclog.Logger) {
		l.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "", "last-leader-id", "")
	}
	tests := []struct {
		name    string
		servers []raft.Server // nil: no configuration yet
		write   func(l hclog.Logger)
		want    []slog.Level
	}{
		{"first election, sole voter", []raft.Server{self}, election, []slog.Level{slog.LevelInfo}},
		{"sole voter with a non-voter", []raft.Server{self, learner}, election, []slog.Level{slog.LevelInfo}},
		{"later election stays a warning", []raft.Server{self},
			func(l hclog.Logger) { election(l); election(l) }, []slog.Level{slog.LevelInfo, slog.LevelWarn}},
		{"several voters", []raft.Server{self, other}, election, []slog.Level{slog.LevelWarn}},
		{"another replica is the voter", []raft.Server{other}, election, []slog.Level{slog.LevelWarn}},
		{"before Raft exists", nil, election, []slog.Level{slog.LevelWarn}},
		{"other warning", []raft.Server{self},
			func(l hclog.Logger) { l.Warn("failed to contact quorum of nodes, stepping down") }, []slog.Level{slog.LevelWarn}},
		{"error", []raft.Server{self},
			func(l hclog.Logger) { l.Error("failed to make requestVote RPC") }, []slog.Level{slog.LevelError}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &recordHandler{}
			w := newRaftLogWriter(slog.New(h), "r1")
			if tt.servers != nil {
				w.setConfiguration(func() raft.Configuration { return raft.Configuration{Servers: tt.servers} })
			}
			tt.write(hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: w, DisableTime: true}))
			var got []slog.Level
			for _, r := range h.recs {
				got = append(got, r.Level)
				line := r.Level.String()
				r.Attrs(func(a slog.Attr) bool {
					line = a.Value.String()
					return true
				})
				if r.Level == slog.LevelInfo && !strings.HasPrefix(line, "[INFO]") {
					t.Errorf("downgraded line %q keeps hclog's level prefix", line)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("levels %v, want %v", got, tt.want)
			}
		})
	}
}
