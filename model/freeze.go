package model

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"path"
	"strings"
)

// Frozen layers. A spec may name the parameters that train
// (Spec.Trainable, Spec.Freeze); the others are frozen. Such a model's
// parameter vector theta holds the trainable parameters only, in the
// order of the full layout with the frozen ones left out, so everything
// that handles theta (the nodes' sums, the wire, the noise, the
// optimizer, the Raft log, snapshots) handles only them. The frozen
// values are given once (WithFrozen) and read in place by every
// workspace: a process holds one copy of them however many workspaces,
// or in-process nodes, share the model.
//
// The unit that trains or not is a leaf: a layer with its own kernels (a
// top-level layer, or a layer nested in a residual block). A pass reads
// a frozen leaf's parameters from the frozen values, computes no
// gradient for it (no bound, no sum), and propagates the loss gradient
// down only as far as the lowest trainable leaf: below it nothing needs
// it. Clipping is over the trainable gradient, which is all a node sends,
// so the sensitivity of the sum is C as before.

// leaf is one unit of parameters: its offset in the full layout, its
// offset in theta (-1 when frozen), its size in the full layout, and the
// size of its head, a leading part that is always frozen (a LoRA layer's
// base weight and bias; 0 for other layers). theta holds size − head
// values of a trainable leaf.
type leaf struct{ full, tau, size, head int }

// trained is the number of values the leaf has in theta when it trains.
func (lf leaf) trained() int { return lf.size - lf.head }

// errNoBase is returned when a model with frozen layers is used before
// its frozen values are given.
var errNoBase = fmt.Errorf("%w: the model freezes layers but has no frozen values (Model.WithFrozen)", ErrShape)

// planTrainable works out which leaves train (Spec.Trainable, Freeze)
// and theta's layout: m.params, numParams, leaves, tauOff and tauSize.
func (m *Model) planTrainable() error {
	s := m.spec
	for _, pats := range [][]string{s.Trainable, s.Freeze} {
		for _, p := range pats {
			if _, err := path.Match(p, ""); err != nil || p == "" {
				return fmt.Errorf("%w: pattern %q is not a path.Match pattern over parameter names", ErrInvalidSpec, p)
			}
		}
	}
	lora := false
	for _, ly := range m.layers {
		if r, ok := ly.(*residual); ok {
			for _, nl := range r.layers {
				_, isLoRA := nl.(*loraLinear)
				lora = lora || isLoRA
			}
		}
		_, isLoRA := ly.(*loraLinear)
		lora = lora || isLoRA
	}
	// With LoRA layers only their adapters train by default; their base
	// weights never do, and other layers only if Trainable names them.
	trains := func(name string, adapter bool) bool {
		ok := len(s.Trainable) == 0 && !lora || adapter
		for _, p := range s.Trainable {
			if match(p, name) {
				ok = true
			}
		}
		for _, p := range s.Freeze {
			if match(p, name) {
				ok = false
			}
		}
		return ok
	}
	for _, pats := range [][]string{s.Trainable, s.Freeze} {
		for _, p := range pats {
			hit := false
			for _, q := range m.full {
				hit = hit || match(p, q.Name)
			}
			if !hit {
				return fmt.Errorf("%w: pattern %q matches no parameter (names are like %q)", ErrInvalidSpec, p, m.full[0].Name)
			}
		}
	}
	m.leaves = make([][]leaf, len(m.layers))
	m.tauOff = make([]int, len(m.layers))
	m.tauSize = make([]int, len(m.layers))
	pi, tau := 0, 0
	for l, ly := range m.layers {
		type unit struct {
			ly        layer
			off, size int
		}
		units := []unit{{ly, m.layerOff[l], m.layerSize[l]}}
		if r, ok := ly.(*residual); ok {
			units = units[:0]
			for j, nl := range r.layers {
				units = append(units, unit{nl, m.layerOff[l] + r.off[j], r.size[j]})
			}
		}
		m.tauOff[l] = tau
		for _, u := range units {
			lf := leaf{full: u.off, tau: -1, size: u.size}
			if ll, ok := u.ly.(*loraLinear); ok {
				lf.head = ll.headSize()
				m.frozen = true
			}
			var on, off []string
			for ; pi < len(m.full) && m.full[pi].Offset < u.off+u.size; pi++ {
				if m.full[pi].Offset < u.off+lf.head {
					continue // a LoRA layer's base: frozen
				}
				if trains(m.full[pi].Name, lf.head > 0) {
					on = append(on, m.full[pi].Name)
				} else {
					off = append(off, m.full[pi].Name)
				}
			}
			switch {
			case lf.size == 0:
				lf.tau = tau // nothing to freeze: an empty part of theta
			case len(on) > 0 && len(off) > 0:
				return fmt.Errorf("%w: the trainable and freeze patterns split a layer: %s train but %s do not (a layer trains whole)",
					ErrInvalidSpec, strings.Join(on, ", "), strings.Join(off, ", "))
			case len(off) > 0:
				m.frozen = true
			case len(on) > 0:
				lf.tau = tau
				tau += lf.trained()
			}
			m.leaves[l] = append(m.leaves[l], lf)
		}
		m.tauSize[l] = tau - m.tauOff[l]
	}
	if tau == 0 {
		return fmt.Errorf("%w: the trainable and freeze patterns leave no parameter to train", ErrInvalidSpec)
	}
	m.numParams = tau
	m.params = m.params[:0]
	for _, p := range m.full {
		if t, ok := m.tauOf(p.Offset); ok {
			p.Offset = t
			m.params = append(m.params, p)
		}
	}
	return nil
}

// match is path.Match with its error (checked by planTrainable) dropped.
func match(pattern, name string) bool {
	ok, _ := path.Match(pattern, name)
	return ok
}

// tauOf maps an offset in the full layout to theta's, if it trains.
func (m *Model) tauOf(full int) (int, bool) {
	for _, ls := range m.leaves {
		for _, lf := range ls {
			if full >= lf.full && full < lf.full+lf.size {
				if lf.tau < 0 || full < lf.full+lf.head {
					return 0, false
				}
				return lf.tau + full - lf.full - lf.head, true
			}
		}
	}
	return 0, false
}

// Freezes reports whether some layer is frozen: theta then holds fewer
// values than the full parameter layout (NumFullParams), and the model
// computes only with the frozen values WithFrozen gives it.
func (m *Model) Freezes() bool { return m.frozen }

// NumFullParams returns the number of parameters of every layer, frozen
// ones included: NumParams unless the model freezes layers.
func (m *Model) NumFullParams() int { return m.numFull }

// FullParams returns the named tensor views of the full layout: every
// parameter, frozen or not, in order (Params lists the trainable ones,
// with their offsets in theta).
func (m *Model) FullParams() []ParamInfo {
	out := make([]ParamInfo, len(m.full))
	for i, p := range m.full {
		p.Shape = append([]int(nil), p.Shape...)
		out[i] = p
	}
	return out
}

// Trainable reports whether the named parameter trains.
func (m *Model) Trainable(name string) bool {
	for _, p := range m.params {
		if p.Name == name {
			return true
		}
	}
	return false
}

// WithFrozen returns the model computing with the frozen values of full,
// a vector in the full layout (NumFullParams values: a checkpoint, or an
// initialization) of which it keeps the frozen layers' values. It keeps
// full itself, not a copy: the caller must not change it afterwards. The
// frozen values must be finite. The returned model's Hash covers them
// (SHA-256 of their float32 bits in order), and Init copies theta₀'s
// trainable values from full.
func (m *Model) WithFrozen(full []float32) (*Model, error) {
	if !m.frozen {
		return nil, fmt.Errorf("%w: WithFrozen on a model that freezes no layer", ErrShape)
	}
	if len(full) != m.numFull {
		return nil, fmt.Errorf("%w: frozen values: %d, the full layout has %d", ErrShape, len(full), m.numFull)
	}
	h := sha256.New()
	h.Write([]byte(m.spec.hashOrEmpty()))
	var buf [4096]byte
	for _, ls := range m.leaves {
		for _, lf := range ls {
			v := full[lf.full : lf.full+lf.size] // a frozen leaf
			if lf.tau >= 0 {
				v = v[:lf.head] // a trainable leaf's frozen head
			}
			if !allFinite(v) {
				return nil, fmt.Errorf("%w: in the frozen values", ErrNonFinite)
			}
			for lo := 0; lo < len(v); lo += len(buf) / 4 {
				chunk := v[lo:min(lo+len(buf)/4, len(v))]
				for i, x := range chunk {
					binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
				}
				h.Write(buf[:4*len(chunk)])
			}
		}
	}
	c := *m
	c.base = full
	c.hash = hex.EncodeToString(h.Sum(nil))
	return &c, nil
}

// hashOrEmpty is the spec's hash, or "" if it cannot be encoded (plan
// has already hashed it, so that does not happen for a model's spec).
func (s Spec) hashOrEmpty() string {
	h, _ := s.Hash()
	return h
}

// Gather writes theta's values (the trainable parameters) from full, a
// vector in the full layout, into dst.
func (m *Model) Gather(dst, full []float32) error {
	if len(dst) != m.numParams || len(full) != m.numFull {
		return fmt.Errorf("%w: Gather of %d from %d values, want %d from %d", ErrShape, len(dst), len(full), m.numParams, m.numFull)
	}
	for _, ls := range m.leaves {
		for _, lf := range ls {
			if lf.tau >= 0 {
				copy(dst[lf.tau:lf.tau+lf.trained()], full[lf.full+lf.head:lf.full+lf.size])
			}
		}
	}
	return nil
}

// Merge writes the full parameter vector of theta into dst (NumFullParams
// values): the frozen values where layers are frozen, theta's elsewhere.
// It is what an export of a model that freezes layers writes.
func (m *Model) Merge(dst, theta []float32) error {
	if len(dst) != m.numFull || len(theta) != m.numParams {
		return fmt.Errorf("%w: Merge of %d into %d values, want %d into %d", ErrShape, len(theta), len(dst), m.numParams, m.numFull)
	}
	if m.frozen && m.base == nil {
		return errNoBase
	}
	for _, ls := range m.leaves {
		for _, lf := range ls {
			if lf.tau < 0 {
				copy(dst[lf.full:lf.full+lf.size], m.base[lf.full:lf.full+lf.size])
				continue
			}
			copy(dst[lf.full:lf.full+lf.head], m.base[lf.full:lf.full+lf.head])
			copy(dst[lf.full+lf.head:lf.full+lf.size], theta[lf.tau:lf.tau+lf.trained()])
		}
	}
	return nil
}

// leafParams returns leaf lf's parameters after its head: its part of
// theta, or of the frozen values.
func (m *Model) leafParams(theta []float32, lf leaf) []float32 {
	if lf.tau >= 0 {
		n := lf.trained()
		return theta[lf.tau : lf.tau+n : lf.tau+n]
	}
	return m.base[lf.full+lf.head : lf.full+lf.size : lf.full+lf.size]
}

// leafHead returns leaf lf's head in the frozen values (nil without one).
func (m *Model) leafHead(lf leaf) []float32 {
	if lf.head == 0 {
		return nil
	}
	return m.base[lf.full : lf.full+lf.head : lf.full+lf.head]
}

// errFrozenCUDA is the CUDA engine's refusal of a model with frozen
// layers: its kernels compute every layer's gradient.
var errFrozenCUDA = errors.New("frozen layers (the spec's trainable or freeze patterns) run on the CPU engines only: the CUDA engine computes every layer's gradient")
