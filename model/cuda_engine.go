//go:build cuda

package model

import (
	"errors"
	"fmt"
	"math"

	"gorgonia.org/cu"

	"github.com/dpcluster/dpcluster/dataset"
)

// The CUDA engine: a node's whole ClippedSum on an NVIDIA GPU through the
// driver API (gorgonia.org/cu). Built only with -tags cuda: the cu package's
// init calls cuInit and exits the process when no driver is present, so the
// default build never links it. Kernels are in kernels/cuda_kernels.cu,
// shipped as PTX (kernels/cuda_kernels.ptx, embedded by package kernels)
// that the driver compiles for the device at load time: the binary needs
// libcuda.so.1 from the NVIDIA driver and no CUDA toolkit or cuBLAS at run
// time, whatever CUDA version built it. The device, its context and kernel
// table are in cuda_device.go, launches and the GEMM kernels' selection in
// cuda_launch.go, each layer's device steps in cuda_layers.go, the staging
// of θ and the sum in cuda_staging.go; this file has the engine's passes
// and its entry points (ClippedSum, ClippedSumIndexed, MeanGrad, Evaluate).
//
// What runs where. θ, the batch and every activation and output gradient
// live in device buffers allocated once per engine. Per call the host
// uploads θ and the batch; the device runs the forward and backward passes,
// the per-example sums of squares that the bounds are made of, the clip
// scaling and the weighted sum; the host downloads 2 float64 per example
// and linear layer (the sums of squares), turns them into clip factors with
// the CPU engine's own bound formulas and clip rule (linear.boundExample,
// clipFactor: the rule stays in one place), uploads the B factors, and
// downloads the d-vector sum. The GPU's accGrad has the CPU's structure
// (float32 sums over blocks of blockRows rows, added in float64), so the
// CPU's error bound holds for it verbatim; see kernels/cuda_kernels.cu.

// cudaEngine computes ClippedSum on the device for models made of the
// layers it has kernels for: every layer of the CPU engine (linear, relu,
// tanh, flatten, conv2d, maxpool, avgpool, embeddingbag, layernorm, and
// the sequence layers of cuda_seq.go: embedding, linear and layernorm at
// T positions, attention, meanpool, residual blocks, the next-token loss)
// except a residual block nested in another.
type cudaEngine struct {
	d    *cudaDevice
	m    *Model
	maxB int

	act, grad []cu.DevicePtr  // as Workspace's; a flatten with c = 1 aliases its input
	lb        []cudaLayerBufs // per layer: what the CPU keeps in the layer's state
	xs        cu.DevicePtr    // input staging when it is permuted to channels-last
	theta     cu.DevicePtr    // float32 × NumParams
	dst       cu.DevicePtr    // float32 × NumParams: the result
	acc       cu.DevicePtr    // float64 × NumParams: the accumulator across chunks
	y         cu.DevicePtr    // int32 × maxB
	coef      cu.DevicePtr    // float32 × maxB
	stats     cu.DevicePtr    // float64 × nstat·maxB: per-example sums the bounds take
	loss      cu.DevicePtr    // float64 × maxB
	correct   cu.DevicePtr    // int32 × maxB
	flags     cu.DevicePtr    // int32 × 2: θ not finite, sum not finite
	scratch   cu.DevicePtr    // float32: accGrad's block products
	bufs      []cu.DevicePtr

	// The units: the model's layers with each residual block flattened
	// into its nested layers between two edges (cudaChain); for a model
	// without residual blocks, exactly its layers. act, grad, lb,
	// statOff and needDin are indexed by unit.
	ly        []cudaUnit
	off, size []int     // per unit: its parameters' offset and count in θ
	src       []cudaSrc // per unit: where it is in the model
	params    []int     // indices of the parameter units
	statOff   []int     // per unit: its first row of stats (statRows rows of maxB)
	permuteIn bool
	needDin   []bool
	emb       *cudaEmbedHost // the embedding bag's host-side index, if any
	seq       *cudaSeqHost   // a sequence model's host side: token index, targets
	stage     *stager        // page-locked staging of θ and the sum (nil: direct copies), made on first use
	staged    bool           // whether stage has been made (or refused)
	host      []pinned       // the page-locked buffers AllocHost handed out

	// host mirrors
	hstats  []float64
	bounds  clipBounds
	hcoef   []float32
	hloss   []float64
	hcorr   []int32
	hflags  []int32
	gx      []float32
	gy      []int32
	zeroFlg []int32
	closed  bool
}

func (d *cudaDevice) NewEngine(m *Model, maxBatch int) (Engine, error) {
	return d.newEngine(m, maxBatch)
}

func (d *cudaDevice) newEngine(m *Model, maxBatch int) (*cudaEngine, error) {
	if maxBatch < 1 {
		return nil, fmt.Errorf("%w: max batch %d < 1", ErrShape, maxBatch)
	}
	if err := cudaSupports(m); err != nil {
		return nil, err
	}
	units, off, size, src := cudaChain(m)
	L := len(units)
	// A NextToken model has a loss and a correct flag per position.
	nl := maxBatch * max(m.seqT, 1)
	e := &cudaEngine{d: d, m: m, maxB: maxBatch, act: make([]cu.DevicePtr, L+1), grad: make([]cu.DevicePtr, L+1),
		ly: units, off: off, size: size, src: src,
		lb: make([]cudaLayerBufs, L), statOff: make([]int, L), needDin: make([]bool, L), bounds: newClipBounds(maxBatch),
		hcoef: make([]float32, maxBatch), hloss: make([]float64, nl), hcorr: make([]int32, nl),
		hflags: make([]int32, 2), zeroFlg: make([]int32, 2)}
	e.permuteIn = len(m.inShape) == 3 && m.inShape[0] > 1
	nstat := 0
	for l, ly := range e.ly {
		e.statOff[l] = nstat
		if e.size[l] > 0 {
			e.params = append(e.params, l)
			nstat += statRows(ly)
		}
		switch ly := ly.(type) {
		case *embedBag:
			e.emb = newCUDAEmbedHost(ly, maxBatch)
		case *seqEmbed:
			e.seq = newCUDASeqHost(m, ly, maxBatch)
		}
	}
	if e.seq == nil && m.seqT > 0 {
		return nil, fmt.Errorf("%w: loss %s without an embedding first", ErrUnsupportedLayer, m.spec.Loss)
	}
	e.hstats = make([]float64, nstat*maxBatch)
	err := d.do(func() error {
		a := func(p *cu.DevicePtr, n int) error {
			var err error
			if *p, err = alloc(n); err == nil {
				e.bufs = append(e.bufs, *p)
			}
			return err
		}
		P := m.numParams
		errs := []error{a(&e.theta, 4*P), a(&e.dst, 4*P), a(&e.acc, 8*P), a(&e.y, 4*maxBatch),
			a(&e.coef, 4*maxBatch), a(&e.stats, 8*max(len(e.hstats), 1)), a(&e.loss, 8*nl),
			a(&e.correct, 4*nl), a(&e.flags, 8), a(&e.act[0], 4*maxBatch*m.inSize)}
		if e.seq != nil {
			errs = append(errs, e.seq.alloc(a))
		}
		if e.permuteIn {
			errs = append(errs, a(&e.xs, 4*maxBatch*m.inSize))
		}
		errs = append(errs, a(&e.scratch, 4*e.scratchSize()))
		if err := errors.Join(errs...); err != nil {
			return err
		}
		// grad[0] is never computed, but a first flatten with c = 1 aliases
		// its output gradient to it.
		if err := a(&e.grad[0], 4*maxBatch*m.inSize); err != nil {
			return err
		}
		paramBelow := false
		for l, ly := range e.ly {
			e.needDin[l] = paramBelow
			if e.size[l] > 0 {
				paramBelow = true
			}
			if err := e.allocLayer(l, a); err != nil {
				return err
			}
			if f, ok := ly.(*flatten); ok && f.c == 1 {
				// A copy on the CPU; here its output is its input, and its
				// input gradient its output gradient.
				e.act[l+1], e.grad[l+1] = e.act[l], e.grad[l]
				continue
			}
			n := 4 * maxBatch * shapeSize(ly.outShape())
			if _, ok := ly.(*cudaResStart); ok {
				// A residual block's nested layers start from its input.
				e.act[l+1] = e.act[l]
				if err := a(&e.grad[l+1], n); err != nil {
					return err
				}
				continue
			}
			if err := errors.Join(a(&e.act[l+1], n), a(&e.grad[l+1], n)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

func (e *cudaEngine) MaxBatch() int { return e.maxB }

func (e *cudaEngine) Close() error {
	if e.closed {
		return nil
	}
	e.closed = true
	return e.d.do(func() error {
		var errs []error
		for _, p := range e.bufs {
			errs = append(errs, cu.MemFree(p))
		}
		e.bufs = nil
		if e.stage != nil {
			errs = append(errs, e.stage.close())
			e.stage = nil
		}
		for _, p := range e.host {
			errs = append(errs, p.free())
		}
		e.host = nil
		return errors.Join(errs...)
	})
}

func (e *cudaEngine) linParams(l int) (w, b cu.DevicePtr, O, K int) {
	ly := e.ly[l].(*linear)
	off := e.off[l]
	return off4(e.theta, off), off4(e.theta, off+ly.out*ly.in), ly.out, ly.in
}

// load uploads a batch (checked) into act[0] and y.
func (e *cudaEngine) load(x []float32, y []int32) error {
	m := e.m
	B := len(y)
	if err := htod(e.y, y); err != nil {
		return err
	}
	if e.seq != nil {
		return e.seq.load(e, x, B)
	}
	if e.emb != nil {
		if err := e.emb.index(e, x, B); err != nil {
			return err
		}
	}
	if !e.permuteIn {
		return htod(e.act[0], x)
	}
	if err := htod(e.xs, x); err != nil {
		return err
	}
	c, hw := m.inShape[0], m.inShape[1]*m.inShape[2]
	return launch1(e.d.k.permute, B*m.inSize, i32(B), i32(c), i32(hw), i32(0), ptr(e.xs), ptr(e.act[0]))
}

func actKind(a *activation) int {
	if a.kind == Tanh {
		return 1
	}
	return 0
}

func (e *cudaEngine) forward(B int) error {
	k := &e.d.k
	for l, ly := range e.ly {
		in, out := e.act[l], e.act[l+1]
		switch ly := ly.(type) {
		case *linear:
			w, b, O, K := e.linParams(l)
			if err := e.d.sgemm(false, true, B, O, K, 1, in, K, w, K, 0, out, O); err != nil {
				return err
			}
			if err := launch1(k.biasAdd, B*O, i32(B), i32(O), ptr(out), ptr(b)); err != nil {
				return err
			}
		case *activation:
			if err := launch1(k.actFwd, B*ly.n, sz(B*ly.n), i32(actKind(ly)), ptr(in), ptr(out)); err != nil {
				return err
			}
		case *flatten:
			if ly.c == 1 {
				continue // aliased
			}
			if err := launch1(k.permute, B*ly.n, i32(B), i32(ly.c), i32(ly.hw), i32(1), ptr(in), ptr(out)); err != nil {
				return err
			}
		default:
			if err := e.layerForward(l, B); err != nil {
				return err
			}
		}
	}
	return nil
}

func (e *cudaEngine) backward(B int) error {
	k := &e.d.k
	for l := len(e.ly) - 1; l >= 0; l-- {
		if !e.needDin[l] {
			continue
		}
		out, dout, din := e.act[l+1], e.grad[l+1], e.grad[l]
		switch ly := e.ly[l].(type) {
		case *linear:
			w, _, O, K := e.linParams(l)
			if err := e.d.sgemm(false, false, B, K, O, 1, dout, O, w, K, 0, din, K); err != nil {
				return err
			}
		case *activation:
			if err := launch1(k.actBwd, B*ly.n, sz(B*ly.n), i32(actKind(ly)), ptr(out), ptr(dout), ptr(din)); err != nil {
				return err
			}
		case *flatten:
			if ly.c == 1 {
				continue // aliased
			}
			if err := launch1(k.permute, B*ly.n, i32(B), i32(ly.c), i32(ly.hw), i32(0), ptr(dout), ptr(din)); err != nil {
				return err
			}
		default:
			if err := e.layerBackward(l, B); err != nil {
				return err
			}
		}
	}
	return nil
}

// ClippedSum is Workspace.ClippedSum on the device.
func (e *cudaEngine) ClippedSum(dst, theta, x []float32, y []int32, clip float64) (int, error) {
	if err := e.checkArgs(dst, theta, clip); err != nil {
		return 0, err
	}
	if err := e.m.checkBatch(e.maxB, dst, theta, x, y); err != nil {
		return 0, err
	}
	if len(y) == 0 {
		clear(dst)
		return 0, nil
	}
	err := e.d.do(func() error {
		if err := e.begin(theta); err != nil {
			return err
		}
		if err := e.chunk(x, y, clip, true, true); err != nil {
			return err
		}
		return e.finish(dst)
	})
	return len(y), err
}

// ClippedSumIndexed is Workspace.ClippedSumIndexed on the device: chunks of
// MaxBatch rows, their sums added in the device's float64 accumulator.
func (e *cudaEngine) ClippedSumIndexed(dst, theta []float32, d *dataset.Dataset, idx []int, clip float64) (int, error) {
	m := e.m
	if err := m.CheckDataset(d); err != nil {
		return 0, err
	}
	for _, i := range idx {
		if i < 0 || i >= d.Len() {
			return 0, fmt.Errorf("%w: index %d outside dataset %q of %d rows", ErrShape, i, d.Name, d.Len())
		}
	}
	if err := e.checkArgs(dst, theta, clip); err != nil {
		return 0, err
	}
	if len(idx) == 0 {
		clear(dst)
		return 0, nil
	}
	if e.gx == nil {
		e.gx = make([]float32, e.maxB*m.inSize)
		e.gy = make([]int32, e.maxB)
	}
	err := e.d.do(func() error {
		if err := e.begin(theta); err != nil {
			return err
		}
		for lo := 0; lo < len(idx); lo += e.maxB {
			chunk := idx[lo:min(lo+e.maxB, len(idx))]
			d.Gather(e.gx, e.gy, chunk)
			x, y := e.gx[:len(chunk)*m.inSize], e.gy[:len(chunk)]
			if err := m.checkBatch(e.maxB, nil, theta, x, y); err != nil {
				return err
			}
			if err := e.chunk(x, y, clip, lo == 0, lo+e.maxB >= len(idx)); err != nil {
				return err
			}
		}
		return e.finish(dst)
	})
	if err != nil {
		return 0, err
	}
	return len(idx), nil
}

// checkArgs is checkClipped without the batch and without θ's finiteness,
// which the device checks (begin, finish).
func (e *cudaEngine) checkArgs(dst, theta []float32, clip float64) error {
	if e.closed {
		return fmt.Errorf("%w: engine closed", ErrNoDevice)
	}
	if dst == nil {
		return fmt.Errorf("%w: nil dst", ErrShape)
	}
	if err := CheckClipNorm(clip); err != nil {
		return err
	}
	if len(theta) != e.m.numParams {
		return fmt.Errorf("%w: theta has %d values, model has %d parameters", ErrShape, len(theta), e.m.numParams)
	}
	if len(dst) != e.m.numParams {
		return fmt.Errorf("%w: dst has %d values, model has %d parameters", ErrShape, len(dst), e.m.numParams)
	}
	return nil
}

// begin uploads θ and flags it if not finite.
func (e *cudaEngine) begin(theta []float32) error {
	if err := htod(e.flags, e.zeroFlg); err != nil {
		return err
	}
	up := htod[float32]
	if s := e.stager(theta); s != nil {
		up = s.upload
	}
	if err := up(e.theta, theta); err != nil {
		return err
	}
	return launch1(e.d.k.nonfinite, len(theta), sz(len(theta)), ptr(e.theta), ptr(e.flags))
}

// chunk adds the clipped sum of one batch (checked, not empty) to the
// accumulator, or, if final, writes the float32 total into the device's
// dst: ClippedSum's algorithm (workspace.go), step for step.
func (e *cudaEngine) chunk(x []float32, y []int32, clip float64, fresh, final bool) error {
	B := len(y)
	if err := e.load(x, y); err != nil {
		return err
	}
	if err := e.forward(B); err != nil {
		return err
	}
	if err := e.lossGrad(B, e.grad[len(e.ly)], 1); err != nil {
		return err
	}
	if err := e.backward(B); err != nil {
		return err
	}
	// Per-example sums that each parameter layer's bound takes (for a
	// linear layer, the sums of squares of its input and output gradient:
	// bound.go's sumSq, in float64 on the device).
	for _, l := range e.params {
		if err := e.layerStats(l, B); err != nil {
			return err
		}
	}
	if err := dtoh(e.hstats, e.stats); err != nil {
		return fmt.Errorf("model: cuda: computing the batch: %w", err)
	}
	b := e.bounds
	b.reset(B)
	for _, l := range e.params {
		e.layerBound(l, B, b)
	}
	coef := e.hcoef[:B]
	for i := range coef {
		coef[i] = clipFactor(b.sq[i], b.share[i], b.floor[i], clip)
	}
	if err := htod(e.coef, coef); err != nil {
		return err
	}
	for _, l := range e.params {
		// clearExample for c = 0, scaling the output gradient rows by
		// c < 1, then the layer's accGrad.
		if err := e.layerClip(l, B); err != nil {
			return err
		}
		if err := e.layerAccGrad(l, B, fresh, final); err != nil {
			return err
		}
	}
	return nil
}

// accGrad adds a linear layer's weight gradient Dᵀ·A (D: rows×O output
// gradients, A: rows×K inputs, both already scaled by the clip factors) to
// the sum at parameter offset off, as linear.accGrad does on the CPU:
// float32 products over blocks of blockRows rows (up to maxBlockGroup of
// them at once, into the scratch buffer), each block's product added into
// the float64 accumulator in block order (blocks_put), which put32's rule
// (fresh, final) rounds into dst at the end. One block in a call that is
// both fresh and final is written into dst directly, as on the CPU. A
// convolution's weight (c > 0 channels, kk kernel positions; rows are
// output positions) is summed in its internal order and put in the public
// one.
func (e *cudaEngine) accGrad(O, K, rows int, D, A cu.DevicePtr, off int, fresh, final bool, c, kk int) error {
	nb := (rows + blockRows - 1) / blockRows
	if fresh && final && nb == 1 && c == 0 {
		return e.d.sgemm(true, false, O, K, rows, 1, D, O, A, K, 0, off4(e.dst, off), K)
	}
	for g := 0; g < nb; g += maxBlockGroup {
		nz := min(maxBlockGroup, nb-g)
		r0 := g * blockRows
		n := min(rows-r0, nz*blockRows)
		if err := e.d.sgemmBlocks(true, false, O, K, n, blockRows, O*K, 1, off4(D, r0*O), O, off4(A, r0*K), K, 0, e.scratch, K); err != nil {
			return err
		}
		if err := launch1(e.d.k.blocksPut, O*K, sz(O*K), i32(nz), ptr(e.scratch), ptr(off8(e.acc, off)), ptr(off4(e.dst, off)),
			flag(fresh && g == 0), flag(final && g+nz >= nb), i32(c), i32(kk)); err != nil {
			return err
		}
	}
	return nil
}

// finish flags a non-finite sum and downloads the result.
func (e *cudaEngine) finish(dst []float32) error {
	n := e.m.numParams
	if err := launch1(e.d.k.nonfinite, n, sz(n), ptr(e.dst), ptr(off4(e.flags, 1))); err != nil {
		return err
	}
	down := dtoh[float32]
	if s := e.stager(dst); s != nil {
		down = s.download
	}
	if err := down(dst, e.dst); err != nil {
		return fmt.Errorf("model: cuda: computing the sum: %w", err)
	}
	if err := dtoh(e.hflags, e.flags); err != nil {
		return err
	}
	if e.hflags[0] != 0 {
		return fmt.Errorf("%w: in the parameters", ErrNonFinite)
	}
	if e.hflags[1] != 0 {
		return fmt.Errorf("%w: in the clipped sum", ErrNonFinite)
	}
	return nil
}

// MeanGrad is Workspace.MeanGrad on the device: the non-private baseline.
func (e *cudaEngine) MeanGrad(dst, theta, x []float32, y []int32) (float64, error) {
	if dst == nil {
		return 0, fmt.Errorf("%w: nil dst", ErrShape)
	}
	if err := e.m.checkBatch(e.maxB, dst, theta, x, y); err != nil {
		return 0, err
	}
	B := len(y)
	if B == 0 {
		return 0, fmt.Errorf("%w: empty batch has no mean gradient", ErrShape)
	}
	var loss float64
	err := e.d.do(func() error {
		if err := e.begin(theta); err != nil {
			return err
		}
		if err := e.load(x, y); err != nil {
			return err
		}
		if err := e.forward(B); err != nil {
			return err
		}
		if err := e.lossGrad(B, e.grad[len(e.ly)], 1/float32(B)); err != nil {
			return err
		}
		if err := e.backward(B); err != nil {
			return err
		}
		for _, l := range e.params {
			if err := e.layerParamGrad(l, B); err != nil {
				return err
			}
		}
		if err := e.finish(dst); err != nil {
			return err
		}
		var r cudaLoss
		if err := e.batchLoss(B, false, &r); err != nil {
			return err
		}
		loss = r.mean
		return nil
	})
	if err != nil {
		return 0, err
	}
	loss /= float64(B)
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return 0, fmt.Errorf("%w: in the mean gradient", ErrNonFinite)
	}
	return loss, nil
}

// Evaluate is Workspace.Evaluate on the device (forward passes only).
func (e *cudaEngine) Evaluate(theta, x []float32, y []int32) (Evaluation, error) {
	m := e.m
	d := m.inSize
	if len(x) != len(y)*d {
		return Evaluation{}, fmt.Errorf("%w: x has %d values, want %d examples × %d", ErrShape, len(x), len(y), d)
	}
	if len(y) == 0 {
		return Evaluation{}, nil
	}
	var r cudaLoss
	err := e.d.do(func() error {
		if err := e.begin(theta); err != nil {
			return err
		}
		for lo := 0; lo < len(y); lo += e.maxB {
			hi := min(lo+e.maxB, len(y))
			xb, yb := x[lo*d:hi*d], y[lo:hi]
			if err := m.checkBatch(e.maxB, nil, theta, xb, yb); err != nil {
				return err
			}
			B := hi - lo
			if err := e.load(xb, yb); err != nil {
				return err
			}
			if err := e.forward(B); err != nil {
				return err
			}
			if err := e.lossGrad(B, 0, 0); err != nil {
				return err
			}
			if err := e.batchLoss(B, true, &r); err != nil {
				return err
			}
		}
		if err := dtoh(e.hflags, e.flags); err != nil {
			return err
		}
		if e.hflags[0] != 0 {
			return fmt.Errorf("%w: in the parameters", ErrNonFinite)
		}
		return nil
	})
	if err != nil {
		return Evaluation{}, err
	}
	loss := r.total
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return Evaluation{}, fmt.Errorf("%w: evaluation loss", ErrNonFinite)
	}
	n := float64(len(y))
	if m.seqT > 0 {
		n = float64(max(r.tokens, 1))
	}
	return Evaluation{Loss: loss / n, Accuracy: float64(r.correct) / n, N: len(y), Tokens: r.tokens}, nil
}
