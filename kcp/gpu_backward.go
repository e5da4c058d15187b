package kcp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/gdnkcp/gdnkcp/comm"
	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/sched"
)

// GPUBackwardStages are the stages of a rank's GPU backward in stream order,
// as RankTiming reports them (docs/gpu-backward.md): the upload of dO and
// the backward tables (and the gradient poison), dV'_local, the offset walk,
// the offset exchange through host memory, the reverse compose, the tape
// walk, the chunk gradients, the qk reduction with the l2norm backward, the
// conv backward with the per-rank dw reduction (module stage), the
// exchanges of the halo gradients (with their addition into dx) and of the
// conv weight gradient (module stage), and the conversions of the
// gradients to bf16. In the core stage the two conv stages are empty.
var GPUBackwardStages = []string{"upload", "dv local", "offset walk", "exchange offsets", "reverse compose",
	"tape walk", "chunk grads", "qk backward", "conv backward", "exchange conv grads", "bf16"}

// PoisonF32 is the 32-bit pattern the GPU backward fills its fp32 gradient
// outputs with before the kernels run: a quiet NaN with a payload no kernel
// computes (a NaN result is the canonical 0x7fffffff), so an element still
// holding it was never written.
const PoisonF32 = 0x7fc0dead

// backwardEntries lists the kernels of ptx/src/gdn_bwd.cu the backward
// launches, with the most dynamic shared memory each takes (walks at the
// larger of the two widths; the offset and tape walks are the set's). The
// backward also launches gdn_compose_fwd and gdn_poison_u32 of the
// forward's set.
func (ks kernelSet) backwardEntries() []gpuEntry {
	es := []gpuEntry{
		{ks.dvlocal, ks.dvlocalSmem},
		{ks.offset, max(ks.bwdWalkSmem(64), ks.bwdWalkSmem(128))},
		{ks.tape, max(ks.tapeSmem(64), ks.tapeSmem(128))},
		{ks.grads, ks.gradsSmem},
	}
	if m := ks.gradsFor(true); m != ks.grads {
		es = append(es, gpuEntry{m, ks.gradsSmem})
	}
	if ks.tape128 != "" {
		es = append(es, gpuEntry{ks.tape128, ks.tapeSmem(128)})
	}
	if ks.tapeHi != "" {
		es = append(es, gpuEntry{ks.tapeHi, ks.tapeSmem(64)}, gpuEntry{ks.tapeHi128, ks.tapeSmem(128)},
			gpuEntry{ks.offsetHi, max(ks.bwdWalkSmem(64), ks.bwdWalkSmem(128))})
	}
	if ks.dvlocalForm != "" {
		es = append(es, gpuEntry{ks.dvlocalForm, dvlocalFormSmem}, gpuEntry{ks.tapeFormSplit, ks.tapeSmem(64)},
			gpuEntry{ks.offsetFormSplit, ks.bwdWalkSmem(64)})
	}
	if ks.tapeForm != "" {
		es = append(es, gpuEntry{ks.tapeForm, ks.tapeSmem(64)}, gpuEntry{ks.offsetForm, ks.bwdWalkSmem(64)})
	}
	return append(es, []gpuEntry{
		{entryQKBwd, 0},
		{entryConvBwd, 0},
		{entryDWReduce, 0},
		{entryAddRows, 0},
		{entryF32ToBF16, 0},
	}...)
}

// tapeEntry returns the tape walk's entry at width vh: tape, or tape128 at
// vh 128 where the set has one entry a width.
func (ks kernelSet) tapeEntry(vh int) string {
	if vh == 128 && ks.tape128 != "" {
		return ks.tape128
	}
	return ks.tape
}

// tapeEntryFor is tapeEntry for a backward of the module stage (module) or
// the core stage, whose tape walk runs on single bf16 products where the set
// has them (GPUOptions.SplitTape unset: tapeHi, tapeHi128), at vh 64 the
// walk that forms dV'_local itself where the set has it (tapeForm,
// tapeFormSplit).
func (ks kernelSet) tapeEntryFor(vh int, module bool) string {
	if !module && ks.tapeHi != "" {
		if vh == 128 {
			return ks.tapeHi128
		}
		if ks.tapeForm != "" {
			return ks.tapeForm
		}
		return ks.tapeHi
	}
	if vh == 64 && ks.tapeFormSplit != "" {
		return ks.tapeFormSplit
	}
	return ks.tapeEntry(vh)
}

// offsetEntryFor is the offset walk's entry for a backward of the module
// stage (module) or the core stage: offsetHi in the core stage where the set
// has it (GPUOptions.SplitTape unset), else offset.
func (ks kernelSet) offsetEntryFor(module bool) string {
	if !module && ks.offsetHi != "" {
		return ks.offsetHi
	}
	return ks.offset
}

// offsetEntryAt is offsetEntryFor at width vh: at vh 64 the offset walk
// that forms dV'_local itself where the set has it (offsetForm on single
// products, offsetFormSplit on split ones).
func (ks kernelSet) offsetEntryAt(vh int, module bool) string {
	e := ks.offsetEntryFor(module)
	switch {
	case vh != 64:
	case e == ks.offsetHi && ks.offsetForm != "":
		return ks.offsetForm
	case e == ks.offset && ks.offsetFormSplit != "":
		return ks.offsetFormSplit
	}
	return e
}

// gradsFor returns the chunk gradients' entry for the module stage
// (module) or the core stage.
func (ks kernelSet) gradsFor(module bool) string {
	if module && ks.gradsModule != "" {
		return ks.gradsModule
	}
	return ks.grads
}

// allEntries lists every kernel the backend resolves when it loads: the
// forward's set (entries) and the backward's (backwardEntries).
func (ks kernelSet) allEntries() []gpuEntry {
	return append(ks.entries(), ks.backwardEntries()...)
}

// GPUBackwardEntries returns the kernel entries the GPU backward needs on
// top of GPUForwardEntries with the default (fp32) kernels, in launch order
// of a module-stage backward.
// NewGPU resolves them with the forward's, and ProbeGPU and NewGPU report a
// blob lacking any of them with ErrMissingKernels.
func GPUBackwardEntries() []string {
	var out []string
	for _, e := range (GPUOptions{}).kernelSet().backwardEntries() {
		out = append(out, e.name)
	}
	return out
}

// GPUGrads is the result of GPUForward.Backward.
type GPUGrads struct {
	// VH is the width each offset and tape walk launched with,
	// [rank][walk kind] (the plan's memoized decision or Options.ForceVH);
	// 0 where nothing launched (an empty walk list, or a forward walk).
	VH [][sched.NumWalkKinds]int
	// Split is, [rank][walk kind], how many (segment, value head) walks of a
	// walk split between the widths (by the width rule's model unless GPUOptions.SingleWidth, or SplitHeads) ran
	// at vh = 128, the rest at vh = 64 (VH then holds the rule's width); 0
	// where the walk ran at one width.
	Split [][sched.NumWalkKinds]int
	// Timing is every rank's backward timeline (GPUBackwardStages), indexed
	// by rank.
	Timing []RankTiming
	// PeakBytes is every rank's peak device memory over the forward (or
	// recompute) and this backward, in bytes, indexed by rank.
	PeakBytes []int64
	// Ranks are the ranks that ran in this process, ascending (the
	// forward's): only their tokens of Gradients (DConvW is whole) and their
	// entries of the per-rank slices are filled.
	Ranks []int

	rows *gpuGradRows // the local ranks' gradients as the GPU stores them
}

// Gradients are the gradients in global order, float64 of the GPU's values:
// DQ, DK, DV the bf16 gradients (core stage: of q, k, v; module stage: of
// the pre-conv projections, the conv's dx), DG, DBeta and DConvW (module
// stage) the fp32 ones; the rows of the ranks that ran in this process
// (Ranks), zeros elsewhere (DConvW whole). They are made on the first call
// (the same *Grads after), in parallel.
func (g *GPUGrads) Gradients() *Grads {
	if g == nil || g.rows == nil {
		return nil
	}
	return g.rows.gradients()
}

// newGrads allocates zero gradients of plan's shapes for stage.
func newGrads(p *Plan, stage Stage) *Grads {
	cfg := p.Config
	T := p.Tokens
	g := &Grads{
		DQ: make([]float64, T*cfg.HQK*cfg.DK), DK: make([]float64, T*cfg.HQK*cfg.DK),
		DV: make([]float64, T*cfg.HV*cfg.DV), DG: make([]float64, T*cfg.HV), DBeta: make([]float64, T*cfg.HV),
	}
	if stage == StageModule {
		g.DConvW = make([]float64, p.ConvChannels()*ConvWidth)
	}
	return g
}

// Backward runs the backward for dout (the gradient of the output, [T, HV,
// 128] in global order; bf16 values as float32, others are rounded to bf16)
// on the device buffers a forward kept (GPUOptions.KeepDevice, upstream's
// B1) or a Recompute made (B3). Every rank runs on its own goroutine and on
// its forward stream, in the order of docs/gpu-backward.md: dO uploaded and
// every gradient output poisoned, dV'_local, offset walk, offset exchange
// (device -> host -> all-gather -> host -> device), reverse compose, tape
// walk, chunk gradients, qk reduction and l2norm backward; then in the core
// stage dq, dk, dv to bf16, in the module stage the conv backward, the halo
// gradients all-gathered and added into dx in a fixed order, the conv
// weight gradient summed per rank on the device and over the ranks in rank
// order on the host, and dx to bf16. Walk widths come from the plan's memo
// (or Options.ForceVH). A gradient element left unwritten (still poisoned)
// or NaN is an error naming the rank, token and head or channel.
//
// Backward allocates its own buffers and frees them before it returns, on
// every path; the forward's stay until GPUForward.Close, so Backward may run
// again (the same dout gives the same bits). Calls on one GPUForward are
// serialized.
func (f *GPUForward) Backward(ctx context.Context, dout []float32) (*GPUGrads, error) {
	if f == nil || f.plan == nil {
		return nil, errors.New("kcp: gpu backward: empty forward result")
	}
	p := f.plan
	if err := p.CheckDOut(dout, false); err != nil {
		return nil, fmt.Errorf("kcp: gpu backward: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.keptLocked(); err != nil {
		return nil, fmt.Errorf("kcp: gpu backward: %w", err)
	}
	R := len(p.Ranks)
	res := &GPUGrads{VH: make([][sched.NumWalkKinds]int, R), Split: make([][sched.NumWalkKinds]int, R), Timing: make([]RankTiming, R), PeakBytes: make([]int64, R),
		Ranks: slices.Clone(f.Ranks), rows: &gpuGradRows{plan: p, stage: f.stage, out: f.out, rows: make([]*gradRows, R)}}
	err := f.be.runRanks(ctx, "backward", GPUBackwardStages, true, func(ctx context.Context, w *rankWork) error {
		return f.backwardRank(ctx, w, dout, res)
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// keptLocked reports a result without device buffers for every rank. f.mu
// is held.
func (f *GPUForward) keptLocked() error {
	if f.fleet == nil || f.be == nil || len(f.ranks) != len(f.plan.Ranks) {
		return errors.New("the forward kept no device buffers (run it with GPUOptions.KeepDevice, or recompute from GPU.ForwardCheckpoint), or it was closed")
	}
	for _, r := range f.be.layout.local {
		if rk := f.ranks[r]; rk == nil {
			return fmt.Errorf("rank %d kept no device buffers (run the forward with GPUOptions.KeepDevice, or recompute from GPU.ForwardCheckpoint)", r)
		}
	}
	return nil
}

// bwdRun is one rank's backward in progress. Its buffers live in mem, freed
// when the rank's backward ends; the forward's stay in rk.
type bwdRun struct {
	f   *GPUForward
	rk  *gpuRank
	cm  comm.Communicator
	tb  *gpuBwdTables
	mem *devMem
	res *GPUGrads
	clk *stageClock
	st  *stageTracker

	dout, offList, rcompOff, rcompIdx, addDst, addOff, addSrc  *loader.Buffer
	dvl, outPT, outR, allPT, allR, dend, dchunk, dvnew, dstart *loader.Buffer
	dqv, dkv, dg, dbeta                                        *loader.Buffer
	dq, dk, dv, dq16, dk16, dv16                               *loader.Buffer // core stage
	dy, dx, dhalo, dwPart, dw, dx16, haloIn                    *loader.Buffer // module stage

	launches []recordedLaunch // every launch, in stream order, while bwdProbeHook is set
}

// recordedLaunch is one kernel launch of a backward, kept while bwdProbeHook
// is set.
type recordedLaunch struct {
	entry string
	grid  [3]uint32
	smem  int
	args  *loader.Args
}

// bwdProbeHook is nil except in this package's overlap benchmarks
// (gpu_overlap_bench_test.go), which replay a backward's kernels: it runs at
// the end of each successful rank backward that launched anything, before
// its buffers are freed, and the run records its launches only while it is
// set. Its error is the backward's.
var bwdProbeHook func(*bwdRun) error

// backwardRank runs one rank's backward and fills its slots of res. A rank
// holding no tokens launches nothing but takes part in every exchange.
func (f *GPUForward) backwardRank(ctx context.Context, w *rankWork, dout []float32, res *GPUGrads) (err error) {
	t0 := time.Now()
	r := w.rank
	rk := f.ranks[r]
	res.Timing[r] = RankTiming{Rank: r}
	tb, err := buildGPUBwdTables(f.plan, r)
	if err != nil {
		return err
	}
	if rk == nil || rk.dev == nil {
		return fmt.Errorf("rank %d kept no device buffers", r)
	}
	cm := w.cm
	b := &bwdRun{f: f, rk: rk, cm: cm, tb: tb, mem: newDevMem(rk.dev.ctx, rk.dev.stage), res: res, st: w.st}
	defer func() {
		if err != nil && rk.stream != nil {
			// Let launched work finish before its memory goes; its error,
			// if any, is the one already reported.
			_ = rk.stream.Synchronize()
			rk.split.sync()
		}
		fwdNow, fwdPeak := rk.mem.held()
		_, bwdPeak := b.mem.held()
		res.PeakBytes[r] = max(fwdPeak, fwdNow+bwdPeak)
		if ferr := b.mem.free(); ferr != nil {
			err = errors.Join(err, fmt.Errorf("rank %d: %w", r, ferr))
		}
	}()
	o := f.opts
	empty := rk.tb.Tokens == 0
	module := f.stage == StageModule
	if !empty {
		if err := b.begin(dout); err != nil {
			return err
		}
		if err := b.offsetWalk(); err != nil {
			return err
		}
	}
	o.progress(r, "dv local")
	o.progress(r, "offset walk")
	if err := b.st.upTo("exchange offsets"); err != nil {
		return err
	}
	var gather deviceAllGather
	if cm != nil && !f.be.gopts.HostExchange {
		gather = deviceGatherOf(cm)
	}
	if b.allPT, b.allR, err = exchangeAffine(ctx, cm, gather, rk, b.mem, "offset", "Pᵀ", "R",
		len(tb.Offset), tb.MaxOffset, f.plan.Config.HV, b.outPT, b.outR); err != nil {
		return err
	}
	o.progress(r, "exchange offsets")
	if !empty {
		if err := b.mark(); err != nil { // exchange offsets
			return err
		}
		if err := b.tapeAndGrads(); err != nil {
			return err
		}
	}
	o.progress(r, "reverse compose")
	o.progress(r, "tape walk")
	o.progress(r, "chunk grads")
	if !empty && module {
		if err := b.convBackward(); err != nil {
			return err
		}
	}
	if !empty {
		if err := b.mark(); err != nil { // conv backward
			return err
		}
	}
	if err := b.st.upTo("exchange conv grads"); err != nil {
		return err
	}
	if module {
		if err := b.exchangeConvGrads(ctx); err != nil {
			return err
		}
	}
	if !empty {
		if err := b.mark(); err != nil { // exchange conv grads
			return err
		}
		if err := b.toBF16(); err != nil {
			return err
		}
		if err := b.collect(); err != nil {
			return err
		}
	} else {
		b.res.rows.setEmpty(r, module)
	}
	o.progress(r, "conv backward")
	if err := b.st.finish(); err != nil {
		return err
	}
	if bwdProbeHook != nil && !empty {
		if err := bwdProbeHook(b); err != nil {
			return fmt.Errorf("rank %d: backward probe: %w", r, err)
		}
	}
	res.Timing[r].HostSeconds = time.Since(t0).Seconds()
	return ctx.Err()
}

// mark records the event that ends the next stage.
func (b *bwdRun) mark() error { return b.clk.mark() }

// recorder is what launchSplit reports its launches to: b.launches while
// bwdProbeHook is set, else nothing.
func (b *bwdRun) recorder() func(recordedLaunch) {
	if bwdProbeHook == nil {
		return nil
	}
	return func(l recordedLaunch) { b.launches = append(b.launches, l) }
}

// launch runs entry on the rank's stream with 256-thread blocks.
func (b *bwdRun) launch(entry string, grid [3]uint32, smem int, args *loader.Args) error {
	if bwdProbeHook != nil {
		b.launches = append(b.launches, recordedLaunch{entry, grid, smem, args})
	}
	return launchOn(b.rk.dev, b.rk.stream, b.rk.rank, entry, grid, smem, args)
}

// vh is the width walk k of this rank launches with; it is recorded in the
// result's VH.
func (b *bwdRun) vh(k sched.WalkKind) (int, error) {
	vh, err := walkWidth(b.f.plan, b.f.opts, b.rk.rank, k)
	if err != nil {
		return 0, err
	}
	b.res.VH[b.rk.rank][k] = vh
	return vh, nil
}

// poison fills words 32-bit words of buf with v.
func (b *bwdRun) poison(buf *loader.Buffer, words int, v uint32) error {
	return poisonOn(b.rk.dev, b.rk.stream, b.rk.rank, buf, words, v)
}

// walkArgs are the offset and tape walks' shared arguments at width vh.
func (b *bwdRun) walkArgs(vh int) bwdWalkArgs {
	rk, cfg := b.rk, b.f.plan.Config
	return bwdWalkArgs{
		w: rk.w.Ptr(), kt: rk.kt.Ptr(), qn: rk.qn.Ptr(), gcum: rk.gcum.Ptr(), dvl: b.dvl.Ptr(), dout: b.dout.Ptr(),
		chunkTok0: rk.chunkTok0.Ptr(), chunkLen: rk.chunkLen.Ptr(), segChunk0: rk.segChunk0.Ptr(), segNChunk: rk.segNChunk.Ptr(),
		HQK: cfg.HQK, HV: cfg.HV, vh: vh, scale: gpuScale(b.f.opts),
	}
}

// planeArgs are the arguments the offset and tape walks on the walk planes
// share at width vh: walkArgs and -W's planes, k's and q's bf16 rows and
// their rstd. The walks copy the rows in 16-byte units: a row start that is
// not 16-byte aligned is an error here, not a fault on the device.
func (b *bwdRun) planeArgs(vh int) (bwdPlaneArgs, error) {
	rk, p := b.rk, b.f.plan
	qp, kp, _, qst, kst, _ := rk.qkv(b.f.stage, p.Config, p.ConvChannels())
	if qp%16 != 0 || qst%8 != 0 || kp%16 != 0 || kst%8 != 0 {
		return bwdPlaneArgs{}, fmt.Errorf("rank %d: the walks on the walk planes need q's and k's bf16 rows 16-byte aligned: q at %#x, k at %#x, row strides %d, %d elements",
			rk.rank, qp, kp, qst, kst)
	}
	if rk.wp == nil || rk.qRstd == nil || rk.kRstd == nil {
		return bwdPlaneArgs{}, fmt.Errorf("rank %d: the walks on the walk planes need the kept forward's planes, q_rstd and k_rstd", rk.rank)
	}
	return bwdPlaneArgs{bwdWalkArgs: b.walkArgs(vh), wp: rk.wp.Ptr(), k: kp, kStride: kst, kRstd: rk.kRstd.Ptr(), q: qp,
		qStride: qst, qRstd: rk.qRstd.Ptr()}, nil
}

// begin makes the events, uploads dO and the backward tables, allocates and
// poisons the gradient buffers, and runs dV'_local.
func (b *bwdRun) begin(dout []float32) (err error) {
	rk, m, p := b.rk, b.mem, b.f.plan
	cfg := p.Config
	tb := rk.tb
	Tr, NS, NC, HQK, HV := tb.Tokens, tb.NS, tb.NC, cfg.HQK, cfg.HV
	nq, nv, C := HQK*gpuD, HV*gpuD, p.ConvChannels()
	module := b.f.stage == StageModule
	wrap := func(err error) error {
		if err == nil {
			return nil
		}
		return fmt.Errorf("rank %d: %w", rk.rank, err)
	}
	if b.clk, err = newStageClock(m, rk.rank, rk.stream, GPUBackwardStages, b.st); err != nil {
		return err
	}
	if err := b.mark(); err != nil {
		return err
	}
	s := rk.stream
	if b.dout, err = uploadDOut(m, s, p, rk.rank, dout); err != nil {
		return wrap(err)
	}
	tables := []struct {
		dst **loader.Buffer
		nm  string
		src []int32
	}{{&b.offList, "offset list", b.tb.Offset}, {&b.rcompOff, "rcomp_off", b.tb.RCompOff}, {&b.rcompIdx, "rcomp_idx", b.tb.RCompIdx}}
	if module {
		tables = append(tables, []struct {
			dst **loader.Buffer
			nm  string
			src []int32
		}{{&b.addDst, "add_rows dst_row", b.tb.AddDst}, {&b.addOff, "add_rows off", b.tb.AddOff}, {&b.addSrc, "add_rows src_row", b.tb.AddSrc}}...)
	}
	for _, t := range tables {
		if *t.dst, err = upload(m, s, t.nm, t.src, 4); err != nil {
			return wrap(err)
		}
	}
	if err := m.dropStager(); err != nil { // dO's copies are queued: the pinned chunks go back
		return wrap(err)
	}
	// With token slots dV' is a 32 KB block a (chunk, value head): the same
	// bytes as fp32 rows of full chunks; as bf16 dV'^T (bf16States) half
	// of that.
	// The chunk adjoints D: fp32, or as bf16 D^T (bf16States) half of that.
	dvnewLen, dvnewName := Tr*nv, "dvnew"
	dchunkLen, dchunkName := NC*summarySlot(HV), "chunk adjoints"
	switch ks := b.rk.dev.ks; {
	case ks.bf16States(b.f.stage):
		dvnewLen, dvnewName = NC*ChunkSize*nv/2, "dvnew bf16"
		dchunkLen, dchunkName = NC*summarySlot(HV)/2, "chunk adjoints bf16"
	case ks.tokenSlots:
		dvnewLen = NC * ChunkSize * nv
	}
	f32 := []struct {
		dst **loader.Buffer
		nm  string
		n   int
	}{
		{&b.dvl, "dvl", Tr * nv}, {&b.dend, "terminal adjoints", NS * summarySlot(HV)},
		{&b.dchunk, dchunkName, dchunkLen}, {&b.dvnew, dvnewName, dvnewLen},
		{&b.dstart, "start adjoints", NS * summarySlot(HV)}, {&b.dg, "dg", Tr * HV}, {&b.dbeta, "dbeta", Tr * HV},
	}
	if !b.rk.dev.ks.grads5 { // the per-value-head dq, dk that gdn_qk_bwd sums
		f32 = append(f32, []struct {
			dst **loader.Buffer
			nm  string
			n   int
		}{{&b.dqv, "dqv", Tr * nv}, {&b.dkv, "dkv", Tr * nv}}...)
	}
	if module {
		f32 = append(f32, []struct {
			dst **loader.Buffer
			nm  string
			n   int
		}{{&b.dy, "dy", Tr * C}, {&b.dx, "dx", Tr * C}, {&b.dhalo, "dhalo", NS * ConvHalo * C},
			{&b.dwPart, "dw_part", NC * C * ConvWidth}, {&b.dw, "dw", C * ConvWidth}}...)
	} else if !b.rk.dev.ks.grads5 {
		// The core stage's fp32 dq, dk, dv, cast to bf16 at the end; the
		// grouped chunk gradients write the bf16 outputs themselves.
		f32 = append(f32, []struct {
			dst **loader.Buffer
			nm  string
			n   int
		}{{&b.dq, "dq fp32", Tr * nq}, {&b.dk, "dk fp32", Tr * nq}, {&b.dv, "dv fp32", Tr * nv}}...)
	}
	for _, t := range f32 {
		if *t.dst, err = m.alloc(t.nm, 4*t.n); err != nil {
			return wrap(err)
		}
	}
	bf := []struct {
		dst **loader.Buffer
		nm  string
		n   int
	}{{&b.dq16, "dq", Tr * nq}, {&b.dk16, "dk", Tr * nq}, {&b.dv16, "dv", Tr * nv}}
	if module {
		bf = bf[:0]
		bf = append(bf, struct {
			dst **loader.Buffer
			nm  string
			n   int
		}{&b.dx16, "dx", Tr * C})
	}
	// Poison every gradient output (and the halo gradients other ranks
	// read): a kernel that leaves an element shows as never written.
	for _, t := range bf {
		if *t.dst, err = m.alloc(t.nm, 2*t.n); err != nil {
			return wrap(err)
		}
		if err := b.poison(*t.dst, t.n/2, PoisonBF16x2); err != nil {
			return err
		}
	}
	for _, t := range []struct {
		buf *loader.Buffer
		n   int
	}{{b.dg, Tr * HV}, {b.dbeta, Tr * HV}, {b.dhalo, NS * ConvHalo * C}, {b.dw, C * ConvWidth}} {
		if t.buf != nil {
			if err := b.poison(t.buf, t.n, PoisonF32); err != nil {
				return err
			}
		}
	}
	if err := b.mark(); err != nil { // upload
		return err
	}
	ks := b.rk.dev.ks
	grid, entry, smem := [3]uint32{uint32(NC), uint32(HV), 1}, ks.dvlocal, ks.dvlocalSmem
	if ks.dvlocalQK {
		grid[1] = uint32(HQK)
	}
	var items uintptr // gdn_dvlocal_form's (chunk, value head) pairs; 0: all of them
	former := ks.dvlocalForm != ""
	if former { // the walks form dvl at vh 64: the kernel forms what other walks read
		list, all, err := b.formerItems()
		if err != nil {
			return err
		}
		// Reserved at every pair whatever the widths, so that they do not change the rank's peak memory.
		buf, err := uploadCap(b.mem, rk.stream, "dV'_local pairs", list, 4, NC*HV)
		if err != nil {
			return fmt.Errorf("rank %d: %w", rk.rank, err)
		}
		if !all && len(list) == 0 {
			return b.mark() // dv local: no walk reads dvl
		}
		entry, smem, grid = ks.dvlocalForm, dvlocalFormSmem, [3]uint32{uint32(NC), uint32(HV), 1}
		if !all {
			grid, items = [3]uint32{uint32(len(list)), 1, 1}, buf.Ptr()
		}
	}
	var args *loader.Args
	if ks.rawQKDvLocal { // q's and k's bf16 rows as the plane walks read them
		pa, err := b.planeArgs(64)
		if err != nil {
			return err
		}
		args = argsDVLocalRaw(pa.q, pa.qStride, pa.qRstd, pa.k, pa.kStride, pa.kRstd, rk.gcum.Ptr(), b.dout.Ptr(),
			rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(), b.dvl.Ptr(), HQK, HV, gpuScale(b.f.opts))
		if former { // gdn_dvlocal_form: the same arguments and its pair list (argsDVLocalForm)
			args.DevicePtr(items)
		}
	} else { // fp32 qn, and kn or K^T's walk planes
		k := rk.kn.Ptr()
		if ks.dvlocalKt {
			k = rk.wk.Ptr()
		}
		args = argsDVLocal(rk.qn.Ptr(), k, rk.gcum.Ptr(), b.dout.Ptr(), rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(),
			b.dvl.Ptr(), HQK, HV, gpuScale(b.f.opts))
	}
	if err := b.launch(entry, grid, smem, args); err != nil {
		return err
	}
	return b.mark() // dv local
}

// formerItems returns, with the tape and offset walks that form dV'_local
// themselves at vh 64 (kernelSet.dvlocalForm), the (chunk, value
// head) pairs whose dvl a walk of this rank reads from memory, as chunk HV +
// head in ascending order: of each walk's segments (the tape walk's all, the
// offset walk's its list) the heads at vh 128 (Wide[s] of a split launch;
// every head at the plan's width 128). all reports that they are every pair.
// Only those does gdn_dvlocal_form form.
func (b *bwdRun) formerItems() (items []int32, all bool, err error) {
	tb, HV := b.rk.tb, b.f.plan.Config.HV
	need := make([]bool, tb.NC*HV)
	mark := func(s, heads int) {
		for c := tb.SegChunk0[s]; c < tb.SegChunk0[s]+tb.SegNChunk[s]; c++ {
			for h := range heads {
				need[int(c)*HV+h] = true
			}
		}
	}
	all128 := make([]int32, tb.NS)
	for s := range all128 {
		all128[s] = int32(s)
	}
	for _, w := range []struct {
		k    sched.WalkKind
		segs []int32 // the walk's list: its chain s is segment segs[s]
	}{{sched.Tape, all128}, {sched.Offset, b.tb.Offset}} {
		if len(w.segs) == 0 {
			continue
		}
		split, err := b.f.be.walkSplit(b.rk, w.k, listChains(tb.SegNChunk, w.segs))
		if err != nil {
			return nil, false, err
		}
		if split != nil {
			for s, n := range split.Wide {
				mark(int(w.segs[s]), n)
			}
			continue
		}
		vh, err := walkWidth(b.f.plan, b.f.opts, b.rk.rank, w.k)
		if err != nil {
			return nil, false, err
		}
		if vh == 128 {
			for _, s := range w.segs {
				mark(int(s), HV)
			}
		}
	}
	for i, n := range need {
		if n {
			items = append(items, int32(i))
		}
	}
	return items, len(items) == len(need), nil
}

// offsetWalk runs the offset walk over the rank's offset list (nothing when
// it is empty): each listed segment's (Pᵀ, R).
func (b *bwdRun) offsetWalk() (err error) {
	HV := b.f.plan.Config.HV
	if nlist := len(b.tb.Offset); nlist > 0 {
		vh, err := b.vh(sched.Offset)
		if err != nil {
			return err
		}
		// maxList slots: the device exchange sends them all (the padding
		// is never read).
		slots := max(nlist, b.tb.MaxOffset)
		if b.outPT, err = b.mem.alloc("offset Pᵀ", 4*slots*summarySlot(HV)); err != nil {
			return fmt.Errorf("rank %d: %w", b.rk.rank, err)
		}
		if b.outR, err = b.mem.alloc("offset R", 4*slots*summarySlot(HV)); err != nil {
			return fmt.Errorf("rank %d: %w", b.rk.rank, err)
		}
		ks := b.rk.dev.ks
		module := b.f.stage == StageModule
		chains := listChains(b.rk.tb.SegNChunk, b.tb.Offset)
		split, err := b.f.be.walkSplit(b.rk, sched.Offset, chains)
		if err != nil {
			return err
		}
		planeArgs := func(w int, order uintptr) (*loader.Args, error) {
			pa, err := b.planeArgs(w)
			if err != nil {
				return nil, err
			}
			return argsOffsetPlanes(pa, b.offList.Ptr(), b.outPT.Ptr(), b.outR.Ptr(), order), nil
		}
		if split != nil {
			if err := b.f.be.launchSplit(b.rk, b.mem, split, "offset walk", splitLaunch{ks.offsetEntryAt(128, module), ks.bwdWalkSmem(128)},
				splitLaunch{ks.offsetEntryAt(64, module), ks.bwdWalkSmem(64)}, planeArgs, b.recorder()); err != nil {
				return err
			}
			b.res.Split[b.rk.rank][sched.Offset] = split.Walks128()
			return b.mark() // offset walk
		}
		args := argsOffset(b.walkArgs(vh), b.offList.Ptr(), b.outPT.Ptr(), b.outR.Ptr())
		if ks.offset == entryOffsetMMA || ks.bwalkPlanes {
			order, err := b.f.be.walkOrder(b.mem, b.rk.stream, chains, HV, sched.Offset, vh, "offset walk order")
			if err != nil {
				return fmt.Errorf("rank %d: %w", b.rk.rank, err)
			}
			args = argsOffsetMMA(b.walkArgs(vh), b.offList.Ptr(), b.outPT.Ptr(), b.outR.Ptr(), order)
			if ks.bwalkPlanes {
				if args, err = planeArgs(vh, order); err != nil {
					return err
				}
			}
		}
		if err := b.launch(ks.offsetEntryAt(vh, module), [3]uint32{uint32(2 * gpuD / vh), uint32(nlist), uint32(HV)}, ks.bwdWalkSmem(vh), args); err != nil {
			return err
		}
	}
	return b.mark() // offset walk
}

// tapeAndGrads runs the reverse compose, the tape walk, the chunk gradients
// and the qk reduction with the l2norm backward.
func (b *bwdRun) tapeAndGrads() error {
	rk, p := b.rk, b.f.plan
	cfg := p.Config
	tb := rk.tb
	Tr, NS, NC, HQK, HV := tb.Tokens, tb.NS, tb.NC, cfg.HQK, cfg.HV
	nq, nv, C := HQK*gpuD, HV*gpuD, p.ConvChannels()
	module := b.f.stage == StageModule
	allPT, allR := b.allPT, b.allR
	if allPT == nil { // nothing gathered: every reverse compose list is empty and the kernel writes zeros
		allPT, allR = b.rcompIdx, b.rcompIdx
	}
	if err := b.launch(entryCompose, [3]uint32{2, uint32(NS), uint32(HV)}, composeSmem,
		argsCompose(allPT.Ptr(), allR.Ptr(), b.rcompOff.Ptr(), b.rcompIdx.Ptr(), b.dend.Ptr(), HV)); err != nil {
		return err
	}
	if err := b.mark(); err != nil { // reverse compose
		return err
	}
	vh, err := b.vh(sched.Tape)
	if err != nil {
		return err
	}
	ks := rk.dev.ks
	dchunk, dvnew, dvnewp, dvnew16, d16 := b.dchunk.Ptr(), b.dvnew.Ptr(), uintptr(0), uintptr(0), uintptr(0)
	switch {
	case ks.bf16States(b.f.stage): // b.dvnew, b.dchunk hold bf16 dV'^T, D^T (gdn_chunk_grads_mma8's)
		dchunk, dvnew, dvnew16, d16 = 0, 0, b.dvnew.Ptr(), b.dchunk.Ptr()
	case ks.tokenSlots: // b.dvnew holds token slots (gdn_chunk_grads_mma6's dV')
		dvnew, dvnewp = 0, b.dvnew.Ptr()
	}
	// planeTapeArgs: gdn_tape_walk_planes(_w128)'s arguments at width w with
	// dispatch order order (0: launch order).
	planeTapeArgs := func(w int, order uintptr) (*loader.Args, error) {
		pa, err := b.planeArgs(w)
		if err != nil {
			return nil, err
		}
		return argsTapePlanes(pa, b.dend.Ptr(), dchunk, dvnew, b.dstart.Ptr(), dvnewp, dvnew16, d16, order), nil
	}
	split, err := b.f.be.walkSplit(rk, sched.Tape, rk.tb.SegNChunk)
	if err != nil {
		return err
	}
	if split != nil {
		if err := b.f.be.launchSplit(rk, b.mem, split, "tape walk", splitLaunch{ks.tapeEntryFor(128, module), ks.tapeSmem(128)},
			splitLaunch{ks.tapeEntryFor(64, module), ks.tapeSmem(64)}, planeTapeArgs, b.recorder()); err != nil {
			return err
		}
		b.res.Split[rk.rank][sched.Tape] = split.Walks128()
	} else {
		tapeArgs := argsTape(b.walkArgs(vh), b.dend.Ptr(), b.dchunk.Ptr(), b.dvnew.Ptr(), b.dstart.Ptr())
		if ks.tape == entryTapeMMA || ks.bwalkPlanes {
			order, err := b.f.be.walkOrder(b.mem, rk.stream, rk.tb.SegNChunk, cfg.HV, sched.Tape, vh, "tape walk order")
			if err != nil {
				return fmt.Errorf("rank %d: %w", rk.rank, err)
			}
			tapeArgs = argsTapeMMA(b.walkArgs(vh), b.dend.Ptr(), dchunk, dvnew, b.dstart.Ptr(), dvnewp, dvnew16, d16, order)
			if ks.bwalkPlanes {
				if tapeArgs, err = planeTapeArgs(vh, order); err != nil {
					return err
				}
			}
		}
		if err := b.launch(ks.tapeEntryFor(vh, module), [3]uint32{uint32(gpuD / vh), uint32(NS), uint32(HV)}, ks.tapeSmem(vh), tapeArgs); err != nil {
			return err
		}
	}
	if err := b.mark(); err != nil { // tape walk
		return err
	}
	_, _, vp, _, _, vst := rk.qkv(b.f.stage, cfg, C)
	// dv: core: its own fp32 array (or, with the grouped chunk gradients, the
	// bf16 output straight away); module: the v columns of the conv's dy.
	direct := !module && ks.grads5
	dvp, dvst := uintptr(0), nv
	switch {
	case module:
		dvp, dvst = b.dy.Ptr()+uintptr(4*2*nq), C
	case !direct:
		dvp = b.dv.Ptr()
	}
	cg := chunkGradArgs{
		qn: rk.qn.Ptr(), kn: rk.kn.Ptr(), v: vp, vStride: vst, gcum: rk.gcum.Ptr(), beta: rk.beta.Ptr(), h: rk.h.Ptr(),
		vnew: rk.vnew.Ptr(), dChunk: b.dchunk.Ptr(), dvnew: b.dvnew.Ptr(), dout: b.dout.Ptr(),
		chunkTok0: rk.chunkTok0.Ptr(), chunkLen: rk.chunkLen.Ptr(), dqv: b.dqv.Ptr(), dkv: b.dkv.Ptr(),
		dv: dvp, dvStride: dvst, dg: b.dg.Ptr(), dbeta: b.dbeta.Ptr(), HQK: HQK, HV: HV, scale: gpuScale(b.f.opts),
	}
	// dq, dk: core: fp32 [Tr, HQK*128]; module: the q and k columns of dy.
	dqp, dkp, dqst := uintptr(0), uintptr(0), nq
	switch {
	case module:
		dqp, dkp, dqst = b.dy.Ptr(), b.dy.Ptr()+uintptr(4*nq), C
	case !direct:
		dqp, dkp = b.dq.Ptr(), b.dk.Ptr()
	}
	if ks.grads5 {
		// The value-head sum and the l2norm backward run inside the chunk
		// gradients: the "qk backward" stage stays empty.
		cg.dqv, cg.dkv = 0, 0
		a5 := chunkGrad5Args{
			chunkGradArgs: cg, qRstd: rk.qRstd.Ptr(), kRstd: rk.kRstd.Ptr(), dq: dqp, dk: dkp, dqStride: dqst,
			l2norm: !b.f.opts.NoL2Norm,
		}
		if direct { // the bf16 outputs, rounded as gdn_f32_to_bf16 would (toBF16 then has nothing to do)
			a5.dq16, a5.dk16, a5.dv16 = b.dq16.Ptr(), b.dk16.Ptr(), b.dv16.Ptr()
		}
		if ks.bf16States(b.f.stage) { // the forward's bf16 H^T and V'^T, the tape walk's D^T and dV'^T (b.dchunk, b.dvnew)
			if rk.h16 == nil || rk.vnew16 == nil {
				return fmt.Errorf("rank %d: chunk gradients: %s reads the forward's bf16 states, which it did not keep", rk.rank, entryGradsMMA8)
			}
			a5.h, a5.vnew = rk.h16.Ptr(), rk.vnew16.Ptr()
		}
		var args *loader.Args
		if ks.rawQKGrads { // q's and k's bf16 rows with their rstd, as dV'_local read them
			pa, err := b.planeArgs(64)
			if err != nil {
				return err
			}
			if pa.qStride != pa.kStride {
				return fmt.Errorf("rank %d: chunk gradients on the raw rows: q's and k's row strides differ (%d, %d elements)",
					rk.rank, pa.qStride, pa.kStride)
			}
			args = argsChunkGrads5Raw(a5, pa.q, pa.k, pa.qStride)
		} else {
			args = argsChunkGrads5(a5)
		}
		if err := b.launch(ks.gradsFor(module), [3]uint32{uint32(NC), uint32(HQK), 1}, ks.gradsSmem, args); err != nil {
			return err
		}
		if err := b.mark(); err != nil { // chunk grads
			return err
		}
		return b.mark() // qk backward
	}
	if err := b.launch(ks.grads, [3]uint32{uint32(NC), uint32(HV), 1}, ks.gradsSmem, argsChunkGrads(cg)); err != nil {
		return err
	}
	if err := b.mark(); err != nil { // chunk grads
		return err
	}
	if err := b.launch(entryQKBwd, [3]uint32{uint32(ceilDiv(Tr*HQK*2, gpuBlock/32)), 1, 1}, 0,
		argsQKBwd(b.dqv.Ptr(), b.dkv.Ptr(), rk.qn.Ptr(), rk.kn.Ptr(), rk.qRstd.Ptr(), rk.kRstd.Ptr(), dqp, dkp, dqst,
			Tr, HQK, HV, !b.f.opts.NoL2Norm)); err != nil {
		return err
	}
	return b.mark() // qk backward
}

// convBackward runs the conv backward (dx, the halo gradients, the
// per-chunk dw parts) and reduces dw over the rank's chunks (module stage).
func (b *bwdRun) convBackward() error {
	rk, p := b.rk, b.f.plan
	tb := rk.tb
	C := p.ConvChannels()
	if err := b.launch(entryConvBwd, [3]uint32{uint32(tb.NC), uint32(ceilDiv(C, gpuBlock)), 1}, 0,
		argsConvBwd(rk.x.Ptr(), rk.convW.Ptr(), rk.halo.Ptr(), rk.segStart.Ptr(), rk.segLen.Ptr(), rk.tokSeg.Ptr(),
			rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(), b.dy.Ptr(), b.dx.Ptr(), b.dhalo.Ptr(), b.dwPart.Ptr(),
			tb.Tokens, C, tb.NS, tb.NC)); err != nil {
		return err
	}
	n := C * ConvWidth
	return b.launch(entryDWReduce, [3]uint32{uint32(ceilDiv(n, gpuBlock)), 1, 1}, 0,
		argsDWReduce(b.dwPart.Ptr(), tb.NC, n, b.dw.Ptr()))
}

// exchangeConvGrads all-gathers the halo gradients and adds the rows this
// rank owns into its dx (gdn_add_rows, in the fixed order of the table),
// then all-gathers the ranks' conv weight gradients and sums them in rank
// order in float32 (module stage). Every rank takes part; one holding no
// tokens sends zeros.
func (b *bwdRun) exchangeConvGrads(ctx context.Context) (err error) {
	rk, p := b.rk, b.f.plan
	r := rk.rank
	C := p.ConvChannels()
	empty := rk.tb.Tokens == 0
	dhalo := make([]float32, rk.tb.NS*ConvHalo*C)
	if !empty {
		if err := download(b.dhalo, rk.stream, "dhalo", dhalo, 4); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		if err := checkHaloGrads(p, r, dhalo); err != nil {
			return err
		}
	}
	all, err := comm.AllGatherFloat32(ctx, b.cm, haloGradSend(b.tb, dhalo, C))
	if err != nil {
		return fmt.Errorf("rank %d: halo gradient exchange: %w", r, err)
	}
	if !empty && len(b.tb.AddDst) > 0 {
		rows, err := haloGradRows(b.tb, all, len(p.Ranks), C)
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		if b.haloIn, err = upload(b.mem, rk.stream, "received halo gradients", rows, 4); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		if err := b.launch(entryAddRows, [3]uint32{uint32(len(b.tb.AddDst)), uint32(ceilDiv(C, gpuBlock)), 1}, 0,
			argsAddRows(b.dx.Ptr(), C, b.haloIn.Ptr(), C, b.addDst.Ptr(), b.addOff.Ptr(), b.addSrc.Ptr(), len(b.tb.AddDst), C)); err != nil {
			return err
		}
	}
	n := C * ConvWidth
	dw := make([]float32, n)
	if !empty {
		if err := download(b.dw, rk.stream, "dw", dw, 4); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		if err := checkF32(r, "conv weight gradient (the rank's sum)", dw, func(i int) string {
			return fmt.Sprintf("channel %d tap %d", i/ConvWidth, i%ConvWidth)
		}); err != nil {
			return err
		}
	}
	allDW, err := comm.AllGatherFloat32(ctx, b.cm, dw)
	if err != nil {
		return fmt.Errorf("rank %d: conv weight gradient exchange: %w", r, err)
	}
	sum, err := sumRanks(allDW, len(p.Ranks), n)
	if err != nil {
		return fmt.Errorf("rank %d: %w", r, err)
	}
	if r == b.f.be.layout.local[0] { // every rank holds the same sum; the first local one writes it
		b.res.rows.dconvW = sum
	}
	return nil
}

// sumRanks adds the ranks' n-value parts of all in rank order, in float32:
// the same bits on every rank.
func sumRanks(all []float32, ranks, n int) ([]float32, error) {
	if len(all) != ranks*n {
		return nil, fmt.Errorf("kcp: conv weight gradient exchange: got %d values, want %d ranks x %d", len(all), ranks, n)
	}
	sum := make([]float32, n)
	for rr := 0; rr < ranks; rr++ {
		for i, v := range all[rr*n : (rr+1)*n] {
			sum[i] += v
		}
	}
	return sum, nil
}

// checkHaloGrads reports a halo gradient element of rank's segments (dhalo,
// [NS, 3, C]) that the conv backward never wrote or that is NaN.
func checkHaloGrads(p *Plan, rank int, dhalo []float32) error {
	per := ConvHalo * p.ConvChannels()
	return checkF32(rank, "halo gradient", dhalo, func(i int) string {
		return fmt.Sprintf("segment %d row %d channel %d", i/per, i%per/p.ConvChannels(), i%p.ConvChannels())
	})
}

// checkF32 reports the fp32 elements of v still holding PoisonF32 (never
// written) or NaN, naming the first through where.
func checkF32(rank int, name string, v []float32, where func(i int) string) error {
	c := gradCheck{rank: rank, name: name}
	for i, x := range v {
		if math.IsNaN(float64(x)) {
			c.bad(math.Float32bits(x) == PoisonF32, func() string { return where(i) })
		}
	}
	return c.err()
}

// gradCheck counts one gradient's elements that were never written (still
// poisoned) or NaN, and remembers where the first was.
type gradCheck struct {
	rank           int
	name           string
	unwritten, nan int
	first          string
}

// bad counts an element: poisoned, or another NaN.
func (c *gradCheck) bad(poisoned bool, where func() string) {
	what := "NaN"
	if poisoned {
		what = "never written (still poisoned)"
		c.unwritten++
	} else {
		c.nan++
	}
	if c.first == "" {
		c.first = where() + ": " + what
	}
}

// err is nil when nothing was counted.
func (c *gradCheck) err() error {
	if c.unwritten+c.nan == 0 {
		return nil
	}
	return fmt.Errorf("rank %d: %s: %d elements never written, %d NaN; first at %s", c.rank, c.name, c.unwritten, c.nan, c.first)
}

// toBF16 converts the fp32 gradients of q, k, v (core) or dx (module) to
// their bf16 outputs; in the core stage with the grouped chunk gradients
// (v5) there is nothing to convert (the stage stays, empty).
func (b *bwdRun) toBF16() error {
	p := b.f.plan
	cfg := p.Config
	Tr := b.rk.tb.Tokens
	nq, nv := cfg.HQK*gpuD, cfg.HV*gpuD
	pairs := []struct {
		src, dst *loader.Buffer
		n        int
	}{{b.dq, b.dq16, Tr * nq}, {b.dk, b.dk16, Tr * nq}, {b.dv, b.dv16, Tr * nv}}
	switch {
	case b.f.stage == StageModule:
		pairs = pairs[:1]
		pairs[0].src, pairs[0].dst, pairs[0].n = b.dx, b.dx16, Tr*p.ConvChannels()
	case b.rk.dev.ks.grads5:
		pairs = nil // the grouped chunk gradients wrote dq, dk, dv as bf16
	}
	for _, t := range pairs {
		if err := b.launch(entryF32ToBF16, [3]uint32{uint32(min(ceilDiv(t.n, gpuBlock), 4096)), 1, 1}, 0,
			argsF32ToBF16(t.src.Ptr(), t.dst.Ptr(), uint64(t.n))); err != nil {
			return err
		}
	}
	return b.mark() // bf16
}

// collect copies the rank's gradients back, reads the timing, and checks and
// scatters the gradients into the global result.
func (b *bwdRun) collect() error {
	rk, p := b.rk, b.f.plan
	r := rk.rank
	cfg := p.Config
	Tr := rk.tb.Tokens
	nq, nv, C, HV := cfg.HQK*gpuD, cfg.HV*gpuD, p.ConvChannels(), cfg.HV
	module := b.f.stage == StageModule
	dg, dbeta := make([]float32, Tr*HV), make([]float32, Tr*HV)
	var dq, dk, dv, dx []bf16.BF16
	downloads := []error{
		download(b.dg, rk.stream, "dg", dg, 4),
		download(b.dbeta, rk.stream, "dbeta", dbeta, 4),
	}
	if module {
		dx = make([]bf16.BF16, Tr*C)
		downloads = append(downloads, download(b.dx16, rk.stream, "dx", dx, 2))
	} else {
		dq, dk, dv = make([]bf16.BF16, Tr*nq), make([]bf16.BF16, Tr*nq), make([]bf16.BF16, Tr*nv)
		downloads = append(downloads, download(b.dq16, rk.stream, "dq", dq, 2), download(b.dk16, rk.stream, "dk", dk, 2),
			download(b.dv16, rk.stream, "dv", dv, 2))
	}
	if err := errors.Join(downloads...); err != nil {
		return fmt.Errorf("rank %d: %w", r, err)
	}
	if err := rk.stream.Synchronize(); err != nil {
		return fmt.Errorf("rank %d: stream: %w", r, err)
	}
	if err := b.clk.read(&b.res.Timing[r]); err != nil {
		return err
	}
	rows := &gradRows{DQ: dq, DK: dk, DV: dv, DX: dx, DG: dg, DBeta: dbeta}
	if err := checkGradRows(p, r, *rows); err != nil {
		return err
	}
	b.res.rows.rows[r] = rows
	return nil
}

// gradRows are one rank's downloaded gradients in buffer order: DQ, DK
// [Tr, HQK*128], DV [Tr, HV*128] bf16 (core stage) or DX [Tr, C] bf16
// (module stage), and DG, DBeta fp32 [Tr, HV].
type gradRows struct {
	DQ, DK, DV, DX []bf16.BF16
	DG, DBeta      []float32
}

// scatterGrads checks rank's gradients (checkGradRows) and writes them, as
// float64, to their global rows in g (fillGrads).
func scatterGrads(p *Plan, rank int, g *Grads, rows gradRows) error {
	if err := checkGradRows(p, rank, rows); err != nil {
		return err
	}
	fillGrads(p, rank, g, rows)
	return nil
}

// checkGradRows reports rank's gradient elements still holding their poison
// (never written) or NaN. An error names the gradient, the rank, and the
// token, head and column (or conv channel) of the first bad element.
func checkGradRows(p *Plan, rank int, rows gradRows) error {
	cfg := p.Config
	nq, nv, C, HV := cfg.HQK*gpuD, cfg.HV*gpuD, p.ConvChannels(), cfg.HV
	bs := tokenBlocks(p.Ranks[rank].Segments)
	var errs []error
	if rows.DX != nil {
		errs = append(errs, checkBF16Rows(rank, "dx", bs, rows.DX, C, C, 0,
			func(j int) string { return fmt.Sprintf("channel %d (%s)", j, convChannel(cfg, j)) }))
	} else {
		errs = append(errs,
			checkBF16Rows(rank, "dq", bs, rows.DQ, nq, nq, 0, headCol("QK")),
			checkBF16Rows(rank, "dk", bs, rows.DK, nq, nq, 0, headCol("QK")),
			checkBF16Rows(rank, "dv", bs, rows.DV, nv, nv, 0, headCol("value")))
	}
	valueHead := func(h int) string { return fmt.Sprintf("value head %d", h) }
	errs = append(errs, checkF32Rows(rank, "dg", bs, rows.DG, HV, valueHead), checkF32Rows(rank, "dbeta", bs, rows.DBeta, HV, valueHead))
	return errors.Join(errs...)
}

// fillGrads writes rank's gradients, as float64, to their global rows in g:
// dq, dk, dv from their own rows (core stage) or from the columns of dx
// (module stage), dg and dbeta.
func fillGrads(p *Plan, rank int, g *Grads, rows gradRows) {
	cfg := p.Config
	nq, nv, C, HV := cfg.HQK*gpuD, cfg.HV*gpuD, p.ConvChannels(), cfg.HV
	bs := tokenBlocks(p.Ranks[rank].Segments)
	if rows.DX != nil {
		fillBF16(bs, g.DQ, nq, rows.DX, C, 0)
		fillBF16(bs, g.DK, nq, rows.DX, C, nq)
		fillBF16(bs, g.DV, nv, rows.DX, C, 2*nq)
	} else {
		fillBF16(bs, g.DQ, nq, rows.DQ, nq, 0)
		fillBF16(bs, g.DK, nq, rows.DK, nq, 0)
		fillBF16(bs, g.DV, nv, rows.DV, nv, 0)
	}
	fillF32(bs, g.DG, HV, rows.DG)
	fillF32(bs, g.DBeta, HV, rows.DBeta)
}

// convChannel names conv channel c of the q|k|v concatenation: "q head 1
// column 3".
func convChannel(cfg PlanConfig, c int) string {
	nq := cfg.HQK * gpuD
	switch {
	case c < nq:
		return fmt.Sprintf("q head %d column %d", c/gpuD, c%gpuD)
	case c < 2*nq:
		return fmt.Sprintf("k head %d column %d", (c-nq)/gpuD, (c-nq)%gpuD)
	}
	return fmt.Sprintf("v head %d column %d", (c-2*nq)/gpuD, (c-2*nq)%gpuD)
}

// GPUCheckpoint is the handle of a GPU forward in checkpoint mode
// (GPU.ForwardCheckpoint, upstream's B3): the output, the width decisions,
// and on the host each rank's boundary start states (as the compose made
// them) and conv halos (module stage), with a reference to the inputs. It
// holds no device memory. Recompute rebuilds the forward's device state from
// it with no communication.
type GPUCheckpoint struct {
	// Decisions are the width decisions of every walk of every rank,
	// [rank][walk kind], read from the plan's memo.
	Decisions [][sched.NumWalkKinds]sched.Decision
	// VH is the width each forward walk launched with, [rank][walk kind].
	VH [][sched.NumWalkKinds]int
	// Split is GPUForward.Split of the checkpointed forward.
	Split [][sched.NumWalkKinds]int
	// Timing is every rank's forward timeline (GPUForwardStages).
	Timing []RankTiming
	// PeakBytes is every rank's peak device memory during the forward.
	PeakBytes []int64
	// Blob is the blob slot the kernels came from.
	Blob string
	// Ranks are the ranks that ran in this process, ascending; Recompute
	// rebuilds only theirs.
	Ranks []int

	g      *GPU
	in     *Inputs
	out    *gpuOutRows   // the forward's bf16 output rows
	starts [][]float32   // [rank] start states, [NS, HV, 128, 128]
	halos  [][]bf16.BF16 // [rank] conv halos, [NS, 3, C] (module stage)
}

// ForwardCheckpoint runs the forward in checkpoint mode: the same stages,
// kernels and exchanges as Forward, after which every device buffer is
// freed; it returns the output, the decisions and a handle that keeps the
// boundary start states and conv halos on the host (and references in,
// which must not change until the backward is done). GPUCheckpoint.Recompute
// rebuilds the device state for GPUForward.Backward.
func (g *GPU) ForwardCheckpoint(ctx context.Context, in *Inputs) (*GPUCheckpoint, error) {
	if err := g.alive(); err != nil {
		return nil, err
	}
	R := len(g.plan.Ranks)
	halos := make([][]bf16.BF16, R)
	f, err := g.forward(ctx, in, false, halos)
	if err != nil {
		return nil, err
	}
	ck := &GPUCheckpoint{out: f.out, Decisions: f.Decisions, VH: f.VH, Split: f.Split, Timing: f.Timing, PeakBytes: f.PeakBytes,
		Blob: f.Blob, Ranks: f.Ranks, g: g, in: in, starts: make([][]float32, R), halos: halos}
	for _, r := range f.Ranks {
		ck.starts[r] = f.States[r].Start
	}
	return ck, nil
}

// Output is the forward's output in global order, as GPUForward.Output.
func (ck *GPUCheckpoint) Output() *Output {
	if ck == nil || ck.out == nil {
		return nil
	}
	return ck.out.output()
}

// Recompute rebuilds the forward's device state from the checkpoint, every
// local rank (Ranks) on its own goroutine and stream on its device, with no
// communication (with GPUOptions.Communicator a failure still aborts the
// communicator, so that the peers stop waiting): inputs and
// tables uploaded with the saved conv halo and start states, conv (module
// stage), l2norm, prep, state walk from the saved start states, output.
// It runs the forward's own code and kernels on the same inputs at the
// widths of the plan's memo, so it reproduces the forward's intermediates
// bit for bit. The result keeps its device buffers (Timing holds
// GPURecomputeStages) for Backward; the caller frees them with Close. The
// backend that made the checkpoint must still be open.
func (ck *GPUCheckpoint) Recompute(ctx context.Context) (*GPUForward, error) {
	if ck == nil || ck.g == nil {
		return nil, errors.New("kcp: gpu recompute: the checkpoint is empty")
	}
	g := ck.g
	if err := g.alive(); err != nil {
		return nil, fmt.Errorf("kcp: gpu recompute: %w", err)
	}
	p := g.plan
	R := len(p.Ranks)
	if len(ck.starts) != R || len(ck.halos) != R {
		return nil, fmt.Errorf("kcp: gpu recompute: the checkpoint holds %d ranks' states and %d halos, the plan %d ranks",
			len(ck.starts), len(ck.halos), R)
	}
	if err := ck.in.Validate(p, g.opts.Stage, false); err != nil {
		return nil, fmt.Errorf("kcp: gpu recompute: %w", err)
	}
	dec, err := p.Decisions(g.opts.Profile, g.opts.Rule)
	if err != nil {
		return nil, err
	}
	res, err := g.newResult(dec)
	if err != nil {
		return nil, err
	}
	err = g.runRanks(ctx, "recompute", GPURecomputeStages, false, func(ctx context.Context, w *rankWork) error {
		return g.recomputeRank(ctx, w, ck, res)
	})
	if err != nil {
		if cerr := res.Close(); cerr != nil {
			return nil, errors.Join(err, fmt.Errorf("kcp: gpu recompute: %w", cerr))
		}
		return nil, err
	}
	return res, nil
}

// deviceBytes downloads the intermediates rank kept on the device (the
// output, the start and final states, the per-chunk states, V', the
// normalised q and k with their inverse norms, gamma, W, U, Kt and, in the
// module stage, the conv output) as raw bytes by name, for bitwise
// comparisons between a forward and a recompute.
func (f *GPUForward) deviceBytes(rank int) (map[string][]byte, error) {
	if f == nil || f.plan == nil {
		return nil, errors.New("kcp: device bytes: empty result")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if rank < 0 || rank >= len(f.ranks) || f.ranks[rank] == nil {
		return nil, fmt.Errorf("kcp: device bytes: rank %d kept no device buffers", rank)
	}
	rk := f.ranks[rank]
	out := map[string][]byte{}
	for name, b := range map[string]*loader.Buffer{
		"o": rk.o, "start": rk.start, "final": rk.final, "h": rk.h, "vnew": rk.vnew, "qn": rk.qn, "kn": rk.kn,
		"q_rstd": rk.qRstd, "k_rstd": rk.kRstd, "gcum": rk.gcum, "w": rk.w, "u": rk.u, "kt": rk.kt, "y": rk.y,
		"h16": rk.h16, "vnew16": rk.vnew16,
	} {
		if b == nil {
			continue
		}
		buf := make([]byte, b.Size())
		if err := loader.CopyFromDevice(b, buf); err != nil {
			return nil, fmt.Errorf("kcp: device bytes: rank %d %s: %w", rank, name, err)
		}
		out[name] = buf
	}
	return out, nil
}
