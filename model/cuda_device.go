//go:build cuda

package model

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"

	"gorgonia.org/cu"

	"github.com/dpcluster/dpcluster/model/kernels"
)

// The CUDA device: one GPU's context, the kernels' module loaded into it
// and the kernel table (the engine is in cuda_engine.go).

func init() { cudaOpen = openCUDA }

// minComputeCapability is what the PTX targets (compute_80).
const minComputeCapability = 80

// cudaDevice is one GPU with its own context and loaded module. All work
// on it is serialized by mu, on an OS thread with the context current.
type cudaDevice struct {
	mu     sync.Mutex
	ctx    cu.CUContext
	mod    cu.Module
	k      cudaKernels
	info   DeviceInfo
	closed bool
}

// cudaKernels is the kernel table of one loaded module: every kernel of
// kernels/cuda_kernels.cu the engine launches.
type cudaKernels struct {
	sgemm                                                  [4]cu.Function // nn, nt, tn, tt: 64×64 tiles
	sgemm128                                               [3]cu.Function // nn, nt, tn: 128×128 tiles
	sgemm128v, sgemm128w                                   [3]cu.Function // vectorized, k-slabs of 8 and 16
	blocksPut, colsumPut, biasAdd, actFwd, actBwd, permute cu.Function
	softmaxXent, rowSumsq, clipRows, nonfinite             cu.Function
	// the layers of cuda_layers.go
	convIm2col, convCol2im, convPermute, convRows, convBiasn cu.Function
	convGhost, convPergrad, convGsum, poolFwd, poolBwd       cu.Function
	embedFwd, embedAcc, lnFwd, lnBwd, lnStats, lnAcc         cu.Function
	// the sequence layers of cuda_seq.go
	seqEmbedFwd, seqEmbedStats, seqLnStats, attnFwd, attnBwdQ cu.Function
	attnBwdKV, meanPoolFwd, meanPoolBwd, add2, tokenXent      cu.Function
}

// openCUDA opens GPU ordinal: it checks the compute capability, creates
// the device's context, loads the PTX and looks up its kernels.
func openCUDA(ordinal int) (Device, error) {
	n, err := cu.NumDevices()
	if err != nil {
		return nil, fmt.Errorf("%w: cuda:%d: %v", ErrNoDevice, ordinal, err)
	}
	if ordinal >= n {
		return nil, fmt.Errorf("%w: cuda:%d: the driver sees %d device(s)", ErrNoDevice, ordinal, n)
	}
	dev, err := cu.GetDevice(ordinal)
	if err != nil {
		return nil, fmt.Errorf("%w: cuda:%d: %v", ErrNoDevice, ordinal, err)
	}
	name, err := dev.Name()
	if err != nil {
		return nil, fmt.Errorf("%w: cuda:%d: name: %v", ErrNoDevice, ordinal, err)
	}
	mem, err := dev.TotalMem()
	if err != nil {
		return nil, fmt.Errorf("%w: cuda:%d: memory: %v", ErrNoDevice, ordinal, err)
	}
	major, err1 := dev.Attribute(cu.ComputeCapabilityMajor)
	minor, err2 := dev.Attribute(cu.ComputeCapabilityMinor)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("%w: cuda:%d: compute capability: %v", ErrNoDevice, ordinal, err)
	}
	if major*10+minor < minComputeCapability {
		return nil, fmt.Errorf("%w: cuda:%d (%s) has compute capability %d.%d; the kernels need %d.%d or newer",
			ErrNoDevice, ordinal, name, major, minor, minComputeCapability/10, minComputeCapability%10)
	}
	d := &cudaDevice{info: DeviceInfo{ID: "cuda:" + strconv.Itoa(ordinal), Name: name, MemoryBytes: mem,
		ComputeCapability: fmt.Sprintf("%d.%d", major, minor)}}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if d.ctx, err = dev.MakeContext(cu.SchedAuto); err != nil {
		return nil, fmt.Errorf("%w: cuda:%d: context: %v", ErrNoDevice, ordinal, err)
	}
	fail := func(what string, err error) (Device, error) {
		d.ctx.Destroy()
		return nil, fmt.Errorf("%w: cuda:%d: %s: %v", ErrNoDevice, ordinal, what, err)
	}
	if d.mod, err = cu.LoadData(kernels.PTX()); err != nil {
		return fail("loading the kernels (PTX)", err)
	}
	if kname, err := d.k.load(d.mod); err != nil {
		return fail("kernel "+kname, err)
	}
	if _, err := cu.PopCurrentCtx(); err != nil {
		return fail("pop context", err)
	}
	return d, nil
}

// load looks up every kernel of the module mod (the PTX of package
// kernels), by its name in kernels/cuda_kernels.cu. On failure it returns
// the name of the kernel it could not find.
func (k *cudaKernels) load(mod cu.Module) (string, error) {
	fns := []struct {
		f    *cu.Function
		name string
	}{
		{&k.sgemm[0], "sgemm_nn"}, {&k.sgemm[1], "sgemm_nt"}, {&k.sgemm[2], "sgemm_tn"}, {&k.sgemm[3], "sgemm_tt"},
		{&k.sgemm128[0], "sgemm128_nn"}, {&k.sgemm128[1], "sgemm128_nt"}, {&k.sgemm128[2], "sgemm128_tn"},
		{&k.sgemm128v[0], "sgemm128v_nn"}, {&k.sgemm128v[1], "sgemm128v_nt"}, {&k.sgemm128v[2], "sgemm128v_tn"},
		{&k.sgemm128w[0], "sgemm128w_nn"}, {&k.sgemm128w[1], "sgemm128w_nt"}, {&k.sgemm128w[2], "sgemm128w_tn"},
		{&k.blocksPut, "blocks_put"}, {&k.colsumPut, "colsum_put"}, {&k.biasAdd, "bias_add"},
		{&k.actFwd, "act_fwd"}, {&k.actBwd, "act_bwd"}, {&k.permute, "permute"},
		{&k.softmaxXent, "softmax_xent"}, {&k.rowSumsq, "row_sumsq"}, {&k.clipRows, "clip_rows"},
		{&k.nonfinite, "nonfinite"},
		{&k.convIm2col, "conv_im2col"}, {&k.convCol2im, "conv_col2im"}, {&k.convPermute, "conv_permute"},
		{&k.convRows, "conv_rows"}, {&k.convBiasn, "conv_biasn"}, {&k.convGhost, "conv_ghost"},
		{&k.convPergrad, "conv_pergrad"}, {&k.convGsum, "conv_gsum"}, {&k.poolFwd, "pool_fwd"},
		{&k.poolBwd, "pool_bwd"}, {&k.embedFwd, "embed_fwd"}, {&k.embedAcc, "embed_acc"},
		{&k.lnFwd, "ln_fwd"}, {&k.lnBwd, "ln_bwd"}, {&k.lnStats, "ln_stats"}, {&k.lnAcc, "ln_acc"},
		{&k.seqEmbedFwd, "seq_embed_fwd"}, {&k.seqEmbedStats, "seq_embed_stats"}, {&k.seqLnStats, "seq_ln_stats"},
		{&k.attnFwd, "attn_fwd"}, {&k.attnBwdQ, "attn_bwd_q"}, {&k.attnBwdKV, "attn_bwd_kv"},
		{&k.meanPoolFwd, "mean_pool_fwd"}, {&k.meanPoolBwd, "mean_pool_bwd"}, {&k.add2, "add2"},
		{&k.tokenXent, "token_xent"},
	}
	for _, f := range fns {
		var err error
		if *f.f, err = mod.Function(f.name); err != nil {
			return f.name, err
		}
	}
	return "", nil
}

func (d *cudaDevice) Info() DeviceInfo { return d.info }

// do runs fn with the device's context current on a locked OS thread,
// holding the device's lock.
func (d *cudaDevice) do(fn func() error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("%w: %s is closed", ErrNoDevice, d.info.ID)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cu.SetCurrentContext(d.ctx); err != nil {
		return fmt.Errorf("model: %s: set context: %w", d.info.ID, err)
	}
	return fn()
}

func (d *cudaDevice) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return d.ctx.Destroy() // unloads the module and frees what is left
}

// karg is a kernel argument, stored in a 64-bit slot (gorgonia.org/cu's
// Launch copies 8 bytes per argument; the driver reads the parameter's own
