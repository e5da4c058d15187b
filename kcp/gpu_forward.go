package kcp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/gdnkcp/gdnkcp/comm"
	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/sched"
)

// GPUForwardStages are the stages of a rank's GPU forward in stream order, as
// RankTiming reports them: the conv halo exchange (module stage; host memory,
// the wait for the other ranks included), uploads of tables and inputs (and
// the output poison), the conv (module stage), the l2norm of q and k, the
// chunk prep, the summary walk, the summary exchange (device memory over
// NCCL, else host memory), the compose, the state walk and the output.
var GPUForwardStages = []string{"exchange halo", "upload", "conv", "l2norm", "prep", "summary walk", "exchange summaries", "compose", "state walk", "output"}

// GPURecomputeStages are the stages of a rank's checkpoint recompute
// (GPUCheckpoint.Recompute) in stream order, as RankTiming reports them: the
// forward's stages without the summary walk, the exchange and the compose
// (the upload carries the saved start states instead).
var GPURecomputeStages = []string{"upload", "conv", "l2norm", "prep", "state walk", "output"}

// StageTime is one stage's time on a rank's stream.
type StageTime struct {
	Stage  string  // one of GPUForwardStages, GPURecomputeStages or GPUBackwardStages
	Millis float64 // CUDA-event time from the end of the previous stage
}

// RankTiming is one rank's timeline of a forward, a recompute or a backward,
// from CUDA events recorded on its stream. A rank holding no tokens launches
// nothing and reports zeros.
type RankTiming struct {
	Rank int
	// Stages are GPUForwardStages, GPURecomputeStages or GPUBackwardStages
	// in order.
	Stages []StageTime
	// TotalMillis is the event time from before the first upload to after
	// the last kernel: copies, kernels and the exchanges (with their host
	// waits for the other ranks) included.
	TotalMillis float64
	// HostSeconds is the rank goroutine's wall time, host preparation of the
	// tables and inputs and the result copies included.
	HostSeconds float64
}

// RankStates are one rank's boundary states from the GPU, fp32, each
// [NS, HV, 128, 128] with every head's state row-major K x V.
type RankStates struct {
	Start []float32 // each segment's true start state (from the compose)
	Final []float32 // each segment's state at its end (from the state walk)
}

// GPUForward is the result of GPU.Forward or GPUCheckpoint.Recompute.
type GPUForward struct {
	// Decisions are the width decisions of every walk of every rank,
	// [rank][walk kind], read from the plan's memo.
	Decisions [][sched.NumWalkKinds]sched.Decision
	// VH is the width each walk launched with, [rank][walk kind]: the
	// decision or Options.ForceVH; 0 where nothing launched (an empty walk
	// list, or a walk the forward does not run).
	VH [][sched.NumWalkKinds]int
	// Split is, [rank][walk kind], how many (segment, value head) walks of a
	// walk split between the widths (GPUOptions.SplitHeads) ran at vh = 128,
	// the rest at vh = 64 (VH then holds the rule's width); 0 where the walk
	// ran at one width.
	Split [][sched.NumWalkKinds]int
	// States are every rank's boundary states, indexed by rank.
	States []RankStates
	// Timing is every rank's timeline, indexed by rank.
	Timing []RankTiming
	// PeakBytes is every rank's peak device memory during the forward (or
	// the recompute), in bytes, indexed by rank.
	PeakBytes []int64
	// Blob is the blob slot the kernels came from, e.g. "sm_90a".
	Blob string
	// Ranks are the ranks that ran in this process, ascending: every rank
	// of the plan, or with GPUOptions.Communicator that one rank. Only
	// their tokens of Out and their entries of the per-rank slices are
	// filled.
	Ranks []int

	plan  *Plan
	stage Stage
	out   *gpuOutRows // the local ranks' bf16 output rows
	opts  Options     // the backend's options, defaults filled in
	be    *GPU        // the backend that ran it: where its ranks run and how they exchange
	fleet *gpuFleet   // held while ranks keep device memory
	ranks []*gpuRank  // KeepDevice (and Recompute) only
	mu    sync.Mutex  // guards ranks and fleet; held through a Backward
}

// gpuRank is one rank's device state.
type gpuRank struct {
	rank   int
	dev    *gpuDevice // the device it lives on
	tb     *gpuTables
	mem    *devMem
	stream *loader.Stream
	split  splitStreams // side streams of split walks (launchSplit)

	chunkTok0, chunkLen, segChunk0, segNChunk, list, compOff, compIdx *loader.Buffer
	segStart, segLen, tokSeg, x, convW, halo, y                       *loader.Buffer
	q, k, v, g, beta                                                  *loader.Buffer
	qn, kn, qRstd, kRstd, gcum, w, u, kt                              *loader.Buffer
	wp, wk                                                            *loader.Buffer // walk planes (kernelSet.planes)
	sumP, sumQ, allP, allQ, start, final, h, vnew, o                  *loader.Buffer
	h16, vnew16                                                       *loader.Buffer // bf16 H^T, V'^T (MMAForward5)
	// normQK: this forward normalises q and k inside the prep and the
	// output (kernelSet.normQK): no l2norm kernel; the prep reads k's bf16
	// rows, the output q's at qRaw (row stride qSt elements) and K from
	// the prep's walk planes. A forward kept for a backward has them write
	// qn, kn, q_rstd and k_rstd as the l2norm kernel would (its chunks'
	// rows); the forward alone has none.
	normQK bool
	qRaw   uintptr
	qSt    int
	// kRaw, kSt: where the plane walks read k's bf16 rows (kernelSet.planes)
	// and their row stride in elements; they read k's rstd from kRstd.
	kRaw uintptr
	kSt  int
}

// normKept reports whether this forward normalises q and k in the prep and
// the output and keeps what a backward reads of them: the _gnk entries,
// which write q's and k's rstd always and qn, kn where they are allocated
// (a backward on q's and k's raw rows, kernelSet.rawQKGrads, the v5 default, keeps the rstd
// alone: qn and kn are nil and their pointers null).
func (rk *gpuRank) normKept() bool { return rk.normQK && rk.qRstd != nil }

// qkv returns where the chunk kernels read q, k and v and their row strides
// in elements: the inputs in the core stage, the conv output's columns in
// the module stage (q at column 0, k at HQK*128, v at 2*HQK*128). The
// forward's prep and the backward's chunk gradients read v alike.
func (rk *gpuRank) qkv(stage Stage, cfg PlanConfig, C int) (qp, kp, vp uintptr, qst, kst, vst int) {
	nq, nv := cfg.HQK*gpuD, cfg.HV*gpuD
	if stage == StageModule {
		base := rk.y.Ptr()
		return base, base + uintptr(2*nq), base + uintptr(2*2*nq), C, C, C
	}
	return rk.q.Ptr(), rk.k.Ptr(), rk.v.Ptr(), nq, nq, nv
}

// Forward runs the forward of every local rank of the plan (GPU.LocalRanks),
// each rank on its own goroutine and stream on its device, the exchanges
// (conv halo, summaries) going device -> host -> all-gather over the
// backend's communicator (loopback, NCCL or the given one) -> host ->
// device. A rank's failure aborts the run: the error is a *RunError naming
// the rank that failed first and every failed rank with its stage. Per rank,
// in stream order: tables and inputs uploaded, conv (module stage), l2norm,
// prep, summary walk, exchange, compose, state walk, output (poisoned first).
// It returns the output, the boundary states and the timings. An output
// element left unwritten (still poisoned) or NaN is an error naming the rank,
// token and head. Device memory is freed before Forward returns unless
// GPUOptions.KeepDevice is set (then GPUForward.Backward can run on it); on
// error it is always freed.
func (g *GPU) Forward(ctx context.Context, in *Inputs) (*GPUForward, error) {
	if err := g.alive(); err != nil {
		return nil, err
	}
	return g.forward(ctx, in, g.gopts.KeepDevice, nil)
}

// forward runs the forward of every rank; keep keeps the device buffers in
// the result. When halos is set (one slot per rank), each rank's conv halo
// is saved there (module stage), for a checkpoint.
func (g *GPU) forward(ctx context.Context, in *Inputs, keep bool, halos [][]bf16.BF16) (*GPUForward, error) {
	if err := g.alive(); err != nil {
		return nil, err
	}
	if err := in.Validate(g.plan, g.opts.Stage, false); err != nil {
		return nil, err
	}
	dec, err := g.plan.Decisions(g.opts.Profile, g.opts.Rule)
	if err != nil {
		return nil, err
	}
	res, err := g.newResult(dec)
	if err != nil {
		return nil, err
	}
	err = g.runRanks(ctx, "forward", GPUForwardStages, true, func(ctx context.Context, w *rankWork) error {
		return g.forwardRank(ctx, w, in, res, keep, halos)
	})
	if err != nil {
		if cerr := res.Close(); cerr != nil {
			return nil, errors.Join(err, fmt.Errorf("kcp: gpu forward: %w", cerr))
		}
		return nil, err
	}
	if !keep {
		if err := res.Close(); err != nil {
			return nil, fmt.Errorf("kcp: gpu forward: %w", err)
		}
	}
	return res, nil
}

// newResult makes an empty result holding a reference to the devices,
// which its Close releases.
func (g *GPU) newResult(dec [][sched.NumWalkKinds]sched.Decision) (*GPUForward, error) {
	if err := g.fleet.retain(); err != nil {
		return nil, err
	}
	p := g.plan
	R := len(p.Ranks)
	return &GPUForward{
		out:       newGPUOutRows(p),
		Decisions: dec, VH: make([][sched.NumWalkKinds]int, R), Split: make([][sched.NumWalkKinds]int, R),
		States: make([]RankStates, R), Timing: make([]RankTiming, R), PeakBytes: make([]int64, R),
		Blob: g.dev.profile.Target, Ranks: g.LocalRanks(), plan: p, stage: g.opts.Stage, opts: g.opts, be: g, fleet: g.fleet,
		ranks: make([]*gpuRank, R),
	}, nil
}

// Close frees the device memory kept with KeepDevice (nothing otherwise).
// It is idempotent.
func (f *GPUForward) Close() error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for i := len(f.ranks) - 1; i >= 0; i-- {
		if rk := f.ranks[i]; rk != nil {
			if err := rk.mem.free(); err != nil {
				errs = append(errs, fmt.Errorf("rank %d: %w", rk.rank, err))
			}
			f.ranks[i] = nil
		}
	}
	if f.fleet != nil {
		errs = append(errs, f.fleet.release())
		f.fleet = nil
	}
	return errors.Join(errs...)
}

// SegmentStates returns segment seg of rank rank's start state (from the
// compose) and final state (from the state walk) for value head head, as
// float64 copies of the fp32 values, row-major K x V (DK*DV values): the
// shape of Activations.SegmentStates on the CPU backend.
func (f *GPUForward) SegmentStates(rank, seg, head int) (start, final []float64, err error) {
	if f == nil || f.plan == nil {
		return nil, nil, errors.New("kcp: gpu states: empty result")
	}
	if err := checkStateIndex(f.plan, rank, seg, head); err != nil {
		return nil, nil, err
	}
	n := gpuD * gpuD
	base := (seg*f.plan.Config.HV + head) * n
	if rank >= len(f.States) || len(f.States[rank].Start) < base+n || len(f.States[rank].Final) < base+n {
		return nil, nil, fmt.Errorf("kcp: gpu states: rank %d did not run in this process (the result holds ranks %v)", rank, f.Ranks)
	}
	st := f.States[rank]
	start, final = make([]float64, n), make([]float64, n)
	for i := 0; i < n; i++ {
		start[i] = float64(st.Start[base+i])
		final[i] = float64(st.Final[base+i])
	}
	return start, final, nil
}

// checkStateIndex reports a rank, segment or head outside the plan.
func checkStateIndex(p *Plan, rank, seg, head int) error {
	if rank < 0 || rank >= len(p.Ranks) {
		return fmt.Errorf("kcp: states: rank %d outside the plan's %d ranks", rank, len(p.Ranks))
	}
	if ns := len(p.Ranks[rank].Segments); seg < 0 || seg >= ns {
		return fmt.Errorf("kcp: states: segment %d outside rank %d's %d segments", seg, rank, ns)
	}
	if hv := p.Config.HV; head < 0 || head >= hv {
		return fmt.Errorf("kcp: states: value head %d outside 0..%d", head, hv-1)
	}
	return nil
}

// StateErrors compares the GPU's boundary states with the CPU backend's over
// every segment and value head of the plan: the norm-wise relative errors
// ||gpu - cpu|| / ||cpu|| of all start states together and of all final
// states together. Both must come from the same plan.
func StateErrors(f *GPUForward, act *Activations) (start, final float64, err error) {
	if f == nil || act == nil || act.be == nil || f.plan == nil {
		return 0, 0, errors.New("kcp: state errors: missing result")
	}
	if f.plan != act.be.plan {
		return 0, 0, errors.New("kcp: state errors: the results come from different plans")
	}
	var gs, cs, gf, cf []float64
	p := f.plan
	for r := range p.Ranks {
		for s := range p.Ranks[r].Segments {
			for h := 0; h < p.Config.HV; h++ {
				a, b, err := f.SegmentStates(r, s, h)
				if err != nil {
					return 0, 0, err
				}
				c, d, err := act.SegmentStates(r, s, h)
				if err != nil {
					return 0, 0, err
				}
				gs, gf, cs, cf = append(gs, a...), append(gf, b...), append(cs, c...), append(cf, d...)
			}
		}
	}
	return RelErr(gs, cs), RelErr(gf, cf), nil
}

// ConvOutput returns the conv output y of the module stage that the GPU
// computed, [T, C] in global order as float32 of the bf16 values. It needs
// KeepDevice (the device buffers) and the module stage.
func (f *GPUForward) ConvOutput() ([]float32, error) {
	if f == nil || f.plan == nil {
		return nil, errors.New("kcp: conv output: empty result")
	}
	if f.stage != StageModule {
		return nil, errors.New("kcp: conv output: the forward ran the core stage (no conv)")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.plan
	C := p.ConvChannels()
	out := make([]float32, p.Tokens*C)
	for r, rk := range f.ranks {
		rp := &p.Ranks[r]
		if rp.Tokens == 0 || !slices.Contains(f.Ranks, r) {
			continue // another process's rank stays zero
		}
		if rk == nil || rk.y == nil {
			return nil, fmt.Errorf("kcp: conv output: rank %d kept no device buffers (set GPUOptions.KeepDevice)", r)
		}
		y := make([]bf16.BF16, rp.Tokens*C)
		v, err := exact(rk.y, 2*len(y))
		if err != nil {
			return nil, err
		}
		if err := loader.CopyFromDevice(v, y); err != nil {
			return nil, fmt.Errorf("kcp: conv output: rank %d: %w", r, err)
		}
		for _, seg := range rp.Segments {
			for i := 0; i < seg.Len; i++ {
				src := y[(seg.LocalStart+i)*C : (seg.LocalStart+i+1)*C]
				dst := out[(seg.Start+i)*C : (seg.Start+i+1)*C]
				for j, b := range src {
					dst[j] = b.Float32()
				}
			}
		}
	}
	return out, nil
}

// stageClock records one CUDA event per stage boundary on a rank's stream
// and reads the stage times back: the forward, the recompute and the
// backward time their stages with it.
type stageClock struct {
	rank   int
	stream *loader.Stream
	stages []string
	events []*loader.Event // len(stages)+1
	n      int             // events recorded so far
	st     *stageTracker   // entered at every stage start; may be nil
}

// newStageClock makes the events of stages in m; each mark that starts a
// stage enters it in st (calling the stage hooks).
func newStageClock(m *devMem, rank int, s *loader.Stream, stages []string, st *stageTracker) (*stageClock, error) {
	c := &stageClock{rank: rank, stream: s, stages: stages, st: st}
	if st != nil {
		st.sync = s.Synchronize
	}
	for range len(stages) + 1 {
		ev, err := m.event()
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", rank, err)
		}
		c.events = append(c.events, ev)
	}
	return c, nil
}

// mark records the event that ends the next stage (the first marks the
// start).
func (c *stageClock) mark() error {
	if c.n >= len(c.events) {
		return fmt.Errorf("rank %d: more stage marks than the %d stages", c.rank, len(c.stages))
	}
	if err := c.events[c.n].Record(c.stream); err != nil {
		return fmt.Errorf("rank %d: record event: %w", c.rank, err)
	}
	c.n++
	if c.n <= len(c.stages) {
		return c.st.upTo(c.stages[c.n-1]) // event n-1 starts stage n-1
	}
	return nil
}

// read fills tm's stage times and total from the recorded events (after the
// stream was synchronized).
func (c *stageClock) read(tm *RankTiming) error {
	if c.n != len(c.events) {
		return fmt.Errorf("rank %d: %d of %d timing events recorded", c.rank, c.n, len(c.events))
	}
	tm.Stages = tm.Stages[:0]
	for i, name := range c.stages {
		ms, err := loader.ElapsedMillis(c.events[i], c.events[i+1])
		if err != nil {
			return fmt.Errorf("rank %d: time %s: %w", c.rank, name, err)
		}
		tm.Stages = append(tm.Stages, StageTime{name, float64(ms)})
	}
	ms, err := loader.ElapsedMillis(c.events[0], c.events[len(c.events)-1])
	if err != nil {
		return fmt.Errorf("rank %d: time all stages: %w", c.rank, err)
	}
	tm.TotalMillis = float64(ms)
	return nil
}

// launchOn runs entry of dev on stream s with 256-thread blocks; an error
// names the rank and the kernel.
func launchOn(dev *gpuDevice, s *loader.Stream, rank int, entry string, grid [3]uint32, smem int, args *loader.Args) error {
	fn := dev.fn[entry]
	if fn == nil {
		return fmt.Errorf("rank %d: %s: the kernel was not resolved when the backend loaded", rank, entry)
	}
	if err := loader.Launch(s, fn, grid, [3]uint32{gpuBlock, 1, 1}, uint32(smem), args); err != nil {
		return fmt.Errorf("rank %d: %s: %w", rank, entry, err)
	}
	return nil
}

// poisonOn fills words 32-bit words of b with v on stream s (gdn_poison_u32).
func poisonOn(dev *gpuDevice, s *loader.Stream, rank int, b *loader.Buffer, words int, v uint32) error {
	if words == 0 {
		return nil
	}
	return launchOn(dev, s, rank, entryPoison, [3]uint32{uint32(min(ceilDiv(words, gpuBlock), 4096)), 1, 1}, 0,
		argsPoison(b.Ptr(), uint64(words), v))
}

// walkWidth is the width walk k of rank launches with: the plan's memoized
// decision under o's profile and rule, or o.ForceVH.
func walkWidth(p *Plan, o Options, rank int, k sched.WalkKind) (int, error) {
	d, err := p.Width(rank, k, o.Profile, o.Rule)
	if err != nil {
		return 0, err
	}
	vh := d.VH
	if o.ForceVH != 0 {
		vh = o.ForceVH
	}
	if vh != 64 && vh != 128 {
		return 0, fmt.Errorf("kcp: rank %d %s walk: width %d (want 64 or 128)", rank, k, vh)
	}
	return vh, nil
}

// walkSlots is how many walk CTAs prof's GPU runs at once: its measured walk
// CTAs an SM (the variant's cost rule) times its SMs, else two an SM (rule B's
// model).
func walkSlots(prof sched.Profile) int {
	if r, err := sched.RulesFor(prof.Variant); err == nil && r.Cost != nil {
		return r.Cost.CTAsPerSM * prof.SMs
	}
	return 2 * prof.SMs
}

// walkDispatch is the dispatch order (sched.DispatchOrder over walkSlots) of
// a walk over chains (the chunk counts of the segments it walks, in launch
// order) with tiles CTAs a segment (128/vh; the summary and offset walks
// 2*128/vh): the CTA a walk's block i runs as (dispatch_cta in
// ptx/src/mma.cuh). It is nil where launch order finishes as early (one
// segment, or segments of one length): the walk then runs in launch order.
func walkDispatch(prof sched.Profile, chains []int32, hv, tiles int) ([]int32, error) {
	c := make([]int, len(chains))
	for i, x := range chains {
		c[i] = int(x)
	}
	slots := walkSlots(prof)
	order, span, err := sched.DispatchOrder(c, hv, tiles, slots)
	if err != nil {
		return nil, err
	}
	launch, err := sched.ListMakespan(c, hv, tiles, slots)
	if err != nil || span >= launch {
		return nil, err
	}
	return order, nil
}

// listChains is the chunk counts of the segments of list (a walk list of
// segment indices), in list order.
func listChains(segNChunk, list []int32) []int32 {
	c := make([]int32, len(list))
	for i, s := range list {
		c[i] = segNChunk[s]
	}
	return c
}

// orderCapacity is the entries of a walk's order table over nchains walked
// segments of hv value heads, t the walk's column sets
// (sched.WalkKind.ColumnSets): its CTAs at vh = 64, 2 t a segment and head,
// the most any width or split takes (sched.Mixed's table is t (2 S HV - W)
// entries, vh = 128's t S HV).
func orderCapacity(t, nchains, hv int) int {
	return 2 * t * nchains * hv
}

// walkOrder reserves walk k's order table in m at orderCapacity entries and
// fills it with walkDispatch's order for g's profile at width vh over
// chains (the walked segments' chunk counts, in list order). It returns the
// order's address, or 0 where the walk runs in launch order (no order
// shorter than it, or GPUOptions.LaunchOrder). The table is reserved in
// every case and at one size, so that the width choice (vh 64, vh 128 or a
// split, with an order or without) does not change the rank's peak device
// memory (issue 6). The orders are remembered by chains, hv and tiles (g's
// plan and profile are fixed): a walk's order is computed once, not before
// every launch.
func (g *GPU) walkOrder(m *devMem, s *loader.Stream, chains []int32, hv int, k sched.WalkKind, vh int, name string) (uintptr, error) {
	var order []int32
	if !g.gopts.LaunchOrder {
		tiles := k.ColumnSets() * gpuD / vh
		key := fmt.Sprint(hv, tiles, chains)
		if v, ok := g.orders.Load(key); ok {
			order = v.([]int32)
		} else {
			var err error
			if order, err = walkDispatch(g.opts.Profile, chains, hv, tiles); err != nil {
				return 0, err
			}
			g.orders.Store(key, order)
		}
	}
	b, err := uploadCap(m, s, name, order, 4, orderCapacity(k.ColumnSets(), len(chains), hv))
	if err != nil || order == nil {
		return 0, err
	}
	return b.Ptr(), nil
}

// gpuScale is the output scale the kernels take: Options.Scale, or
// 1/sqrt(128).
func gpuScale(o Options) float32 {
	if o.Scale == 0 {
		return float32(1 / math.Sqrt(gpuD))
	}
	return float32(o.Scale)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// rankRun is one rank's forward (or recompute) in progress.
type rankRun struct {
	g   *GPU
	rk  *gpuRank
	cm  comm.Communicator // nil in a recompute
	in  *gpuRankInputs
	res *GPUForward
	clk *stageClock
	st  *stageTracker
	// keepStates: a backward will read the fp32 per-chunk states and V'
	// (KeepDevice, Recompute); with MMAForward5 they are written only then.
	keepStates bool
}

// newRankRun lays out the tables of w's rank and starts its device state on
// w's device.
func (g *GPU) newRankRun(w *rankWork, res *GPUForward) (*rankRun, error) {
	r := w.rank
	tb, err := buildGPUTables(g.plan, r)
	if err != nil {
		return nil, err
	}
	if w.dev == nil {
		return nil, fmt.Errorf("rank %d: device %d is not loaded", r, w.device)
	}
	rk := &gpuRank{rank: r, dev: w.dev, tb: tb, mem: newDevMem(w.dev.ctx, w.dev.stage)}
	res.Timing[r] = RankTiming{Rank: r}
	return &rankRun{g: g, rk: rk, cm: w.cm, res: res, st: w.st}, nil
}

// release ends a rank's run: on error, or unless keep, the rank's device
// memory is freed (after launched work finished); else it goes to the
// result. The rank's peak memory is recorded either way.
func (rr *rankRun) release(err *error, keep bool) {
	rk := rr.rk
	_, rr.res.PeakBytes[rk.rank] = rk.mem.held()
	if *err != nil || !keep {
		if *err != nil && rk.stream != nil {
			// Let launched work finish before its memory goes; its error,
			// if any, is the one already reported.
			_ = rk.stream.Synchronize()
			rk.split.sync()
		}
		*err = errors.Join(*err, rk.mem.free())
		return
	}
	rr.res.ranks[rk.rank] = rk
}

// forwardRank runs one rank's forward and fills its slots of res. When
// halos is set, the rank's conv halo is saved in halos[rank].
func (g *GPU) forwardRank(ctx context.Context, w *rankWork, in *Inputs, res *GPUForward, keep bool, halos [][]bf16.BF16) (err error) {
	t0 := time.Now()
	p := g.plan
	r := w.rank
	rr, err := g.newRankRun(w, res)
	if err != nil {
		return err
	}
	defer rr.release(&err, keep)
	rr.keepStates = keep
	empty := rr.rk.tb.Tokens == 0
	if !empty {
		rr.in = gatherGPUInputs(p, r, g.opts.Stage, in)
	}
	if !empty {
		// The timeline starts before the halo exchange, so that it (and
		// the wait for the other ranks in it) is in the rank's total.
		if err := rr.startClock(GPUForwardStages); err != nil {
			return err
		}
	}
	var halo []bf16.BF16
	if g.opts.Stage == StageModule {
		if halo, err = rr.exchangeHalo(ctx, in); err != nil {
			return err
		}
		if halos != nil {
			halos[r] = halo
		}
	}
	if !empty {
		if err := rr.mark(); err != nil { // exchange halo
			return err
		}
		if err := rr.begin(GPUForwardStages, halo, nil); err != nil {
			return err
		}
		if err := rr.summaryWalk(); err != nil {
			return err
		}
	}
	g.opts.progress(r, "conv")
	g.opts.progress(r, "prep")
	g.opts.progress(r, "summary walk")
	if err := rr.st.upTo("exchange summaries"); err != nil {
		return err
	}
	if err := rr.exchangeSummaries(ctx); err != nil {
		return err
	}
	g.opts.progress(r, "exchange summaries")
	if !empty {
		if err := rr.clk.mark(); err != nil { // exchange summaries
			return err
		}
		if err := rr.compose(); err != nil {
			return err
		}
		if err := rr.finish(); err != nil {
			return err
		}
	} else if err := rr.res.out.setEmpty(r); err != nil {
		return err
	}
	g.opts.progress(r, "compose")
	g.opts.progress(r, "state walk")
	g.opts.progress(r, "output")
	if err := rr.st.finish(); err != nil {
		return err
	}
	res.Timing[r].HostSeconds = time.Since(t0).Seconds()
	return ctx.Err()
}

// recomputeRank runs one rank's checkpoint recompute, with no
// communication: the forward's begin (uploads with the saved conv halo and
// start states, conv, l2norm, prep) and finish (state walk, output), the
// device buffers kept in res.
func (g *GPU) recomputeRank(ctx context.Context, w *rankWork, ck *GPUCheckpoint, res *GPUForward) (err error) {
	t0 := time.Now()
	r := w.rank
	rr, err := g.newRankRun(w, res)
	if err != nil {
		return err
	}
	defer rr.release(&err, true)
	rr.keepStates = true
	if rr.rk.tb.Tokens > 0 {
		rr.in = gatherGPUInputs(g.plan, r, g.opts.Stage, ck.in)
		if err := rr.begin(GPURecomputeStages, ck.halos[r], ck.starts[r]); err != nil {
			return err
		}
		g.opts.progress(r, "conv")
		g.opts.progress(r, "prep")
		if err := rr.finish(); err != nil {
			return err
		}
	} else {
		if err := rr.res.out.setEmpty(r); err != nil {
			return err
		}
		g.opts.progress(r, "conv")
		g.opts.progress(r, "prep")
	}
	g.opts.progress(r, "state walk")
	g.opts.progress(r, "output")
	if err := rr.st.finish(); err != nil {
		return err
	}
	res.Timing[r].HostSeconds = time.Since(t0).Seconds()
	return ctx.Err()
}

// exchangeHalo all-gathers every segment's last 3 pre-conv tokens and builds
// the rank's halo, bf16 [NS, 3, C].
func (rr *rankRun) exchangeHalo(ctx context.Context, in *Inputs) ([]bf16.BF16, error) {
	p := rr.g.plan
	send := haloSend(p, rr.rk.rank, in)
	all, err := comm.AllGatherFloat32(ctx, rr.cm, send)
	if err != nil {
		return nil, fmt.Errorf("rank %d: halo exchange: %w", rr.rk.rank, err)
	}
	return haloFromGathered(p, rr.rk.rank, all)
}

// mark records the event that ends the next stage.
func (rr *rankRun) mark() error { return rr.clk.mark() }

// gather is the device all-gather of the rank's communicator, nil for the
// host path (the loopback, or GPUOptions.HostExchange).
func (rr *rankRun) gather() deviceAllGather {
	if rr.cm == nil || rr.g.gopts.HostExchange {
		return nil
	}
	return deviceGatherOf(rr.cm)
}

// launch runs entry on the rank's stream with 256-thread blocks.
func (rr *rankRun) launch(entry string, grid [3]uint32, smem int, args *loader.Args) error {
	return launchOn(rr.rk.dev, rr.rk.stream, rr.rk.rank, entry, grid, smem, args)
}

// vh is the width walk k of this rank launches with; it is recorded in the
// result's VH.
func (rr *rankRun) vh(k sched.WalkKind) (int, error) {
	vh, err := walkWidth(rr.g.plan, rr.g.opts, rr.rk.rank, k)
	if err != nil {
		return 0, err
	}
	rr.res.VH[rr.rk.rank][k] = vh
	return vh, nil
}

// startClock makes the rank's stream and the events of stages, and marks
// the start of the first stage.
func (rr *rankRun) startClock(stages []string) (err error) {
	rk := rr.rk
	if rk.stream, err = rk.mem.stream(); err != nil {
		return fmt.Errorf("rank %d: %w", rk.rank, err)
	}
	if rr.clk, err = newStageClock(rk.mem, rk.rank, rk.stream, stages, rr.st); err != nil {
		return err
	}
	return rr.mark()
}

// begin uploads the tables and inputs (halo: the conv halo of the module
// stage; start, when set, the segments' start states, [NS, HV, 128, 128],
// for a recompute) and runs conv, l2norm and prep, marking the end of each
// of the stages upload, conv, l2norm and prep. Unless startClock made the
// rank's stream and clock already (the forward, whose first stage is the
// halo exchange), it makes them for stages first. The forward and the
// recompute share it, so they launch the same kernels on the same inputs.
func (rr *rankRun) begin(stages []string, halo []bf16.BF16, start []float32) (err error) {
	rk, g := rr.rk, rr.g
	m, tb := rk.mem, rk.tb
	ks := rk.dev.ks
	cfg := g.plan.Config
	Tr, NS, NC := tb.Tokens, tb.NS, tb.NC
	HQK, HV := cfg.HQK, cfg.HV
	nq, nv := HQK*gpuD, HV*gpuD
	wrap := func(err error) error {
		if err == nil {
			return nil
		}
		return fmt.Errorf("rank %d: %w", rk.rank, err)
	}
	if rr.clk == nil {
		if err := rr.startClock(stages); err != nil {
			return err
		}
	}
	s := rk.stream
	i32 := func(name string, src []int32) (*loader.Buffer, error) { return upload(m, s, name, src, 4) }
	f32 := func(name string, n int) (*loader.Buffer, error) { return m.alloc(name, 4*n) }
	for _, t := range []struct {
		dst **loader.Buffer
		nm  string
		src []int32
	}{
		{&rk.chunkTok0, "chunk_tok0", tb.ChunkTok0}, {&rk.chunkLen, "chunk_len", tb.ChunkLen},
		{&rk.segChunk0, "seg_chunk0", tb.SegChunk0}, {&rk.segNChunk, "seg_nchunk", tb.SegNChunk},
		{&rk.list, "summary list", tb.Summary}, {&rk.compOff, "comp_off", tb.CompOff}, {&rk.compIdx, "comp_idx", tb.CompIdx},
	} {
		if *t.dst, err = i32(t.nm, t.src); err != nil {
			return wrap(err)
		}
	}
	in := rr.in
	module := g.opts.Stage == StageModule
	C := g.plan.ConvChannels()
	if module {
		if len(halo) != NS*ConvHalo*C {
			return fmt.Errorf("rank %d: conv halo has %d values, want %d segments x %d x %d", rk.rank, len(halo), NS, ConvHalo, C)
		}
		for _, t := range []struct {
			dst **loader.Buffer
			nm  string
			src []int32
		}{{&rk.segStart, "seg_start", tb.SegStart}, {&rk.segLen, "seg_len", tb.SegLen}, {&rk.tokSeg, "tok_seg", tb.TokSeg}} {
			if *t.dst, err = i32(t.nm, t.src); err != nil {
				return wrap(err)
			}
		}
		if rk.x, err = upload(m, s, "x", in.X, 2); err != nil {
			return wrap(err)
		}
		if rk.convW, err = upload(m, s, "conv_w", in.ConvW, 2); err != nil {
			return wrap(err)
		}
		if rk.halo, err = upload(m, s, "halo", halo, 2); err != nil {
			return wrap(err)
		}
		if rk.y, err = m.alloc("y", 2*Tr*C); err != nil {
			return wrap(err)
		}
	} else {
		if rk.q, err = upload(m, s, "q", in.Q, 2); err != nil {
			return wrap(err)
		}
		if rk.k, err = upload(m, s, "k", in.K, 2); err != nil {
			return wrap(err)
		}
		if rk.v, err = upload(m, s, "v", in.V, 2); err != nil {
			return wrap(err)
		}
	}
	if rk.g, err = upload(m, s, "g", in.G, 4); err != nil {
		return wrap(err)
	}
	if rk.beta, err = upload(m, s, "beta", in.Beta, 4); err != nil {
		return wrap(err)
	}
	if err := m.dropStager(); err != nil { // the inputs' copies are queued: the pinned chunks go back
		return wrap(err)
	}
	// Kt: see below. The v5 set's prep and output normalise q and k
	// themselves (kernelSet.normQK) and, where a backward needs them, write
	// qn, kn and their rstd too; with Kt only while the grouped prep takes
	// every head's Kt in one pass (kernelSet.prepFor).
	//
	// fp32Walk: a backward's offset and tape walks will read fp32 W and Kt,
	// unless they read the walk planes (kernelSet.bwalkPlanes); then the
	// kept forward writes neither (1.6 GB at 32,768 tokens and 48 value
	// heads).
	keep := rr.keepStates
	fp32Walk := keep && !ks.bwalkPlanes
	needKt := !ks.out16 || fp32Walk || (ks.prep != entryPrepMMA && ks.prep != entryPrepMMAG)
	rk.normQK = ks.normQK && (!needKt || HV/HQK <= prepMaxGroup)
	rk.qn, rk.kn, rk.qRstd, rk.kRstd = nil, nil, nil, nil
	for _, t := range []struct {
		dst  **loader.Buffer
		nm   string
		n    int
		norm bool // l2norm output: not made with normQK
	}{
		{&rk.qn, "qn", Tr * nq, true}, {&rk.kn, "kn", Tr * nq, true}, {&rk.qRstd, "q_rstd", Tr * HQK, true},
		{&rk.kRstd, "k_rstd", Tr * HQK, true}, {&rk.gcum, "gcum", Tr * HV, false}, {&rk.u, "u", Tr * nv, false},
		{&rk.start, "start states", NS * summarySlot(HV), false}, {&rk.final, "final states", NS * summarySlot(HV), false},
	} {
		if t.norm && rk.normQK && !keep && !(ks.planes && t.dst == &rk.kRstd) { // the forward alone: nothing reads them
			continue // (but k's rstd, which the plane walks read)
		}
		if rk.normQK && keep && ks.rawQKDvLocal && ks.rawQKGrads && (t.dst == &rk.qn || t.dst == &rk.kn) {
			continue // the backward reads q's and k's raw rows and their rstd (kernelSet.rawQKGrads)
		}
		if *t.dst, err = f32(t.nm, t.n); err != nil {
			return wrap(err)
		}
	}
	// W: fp32 for the walks and the backward; with the plane walks the prep
	// writes the walk planes and fp32 W only where a backward's walk reads it.
	if !ks.planes || fp32Walk {
		if rk.w, err = f32("w", Tr*nv); err != nil {
			return wrap(err)
		}
	}
	if ks.planes {
		if rk.wp, err = m.alloc("walk planes -W", NC*HV*walkWPlaneBytes); err != nil {
			return wrap(err)
		}
		if rk.wk, err = m.alloc("walk planes K", NC*HQK*walkKPlaneBytes); err != nil {
			return wrap(err)
		}
	}
	// Kt and the per-chunk states and V': fp32 for the walks, the output and
	// the backward; with MMAForward5 the walks rebuild Kt from kn and the
	// output reads bf16 copies of H and V', so the fp32 ones are made only
	// where a backward reads them (and Kt also where the prep cannot skip
	// it: only gdn_prep_mma and gdn_prep_mma_g take a null Kt).
	if needKt {
		if rk.kt, err = f32("kt", Tr*nv); err != nil {
			return wrap(err)
		}
	}
	if ks.fp32States(rr.keepStates, g.opts.Stage) {
		if rk.h, err = f32("chunk states", NC*summarySlot(HV)); err != nil {
			return wrap(err)
		}
		// With token slots V' is a 32 KB block a (chunk, value head): the
		// same bytes as fp32 rows of full chunks.
		nvnew, what := Tr*nv, "vnew"
		if ks.tokenSlots {
			nvnew, what = NC*ChunkSize*nv, "vnew token slots"
		}
		if rk.vnew, err = f32(what, nvnew); err != nil {
			return wrap(err)
		}
	}
	if ks.out16 {
		if rk.h16, err = m.alloc("chunk states bf16", 2*NC*summarySlot(HV)); err != nil {
			return wrap(err)
		}
		if rk.vnew16, err = m.alloc("vnew bf16", 2*NC*HV*gpuD*ChunkSize); err != nil {
			return wrap(err)
		}
	}
	if start != nil {
		if len(start) != NS*summarySlot(HV) {
			return fmt.Errorf("rank %d: saved start states have %d values, want %d segments x %d", rk.rank, len(start), NS, summarySlot(HV))
		}
		if err := loader.CopyToDeviceAsync(rk.start, start, s); err != nil {
			return fmt.Errorf("rank %d: upload start states: %w", rk.rank, err)
		}
	}
	if rk.o, err = m.alloc("o", 2*Tr*nv); err != nil {
		return wrap(err)
	}
	// Poison o so that anything the output kernel leaves shows as NaN.
	if err := poisonOn(rk.dev, s, rk.rank, rk.o, Tr*nv/2, PoisonBF16x2); err != nil {
		return err
	}
	if err := rr.mark(); err != nil { // upload
		return err
	}
	// conv (module stage): y = silu(conv(x)), then q, k, v are read out of y.
	if module {
		lanes := C
		if C%8 == 0 {
			lanes = C / 8
		}
		items := lanes * ceilDiv(Tr, 16)
		if err := rr.launch(entryConv, [3]uint32{uint32(ceilDiv(items, gpuBlock)), 1, 1}, 0,
			argsConv(rk.x.Ptr(), rk.convW.Ptr(), rk.halo.Ptr(), rk.segStart.Ptr(), rk.segLen.Ptr(), rk.tokSeg.Ptr(), rk.y.Ptr(),
				Tr, C, NS)); err != nil {
			return err
		}
	}
	qp, kp, vp, qst, kst, vst := rk.qkv(g.opts.Stage, cfg, C)
	if err := rr.mark(); err != nil { // conv
		return err
	}
	rk.qRaw, rk.qSt = qp, qst
	rk.kRaw, rk.kSt = kp, kst
	if ks.planes && (kp%16 != 0 || kst%8 != 0) { // the plane walks copy k's rows in 16-byte units
		return fmt.Errorf("rank %d: k's rows (at %#x, stride %d elements) are not 16-byte aligned for the plane walks", rk.rank, kp, kst)
	}
	if !rk.normQK { // with normQK the prep and the output normalise q, k themselves
		if err := rr.launch(entryL2Norm, [3]uint32{uint32(ceilDiv(Tr*HQK*2, gpuBlock/32)), 1, 1}, 0,
			argsL2Norm(qp, kp, qst, kst, rk.qn.Ptr(), rk.kn.Ptr(), rk.qRstd.Ptr(), rk.kRstd.Ptr(), Tr, HQK, !g.opts.NoL2Norm)); err != nil {
			return err
		}
	}
	if err := rr.mark(); err != nil { // l2norm
		return err
	}
	prep, prepSmem, prepQK := ks.prepFor(rk.kt != nil, HV/HQK)
	prepBlocks := HV
	if prepQK {
		prepBlocks = HQK
	}
	args := argsPrep(rk.kn.Ptr(), vp, vst, rk.g.Ptr(), rk.beta.Ptr(), rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(),
		rk.gcum.Ptr(), rk.w.Ptr(), rk.u.Ptr(), rk.kt.Ptr(), HQK, HV)
	switch {
	case rk.normKept():
		prep = entryPrepMMAGNK
		args = argsPrepMMAGNK(kp, kst, !g.opts.NoL2Norm, vp, vst, rk.g.Ptr(), rk.beta.Ptr(), rk.chunkTok0.Ptr(),
			rk.chunkLen.Ptr(), rk.gcum.Ptr(), rk.w.Ptr(), rk.u.Ptr(), rk.wp.Ptr(), rk.wk.Ptr(), HQK, HV, rk.kt.Ptr(),
			rk.kn.Ptr(), rk.kRstd.Ptr())
	case rk.normQK:
		prep = entryPrepMMAGN
		args = argsPrepMMAGN(kp, kst, !g.opts.NoL2Norm, vp, vst, rk.g.Ptr(), rk.beta.Ptr(), rk.chunkTok0.Ptr(),
			rk.chunkLen.Ptr(), rk.gcum.Ptr(), rk.w.Ptr(), rk.u.Ptr(), rk.wp.Ptr(), rk.wk.Ptr(), HQK, HV, rk.kRstd.Ptr())
	case prep == entryPrepMMA || prep == entryPrepMMAG:
		args = argsPrepMMA(rk.kn.Ptr(), vp, vst, rk.g.Ptr(), rk.beta.Ptr(), rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(),
			rk.gcum.Ptr(), rk.w.Ptr(), rk.u.Ptr(), rk.kt.Ptr(), rk.wp.Ptr(), rk.wk.Ptr(), HQK, HV)
	}
	if err := rr.launch(prep, [3]uint32{uint32(NC), uint32(prepBlocks), 1}, prepSmem, args); err != nil {
		return err
	}
	return rr.mark() // prep
}

// summaryWalk runs the summary walk over the rank's summary list (nothing
// when it is empty) and marks its end.
func (rr *rankRun) summaryWalk() (err error) {
	rk, g := rr.rk, rr.g
	tb, HV := rk.tb, g.plan.Config.HV
	ks := rk.dev.ks
	if nlist := len(tb.Summary); nlist > 0 {
		vh, err := rr.vh(sched.Summary)
		if err != nil {
			return err
		}
		// maxList slots: the device exchange sends them all (the padding
		// is never read).
		slots := max(nlist, tb.MaxSummary)
		if rk.sumP, err = rk.mem.alloc("summary P", 4*slots*summarySlot(HV)); err != nil {
			return fmt.Errorf("rank %d: %w", rk.rank, err)
		}
		if rk.sumQ, err = rk.mem.alloc("summary Q", 4*slots*summarySlot(HV)); err != nil {
			return fmt.Errorf("rank %d: %w", rk.rank, err)
		}
		args := argsSummary(rk.w.Ptr(), rk.u.Ptr(), rk.kt.Ptr(), rk.gcum.Ptr(), rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(),
			rk.segChunk0.Ptr(), rk.segNChunk.Ptr(), rk.list.Ptr(), rk.sumP.Ptr(), rk.sumQ.Ptr(), HV, vh)
		split, err := g.walkSplit(rk, sched.Summary, listChains(tb.SegNChunk, tb.Summary))
		if err != nil {
			return err
		}
		planeArgs := func(w int, order uintptr) *loader.Args {
			return argsSummaryPlanes(rk.wp.Ptr(), rk.kRaw, rk.kSt, rk.kRstd.Ptr(), rk.u.Ptr(), rk.gcum.Ptr(), rk.chunkTok0.Ptr(),
				rk.chunkLen.Ptr(), rk.segChunk0.Ptr(), rk.segNChunk.Ptr(), rk.list.Ptr(), rk.sumP.Ptr(), rk.sumQ.Ptr(),
				g.plan.Config.HQK, HV, w, order)
		}
		switch {
		case split != nil:
			if err := g.launchSplit(rk, rk.mem, split, "summary walk", splitLaunch{ks.summary, ks.walkSmem(128)},
				splitLaunch{ks.summary, ks.walkSmem(64)}, infallible(planeArgs), nil); err != nil {
				return err
			}
			rr.res.Split[rk.rank][sched.Summary] = split.Walks128()
			return rr.mark() // summary walk
		case ks.planes:
			order, err := g.walkOrder(rk.mem, rk.stream, listChains(tb.SegNChunk, tb.Summary), HV, sched.Summary, vh,
				"summary walk order")
			if err != nil {
				return fmt.Errorf("rank %d: %w", rk.rank, err)
			}
			args = planeArgs(vh, order)
		case ks.out16:
			args = argsSummary16(rk.w.Ptr(), rk.u.Ptr(), rk.kn.Ptr(), rk.gcum.Ptr(), rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(),
				rk.segChunk0.Ptr(), rk.segNChunk.Ptr(), rk.list.Ptr(), rk.sumP.Ptr(), rk.sumQ.Ptr(), g.plan.Config.HQK, HV, vh)
		}
		if err := rr.launch(ks.summary, [3]uint32{uint32(2 * gpuD / vh), uint32(nlist), uint32(HV)}, ks.walkSmem(vh), args); err != nil {
			return err
		}
	}
	return rr.mark() // summary walk
}

// exchangeSummaries sends the rank's (P, Q) summaries, padded to the longest
// summary list of the plan, to every rank (exchangeAffine) into all_p and
// all_q. Every rank takes part, also one holding no
// tokens; a plan with no summaries exchanges nothing.
func (rr *rankRun) exchangeSummaries(ctx context.Context) (err error) {
	rk := rr.rk
	tb := rk.tb
	rk.allP, rk.allQ, err = exchangeAffine(ctx, rr.cm, rr.gather(), rk, rk.mem, "summary", "P", "Q",
		len(tb.Summary), tb.MaxSummary, rr.g.plan.Config.HV, rk.sumP, rk.sumQ)
	return err
}

// exchangeAffine sends rk's per-segment affine maps, a pair of
// [nlist, HV, 128, 128] fp32 device arrays a and b (the summaries' P and Q,
// or the offsets' Pᵀ and R), padded to maxList slots, to every rank over
// cm, into two new [R*maxList, HV, 128, 128] arrays allocated in m, in
// which entry rr*maxList + li is list entry li of rank rr (the padding
// slots are never read). With gather (an NCCL communicator's device
// all-gather; a and b then hold maxList slots, or are nil when nlist is 0)
// a and b are all-gathered on the device, on rk's stream; else through host
// memory: downloaded (padded with zeros), all-gathered, uploaded. Every rank
// takes part, also one holding no tokens (it sends zeros; on the host path
// it uploads nothing); with maxList 0 nothing is exchanged and the arrays
// are nil.
func exchangeAffine(ctx context.Context, cm comm.Communicator, gather deviceAllGather, rk *gpuRank, m *devMem, what, aName, bName string,
	nlist, maxList, hv int, a, b *loader.Buffer) (allA, allB *loader.Buffer, err error) {
	if maxList == 0 {
		return nil, nil, nil
	}
	if gather != nil {
		return exchangeAffineDevice(ctx, cm.Size(), gather, rk, m, what, aName, bName, nlist, maxList, hv, a, b)
	}
	R := cm.Size()
	bOff, size := summarySend(maxList, hv)
	send := make([]float32, size)
	if n := nlist * summarySlot(hv); n > 0 {
		if err := download(a, rk.stream, what+" "+aName, send[:n], 4); err != nil {
			return nil, nil, fmt.Errorf("rank %d: %w", rk.rank, err)
		}
		if err := download(b, rk.stream, what+" "+bName, send[bOff:bOff+n], 4); err != nil {
			return nil, nil, fmt.Errorf("rank %d: %w", rk.rank, err)
		}
	}
	all, err := comm.AllGatherFloat32(ctx, cm, send)
	if err != nil {
		return nil, nil, fmt.Errorf("rank %d: %s exchange: %w", rk.rank, what, err)
	}
	if rk.tb.Tokens == 0 {
		return nil, nil, nil
	}
	as, bs, err := summaryBlocks(all, R, maxList, hv)
	if err != nil {
		return nil, nil, fmt.Errorf("rank %d: %s: %w", rk.rank, what, err)
	}
	block := 4 * bOff
	if allA, err = m.alloc("gathered "+what+" "+aName, R*block); err != nil {
		return nil, nil, fmt.Errorf("rank %d: %w", rk.rank, err)
	}
	if allB, err = m.alloc("gathered "+what+" "+bName, R*block); err != nil {
		return nil, nil, fmt.Errorf("rank %d: %w", rk.rank, err)
	}
	for r := 0; r < R; r++ {
		for _, t := range []struct {
			dst *loader.Buffer
			src []float32
		}{{allA, as[r]}, {allB, bs[r]}} {
			v, err := t.dst.View(r*block, block)
			if err != nil {
				return nil, nil, fmt.Errorf("rank %d: %w", rk.rank, err)
			}
			if err := loader.CopyToDeviceAsync(v, t.src, rk.stream); err != nil {
				return nil, nil, fmt.Errorf("rank %d: upload gathered %s of rank %d: %w", rk.rank, what, r, err)
			}
		}
	}
	return allA, allB, nil
}

// exchangeAffineDevice is exchangeAffine's device path: a and b (maxList
// slots; nil when nlist is 0, then a zeroed buffer is sent) all-gathered
// into allA and allB by gather on rk's stream.
func exchangeAffineDevice(ctx context.Context, R int, gather deviceAllGather, rk *gpuRank, m *devMem, what, aName, bName string,
	nlist, maxList, hv int, a, b *loader.Buffer) (allA, allB *loader.Buffer, err error) {
	n := 4 * maxList * summarySlot(hv)
	wrap := func(err error) error { return fmt.Errorf("rank %d: %s exchange: %w", rk.rank, what, err) }
	send := func(name string, buf *loader.Buffer) (*loader.Buffer, error) {
		if nlist == 0 {
			z, err := m.alloc("zero "+what+" "+name, n)
			if err != nil {
				return nil, err
			}
			if rk.stream == nil { // a rank holding no tokens: no stream of its own
				return z, z.Memset32(0)
			}
			return z, z.Memset32Async(0, rk.stream)
		}
		if buf == nil || buf.Size() < n {
			return nil, fmt.Errorf("%s %s holds %d bytes, the device exchange needs %d (%d slots)", what, name, bufSize(buf), n, maxList)
		}
		return buf.View(0, n)
	}
	for _, t := range []struct {
		name string
		src  *loader.Buffer
		dst  **loader.Buffer
	}{{aName, a, &allA}, {bName, b, &allB}} {
		s, err := send(t.name, t.src)
		if err != nil {
			return nil, nil, wrap(err)
		}
		if *t.dst, err = m.alloc("gathered "+what+" "+t.name, R*n); err != nil {
			return nil, nil, wrap(err)
		}
		if err := gather(ctx, s, *t.dst, rk.stream); err != nil {
			return nil, nil, wrap(err)
		}
	}
	return allA, allB, nil
}

// bufSize is b's size, 0 for nil.
func bufSize(b *loader.Buffer) int {
	if b == nil {
		return 0
	}
	return b.Size()
}

// compose runs the compose into the segments' start states and marks its
// end.
func (rr *rankRun) compose() error {
	rk := rr.rk
	allP, allQ := rk.allP, rk.allQ
	if allP == nil { // nothing gathered: every compose list is empty and the kernel writes zeros
		allP, allQ = rk.compIdx, rk.compIdx
	}
	if err := rr.launch(entryCompose, [3]uint32{2, uint32(rk.tb.NS), uint32(rr.g.plan.Config.HV)}, composeSmem,
		argsCompose(allP.Ptr(), allQ.Ptr(), rk.compOff.Ptr(), rk.compIdx.Ptr(), rk.start.Ptr(), rr.g.plan.Config.HV)); err != nil {
		return err
	}
	return rr.mark() // compose
}

// finish runs the state walk from the start states and the output, copies
// the results back and checks the output. The forward and the recompute
// share it.
func (rr *rankRun) finish() error {
	rk, g := rr.rk, rr.g
	tb := rk.tb
	ks := rk.dev.ks
	cfg := g.plan.Config
	Tr, NS, NC, HQK, HV := tb.Tokens, tb.NS, tb.NC, cfg.HQK, cfg.HV
	vh, err := rr.vh(sched.State)
	if err != nil {
		return err
	}
	stateArgs := argsState(rk.w.Ptr(), rk.u.Ptr(), rk.kt.Ptr(), rk.gcum.Ptr(), rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(),
		rk.segChunk0.Ptr(), rk.segNChunk.Ptr(), rk.start.Ptr(), rk.h.Ptr(), rk.vnew.Ptr(), rk.final.Ptr(), HV, vh)
	outH, outV := rk.h.Ptr(), rk.vnew.Ptr()
	if ks.out16 {
		stateArgs = argsState16(rk.w.Ptr(), rk.u.Ptr(), rk.kn.Ptr(), rk.gcum.Ptr(), rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(),
			rk.segChunk0.Ptr(), rk.segNChunk.Ptr(), rk.start.Ptr(), rk.h.Ptr(), rk.vnew.Ptr(), rk.final.Ptr(),
			rk.h16.Ptr(), rk.vnew16.Ptr(), HQK, HV, vh)
		outH, outV = rk.h16.Ptr(), rk.vnew16.Ptr()
	}
	split, err := g.walkSplit(rk, sched.State, tb.SegNChunk)
	if err != nil {
		return err
	}
	if ks.planes {
		vnew, vnewp := rk.vnew.Ptr(), uintptr(0)
		if ks.tokenSlots { // rk.vnew holds token slots (gdn_chunk_grads_mma6's V')
			vnew, vnewp = 0, rk.vnew.Ptr()
		}
		planeArgs := func(w int, order uintptr) *loader.Args {
			return argsStatePlanes(rk.wp.Ptr(), rk.kRaw, rk.kSt, rk.kRstd.Ptr(), rk.u.Ptr(), rk.gcum.Ptr(), rk.chunkTok0.Ptr(),
				rk.chunkLen.Ptr(), rk.segChunk0.Ptr(), rk.segNChunk.Ptr(), rk.start.Ptr(), rk.h.Ptr(), vnew, rk.final.Ptr(),
				rk.h16.Ptr(), rk.vnew16.Ptr(), HQK, HV, w, vnewp, order)
		}
		if split != nil {
			if err := g.launchSplit(rk, rk.mem, split, "state walk", splitLaunch{ks.state, ks.walkSmem(128)},
				splitLaunch{ks.state, ks.walkSmem(64)}, infallible(planeArgs), nil); err != nil {
				return err
			}
			rr.res.Split[rk.rank][sched.State] = split.Walks128()
		} else {
			order, err := g.walkOrder(rk.mem, rk.stream, tb.SegNChunk, HV, sched.State, vh, "state walk order")
			if err != nil {
				return fmt.Errorf("rank %d: %w", rk.rank, err)
			}
			stateArgs = planeArgs(vh, order)
		}
	}
	if split == nil {
		if err := rr.launch(ks.state, [3]uint32{uint32(gpuD / vh), uint32(NS), uint32(HV)}, ks.walkSmem(vh), stateArgs); err != nil {
			return err
		}
	}
	if err := rr.mark(); err != nil { // state walk
		return err
	}
	outBlocks := HV
	if ks.outputQK {
		outBlocks = HQK
	}
	output, outArgs := ks.output, argsOutput(rk.qn.Ptr(), rk.kn.Ptr(), rk.gcum.Ptr(), outV, outH, rk.chunkTok0.Ptr(),
		rk.chunkLen.Ptr(), rk.o.Ptr(), HQK, HV, gpuScale(g.opts))
	switch {
	case rk.normKept():
		output, outArgs = entryOutputMMA16GNK, argsOutputGNK(rk.qRaw, rk.wk.Ptr(), rk.qSt, !g.opts.NoL2Norm,
			rk.gcum.Ptr(), outV, outH, rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(), rk.o.Ptr(), HQK, HV, gpuScale(g.opts),
			rk.qn.Ptr(), rk.qRstd.Ptr())
	case rk.normQK:
		output, outArgs = entryOutputMMA16GN, argsOutputGN(rk.qRaw, rk.wk.Ptr(), rk.qSt, !g.opts.NoL2Norm, rk.gcum.Ptr(),
			outV, outH, rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(), rk.o.Ptr(), HQK, HV, gpuScale(g.opts))
	}
	if err := rr.launch(output, [3]uint32{uint32(NC), uint32(outBlocks), 1}, ks.outputSmem, outArgs); err != nil {
		return err
	}
	if err := rr.mark(); err != nil { // output
		return err
	}
	o := make([]bf16.BF16, Tr*HV*gpuD)
	st := RankStates{Start: make([]float32, NS*summarySlot(HV)), Final: make([]float32, NS*summarySlot(HV))}
	for _, d := range []struct {
		name string
		err  error
	}{
		{"o", download(rk.o, rk.stream, "o", o, 2)},
		{"start states", download(rk.start, rk.stream, "start states", st.Start, 4)},
		{"final states", download(rk.final, rk.stream, "final states", st.Final, 4)},
	} {
		if d.err != nil {
			return fmt.Errorf("rank %d: %w", rk.rank, d.err)
		}
	}
	if err := rk.stream.Synchronize(); err != nil {
		return fmt.Errorf("rank %d: stream: %w", rk.rank, err)
	}
	if err := rr.clk.read(&rr.res.Timing[rk.rank]); err != nil {
		return err
	}
	if err := rr.scatterOutput(o); err != nil {
		return err
	}
	rr.res.States[rk.rank] = st
	return nil
}

// scatterOutput checks the rank's bf16 output (a still-poisoned element was
// never written; any other NaN was computed) and keeps it in the result.
func (rr *rankRun) scatterOutput(o []bf16.BF16) error {
	return rr.res.out.set(rr.rk.rank, o)
}

// Output is the output in global order, the GPU's bf16 values as float64:
// the rows of the ranks that ran in this process (Ranks), zeros elsewhere.
// It is made on the first call (the same *Output after), in parallel.
func (f *GPUForward) Output() *Output {
	if f == nil || f.out == nil {
		return nil
	}
	return f.out.output()
}
