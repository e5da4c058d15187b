package kcp

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/gdnkcp/gdnkcp/archdetect"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/gdnkcp/gdnkcp/sched"
)

// gpuD is the only head dim the GPU kernels take (K = V = 128).
const gpuD = 128

// gpuBlock is the block size of every GDN kernel and of the conv launch.
const gpuBlock = 256

// PoisonBF16x2 is the 32-bit pattern the GPU backend fills its bf16 output
// with before the output kernel runs: two bf16 quiet NaNs (0x7fc1), a payload
// no kernel computes (a NaN result rounds to the canonical 0x7fff), so an
// element still holding it was never written.
const PoisonBF16x2 = 0x7fc17fc1

// poisonBF16 is one bf16 half of PoisonBF16x2.
const poisonBF16 = 0x7fc1

// The kernel entries of ptx/src the GPU forward launches.
const (
	entryConv    = "gdn_conv1d_silu_fwd"
	entryPoison  = "gdn_poison_u32"
	entryL2Norm  = "gdn_l2norm_fwd"
	entryPrep    = "gdn_prep_fwd"
	entrySummary = "gdn_summary_walk"
	entryCompose = "gdn_compose_fwd"
	entryState   = "gdn_state_walk"
	entryOutput  = "gdn_output_fwd"
)

// Dynamic shared memory of the GDN forward kernels in bytes, as
// ptx/src/gdn_fwd.cu lays it out (kPrepSmem, walk_smem, kComposeSmem,
// kOutputSmem).
const (
	prepSmem    = 4 * (ChunkSize*gpuD + ChunkSize*ChunkSize + 4*ChunkSize) // 50176
	composeSmem = 4 * 2 * gpuD * 64                                        // 65536
	outputSmem  = 4 * (2*ChunkSize*gpuD + ChunkSize*ChunkSize + gpuD*gpuD + ChunkSize)
)

// walkSmem is the dynamic shared memory of a summary or state walk CTA at
// width vh: 114944 bytes at vh 64, 164096 at vh 128.
func walkSmem(vh int) int {
	return 4 * (gpuD*vh + ChunkSize*vh + 2*ChunkSize*gpuD + ChunkSize)
}

// The tensor-core variants (ptx/src/gdn_walk_tc.cu, gdn_chunk_tc.cu): the
// same arguments and grids as the fp32 kernels, other shared memory.
const (
	entryPrepTC    = "gdn_prep_tc"
	entrySummaryTC = "gdn_summary_walk_tc"
	entryStateTC   = "gdn_state_walk_tc"
	entryOutputTC  = "gdn_output_tc"

	// The tensor-core kernels pad their bf16 rows by 8 elements (gdn_chunk_tc.cu).
	padD, padC   = gpuD + 8, ChunkSize + 8
	prepTCSmem   = 2*2*ChunkSize*padD + 4*2*ChunkSize*ChunkSize + 2*2*ChunkSize*padC + 2*ChunkSize*padD + 4*2*ChunkSize         // 103936
	outputTCSmem = 2*4*ChunkSize*padD + 2*gpuD*padD + 4*ChunkSize*ChunkSize + 2*ChunkSize*padC + 4*ChunkSize*gpuD + 4*ChunkSize // 163072
)

// walkTCSmem is walk_tc_smem(vh): 150544 bytes at vh 64, 216080 at vh 128.
func walkTCSmem(vh int) int { return 768*(vh+8) + 256*(vh+4) + 4*ChunkSize*padD*2 + 8*256*4 + 16 }

// gpuEntry is a kernel the backend resolves and the most dynamic shared
// memory it launches it with.
type gpuEntry struct {
	name string
	smem int
}

// kernelSet names the kernels of the stages that have variants and their
// shared memory.
type kernelSet struct {
	prep, summary, state, output string
	prepSmem, outputSmem         int
	walkSmem                     func(vh int) int
}

// kernelSet returns the kernels the options select: the fp32 CUDA-core
// kernels of gdn_fwd.cu, or the tensor-core variants.
func (o GPUOptions) kernelSet() kernelSet {
	ks := kernelSet{entryPrep, entrySummary, entryState, entryOutput, prepSmem, outputSmem, walkSmem}
	if o.TensorCoreWalks {
		ks.summary, ks.state, ks.walkSmem = entrySummaryTC, entryStateTC, walkTCSmem
	}
	if o.TensorCoreChunk {
		ks.prep, ks.output, ks.prepSmem, ks.outputSmem = entryPrepTC, entryOutputTC, prepTCSmem, outputTCSmem
	}
	return ks
}

// entries lists every kernel a forward with this set launches, with the
// most dynamic shared memory it takes (walks at vh 128).
func (ks kernelSet) entries() []gpuEntry {
	return []gpuEntry{
		{entryConv, 0},
		{entryPoison, 0},
		{entryL2Norm, 0},
		{ks.prep, ks.prepSmem},
		{ks.summary, max(ks.walkSmem(64), ks.walkSmem(128))},
		{entryCompose, composeSmem},
		{ks.state, max(ks.walkSmem(64), ks.walkSmem(128))},
		{ks.output, ks.outputSmem},
	}
}

// GPUForwardEntries returns the kernel entries the GPU forward needs in a
// blob with the default (fp32) kernels, in launch order of a module-stage
// forward.
func GPUForwardEntries() []string {
	var out []string
	for _, e := range (GPUOptions{}).kernelSet().entries() {
		out = append(out, e.name)
	}
	return out
}

// missingEntries lists the entries of es that blob b lacks.
func missingEntries(b *ptx.Blob, es []gpuEntry) []string {
	var miss []string
	for _, e := range es {
		if _, ok := b.Entry(e.name); !ok {
			miss = append(miss, e.name)
		}
	}
	return miss
}

// ErrMissingKernels is wrapped by the error of ProbeGPU and NewGPU when the
// chosen blob lacks kernel entries the backend launches (blobs built before
// the kernels were added).
var ErrMissingKernels = errors.New("kcp: gpu: the blob lacks kernel entries")

// ProbeGPU reports whether GPU device can run the GPU backend without loading
// anything: it detects the device (archdetect.Detect with the given blob
// override; empty: GDNKCP_BLOB or the automatic choice) and checks that the
// chosen blob has every entry of GPUForwardEntries. It returns the profile,
// or an error that wraps loader.ErrNoDriver when there is no driver, and one
// that wraps ErrMissingKernels and names the entries when the blob predates
// the GDN kernels.
func ProbeGPU(device int, blob string) (*archdetect.Profile, error) {
	return probeGPU(device, blob, GPUOptions{}.kernelSet().entries())
}

func probeGPU(device int, blob string, es []gpuEntry) (*archdetect.Profile, error) {
	p, err := archdetect.Detect(device, archdetect.Options{Blob: blob})
	if err != nil {
		return nil, fmt.Errorf("kcp: gpu: %w", err)
	}
	if miss := missingEntries(p.Blob, es); len(miss) > 0 {
		return nil, fmt.Errorf("%w: blob %s (%s) lacks %s: the embedded blobs predate these kernels; rebuild them from ptx/src with tools/ptxgen",
			ErrMissingKernels, p.Target, p.Blob.File, strings.Join(miss, ", "))
	}
	return p, nil
}

// GPUOptions configure the GPU backend.
type GPUOptions struct {
	// Options are the backend options shared with the CPU backend. A zero
	// Options.Profile takes the width profile of the detected GPU
	// (sched.NewProfile(variant, SMs)) rather than DefaultProfile.
	Options
	// Device is the CUDA device ordinal.
	Device int
	// Blob forces a blob slot, e.g. "compute_80" to run the portable PTX
	// path; empty: GDNKCP_BLOB, else the automatic choice.
	Blob string
	// KeepDevice keeps every rank's device buffers after Forward, in the
	// returned GPUForward (for a backward to come, and for inspection); the
	// caller then frees them with GPUForward.Close. Unset, Forward frees
	// them before it returns.
	KeepDevice bool
	// TensorCoreWalks launches the tensor-core summary and state walks
	// (gdn_summary_walk_tc, gdn_state_walk_tc) instead of the fp32 ones.
	TensorCoreWalks bool
	// TensorCoreChunk launches the tensor-core chunk prep and output
	// (gdn_prep_tc, gdn_output_tc) instead of the fp32 ones.
	TensorCoreChunk bool
}

// gpuDevice is a loaded blob on one device, shared by the GPU values made
// from one NewGPU through ForPlan and released when the last is closed.
type gpuDevice struct {
	mu      sync.Mutex
	refs    int
	profile *archdetect.Profile
	ks      kernelSet
	ctx     *loader.Context
	kernels *archdetect.Kernels
	fn      map[string]*loader.Function
}

// openGPUDevice detects device, loads the blob and resolves every entry with
// its shared-memory limit. On error everything it made is released.
func openGPUDevice(device int, blob string, ks kernelSet) (d *gpuDevice, err error) {
	prof, err := probeGPU(device, blob, ks.entries())
	if err != nil {
		return nil, err
	}
	ctx, err := loader.Primary(prof.Ordinal)
	if err != nil {
		return nil, fmt.Errorf("kcp: gpu: device %d: %w", prof.Ordinal, err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, ctx.Close())
		}
	}()
	k, err := archdetect.Load(ctx, ptx.Default(), prof)
	if err != nil {
		return nil, fmt.Errorf("kcp: gpu: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, k.Close())
		}
	}()
	d = &gpuDevice{refs: 1, profile: prof, ks: ks, ctx: ctx, kernels: k, fn: map[string]*loader.Function{}}
	for _, e := range ks.entries() {
		f, err := k.Function(e.name)
		if err != nil {
			return nil, fmt.Errorf("kcp: gpu: blob %s: entry %s: %w", prof.Target, e.name, err)
		}
		if e.smem > 0 {
			if prof.SharedOptin > 0 && e.smem > prof.SharedOptin {
				return nil, fmt.Errorf("kcp: gpu: %s needs %d bytes of shared memory per block, device %d (%s) allows %d",
					e.name, e.smem, prof.Ordinal, prof.Name, prof.SharedOptin)
			}
			if err := f.SetMaxDynamicSharedMemory(e.smem); err != nil {
				return nil, fmt.Errorf("kcp: gpu: %s: allow %d bytes of dynamic shared memory: %w", e.name, e.smem, err)
			}
		}
		d.fn[e.name] = f
	}
	return d, nil
}

// retain adds a reference; it fails once the device was released.
func (d *gpuDevice) retain() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refs == 0 {
		return errors.New("kcp: gpu: the backend is closed")
	}
	d.refs++
	return nil
}

// release drops a reference and unloads the blob and the context with the
// last one.
func (d *gpuDevice) release() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refs == 0 {
		return nil
	}
	if d.refs--; d.refs > 0 {
		return nil
	}
	return errors.Join(d.kernels.Close(), d.ctx.Close())
}

// GPU is the CUDA backend of one plan: every rank of the plan runs on one GPU,
// each rank on its own goroutine and stream, exchanging through host memory
// over the in-process loopback communicator (DESIGN.md §3). It launches the
// embedded kernels of ptx/src (gdn_fwd.cu, conv1d.cu) with the widths the
// plan's memo decides for the detected GPU.
//
// A GPU is safe for concurrent use: each Forward allocates its own buffers
// and streams. Close releases it; a GPU made by ForPlan shares the loaded
// blob, which is unloaded when the last of them is closed.
type GPU struct {
	plan  *Plan
	opts  Options
	gopts GPUOptions
	dev   *gpuDevice

	mu     sync.Mutex
	closed bool
}

// NewGPU loads the GPU backend for plan: it checks the plan (head dims
// DK = DV = 128) and the options, detects the device (archdetect.Detect),
// loads the embedded blob (archdetect.Load), resolves every kernel of
// GPUForwardEntries (an error names a missing one, as when the blobs predate
// the kernels) and allows each its dynamic shared memory. Without a driver
// the error wraps loader.ErrNoDriver. Everything made is released on error.
func NewGPU(plan *Plan, opts GPUOptions) (*GPU, error) {
	if err := checkGPUPlan(plan); err != nil {
		return nil, err
	}
	if _, err := opts.Options.normalize(); err != nil {
		return nil, err
	}
	dev, err := openGPUDevice(opts.Device, opts.Blob, opts.kernelSet())
	if err != nil {
		return nil, err
	}
	g, err := newGPU(plan, opts, dev)
	if err != nil {
		return nil, errors.Join(err, dev.release())
	}
	return g, nil
}

// ForPlan returns a GPU backend for another plan and options on the same
// device, blob and kernels (no reload, no JIT). opts.Device, opts.Blob and
// the kernel choice must be left zero or equal g's; Options and KeepDevice
// are opts'. The returned GPU must be closed too; the blob is unloaded when
// the last GPU sharing it is closed.
func (g *GPU) ForPlan(plan *Plan, opts GPUOptions) (*GPU, error) {
	if err := g.alive(); err != nil {
		return nil, err
	}
	if err := checkGPUPlan(plan); err != nil {
		return nil, err
	}
	if (opts.Device != 0 && opts.Device != g.gopts.Device) || (opts.Blob != "" && opts.Blob != g.gopts.Blob) ||
		(opts.TensorCoreWalks && !g.gopts.TensorCoreWalks) || (opts.TensorCoreChunk && !g.gopts.TensorCoreChunk) {
		return nil, errors.New("kcp: gpu: ForPlan keeps the device, blob and kernels; make a new backend with NewGPU to change them")
	}
	if _, err := opts.Options.normalize(); err != nil {
		return nil, err
	}
	if err := g.dev.retain(); err != nil {
		return nil, err
	}
	gopts := g.gopts
	gopts.Options, gopts.KeepDevice = opts.Options, opts.KeepDevice
	ng, err := newGPU(plan, gopts, g.dev)
	if err != nil {
		return nil, errors.Join(err, g.dev.release())
	}
	return ng, nil
}

// checkGPUPlan reports a nil plan or head dims the kernels do not take.
func checkGPUPlan(plan *Plan) error {
	if plan == nil {
		return errors.New("kcp: gpu: plan is nil")
	}
	if c := plan.Config; c.DK != gpuD || c.DV != gpuD {
		return fmt.Errorf("kcp: gpu: head dims DK = %d, DV = %d: the GPU kernels need DK = DV = %d (smaller dims run on the CPU backend)",
			c.DK, c.DV, gpuD)
	}
	if plan.Tokens > maxInt32 {
		return fmt.Errorf("kcp: gpu: %d tokens exceed the kernels' int32 range", plan.Tokens)
	}
	return nil
}

// newGPU fills in the options (the width profile of the detected GPU when
// none is given) and binds plan to dev. It takes over one reference of dev
// only on success.
func newGPU(plan *Plan, gopts GPUOptions, dev *gpuDevice) (*GPU, error) {
	o := gopts.Options
	if o.Profile == (sched.Profile{}) {
		prof, err := sched.NewProfile(dev.profile.Variant, dev.profile.SMs)
		if err != nil {
			return nil, fmt.Errorf("kcp: gpu: width profile of %s: %w", dev.profile.Name, err)
		}
		o.Profile = prof
	}
	o, err := o.normalize()
	if err != nil {
		return nil, err
	}
	return &GPU{plan: plan, opts: o, gopts: gopts, dev: dev}, nil
}

// Plan returns the backend's plan.
func (g *GPU) Plan() *Plan { return g.plan }

// Options returns the backend's options with defaults filled in (the width
// profile is the detected GPU's unless one was given).
func (g *GPU) Options() Options { return g.opts }

// Profile returns the detected device and the blob loaded on it.
func (g *GPU) Profile() *archdetect.Profile { return g.dev.profile }

// Close releases the backend's reference to the device; the blob and the
// context go with the last reference. GPUForward values kept with
// KeepDevice must be closed first. Close is idempotent.
func (g *GPU) Close() error {
	if g == nil || g.dev == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	return g.dev.release()
}

// alive reports a closed backend.
func (g *GPU) alive() error {
	if g == nil || g.dev == nil {
		return errors.New("kcp: gpu: nil backend")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return errors.New("kcp: gpu: the backend is closed")
	}
	return nil
}
