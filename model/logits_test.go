package model

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// TestLogitsMatchEvaluate: the mean softmax cross-entropy and accuracy
// computed from Logits are Evaluate's.
func TestLogitsMatchEvaluate(t *testing.T) {
	m, err := New(MLP([]int{6}, []int{5}, 3))
	if err != nil {
		t.Fatal(err)
	}
	theta := make([]float32, m.NumParams())
	if err := m.Init(theta, 3); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const B = 7
	x := make([]float32, B*6)
	y := make([]int32, B)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	for i := range y {
		y[i] = int32(rng.IntN(3))
	}
	ws, err := m.NewWorkspace(8)
	if err != nil {
		t.Fatal(err)
	}
	logits := make([]float32, B*3)
	if err := ws.Logits(logits, theta, x); err != nil {
		t.Fatal(err)
	}
	var loss float64
	correct := 0
	for i := range B {
		z := logits[i*3 : i*3+3]
		mx, arg := math.Inf(-1), 0
		for c, v := range z {
			if float64(v) > mx {
				mx, arg = float64(v), c
			}
		}
		var se float64
		for _, v := range z {
			se += math.Exp(float64(v) - mx)
		}
		loss += mx + math.Log(se) - float64(z[y[i]])
		if arg == int(y[i]) {
			correct++
		}
	}
	ev, err := ws.Evaluate(theta, x, y)
	if err != nil {
		t.Fatal(err)
	}
	if got := loss / B; math.Abs(got-ev.Loss) > 1e-5*max(1, ev.Loss) || float64(correct)/B != ev.Accuracy {
		t.Errorf("from Logits: loss %v, accuracy %v; Evaluate: %v, %v", got, float64(correct)/B, ev.Loss, ev.Accuracy)
	}
	if err := ws.Logits(make([]float32, 5), theta, x); !errors.Is(err, ErrShape) {
		t.Errorf("a short dst: %v, want ErrShape", err)
	}
	if err := ws.Logits(logits, theta, x[:5]); !errors.Is(err, ErrShape) {
		t.Errorf("a partial example: %v, want ErrShape", err)
	}
}
