package coordinator

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpcluster/dpcluster/aggregation"
)

// Metrics are a replica's Prometheus metrics. Every value is public: step
// numbers, ε, timings, counts of contributions by outcome, Raft state and
// evaluations on public data (test_accuracy, test_loss), except the
// evaluations on rows held out of the private training data, which are
// exported only under their own nonprivate_holdout_ names (EvalData.Key).
// No per-node sum or example count is exported.
//
// A nil *Metrics is valid and records nothing.
type Metrics struct {
	step prometheus.Gauge
	// epsilon reads fsm's ε (FSM.Spent; fsm set by observe) when
	// scraped, so it is never below what was charged and never waits for
	// the state machine's lock.
	epsilon prometheus.GaugeFunc
	// chargedStep reads the step ε runs through (FSM.ChargedStep) the
	// same way: step is the last applied step, one behind it while a step
	// charged ahead waits for its g̃.
	chargedStep  prometheus.GaugeFunc
	fsm          atomic.Pointer[FSM]
	target       prometheus.Gauge
	charges      prometheus.Counter
	chargesSeen  uint64 // the ledger's charge count charges has reached
	stopped      prometheus.Gauge
	roundSeconds prometheus.Histogram
	phaseSeconds *prometheus.HistogramVec
	participants prometheus.Gauge
	acceptedN    prometheus.Counter
	rejectedN    *prometheus.CounterVec
	raftState    *prometheus.GaugeVec
	term         prometheus.Gauge
	// leaderExit counts Consensus.LeaderExitElections; leaderExitSeen is
	// the count already added.
	leaderExit     prometheus.Counter
	leaderExitSeen uint64
	// restores counts FSM.SnapshotsRestored; restoresSeen likewise.
	restores     prometheus.Counter
	restoresSeen uint64
	nodes        prometheus.Gauge
	blocked      *prometheus.GaugeVec
	refused      *prometheus.CounterVec
	ctlRefused   *prometheus.CounterVec
	// outStanding, standingChanges and roundsClosed are the rounds' good
	// standing (standing.go).
	outStanding     *prometheus.GaugeVec
	standingChanges *prometheus.CounterVec
	roundsClosed    *prometheus.CounterVec
	// evalAccuracy and evalLoss, by EvalData.Key: vectors without
	// labels, so a metric is exported only once an evaluation on its data
	// happened.
	evalAccuracy map[string]*prometheus.GaugeVec
	evalLoss     map[string]*prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them on reg, labelled with
// the run and replica. It fails if they are already registered there.
func NewMetrics(reg prometheus.Registerer, run, replica string) (*Metrics, error) {
	labels := prometheus.Labels{"run": run, "replica": replica}
	m := newMetrics(labels)
	evals := m.addEvalGauges(labels)
	m.touchLabels()
	for _, c := range append([]prometheus.Collector{
		m.step, m.epsilon, m.chargedStep, m.target, m.charges, m.stopped, m.roundSeconds, m.phaseSeconds, m.participants,
		m.acceptedN, m.rejectedN, m.raftState, m.term, m.leaderExit, m.restores, m.nodes, m.blocked, m.refused, m.ctlRefused,
		m.outStanding, m.standingChanges, m.roundsClosed,
	}, evals...) {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// newMetrics creates the metrics (no evaluation gauges yet) with the
// constant labels, registering none.
func newMetrics(labels prometheus.Labels) *Metrics {
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "dpcluster", Subsystem: "coordinator", Name: name, Help: help, ConstLabels: labels})
	}
	m := &Metrics{
		step:   gauge("step", "Last applied training step."),
		target: gauge("epsilon_target", "The run's privacy budget ε."),
		charges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "dpcluster", Subsystem: "coordinator", Name: "ledger_charges_total",
			Help:        "Charge records in the privacy ledger (≥ applied steps; a counter: the ledger only grows).",
			ConstLabels: labels,
		}),
		stopped: gauge("stopped", "1 once the run has stopped."),
		roundSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "dpcluster", Subsystem: "coordinator", Name: "round_seconds",
			Help: "Time from RoundStart to the round's close.", ConstLabels: labels,
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
		phaseSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "dpcluster", Subsystem: "coordinator", Name: "step_phase_seconds",
			Help: "The leader's links of a step after its round closed, by phase: privatize (noise over the sum, " +
				"and the optimizer's check of g̃), commit (from g̃ formed until its charge entry, proposed before the round closed, " +
				"is applied here; then the update of the leader's θ), release (θ published), " +
				"and off the chain, charge (the charge entry from proposal to applied here: the Raft log's fsync, replication, " +
				"the ledger's charge, while θ goes out and the nodes compute) and log (g̃'s entry from proposal to applied here, " +
				"while the next round runs).",
			ConstLabels: labels, Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"phase"}),
		participants: gauge("round_participants", "Nodes whose contribution the last round accepted."),
		acceptedN: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "dpcluster", Subsystem: "coordinator", Name: "contributions_accepted_total",
			Help: "Contributions accepted into a round.", ConstLabels: labels,
		}),
		rejectedN: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dpcluster", Subsystem: "coordinator", Name: "contributions_rejected_total",
			Help: "Contributions rejected, by reason.", ConstLabels: labels,
		}, []string{"reason"}),
		raftState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "dpcluster", Subsystem: "coordinator", Name: "raft_state",
			Help: "1 for the replica's current Raft state.", ConstLabels: labels,
		}, []string{"state"}),
		term: gauge("raft_term", "Current Raft term."),
		leaderExit: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "dpcluster", Subsystem: "coordinator", Name: "raft_leader_exit_elections_total",
			Help: "Elections this replica started at once on proof that the leader's process was gone (an inbound Raft " +
				"connection ended, the leader silent, its address refusing connections), not on Raft's heartbeat timeout.",
			ConstLabels: labels,
		}),
		restores: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "dpcluster", Subsystem: "coordinator", Name: "snapshots_restored_total",
			Help: "Snapshots this replica process restored: its own at start and those its leader sent. One or two per " +
				"restart; a count that keeps growing while the replica stays behind means it cannot catch up.",
			ConstLabels: labels,
		}),
		nodes:        gauge("nodes", "Live registered nodes."),
		evalAccuracy: map[string]*prometheus.GaugeVec{},
		evalLoss:     map[string]*prometheus.GaugeVec{},
		blocked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "dpcluster", Subsystem: "coordinator", Name: "rounds_blocked",
			Help: "1 while the leader leaves a live node out of its rounds because its shard claim conflicts with an older one (the rounds go on without it), by reason.", ConstLabels: labels,
		}, []string{"reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dpcluster", Subsystem: "coordinator", Name: "node_messages_refused_total",
			Help: "Join and Heartbeat messages of refused nodes, by reason.", ConstLabels: labels,
		}, []string{"reason"}),
		ctlRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dpcluster", Subsystem: "coordinator", Name: "control_messages_ignored_total",
			Help: "Replica control messages ignored, by reason (foreign_group: another replica group under this run's name).", ConstLabels: labels,
		}, []string{"reason"}),
	}
	m.addLedgerGauges(labels)
	m.addStandingMetrics(labels)
	return m
}

// addStandingMetrics creates the metrics of the members the leader's
// rounds wait for (standing.go) and of how its rounds close.
func (m *Metrics) addStandingMetrics(labels prometheus.Labels) {
	m.outStanding = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "dpcluster", Subsystem: "coordinator", Name: "nodes_out_of_standing",
		Help: "Live registered nodes out of good standing, which the leader's rounds do not wait for, by reason: missed (a round " +
			"that waited for the node closed at its deadline without it), refused (a contribution of its was refused for its values). " +
			"The leader's view; 0 on a follower.", ConstLabels: labels,
	}, []string{"reason"})
	m.standingChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "dpcluster", Subsystem: "coordinator", Name: "node_standing_changes_total",
		Help: "Nodes that lost or regained good standing in the rounds this replica led, by change (lost, regained).", ConstLabels: labels,
	}, []string{"change"})
	m.roundsClosed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "dpcluster", Subsystem: "coordinator", Name: "rounds_closed_total",
		Help: "Rounds this replica led that closed, by cause: all_answered (every member accepted), standing_answered (every " +
			"member the round waited for accepted or refused, before the deadline, without some out of good standing), deadline.",
		ConstLabels: labels,
	}, []string{"cause"})
}

// addLedgerGauges creates the gauges read from the state machine when
// scraped (fsm, set by observe): ε spent and the step it runs through.
func (m *Metrics) addLedgerGauges(labels prometheus.Labels) {
	m.epsilon = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dpcluster", Subsystem: "coordinator",
		Name: "epsilon_spent", Help: "Privacy spent so far (ε at the run's δ, by the run's accountant), as of the last entry applied when scraped.",
		ConstLabels: labels}, m.spent)
	m.chargedStep = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dpcluster", Subsystem: "coordinator",
		Name: "charged_step", Help: "The last step the privacy ledger charged, the step epsilon_spent runs through: " +
			"the last applied step, or one more while a step charged ahead of its noisy gradient waits for it (or " +
			"after the run ended between that charge and its update).",
		ConstLabels: labels}, func() float64 {
		if f := m.fsm.Load(); f != nil {
			return float64(f.ChargedStep())
		}
		return 0
	})
}

// spent is epsilon_spent: the state machine's ε now (FSM.Spent), once the
// server's first observe has named it (0 before: the loop observes as it
// starts). The ledger only grows, so a scrape never reads less than was
// charged before it, and it takes no lock the state machine holds: a
// replica restoring a snapshot still answers at once.
func (m *Metrics) spent() float64 {
	if f := m.fsm.Load(); f != nil {
		return f.Spent()
	}
	return 0
}

// addEvalGauges creates the evaluation gauges, accuracy and loss for each
// kind of evaluation data (EvalData.Key), and returns them to register.
func (m *Metrics) addEvalGauges(labels prometheus.Labels) []prometheus.Collector {
	evalGauge := func(d EvalData, what, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "dpcluster", Subsystem: "coordinator", Name: d.Key() + "_" + what,
			Help: help + " of θ on " + d.Examples() + " at the last evaluation.", ConstLabels: labels,
		}, nil)
	}
	evals := []prometheus.Collector{}
	for _, d := range []EvalData{EvalPublic, EvalTrainHoldout} {
		m.evalAccuracy[d.Key()] = evalGauge(d, "accuracy", "Accuracy")
		m.evalLoss[d.Key()] = evalGauge(d, "loss", "Mean loss")
		evals = append(evals, m.evalAccuracy[d.Key()], m.evalLoss[d.Key()])
	}
	return evals
}

// touchLabels creates every known label value of the labelled metrics, so
// that each is exported (at zero) before it first happens.
func (m *Metrics) touchLabels() {
	for _, r := range aggregation.Reasons() {
		m.rejectedN.WithLabelValues(r.String())
	}
	for _, r := range Roles() {
		m.raftState.WithLabelValues(string(r))
	}
	for _, p := range []string{phasePrivatize, phaseCommit, phaseRelease, phaseCharge, phaseLog} {
		m.phaseSeconds.WithLabelValues(p)
	}
	for _, r := range blockReasons {
		m.blocked.WithLabelValues(r)
	}
	for _, r := range refusalReasons {
		m.refused.WithLabelValues(r)
	}
	m.ctlRefused.WithLabelValues(refusedForeignGroup)
	for _, r := range standingReasons {
		m.outStanding.WithLabelValues(r)
	}
	for _, c := range []string{"lost", "regained"} {
		m.standingChanges.WithLabelValues(c)
	}
	for _, c := range closeCauses {
		m.roundsClosed.WithLabelValues(c)
	}
}

// observe records the replica's state, its Raft role and term.
func (m *Metrics) observe(st State, c Consensus) {
	if m == nil {
		return
	}
	m.step.Set(float64(st.Applied))
	m.fsm.Store(c.FSM())
	if st.Charges > m.chargesSeen { // the ledger only grows
		m.charges.Add(float64(st.Charges - m.chargesSeen))
		m.chargesSeen = st.Charges
	}
	if st.Stopped != "" {
		m.stopped.Set(1)
	}
	if rc, ok := c.FSM().Config(); ok {
		m.target.Set(rc.TargetEpsilon)
	}
	role := c.Role()
	for _, r := range Roles() {
		v := 0.0
		if r == role {
			v = 1
		}
		m.raftState.WithLabelValues(string(r)).Set(v)
	}
	m.term.Set(float64(c.Term()))
	if n := c.LeaderExitElections(); n > m.leaderExitSeen {
		m.leaderExit.Add(float64(n - m.leaderExitSeen))
		m.leaderExitSeen = n
	}
	if n := c.FSM().SnapshotsRestored(); n > m.restoresSeen {
		m.restores.Add(float64(n - m.restoresSeen))
		m.restoresSeen = n
	}
}

func (m *Metrics) nodeCount(n int) {
	if m != nil {
		m.nodes.Set(float64(n))
	}
}

// roundsBlocked sets rounds_blocked{reason} to 1 for reason and 0 for the
// others ("": not blocked).
func (m *Metrics) roundsBlocked(reason string) {
	if m == nil {
		return
	}
	for _, r := range blockReasons {
		v := 0.0
		if r == reason {
			v = 1
		}
		m.blocked.WithLabelValues(r).Set(v)
	}
}

// refusedForeignGroup: a control message of another replica group (its
// history is not this run's).
const refusedForeignGroup = "foreign_group"

func (m *Metrics) controlRefused(reason string) {
	if m != nil {
		m.ctlRefused.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) nodeRefused(reason string) {
	if m != nil {
		m.refused.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) roundClosed(res aggregation.Result, d time.Duration, cause string) {
	if m == nil {
		return
	}
	m.roundSeconds.Observe(d.Seconds())
	m.participants.Set(float64(len(res.Accepted)))
	m.roundsClosed.WithLabelValues(cause).Inc()
}

// outOfStanding sets nodes_out_of_standing{reason} from by (absent: 0).
func (m *Metrics) outOfStanding(by map[string]int) {
	if m == nil {
		return
	}
	for _, r := range standingReasons {
		m.outStanding.WithLabelValues(r).Set(float64(by[r]))
	}
}

func (m *Metrics) standingChanged(lost bool) {
	if m == nil {
		return
	}
	change := "regained"
	if lost {
		change = "lost"
	}
	m.standingChanges.WithLabelValues(change).Inc()
}

// The phases of step_phase_seconds.
const (
	phasePrivatize = "privatize"
	phaseCommit    = "commit"
	phaseRelease   = "release"
	// phaseCharge is the charge entry's, off the chain: from its proposal
	// (as the previous step is released) to its apply on the leader.
	phaseCharge = "charge"
	// phaseLog is the grad entry's, off the chain: from its proposal to
	// its apply on the leader, while θ_t is released and the next round
	// runs.
	phaseLog = "log"
)

// phase records how long one of a step's links took.
func (m *Metrics) phase(name string, d time.Duration) {
	if m == nil {
		return
	}
	m.phaseSeconds.WithLabelValues(name).Observe(d.Seconds())
}

func (m *Metrics) stepApplied(p Progress) {
	if m == nil {
		return
	}
	m.step.Set(float64(p.Step))
}

func (m *Metrics) accepted() {
	if m != nil {
		m.acceptedN.Inc()
	}
}

func (m *Metrics) rejected(r aggregation.Reason) {
	if m != nil {
		m.rejectedN.WithLabelValues(r.String()).Inc()
	}
}

// evaluated exports an evaluation on data d under d's names (EvalData.Key).
func (m *Metrics) evaluated(e Evaluation, d EvalData) {
	if m == nil {
		return
	}
	m.evalAccuracy[d.Key()].WithLabelValues().Set(e.Accuracy)
	m.evalLoss[d.Key()].WithLabelValues().Set(e.Loss)
}
