package accounting

import (
	"encoding/json"
	"fmt"
	"math"
)

// EventFormat is the version of the serialized Event format. An event's
// meaning never changes once released: a new meaning gets a new Kind or a new
// format version, and decoders reject versions they do not know.
const EventFormat = 1

// Kind names a privacy mechanism, after Google dp_accounting's DpEvent
// classes.
type Kind string

// The mechanisms the accountant understands.
const (
	// KindGaussian is one release of the Gaussian mechanism with L2
	// sensitivity 1 and noise standard deviation NoiseMultiplier
	// (dp_accounting GaussianDpEvent).
	KindGaussian Kind = "gaussian"
	// KindDiscreteGaussian is one release of the discrete Gaussian
	// mechanism (Canonne, Kamath and Steinke, "The Discrete Gaussian for
	// Differential Privacy", NeurIPS 2020): an integer-vector query plus
	// independent N_Z(0, s²) noise on every coordinate, where NoiseMultiplier
	// is s over the query's L2 sensitivity, both in units of the integer
	// lattice. The accountant bounds its Rényi DP by the Gaussian's (see
	// SubsampledDiscreteGaussianRDP for the argument).
	KindDiscreteGaussian Kind = "discrete_gaussian"
	// KindPoissonSampled runs Event on a Poisson subsample in which each
	// record is included independently with probability SampleRate
	// (dp_accounting PoissonSampledDpEvent).
	KindPoissonSampled Kind = "poisson_sampled"
	// KindSelfComposed runs Event Count times (dp_accounting
	// SelfComposedDpEvent).
	KindSelfComposed Kind = "self_composed"
	// KindComposed runs each of Events once (dp_accounting ComposedDpEvent).
	KindComposed Kind = "composed"
)

// Event describes a privacy mechanism that ran. Events nest: a DP-SGD step is
// PoissonSampled{q, Gaussian{σ}}, and T steps of it are SelfComposed{T, ...}.
// Build events with the constructors; an Event is a value and safe to copy.
type Event struct {
	Kind            Kind    `json:"kind"`
	NoiseMultiplier float64 `json:"noise_multiplier,omitempty"`
	SampleRate      float64 `json:"sample_rate,omitempty"`
	Count           int64   `json:"count,omitempty"`
	Event           *Event  `json:"event,omitempty"`
	Events          []Event `json:"events,omitempty"`
	// Dimension and LatticeScale name a discrete Gaussian's lattice: the
	// number of coordinates d and the noise scale s in lattice units (s =
	// NoiseMultiplier × sensitivity). They are optional, and only for
	// KindDiscreteGaussian: the RDP accountant does not need them; the PLD
	// accountant charges a discrete Gaussian only with them
	// (accounting/pld_discrete.go). Omitted when zero, so events written
	// before they existed keep their bytes.
	Dimension    int64   `json:"dimension,omitempty"`
	LatticeScale float64 `json:"lattice_scale,omitempty"`
}

// Gaussian returns the event of one Gaussian mechanism release with noise
// multiplier sigma (noise standard deviation over L2 sensitivity).
func Gaussian(sigma float64) Event {
	return Event{Kind: KindGaussian, NoiseMultiplier: sigma}
}

// DiscreteGaussian returns the event of one discrete Gaussian mechanism
// release with noise multiplier sigma (noise scale over L2 sensitivity, in
// lattice units).
func DiscreteGaussian(sigma float64) Event {
	return Event{Kind: KindDiscreteGaussian, NoiseMultiplier: sigma}
}

// DiscreteGaussianLattice returns the event of one discrete Gaussian
// mechanism release with noise multiplier sigma that also names its
// lattice: dim coordinates with noise N_ℤ(0, scale²) each, scale in
// lattice units (the PLD accountant needs them).
func DiscreteGaussianLattice(sigma, scale float64, dim int64) Event {
	return Event{Kind: KindDiscreteGaussian, NoiseMultiplier: sigma, Dimension: dim, LatticeScale: scale}
}

// PoissonSampled returns the event of running e on a Poisson subsample with
// inclusion probability q.
func PoissonSampled(q float64, e Event) Event {
	return Event{Kind: KindPoissonSampled, SampleRate: q, Event: &e}
}

// SelfComposed returns the event of running e count times.
func SelfComposed(e Event, count int64) Event {
	return Event{Kind: KindSelfComposed, Count: count, Event: &e}
}

// Composed returns the event of running each of events once.
func Composed(events ...Event) Event {
	return Event{Kind: KindComposed, Events: append([]Event(nil), events...)}
}

// SubsampledGaussian returns the event charged for one DP-SGD style step:
// the Gaussian mechanism with noise multiplier sigma on a Poisson subsample
// with rate q.
func SubsampledGaussian(q, sigma float64) Event {
	return PoissonSampled(q, Gaussian(sigma))
}

// Describe names e's mechanism for messages: its kind, and for a
// Poisson-sampled event the inner kind with the sample rate
// ("gaussian with q=0.01").
func (e Event) Describe() string {
	if e.Kind == KindPoissonSampled && e.Event != nil {
		return fmt.Sprintf("%s with q=%v", e.Event.Kind, e.SampleRate)
	}
	return string(e.Kind)
}

// Equal reports whether e and o describe the same mechanism with the same
// parameters, compared exactly (nested events and their order included).
// The coordinator's state machine uses it to refuse a step entry whose
// event is not the run configuration's.
func (e Event) Equal(o Event) bool {
	if e.Kind != o.Kind || e.NoiseMultiplier != o.NoiseMultiplier || e.SampleRate != o.SampleRate ||
		e.Dimension != o.Dimension || e.LatticeScale != o.LatticeScale ||
		e.Count != o.Count || (e.Event == nil) != (o.Event == nil) || len(e.Events) != len(o.Events) {
		return false
	}
	if e.Event != nil && !e.Event.Equal(*o.Event) {
		return false
	}
	for i := range e.Events {
		if !e.Events[i].Equal(o.Events[i]) {
			return false
		}
	}
	return true
}

// SubsampledDiscreteGaussian returns the event charged for one step of a
// run whose leader adds discrete Gaussian noise: the discrete Gaussian
// mechanism with noise multiplier sigma on a Poisson subsample with rate q.
func SubsampledDiscreteGaussian(q, sigma float64) Event {
	return PoissonSampled(q, DiscreteGaussian(sigma))
}

// Validate reports whether e is well formed: known kinds, q in (0, 1],
// σ > 0 and finite, count ≥ 0, a discrete Gaussian's lattice (if named)
// consistent, and the nesting the kind requires.
func (e Event) Validate() error {
	if e.Kind != KindDiscreteGaussian && (e.Dimension != 0 || e.LatticeScale != 0) {
		return fmt.Errorf("%w: %s has a lattice (dimension %d, scale %v); only %s does", ErrInvalidEvent, e.Kind, e.Dimension, e.LatticeScale, KindDiscreteGaussian)
	}
	switch e.Kind {
	case KindGaussian, KindDiscreteGaussian:
		if !(e.NoiseMultiplier > 0) || math.IsInf(e.NoiseMultiplier, 0) {
			return fmt.Errorf("%w: %s noise multiplier %v must be positive and finite", ErrInvalidEvent, e.Kind, e.NoiseMultiplier)
		}
		// A lattice is both fields or neither; a nonzero integer shift has
		// norm ≥ 1, so the scale is at least the noise multiplier.
		if e.Dimension != 0 || e.LatticeScale != 0 {
			if e.Dimension < 1 || !(e.LatticeScale >= 1 && e.LatticeScale >= e.NoiseMultiplier) || math.IsInf(e.LatticeScale, 0) {
				return fmt.Errorf("%w: %s lattice dimension %d and scale %v must be ≥ 1, the scale finite and ≥ the noise multiplier %v",
					ErrInvalidEvent, e.Kind, e.Dimension, e.LatticeScale, e.NoiseMultiplier)
			}
		}
	case KindPoissonSampled:
		if !(e.SampleRate > 0 && e.SampleRate <= 1) {
			return fmt.Errorf("%w: sample rate %v must be in (0, 1]", ErrInvalidEvent, e.SampleRate)
		}
		if e.Event == nil {
			return fmt.Errorf("%w: poisson_sampled without an inner event", ErrInvalidEvent)
		}
		return e.Event.Validate()
	case KindSelfComposed:
		if e.Count < 0 {
			return fmt.Errorf("%w: negative count %d", ErrInvalidEvent, e.Count)
		}
		if e.Event == nil {
			return fmt.Errorf("%w: self_composed without an inner event", ErrInvalidEvent)
		}
		return e.Event.Validate()
	case KindComposed:
		for i := range e.Events {
			if err := e.Events[i].Validate(); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("%w: unknown kind %q", ErrInvalidEvent, e.Kind)
	}
	return nil
}

// envelope is the serialized form: the format version next to the event.
type envelope struct {
	Format int   `json:"format"`
	Event  Event `json:"event"`
}

// Marshal returns the versioned serialized form of e.
func (e Event) Marshal() ([]byte, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(envelope{Format: EventFormat, Event: e})
}

// UnmarshalEvent decodes an event written by Marshal. It returns
// ErrEventFormat for an unknown format version and ErrInvalidEvent for an
// event that does not validate.
func UnmarshalEvent(b []byte) (Event, error) {
	var env envelope
	if err := json.Unmarshal(b, &env); err != nil {
		return Event{}, fmt.Errorf("%w: %v", ErrInvalidEvent, err)
	}
	if env.Format != EventFormat {
		return Event{}, fmt.Errorf("%w: version %d (this build reads %d)", ErrEventFormat, env.Format, EventFormat)
	}
	if err := env.Event.Validate(); err != nil {
		return Event{}, err
	}
	return env.Event, nil
}
