package aggregation

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/dpcluster/dpcluster/internal/parallel"
)

// Contribution is one node's answer to a round. Sum is owned by the Round
// once passed to Add (accepted or not, the caller must not modify it).
type Contribution struct {
	NodeID  string
	Step    uint64
	RoundID uint64    // checked only if the Round was made WithRoundID
	Count   int64     // number of examples summed; private
	Sum     []float32 // sum of clipped per-example gradients; private
}

// Reason says why a contribution was rejected. Its String is a stable
// snake_case name for metrics and logs.
type Reason uint8

// Rejection reasons, in the order Add checks them.
const (
	ReasonWrongStep Reason = iota + 1
	ReasonWrongRound
	ReasonUnknownNode
	ReasonLate
	ReasonDuplicate
	ReasonDimension
	ReasonNegativeCount
	ReasonCountTooLarge
	ReasonNaN
	ReasonInf
	ReasonNormBound
	numReasons = iota + 1
)

// Sentinel errors, one per Reason. Add returns a *RejectError that wraps one
// of them, so errors.Is(err, ErrNaN) works.
var (
	// ErrWrongStep: the contribution names a step other than the round's.
	ErrWrongStep = errors.New("aggregation: contribution for another step")
	// ErrWrongRound: the contribution names another round ID of this step
	// (made for a round opened by an earlier leader).
	ErrWrongRound = errors.New("aggregation: contribution for another round")
	// ErrUnknownNode: the node is not registered for the round.
	ErrUnknownNode = errors.New("aggregation: unknown node")
	// ErrLate: the round is closed or its deadline has passed.
	ErrLate = errors.New("aggregation: contribution after the round closed")
	// ErrDuplicate: the node already has an accepted contribution.
	ErrDuplicate = errors.New("aggregation: duplicate contribution")
	// ErrDimension: len(Sum) differs from the round's dimension.
	ErrDimension = errors.New("aggregation: wrong dimension")
	// ErrNegativeCount: Count < 0.
	ErrNegativeCount = errors.New("aggregation: negative count")
	// ErrCountTooLarge: Count exceeds the node's shard size (WithShardSizes).
	ErrCountTooLarge = errors.New("aggregation: count exceeds shard size")
	// ErrNaN: Sum holds a NaN.
	ErrNaN = errors.New("aggregation: NaN in sum")
	// ErrInf: Sum holds an infinity.
	ErrInf = errors.New("aggregation: infinity in sum")
	// ErrNormBound: ‖Sum‖₂ > Count·C·(1+1e-6).
	ErrNormBound = errors.New("aggregation: sum norm exceeds count times clip norm")
	// ErrInvalidRound is returned by NewRound for bad arguments.
	ErrInvalidRound = errors.New("aggregation: invalid round")
)

var reasonInfo = [numReasons]struct {
	name string
	err  error
}{
	ReasonWrongStep:     {"wrong_step", ErrWrongStep},
	ReasonWrongRound:    {"wrong_round", ErrWrongRound},
	ReasonUnknownNode:   {"unknown_node", ErrUnknownNode},
	ReasonLate:          {"late", ErrLate},
	ReasonDuplicate:     {"duplicate", ErrDuplicate},
	ReasonDimension:     {"dimension", ErrDimension},
	ReasonNegativeCount: {"negative_count", ErrNegativeCount},
	ReasonCountTooLarge: {"count_too_large", ErrCountTooLarge},
	ReasonNaN:           {"nan", ErrNaN},
	ReasonInf:           {"inf", ErrInf},
	ReasonNormBound:     {"norm_bound", ErrNormBound},
}

// String returns the reason's metric name, e.g. "norm_bound".
func (r Reason) String() string {
	if r == 0 || int(r) >= numReasons {
		return fmt.Sprintf("reason(%d)", uint8(r))
	}
	return reasonInfo[r].name
}

// Err returns the reason's sentinel error (nil for an unknown reason).
func (r Reason) Err() error {
	if r == 0 || int(r) >= numReasons {
		return nil
	}
	return reasonInfo[r].err
}

// Reasons returns every rejection reason, for registering metrics.
func Reasons() []Reason {
	rs := make([]Reason, 0, numReasons-1)
	for r := Reason(1); int(r) < numReasons; r++ {
		rs = append(rs, r)
	}
	return rs
}

// RejectError is the error Add returns for a rejected contribution. It holds
// no values from the contribution.
type RejectError struct {
	Node   string
	Reason Reason
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("%v (node %q)", e.Reason.Err(), e.Node)
}

// Unwrap returns the reason's sentinel.
func (e *RejectError) Unwrap() error { return e.Reason.Err() }

// ReasonOf returns the Reason of an error returned by Add, or 0.
func ReasonOf(err error) Reason {
	var re *RejectError
	if errors.As(err, &re) {
		return re.Reason
	}
	return 0
}

// Rejection records one rejected contribution.
type Rejection struct {
	Node   string // as claimed by the contribution, cut to 64 bytes
	Reason Reason
}

// Cause says why a round closed.
type Cause uint8

// Close causes.
const (
	CauseAllAnswered Cause = iota + 1 // every registered node was accepted
	CauseDeadline                     // the deadline passed
	CauseClosed                       // Close was called
)

func (c Cause) String() string {
	switch c {
	case CauseAllAnswered:
		return "all_answered"
	case CauseDeadline:
		return "deadline"
	case CauseClosed:
		return "closed"
	}
	return fmt.Sprintf("cause(%d)", uint8(c))
}

// Result is a closed round's outcome. Its slices and map are shared by
// every caller of Close and Wait: do not modify them.
type Result struct {
	Step uint64
	// Sum is the element-wise sum of the accepted contributions' sums,
	// accumulated in float64 in ascending node-ID order (all zeros if none
	// was accepted). Private: add noise before it leaves memory.
	Sum []float64
	// Count is the sum of the accepted counts (saturating at MaxInt64).
	// Private: never log or export it.
	Count int64
	// Accepted and Missing list the registered nodes with and without an
	// accepted contribution, sorted.
	Accepted []string
	Missing  []string
	// Rejected lists rejections before close in the order they happened,
	// at most MaxRecordedRejections; RejectedByReason counts all of them.
	// Contributions rejected after close (ReasonLate and others) are only
	// reported by Add's error.
	Rejected         []Rejection
	RejectedByReason map[Reason]int
	ClosedBy         Cause
}

// MaxRecordedRejections bounds Result.Rejected, so a flood of bad messages
// cannot grow a round's memory without bound.
const MaxRecordedRejections = 4096

// Option configures NewRound.
type Option func(*Round)

// WithRoundID makes Add reject contributions whose RoundID is not id with
// ReasonWrongRound.
func WithRoundID(id uint64) Option {
	return func(r *Round) { r.roundID, r.checkRound = id, true }
}

// WithShardSizes makes Add reject a node's contribution whose Count exceeds
// its shard size with ReasonCountTooLarge: a node sampling its shard cannot
// draw more examples than it holds, and an inflated count would loosen the
// norm bound. Nodes absent from sizes are not limited.
func WithShardSizes(sizes map[string]int64) Option {
	sizes = maps.Clone(sizes)
	return func(r *Round) { r.shard = sizes }
}

// WithSumBuffer makes the Result's Sum buf (if it has the round's
// dimension; else it is ignored) instead of a new slice, overwritten
// whatever it held: a caller can hand the same buffer to every round, so
// the model-sized sum is not allocated, and its pages faulted in, every
// step. The caller must not use buf until the round is closed.
func WithSumBuffer(buf []float64) Option {
	return func(r *Round) { r.sumBuf = buf }
}

// Round accumulates the contributions of one step. It is safe for
// concurrent use. Its one timer (the deadline) is stopped at close.
type Round struct {
	step       uint64
	roundID    uint64
	checkRound bool
	dim        int
	clip       float64
	deadline   time.Time
	registered map[string]bool
	shard      map[string]int64
	sumBuf     []float64 // WithSumBuffer

	mu       sync.Mutex
	accepted map[string]accepted
	rejected []Rejection
	byReason map[Reason]int
	closed   bool
	result   Result
	done     chan struct{}
	timer    *time.Timer
}

type accepted struct {
	count int64
	sum   []float32
}

// NewRound opens the round of step for nodes (distinct, non-empty IDs) with
// vectors of dim values, per-example clip norm clipNorm (finite, > 0), closing
// at deadline. A round with no nodes, or whose deadline has passed, closes at
// once. The deadline is read from the time package (so testing/synctest
// controls it).
func NewRound(step uint64, nodes []string, dim int, clipNorm float64, deadline time.Time, opts ...Option) (*Round, error) {
	if dim <= 0 {
		return nil, fmt.Errorf("%w: dimension %d", ErrInvalidRound, dim)
	}
	if !(clipNorm > 0) || math.IsInf(clipNorm, 0) {
		return nil, fmt.Errorf("%w: clip norm %v", ErrInvalidRound, clipNorm)
	}
	reg := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		if n == "" {
			return nil, fmt.Errorf("%w: empty node ID", ErrInvalidRound)
		}
		if reg[n] {
			return nil, fmt.Errorf("%w: node %q listed twice", ErrInvalidRound, n)
		}
		reg[n] = true
	}
	r := &Round{
		step: step, dim: dim, clip: clipNorm, deadline: deadline, registered: reg,
		accepted: make(map[string]accepted, len(nodes)),
		byReason: make(map[Reason]int),
		done:     make(chan struct{}),
	}
	for _, o := range opts {
		o(r)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(reg) == 0 {
		r.closeLocked(CauseAllAnswered)
		return r, nil
	}
	r.timer = time.AfterFunc(time.Until(deadline), func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.closeLocked(CauseDeadline)
	})
	return r, nil
}

// Step returns the round's step.
func (r *Round) Step() uint64 { return r.step }

// Deadline returns the round's deadline.
func (r *Round) Deadline() time.Time { return r.deadline }

// Add validates c and, if it passes, records it. It returns nil or a
// *RejectError wrapping the sentinel of the first failed check, in the
// order of the Reason constants. A rejected contribution does not use up the
// node's turn: the node may send a corrected one before the round closes.
// The round stays usable after any rejection. Add closes the round when the
// last registered node is accepted. Validation of the values runs outside
// the round's lock.
func (r *Round) Add(c Contribution) error {
	r.mu.Lock()
	reason := r.admitLocked(c)
	r.mu.Unlock()
	if reason == 0 {
		reason = r.validate(c)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if reason == 0 {
		reason = r.admitLocked(c) // again: the round may have closed, or a twin been accepted
	}
	if reason != 0 {
		node := c.NodeID
		if len(node) > 64 {
			node = node[:64]
		}
		r.byReason[reason]++
		if len(r.rejected) < MaxRecordedRejections {
			r.rejected = append(r.rejected, Rejection{Node: node, Reason: reason})
		}
		return &RejectError{Node: node, Reason: reason}
	}
	r.accepted[c.NodeID] = accepted{count: c.Count, sum: c.Sum}
	if len(r.accepted) == len(r.registered) {
		r.closeLocked(CauseAllAnswered)
	}
	return nil
}

// admitLocked runs the checks that depend on the round's state.
func (r *Round) admitLocked(c Contribution) Reason {
	switch {
	case c.Step != r.step:
		return ReasonWrongStep
	case r.checkRound && c.RoundID != r.roundID:
		return ReasonWrongRound
	case !r.registered[c.NodeID]:
		return ReasonUnknownNode
	case r.closed || !time.Now().Before(r.deadline):
		return ReasonLate
	}
	if _, dup := r.accepted[c.NodeID]; dup {
		return ReasonDuplicate
	}
	return 0
}

// validate runs the checks on the values; it reads only immutable fields of
// r.
func (r *Round) validate(c Contribution) Reason {
	if len(c.Sum) != r.dim {
		return ReasonDimension
	}
	if c.Count < 0 {
		return ReasonNegativeCount
	}
	if limit, ok := r.shard[c.NodeID]; ok && c.Count > limit {
		return ReasonCountTooLarge
	}
	// One pass: classify non-finite values and accumulate the squared norm
	// in float64 (no overflow possible from float32 inputs; see the package
	// doc), in chunks of valueChunk on several cores, the chunks' sums
	// added in chunk order (the same bits whatever the core count).
	parts := make([]valueStats, parallel.Count(len(c.Sum), valueChunk))
	parallel.Chunks(len(c.Sum), valueChunk, func(k, lo, hi int) { parts[k] = statsOf(c.Sum[lo:hi]) })
	var ss float64
	nan, inf := false, false
	for _, p := range parts {
		ss += p.ss
		nan, inf = nan || p.nan, inf || p.inf
	}
	switch {
	case nan:
		return ReasonNaN
	case inf:
		return ReasonInf
	}
	if math.Sqrt(ss) > float64(c.Count)*r.clip*(1+1e-6) {
		return ReasonNormBound
	}
	return 0
}

// valueChunk is the number of values one goroutine checks, or sums, at a
// time: a model-sized vector (20M values at 20M parameters) is checked
// and summed on every core, and one of at most valueChunk values exactly
// as by a serial loop.
const valueChunk = 1 << 16

// valueStats is one chunk's part of validate's pass.
type valueStats struct {
	ss       float64 // Σ x² over the finite values
	nan, inf bool
}

// statsOf tells NaN from ±Inf by the float32 bits (exponent all ones; a
// non-zero fraction is a NaN) and sums the squares of the rest in
// float64, in order.
func statsOf(v []float32) valueStats {
	const exp, frac = 0x7f800000, 0x007fffff
	var st valueStats
	for _, f := range v {
		b := math.Float32bits(f)
		if b&exp != exp {
			x := float64(f)
			st.ss += x * x
			continue
		}
		if b&frac != 0 {
			st.nan = true
		} else {
			st.inf = true
		}
	}
	return st
}

// closeLocked closes the round once: sums the accepted contributions in
// ascending node-ID order in float64, builds the Result, frees the per-node
// sums, stops the timer and closes Done.
func (r *Round) closeLocked(cause Cause) {
	if r.closed {
		return
	}
	r.closed = true
	if r.timer != nil {
		r.timer.Stop()
	}
	sum := r.sumBuf
	if len(sum) != r.dim {
		sum = make([]float64, r.dim)
	}
	res := Result{
		Step:             r.step,
		Sum:              sum,
		Rejected:         slices.Clone(r.rejected),
		RejectedByReason: maps.Clone(r.byReason),
		ClosedBy:         cause,
	}
	for n := range r.accepted {
		res.Accepted = append(res.Accepted, n)
	}
	slices.Sort(res.Accepted)
	// Every element sums the nodes in ascending ID order: splitting the
	// elements over cores leaves each one's sum as the serial loop's.
	sums := make([][]float32, len(res.Accepted))
	for j, n := range res.Accepted {
		sums[j] = r.accepted[n].sum
	}
	parallel.Chunks(r.dim, valueChunk, func(_, lo, hi int) {
		out := res.Sum[lo:hi]
		clear(out) // the buffer may hold a previous round's values
		for _, v := range sums {
			for i, x := range v[lo:hi] {
				out[i] += float64(x)
			}
		}
	})
	for _, n := range res.Accepted {
		a := r.accepted[n]
		if res.Count > math.MaxInt64-a.count {
			res.Count = math.MaxInt64
		} else {
			res.Count += a.count
		}
	}
	for n := range r.registered {
		if _, ok := r.accepted[n]; !ok {
			res.Missing = append(res.Missing, n)
		}
	}
	slices.Sort(res.Missing)
	r.accepted = nil
	r.result = res
	close(r.done)
}

// Done returns a channel closed when the round closes.
func (r *Round) Done() <-chan struct{} { return r.done }

// Close closes the round now if it is still open (cause CauseClosed) and
// returns its Result. It is idempotent: later calls return the same Result.
func (r *Round) Close() Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closeLocked(CauseClosed)
	return r.result
}

// Wait blocks until the round closes (all nodes answered or the deadline
// passed) and returns its Result, or returns ctx's error first.
func (r *Round) Wait(ctx context.Context) (Result, error) {
	select {
	case <-r.done:
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.result, nil
}
