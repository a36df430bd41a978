package model

import "fmt"

// tokenPick takes one position of a [T, D] sequence as the example's
// vector [D]: position 0 (firsttoken: BERT's pooler reads the [CLS]
// token's), or the last position whose model-input token is not padding,
// position 0 if all are (lasttoken: GPT-2's sequence classification,
// which reads the token ids, pass.ids). Its backward pass puts the output
// gradient at that position and zeros elsewhere.
type tokenPick struct {
	noParams
	T, D int
	last bool
}

// newTokenPick checks a firsttoken or lasttoken layer spec against its
// [T, D] input.
func newTokenPick(ls LayerSpec, in []int) (layer, error) {
	if err := unused(ls, "out", "kernel", "stride", "pad", "vocab", "dim", "eps"); err != nil {
		return nil, err
	}
	if len(in) != 2 {
		return nil, fmt.Errorf("%s needs a [T, D] sequence input", ls.Type)
	}
	return &tokenPick{T: in[0], D: in[1], last: ls.Type == LastToken}, nil
}

func (l *tokenPick) outShape() []int                                     { return []int{l.D} }
func (l *tokenPick) newState(maxB, workers int, needDin bool) layerState { return l }

// position returns the position example i takes.
func (l *tokenPick) position(p *pass, i int) int {
	if l.last {
		ids := p.ids[i*l.T : (i+1)*l.T]
		for t := l.T - 1; t >= 0; t-- {
			if ids[t] >= 0 {
				return t
			}
		}
	}
	return 0
}

func (l *tokenPick) forward(p *pass, w, in, out []float32) {
	T, D := l.T, l.D
	for i := 0; i < p.B; i++ {
		t := l.position(p, i)
		copy(out[i*D:(i+1)*D], in[(i*T+t)*D:(i*T+t+1)*D])
	}
}

func (l *tokenPick) backward(p *pass, w, in, out, dout, din []float32) {
	if din == nil {
		return
	}
	T, D := l.T, l.D
	for i := 0; i < p.B; i++ {
		dx := din[i*T*D : (i+1)*T*D]
		clear(dx)
		t := l.position(p, i)
		copy(dx[t*D:(t+1)*D], dout[i*D:(i+1)*D])
	}
}
