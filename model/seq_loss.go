package model

import (
	"fmt"
	"math"
)

// checkHead checks the last layer's output shape against the loss: [Classes]
// for SoftmaxCrossEntropy; [T, Classes] for NextToken, whose first layer
// must also be an embedding over the Classes output tokens.
func (m *Model) checkHead(shape []int) error {
	s := m.spec
	if m.seqT == 0 {
		if len(shape) != 1 || shape[0] != s.Classes {
			return fmt.Errorf("%w: last layer outputs %v, want [%d] (classes)", ErrInvalidSpec, shape, s.Classes)
		}
		return nil
	}
	if len(shape) != 2 || shape[0] != m.seqT || shape[1] != s.Classes {
		return fmt.Errorf("%w: loss %s: last layer outputs %v, want [%d, %d] (positions, vocabulary)", ErrInvalidSpec, s.Loss, shape, m.seqT, s.Classes)
	}
	if e, ok := m.layers[0].(*seqEmbed); !ok || e.V != s.Classes {
		return fmt.Errorf("%w: loss %s needs an embedding first layer with vocab = classes = %d", ErrInvalidSpec, s.Loss, s.Classes)
	}
	return nil
}

// checkInputIDs checks that every layer that reads the model's input token
// ids (pass.ids: attention with a padding mask, lasttoken), nested ones
// included, has them: the first layer must be an embedding, whose input
// they are. Every layer between keeps the embedding's T positions (no
// layer maps a [T, D] sequence to another length), so position t of such
// a layer is token t. Today only an embedding makes a [T, D] sequence, so
// no valid spec fails the check; it keeps the ids' meaning from resting
// on that.
func (m *Model) checkInputIDs() error {
	if _, ok := m.layers[0].(*seqEmbed); ok {
		return nil
	}
	var walk func(where string, ly layer) error
	walk = func(where string, ly layer) error {
		if what := readsIDs(ly); what != "" {
			return fmt.Errorf("%w: %s (%s) needs an embedding first layer: it reads the model's input token ids to find the padding", ErrInvalidSpec, where, what)
		}
		if r, ok := ly.(*residual); ok {
			for j, nl := range r.layers {
				if err := walk(fmt.Sprintf("%s (residual): nested layer %d", where, j), nl); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for l, ly := range m.layers {
		if err := walk(fmt.Sprintf("layer %d", l), ly); err != nil {
			return err
		}
	}
	return nil
}

// readsIDs names a layer that reads the model's input token ids, or
// returns "".
func readsIDs(ly layer) string {
	switch ly := ly.(type) {
	case *attention:
		if ly.padding {
			return "attention with mask padding"
		}
	case *tokenPick:
		if ly.last {
			return LastToken
		}
	}
	return ""
}

// loadSequences copies, for a NextToken model, each example's first T ids
// into the layers' input in (B·T values) and its last T ids, the targets,
// into w.targets.
func (w *Workspace) loadSequences(B int, x []float32) {
	T := w.m.seqT
	if w.targets == nil {
		w.targets = make([]int32, w.maxB*T)
	}
	in := w.act[0]
	for i := 0; i < B; i++ {
		ex := x[i*(T+1) : (i+1)*(T+1)]
		copy(in[i*T:(i+1)*T], ex[:T])
		for t, v := range ex[1:] {
			w.targets[i*T+t] = int32(v)
		}
	}
}

// tokenLoss is the NextToken loss of a batch: sum, the sum over examples
// of each example's mean over its targets; tokens, the number of targets
// (not padding); tokenSum, the sum over all targets; correct, the targets
// whose arg-max logit is the target.
type tokenLoss struct {
	sum, tokenSum   float64
	tokens, correct int
}

// nextTokenXent computes the NextToken loss of the logits act[L] ([B, T,
// V]) against w.targets and, if dlogits is non-nil, writes each position's
// scale/nᵢ·(softmax − onehot(target)) to it (nᵢ the example's number of
// targets; zero rows at padding targets): the gradient of scale times the
// example's mean. Sums are float64, log-sum-exp with the max subtracted,
// in example and position order.
func (w *Workspace) nextTokenXent(B int, dlogits []float32, scale float32) tokenLoss {
	V, T := w.m.classes, w.m.seqT
	logits := w.act[len(w.m.layers)]
	var r tokenLoss
	for i := 0; i < B; i++ {
		n := 0
		for _, tg := range w.targets[i*T : (i+1)*T] {
			if tg >= 0 {
				n++
			}
		}
		var sum float64
		for t := 0; t < T; t++ {
			tg := w.targets[i*T+t]
			z := logits[(i*T+t)*V : (i*T+t+1)*V]
			var d []float32
			if dlogits != nil {
				d = dlogits[(i*T+t)*V : (i*T+t+1)*V]
			}
			if tg < 0 {
				clear(d)
				continue
			}
			l, ok := xentRow(d, z, int(tg), scale/float32(n))
			sum += l
			if ok {
				r.correct++
			}
		}
		r.tokens += n
		r.tokenSum += sum
		if n > 0 {
			r.sum += sum / float64(n)
		}
	}
	return r
}

// xentRow returns the softmax cross-entropy of logits z for class y and
// whether y is the arg-max, and if d is non-nil writes
// scale·(softmax(z) − onehot(y)) to it.
func xentRow(d, z []float32, y int, scale float32) (float64, bool) {
	arg := 0
	for j, v := range z {
		if v > z[arg] {
			arg = j
		}
	}
	mx := float64(z[arg])
	var se float64
	for _, v := range z {
		se += math.Exp(float64(v) - mx)
	}
	lse := mx + math.Log(se)
	if d != nil {
		for j, v := range z {
			pj := math.Exp(float64(v) - lse)
			if j == y {
				pj--
			}
			d[j] = scale * float32(pj)
		}
	}
	return lse - float64(z[y]), arg == y
}
