package kcp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/gdnkcp/gdnkcp/comm"
	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/sched"
)

// GPUForwardStages are the stages of a rank's GPU forward in stream order, as
// RankTiming reports them: uploads of tables and inputs (and the output
// poison), the conv (module stage), the l2norm of q and k, the chunk prep,
// the summary walk, the summary exchange through host memory, the compose,
// the state walk and the output.
var GPUForwardStages = []string{"upload", "conv", "l2norm", "prep", "summary walk", "exchange summaries", "compose", "state walk", "output"}

// StageTime is one stage's time on a rank's stream.
type StageTime struct {
	Stage  string  // one of GPUForwardStages
	Millis float64 // CUDA-event time from the end of the previous stage
}

// RankTiming is one rank's forward timeline from CUDA events recorded on its
// stream. A rank holding no tokens launches nothing and reports zeros.
type RankTiming struct {
	Rank int
	// Stages are GPUForwardStages in order.
	Stages []StageTime
	// TotalMillis is the event time from before the first upload to after
	// the output kernel: copies, kernels and the exchange (with its host
	// wait for the other ranks) included.
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

// GPUForward is the result of GPU.Forward.
type GPUForward struct {
	// Out is the output in global order: the GPU's bf16 values as float64.
	Out *Output
	// Decisions are the width decisions of every walk of every rank,
	// [rank][walk kind], read from the plan's memo.
	Decisions [][sched.NumWalkKinds]sched.Decision
	// VH is the width each walk launched with, [rank][walk kind]: the
	// decision or Options.ForceVH; 0 where nothing launched (an empty walk
	// list, or a walk the forward does not run).
	VH [][sched.NumWalkKinds]int
	// States are every rank's boundary states, indexed by rank.
	States []RankStates
	// Timing is every rank's timeline, indexed by rank.
	Timing []RankTiming
	// Blob is the blob slot the kernels came from, e.g. "sm_90a".
	Blob string

	plan  *Plan
	stage Stage
	dev   *gpuDevice // held while ranks keep device memory
	ranks []*gpuRank // KeepDevice only
	mu    sync.Mutex
}

// gpuRank is one rank's device state.
type gpuRank struct {
	rank   int
	tb     *gpuTables
	mem    *devMem
	stream *loader.Stream
	events []*loader.Event

	chunkTok0, chunkLen, segChunk0, segNChunk, list, compOff, compIdx *loader.Buffer
	segStart, segLen, tokSeg, x, convW, halo, y                       *loader.Buffer
	q, k, v, g, beta                                                  *loader.Buffer
	qn, kn, qRstd, kRstd, gcum, w, u, kt                              *loader.Buffer
	sumP, sumQ, allP, allQ, start, final, h, vnew, o                  *loader.Buffer
}

// Forward runs the forward of every rank of the plan on the GPU, each rank on
// its own goroutine and stream, the exchanges (conv halo, summaries) going
// device -> host -> all-gather over the loopback -> host -> device. Per rank,
// in stream order: tables and inputs uploaded, conv (module stage), l2norm,
// prep, summary walk, exchange, compose, state walk, output (poisoned first).
// It returns the output, the boundary states and the timings. An output
// element left unwritten (still poisoned) or NaN is an error naming the rank,
// token and head. Device memory is freed before Forward returns unless
// GPUOptions.KeepDevice is set; on error it is always freed.
func (g *GPU) Forward(ctx context.Context, in *Inputs) (*GPUForward, error) {
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
	if err := g.dev.retain(); err != nil {
		return nil, err
	}
	p := g.plan
	R := len(p.Ranks)
	res := &GPUForward{
		Out:       &Output{O: make([]float64, p.OutputShape().Size())},
		Decisions: dec, VH: make([][sched.NumWalkKinds]int, R),
		States: make([]RankStates, R), Timing: make([]RankTiming, R),
		Blob: g.dev.profile.Target, plan: p, stage: g.opts.Stage, dev: g.dev, ranks: make([]*gpuRank, R),
	}
	comms, err := comm.NewLoopback(R)
	if err != nil {
		return nil, errors.Join(err, res.Close())
	}
	err = comm.RunRanks(ctx, comms, func(ctx context.Context, cm comm.Communicator) error {
		return g.forwardRank(ctx, cm, in, res)
	})
	for _, c := range comms {
		_ = c.Close() // the group is done; closing an in-process endpoint cannot fail usefully
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("kcp: gpu forward: %w", err), res.Close())
	}
	if !g.gopts.KeepDevice {
		if err := res.Close(); err != nil {
			return nil, fmt.Errorf("kcp: gpu forward: %w", err)
		}
	}
	return res, nil
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
	if f.dev != nil {
		errs = append(errs, f.dev.release())
		f.dev = nil
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
		if rp.Tokens == 0 {
			continue
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

// rankRun is one rank's forward in progress.
type rankRun struct {
	g   *GPU
	rk  *gpuRank
	cm  comm.Communicator
	in  *gpuRankInputs
	res *GPUForward
	ev  int // events recorded so far
}

// forwardRank runs one rank's forward and fills its slots of res.
func (g *GPU) forwardRank(ctx context.Context, cm comm.Communicator, in *Inputs, res *GPUForward) (err error) {
	t0 := time.Now()
	p := g.plan
	r := cm.Rank()
	tb, err := buildGPUTables(p, r)
	if err != nil {
		return err
	}
	rk := &gpuRank{rank: r, tb: tb, mem: newDevMem(g.dev.ctx)}
	defer func() {
		if err != nil || !g.gopts.KeepDevice {
			if err != nil && rk.stream != nil {
				// Let launched work finish before its memory goes; its
				// error, if any, is the one already reported.
				_ = rk.stream.Synchronize()
			}
			err = errors.Join(err, rk.mem.free())
			return
		}
		res.ranks[r] = rk
	}()
	run := &rankRun{g: g, rk: rk, cm: cm, res: res}
	empty := tb.Tokens == 0
	res.Timing[r] = RankTiming{Rank: r}
	if !empty {
		run.in = gatherGPUInputs(p, r, g.opts.Stage, in)
	}
	var halo []bf16.BF16
	if g.opts.Stage == StageModule {
		if halo, err = run.exchangeHalo(ctx, in); err != nil {
			return err
		}
	}
	if !empty {
		if err := run.begin(halo); err != nil {
			return err
		}
	}
	g.opts.progress(r, "conv")
	g.opts.progress(r, "prep")
	g.opts.progress(r, "summary walk")
	if err := run.exchangeSummaries(ctx); err != nil {
		return err
	}
	g.opts.progress(r, "exchange summaries")
	if !empty {
		if err := run.finish(); err != nil {
			return err
		}
	}
	g.opts.progress(r, "compose")
	g.opts.progress(r, "state walk")
	g.opts.progress(r, "output")
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
func (rr *rankRun) mark() error {
	if err := rr.rk.events[rr.ev].Record(rr.rk.stream); err != nil {
		return fmt.Errorf("rank %d: record event: %w", rr.rk.rank, err)
	}
	rr.ev++
	return nil
}

// launch runs entry on the rank's stream with 256-thread blocks.
func (rr *rankRun) launch(entry string, grid [3]uint32, smem int, args *loader.Args) error {
	if err := loader.Launch(rr.rk.stream, rr.g.dev.fn[entry], grid, [3]uint32{gpuBlock, 1, 1}, uint32(smem), args); err != nil {
		return fmt.Errorf("rank %d: %s: %w", rr.rk.rank, entry, err)
	}
	return nil
}

// vh is the width walk k of this rank launches with.
func (rr *rankRun) vh(k sched.WalkKind) (int, error) {
	g := rr.g
	d, err := g.plan.Width(rr.rk.rank, k, g.opts.Profile, g.opts.Rule)
	if err != nil {
		return 0, err
	}
	vh := d.VH
	if g.opts.ForceVH != 0 {
		vh = g.opts.ForceVH
	}
	if vh != 64 && vh != 128 {
		return 0, fmt.Errorf("kcp: rank %d %s walk: width %d (want 64 or 128)", rr.rk.rank, k, vh)
	}
	rr.res.VH[rr.rk.rank][k] = vh
	return vh, nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// begin uploads the tables and inputs and runs everything up to the summary
// walk.
func (rr *rankRun) begin(halo []bf16.BF16) (err error) {
	rk, g := rr.rk, rr.g
	m, tb := rk.mem, rk.tb
	ks := g.dev.ks
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
	if rk.stream, err = m.stream(); err != nil {
		return wrap(err)
	}
	for range len(GPUForwardStages) + 1 {
		ev, err := m.event()
		if err != nil {
			return wrap(err)
		}
		rk.events = append(rk.events, ev)
	}
	if err := rr.mark(); err != nil {
		return err
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
	for _, t := range []struct {
		dst **loader.Buffer
		nm  string
		n   int
	}{
		{&rk.qn, "qn", Tr * nq}, {&rk.kn, "kn", Tr * nq}, {&rk.qRstd, "q_rstd", Tr * HQK}, {&rk.kRstd, "k_rstd", Tr * HQK},
		{&rk.gcum, "gcum", Tr * HV}, {&rk.w, "w", Tr * nv}, {&rk.u, "u", Tr * nv}, {&rk.kt, "kt", Tr * nv},
		{&rk.start, "start states", NS * summarySlot(HV)}, {&rk.final, "final states", NS * summarySlot(HV)},
		{&rk.h, "chunk states", NC * summarySlot(HV)}, {&rk.vnew, "vnew", Tr * nv},
	} {
		if *t.dst, err = f32(t.nm, t.n); err != nil {
			return wrap(err)
		}
	}
	if rk.o, err = m.alloc("o", 2*Tr*nv); err != nil {
		return wrap(err)
	}
	// Poison o so that anything the output kernel leaves shows as NaN.
	words := Tr * nv / 2
	if err := rr.launch(entryPoison, [3]uint32{uint32(min(ceilDiv(words, gpuBlock), 4096)), 1, 1}, 0,
		argsPoison(rk.o.Ptr(), uint64(words), PoisonBF16x2)); err != nil {
		return err
	}
	if err := rr.mark(); err != nil { // upload
		return err
	}
	// conv (module stage): y = silu(conv(x)), then q, k, v are read out of y.
	var qp, kp, vp uintptr
	var qst, kst, vst int
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
		base := rk.y.Ptr()
		qp, kp, vp = base, base+uintptr(2*nq), base+uintptr(2*2*nq)
		qst, kst, vst = C, C, C
	} else {
		qp, kp, vp = rk.q.Ptr(), rk.k.Ptr(), rk.v.Ptr()
		qst, kst, vst = nq, nq, nv
	}
	if err := rr.mark(); err != nil { // conv
		return err
	}
	if err := rr.launch(entryL2Norm, [3]uint32{uint32(ceilDiv(Tr*HQK*2, gpuBlock/32)), 1, 1}, 0,
		argsL2Norm(qp, kp, qst, kst, rk.qn.Ptr(), rk.kn.Ptr(), rk.qRstd.Ptr(), rk.kRstd.Ptr(), Tr, HQK, !g.opts.NoL2Norm)); err != nil {
		return err
	}
	if err := rr.mark(); err != nil { // l2norm
		return err
	}
	if err := rr.launch(ks.prep, [3]uint32{uint32(NC), uint32(HV), 1}, ks.prepSmem,
		argsPrep(rk.kn.Ptr(), vp, vst, rk.g.Ptr(), rk.beta.Ptr(), rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(),
			rk.gcum.Ptr(), rk.w.Ptr(), rk.u.Ptr(), rk.kt.Ptr(), HQK, HV)); err != nil {
		return err
	}
	if err := rr.mark(); err != nil { // prep
		return err
	}
	if nlist := len(tb.Summary); nlist > 0 {
		vh, err := rr.vh(sched.Summary)
		if err != nil {
			return err
		}
		if rk.sumP, err = f32("summary P", nlist*summarySlot(HV)); err != nil {
			return wrap(err)
		}
		if rk.sumQ, err = f32("summary Q", nlist*summarySlot(HV)); err != nil {
			return wrap(err)
		}
		if err := rr.launch(ks.summary, [3]uint32{uint32(2 * gpuD / vh), uint32(nlist), uint32(HV)}, ks.walkSmem(vh),
			argsSummary(rk.w.Ptr(), rk.u.Ptr(), rk.kt.Ptr(), rk.gcum.Ptr(), rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(),
				rk.segChunk0.Ptr(), rk.segNChunk.Ptr(), rk.list.Ptr(), rk.sumP.Ptr(), rk.sumQ.Ptr(), HV, vh)); err != nil {
			return err
		}
	}
	return rr.mark() // summary walk
}

// exchangeSummaries sends the rank's (P, Q) summaries, padded to the longest
// summary list of the plan, through host memory to every rank and uploads
// the gathered all_p and all_q. Every rank takes part, also one holding no
// tokens; a plan with no summaries exchanges nothing.
func (rr *rankRun) exchangeSummaries(ctx context.Context) error {
	rk := rr.rk
	tb := rk.tb
	hv := rr.g.plan.Config.HV
	R := len(rr.g.plan.Ranks)
	if tb.MaxSummary == 0 {
		return nil
	}
	qOff, size := summarySend(tb.MaxSummary, hv)
	send := make([]float32, size)
	if n := len(tb.Summary) * summarySlot(hv); n > 0 {
		if err := download(rk.sumP, rk.stream, "summary P", send[:n], 4); err != nil {
			return fmt.Errorf("rank %d: %w", rk.rank, err)
		}
		if err := download(rk.sumQ, rk.stream, "summary Q", send[qOff:qOff+n], 4); err != nil {
			return fmt.Errorf("rank %d: %w", rk.rank, err)
		}
	}
	all, err := comm.AllGatherFloat32(ctx, rr.cm, send)
	if err != nil {
		return fmt.Errorf("rank %d: summary exchange: %w", rk.rank, err)
	}
	if tb.Tokens == 0 {
		return nil
	}
	ps, qs, err := summaryBlocks(all, R, tb.MaxSummary, hv)
	if err != nil {
		return fmt.Errorf("rank %d: %w", rk.rank, err)
	}
	block := 4 * qOff
	if rk.allP, err = rk.mem.alloc("all_p", R*block); err != nil {
		return fmt.Errorf("rank %d: %w", rk.rank, err)
	}
	if rk.allQ, err = rk.mem.alloc("all_q", R*block); err != nil {
		return fmt.Errorf("rank %d: %w", rk.rank, err)
	}
	for r := 0; r < R; r++ {
		for _, t := range []struct {
			dst *loader.Buffer
			src []float32
		}{{rk.allP, ps[r]}, {rk.allQ, qs[r]}} {
			v, err := t.dst.View(r*block, block)
			if err != nil {
				return fmt.Errorf("rank %d: %w", rk.rank, err)
			}
			if err := loader.CopyToDeviceAsync(v, t.src, rk.stream); err != nil {
				return fmt.Errorf("rank %d: upload gathered summaries of rank %d: %w", rk.rank, r, err)
			}
		}
	}
	return nil
}

// finish runs compose, state walk and output, copies the results back and
// checks the output.
func (rr *rankRun) finish() error {
	rk, g := rr.rk, rr.g
	tb := rk.tb
	ks := g.dev.ks
	cfg := g.plan.Config
	Tr, NS, NC, HQK, HV := tb.Tokens, tb.NS, tb.NC, cfg.HQK, cfg.HV
	if err := rr.mark(); err != nil { // exchange summaries
		return err
	}
	allP, allQ := rk.allP, rk.allQ
	if allP == nil { // nothing gathered: every compose list is empty and the kernel writes zeros
		allP, allQ = rk.compIdx, rk.compIdx
	}
	if err := rr.launch(entryCompose, [3]uint32{2, uint32(NS), uint32(HV)}, composeSmem,
		argsCompose(allP.Ptr(), allQ.Ptr(), rk.compOff.Ptr(), rk.compIdx.Ptr(), rk.start.Ptr(), HV)); err != nil {
		return err
	}
	if err := rr.mark(); err != nil { // compose
		return err
	}
	vh, err := rr.vh(sched.State)
	if err != nil {
		return err
	}
	if err := rr.launch(ks.state, [3]uint32{uint32(gpuD / vh), uint32(NS), uint32(HV)}, ks.walkSmem(vh),
		argsState(rk.w.Ptr(), rk.u.Ptr(), rk.kt.Ptr(), rk.gcum.Ptr(), rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(),
			rk.segChunk0.Ptr(), rk.segNChunk.Ptr(), rk.start.Ptr(), rk.h.Ptr(), rk.vnew.Ptr(), rk.final.Ptr(), HV, vh)); err != nil {
		return err
	}
	if err := rr.mark(); err != nil { // state walk
		return err
	}
	scale := g.opts.Scale
	if scale == 0 {
		scale = 1 / math.Sqrt(gpuD)
	}
	if err := rr.launch(ks.output, [3]uint32{uint32(NC), uint32(HV), 1}, ks.outputSmem,
		argsOutput(rk.qn.Ptr(), rk.kn.Ptr(), rk.gcum.Ptr(), rk.vnew.Ptr(), rk.h.Ptr(), rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(),
			rk.o.Ptr(), HQK, HV, float32(scale))); err != nil {
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
	if err := rr.timing(); err != nil {
		return err
	}
	if err := rr.scatterOutput(o); err != nil {
		return err
	}
	rr.res.States[rk.rank] = st
	return nil
}

// timing reads the rank's events into its RankTiming.
func (rr *rankRun) timing() error {
	rk := rr.rk
	tm := &rr.res.Timing[rk.rank]
	if rr.ev != len(rk.events) {
		return fmt.Errorf("rank %d: %d of %d timing events recorded", rk.rank, rr.ev, len(rk.events))
	}
	for i, name := range GPUForwardStages {
		ms, err := loader.ElapsedMillis(rk.events[i], rk.events[i+1])
		if err != nil {
			return fmt.Errorf("rank %d: time %s: %w", rk.rank, name, err)
		}
		tm.Stages = append(tm.Stages, StageTime{name, float64(ms)})
	}
	ms, err := loader.ElapsedMillis(rk.events[0], rk.events[len(rk.events)-1])
	if err != nil {
		return fmt.Errorf("rank %d: time forward: %w", rk.rank, err)
	}
	tm.TotalMillis = float64(ms)
	return nil
}

// scatterOutput checks the rank's bf16 output (a still-poisoned element was
// never written; any other NaN was computed) and writes it to the global
// output.
func (rr *rankRun) scatterOutput(o []bf16.BF16) error {
	p := rr.g.plan
	hv := p.Config.HV
	row := hv * gpuD
	var unwritten, nan int
	first := ""
	for _, seg := range p.Ranks[rr.rk.rank].Segments {
		for i := 0; i < seg.Len; i++ {
			lt, t := seg.LocalStart+i, seg.Start+i
			src := o[lt*row : (lt+1)*row]
			dst := rr.res.Out.O[t*row : (t+1)*row]
			for j, b := range src {
				if b.IsNaN() {
					what := "NaN"
					if b == poisonBF16 {
						what = "never written (still poisoned)"
						unwritten++
					} else {
						nan++
					}
					if first == "" {
						first = fmt.Sprintf("token %d (local %d, document %d) head %d column %d: %s",
							t, lt, seg.Doc, j/gpuD, j%gpuD, what)
					}
				}
				dst[j] = float64(b.Float32())
			}
		}
	}
	if unwritten+nan > 0 {
		return fmt.Errorf("rank %d: output: %d elements never written, %d NaN; first at %s", rr.rk.rank, unwritten, nan, first)
	}
	return nil
}
