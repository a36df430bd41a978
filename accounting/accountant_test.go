package accounting

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
)

func TestEventRoundTrip(t *testing.T) {
	events := []Event{
		Gaussian(2),
		SubsampledGaussian(0.01, 1.1),
		SelfComposed(SubsampledGaussian(0.01, 1.1), 1000),
		Composed(SelfComposed(SubsampledGaussian(0.01, 1.1), 10), SubsampledGaussian(0.02, 0.9)),
	}
	for _, e := range events {
		b, err := e.Marshal()
		if err != nil {
			t.Fatalf("Marshal(%+v): %v", e, err)
		}
		got, err := UnmarshalEvent(b)
		if err != nil {
			t.Fatalf("UnmarshalEvent(%s): %v", b, err)
		}
		b2, err := got.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if string(b2) != string(b) {
			t.Errorf("round trip changed the event: got %s, want %s", b2, b)
		}
	}
}

// TestEventEqual: Equal holds for an event and its decoded copy, and fails
// when any parameter or any part of the nesting differs.
func TestEventEqual(t *testing.T) {
	events := []Event{
		Gaussian(2),
		Gaussian(2.0000000001),
		SubsampledGaussian(0.01, 1.1),
		SubsampledGaussian(1e-9, 1.1),
		SubsampledGaussian(0.01, 1.2),
		SelfComposed(SubsampledGaussian(0.01, 1.1), 1000),
		SelfComposed(SubsampledGaussian(0.01, 1.1), 999),
		Composed(SubsampledGaussian(0.01, 1.1), Gaussian(2)),
		Composed(Gaussian(2), SubsampledGaussian(0.01, 1.1)),
		Composed(Gaussian(2)),
		{Kind: KindPoissonSampled, SampleRate: 0.01},
	}
	for i, a := range events {
		b, _ := json.Marshal(a)
		var copied Event
		if err := json.Unmarshal(b, &copied); err != nil {
			t.Fatal(err)
		}
		if !a.Equal(copied) {
			t.Errorf("%+v is not Equal to its decoded copy", a)
		}
		for j, o := range events {
			if got := a.Equal(o); got != (i == j) {
				t.Errorf("events %d and %d: Equal = %v", i, j, got)
			}
		}
	}
}

func TestEventRejects(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want error
	}{
		{"unknown format", `{"format":2,"event":{"kind":"gaussian","noise_multiplier":1}}`, ErrEventFormat},
		{"missing format", `{"event":{"kind":"gaussian","noise_multiplier":1}}`, ErrEventFormat},
		{"unknown kind", `{"format":1,"event":{"kind":"laplace","noise_multiplier":1}}`, ErrInvalidEvent},
		{"zero sigma", `{"format":1,"event":{"kind":"gaussian"}}`, ErrInvalidEvent},
		{"negative sigma", `{"format":1,"event":{"kind":"gaussian","noise_multiplier":-1}}`, ErrInvalidEvent},
		{"q above one", `{"format":1,"event":{"kind":"poisson_sampled","sample_rate":1.5,"event":{"kind":"gaussian","noise_multiplier":1}}}`, ErrInvalidEvent},
		{"q zero", `{"format":1,"event":{"kind":"poisson_sampled","sample_rate":0,"event":{"kind":"gaussian","noise_multiplier":1}}}`, ErrInvalidEvent},
		{"no inner", `{"format":1,"event":{"kind":"self_composed","count":3}}`, ErrInvalidEvent},
		{"negative count", `{"format":1,"event":{"kind":"self_composed","count":-3,"event":{"kind":"gaussian","noise_multiplier":1}}}`, ErrInvalidEvent},
		{"not json", `{"format":1,`, ErrInvalidEvent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := UnmarshalEvent([]byte(tt.in))
			if !errors.Is(err, tt.want) {
				t.Errorf("UnmarshalEvent(%s) error = %v, want %v", tt.in, err, tt.want)
			}
		})
	}
}

func TestComposeAdditive(t *testing.T) {
	e := SubsampledGaussian(0.01, 1.0)
	one := RDP{}.NewComposition()
	for range 100 {
		if err := one.Compose(e, 1); err != nil {
			t.Fatal(err)
		}
	}
	many := RDP{}.NewComposition()
	if err := many.Compose(SelfComposed(e, 100), 1); err != nil {
		t.Fatal(err)
	}
	nested := RDP{}.NewComposition()
	if err := nested.Compose(Composed(SelfComposed(e, 60), SelfComposed(e, 40)), 1); err != nil {
		t.Fatal(err)
	}
	for i := range one.RDP() {
		a, b, c := one.RDP()[i], many.RDP()[i], nested.RDP()[i]
		if math.Abs(a-b) > 1e-12*b || math.Abs(c-b) > 1e-12*b {
			t.Fatalf("order %v: step-by-step %v, self-composed %v, nested %v", one.Orders()[i], a, b, c)
		}
	}
}

func TestComposeRejectsWithoutCharging(t *testing.T) {
	acc := RDP{}.NewComposition()
	if err := acc.Compose(Gaussian(0), 1); !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("Compose(σ=0) = %v, want ErrInvalidEvent", err)
	}
	if err := acc.Compose(PoissonSampled(0.1, SelfComposed(Gaussian(1), 2)), 1); !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("Compose(sampled composite) = %v, want ErrInvalidEvent", err)
	}
	for i, r := range acc.RDP() {
		if r != 0 {
			t.Fatalf("rejected event charged order %v with %v", acc.Orders()[i], r)
		}
	}
}

// TestEpsilonMonotone checks the shape the calibrator relies on: ε grows with
// steps and q and shrinks with σ.
func TestEpsilonMonotone(t *testing.T) {
	prev := math.Inf(1)
	for _, sigma := range []float64{0.5, 0.7, 1, 1.5, 2, 4, 8} {
		e, _, err := RDP{}.EpsilonOrder(SubsampledGaussian(0.01, sigma), 1000, 1e-5)
		if err != nil {
			t.Fatal(err)
		}
		if e > prev {
			t.Errorf("ε(σ=%v) = %v > ε at smaller σ %v", sigma, e, prev)
		}
		prev = e
	}
	prev = 0
	for _, steps := range []int64{1, 10, 100, 1000, 10000} {
		e, _, _ := RDP{}.EpsilonOrder(SubsampledGaussian(0.01, 1), steps, 1e-5)
		if e < prev {
			t.Errorf("ε(steps=%d) = %v < ε at fewer steps %v", steps, e, prev)
		}
		prev = e
	}
}

// TestFractionalOrderContinuity: the fractional-order series and the integer
// closed form are two computations of the same A_α, so the RDP curve must be
// continuous across integers.
func TestFractionalOrderContinuity(t *testing.T) {
	for _, tc := range []struct{ q, sigma float64 }{{0.01, 1}, {0.1, 0.8}, {0.004, 1.1}} {
		for _, a := range []float64{2, 3, 5, 8, 16} {
			at := SubsampledGaussianRDP(tc.q, tc.sigma, a)
			below := SubsampledGaussianRDP(tc.q, tc.sigma, a-1e-7)
			above := SubsampledGaussianRDP(tc.q, tc.sigma, a+1e-7)
			if math.Abs(below-at) > 1e-5*at || math.Abs(above-at) > 1e-5*at {
				t.Errorf("q=%v σ=%v: RDP(%v−)=%v RDP(%v)=%v RDP(%v+)=%v", tc.q, tc.sigma, a, below, a, at, a, above)
			}
		}
	}
}

func TestRDPGaussianLimit(t *testing.T) {
	// With q = 1 the subsampled mechanism is the Gaussian mechanism.
	for _, a := range []float64{1.5, 2, 10} {
		if got, want := SubsampledGaussianRDP(1, 2, a), a/8; math.Abs(got-want) > 1e-15 {
			t.Errorf("RDP(q=1, σ=2, α=%v) = %v, want %v", a, got, want)
		}
	}
}

func TestEpsilonInvalid(t *testing.T) {
	tests := []struct {
		name            string
		q, sigma, delta float64
		steps           int64
	}{
		{"q zero", 0, 1, 1e-5, 10},
		{"q above one", 1.1, 1, 1e-5, 10},
		{"sigma zero", 0.1, 0, 1e-5, 10},
		{"sigma NaN", 0.1, math.NaN(), 1e-5, 10},
		{"delta zero", 0.1, 1, 0, 10},
		{"delta one", 0.1, 1, 1, 10},
		{"steps zero", 0.1, 1, 1e-5, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := ValidateRun(tt.q, tt.sigma, tt.steps, tt.delta); !errors.Is(err, ErrInvalidParameter) {
				t.Errorf("ValidateRun error = %v, want ErrInvalidParameter", err)
			}
			// Each accountant refuses the same run: an invalid event, δ or
			// step count.
			for _, acc := range []Accountant{RDP{}, PLD{}} {
				if tt.steps < 1 {
					continue // RDP composes 0 runs (ε is the conversion's floor); PLD refuses them
				}
				if _, err := acc.Epsilon(SubsampledGaussian(tt.q, tt.sigma), tt.steps, tt.delta); err == nil {
					t.Errorf("%s: Epsilon error = nil for an invalid run", acc.Name())
				}
			}
		})
	}
}

func TestCalibrateSigma(t *testing.T) {
	for _, tc := range []struct {
		eps, q, delta float64
		steps         int64
	}{
		{3, 0.004266666666666667, 1e-5, 2343},
		{0.5, 0.01, 1e-5, 1000},
		{8, 0.1, 1e-6, 100},
		{50, 0.001, 1e-5, 10},
	} {
		sigma, err := RDP{}.Calibrate(tc.eps, tc.steps, tc.delta, func(s float64) Event { return SubsampledGaussian(tc.q, s) })
		if err != nil {
			t.Fatalf("Calibrate(%+v): %v", tc, err)
		}
		e, _, _ := RDP{}.EpsilonOrder(SubsampledGaussian(tc.q, sigma), tc.steps, tc.delta)
		if e > tc.eps {
			t.Errorf("%+v: σ=%v gives ε=%v above target", tc, sigma, e)
		}
		// Smallest: a slightly smaller σ must overshoot, unless σ hit the
		// search floor.
		if sigma > minSigma {
			if e2, _, _ := (RDP{}).EpsilonOrder(SubsampledGaussian(tc.q, sigma*(1-1e-6)), tc.steps, tc.delta); e2 <= tc.eps {
				t.Errorf("%+v: σ=%v is not the smallest: σ(1−1e-6) gives ε=%v", tc, sigma, e2)
			}
		}
	}
	if _, err := (RDP{}).Calibrate(1e-4, 1000, 1e-5, func(s float64) Event { return SubsampledGaussian(0.5, s) }); !errors.Is(err, ErrUnreachable) {
		t.Errorf("unreachable target: err = %v, want ErrUnreachable", err)
	}
	if _, err := (RDP{}).Calibrate(-1, 1000, 1e-5, func(s float64) Event { return SubsampledGaussian(0.5, s) }); !errors.Is(err, ErrInvalidParameter) {
		t.Errorf("negative target: err = %v, want ErrInvalidParameter", err)
	}
}

func FuzzUnmarshalEvent(f *testing.F) {
	for _, e := range []Event{Gaussian(1), SubsampledGaussian(0.1, 1), SelfComposed(SubsampledGaussian(0.1, 1), 7), SubsampledDiscreteGaussian(0.01, 0.9)} {
		b, _ := e.Marshal()
		f.Add(b)
	}
	f.Add([]byte(`{"format":1,"event":{"kind":"composed","events":[{"kind":"gaussian","noise_multiplier":1}]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := UnmarshalEvent(b)
		if err != nil {
			return
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("decoded event does not validate: %v", err)
		}
		b2, err := e.Marshal()
		if err != nil {
			t.Fatalf("re-marshal: %v", err)
		}
		e2, err := UnmarshalEvent(b2)
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		b3, _ := e2.Marshal()
		if string(b3) != string(b2) {
			t.Fatalf("not stable: %s vs %s", b3, b2)
		}
	})
}

func BenchmarkEpsilon100kSteps(b *testing.B) {
	for b.Loop() {
		if _, _, err := (RDP{}).EpsilonOrder(SubsampledGaussian(0.004266666666666667, 1.1), 100000, 1e-5); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCalibrateSigma(b *testing.B) {
	for b.Loop() {
		if _, err := (RDP{}).Calibrate(3, 100000, 1e-5, func(s float64) Event { return SubsampledGaussian(0.004266666666666667, s) }); err != nil {
			b.Fatal(err)
		}
	}
}
