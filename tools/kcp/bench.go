package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gdnkcp/gdnkcp/internal/stats"
	"github.com/gdnkcp/gdnkcp/kcp"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/sched"
)

func init() { register(newBenchCmd) }

type benchOptions struct {
	docs, kernels, blob, modes string
	reps, warmup               int
	copyTBs, mmaTFLOPs         float64
	json, splitGrads           bool
	launchOrder, singleWidth   bool
	splitPriority              bool
	splitTape, splitDvLocal    bool
	tapeFormer                 bool
	fp32QKGrads                bool
	split                      map[string]int
	splitHeads                 [sched.NumWalkKinds]int // split, parsed
	forceVH                    int
}

// The core forward stages a bench times: l2norm to O on one rank (conv and
// uploads excluded).
var benchStages = []string{"l2norm", "prep", "summary walk", "compose", "state walk", "output"}

// The bench modes: the core forward (l2norm to O), the core forward and
// backward (l2norm to O, then dO to dq, dk, dv, dg, dbeta in bf16/fp32;
// uploads and the conv excluded), and the module (conv included) in B1 and
// B3 with every copy and exchange of the run (the ranks' CUDA-event totals).
const (
	benchCore      = "core"
	benchCoreBwd   = "core+bwd"
	benchModuleB1  = "module-b1"
	benchModuleB3  = "module-b3"
	benchModesHelp = "core (forward), core+bwd (forward and backward), module-b1, module-b3 (conv included, copies and exchanges included)"
)

// FLOPs per chunk of 64 tokens and value head of the chunked algorithm
// (matrix products only; docs/perf-notes.md): the forward's 11.6 M, and
// the backward's 28.3 M (dV'_local 2.1, tape walk 6.3, chunk gradients 19.9).
const (
	// defaultMMATFLOPs is the bf16 matrix rate the compute floor takes where
	// cuBLAS cannot be measured: PyTorch's bf16 GEMM 8192^3 on the H200
	// (scripts/ceilings.py, docs/perf-notes.md).
	defaultMMATFLOPs = 758
	fwdChunkFlops    = 11.6e6
	bwdChunkFlops    = 28.3e6
)

func newBenchCmd() *cobra.Command {
	var o benchOptions
	cmd := &cobra.Command{
		Use:   "bench [flags]",
		Short: "Time the GPU forward and backward of the GDN core and module on one rank (CUDA-event medians after warm-up)",
		Long: `bench runs the GPU backend on one rank, heads 16/48, dims 128, random inputs, and reports the
median over --reps runs after --warmup runs of each stage's CUDA-event time and of their sum, next to the
memory and compute floors (bytes moved and FLOPs of the chunked algorithm over the measured copy bandwidth
and bf16 matrix rate, docs/perf-notes.md).

Modes (--modes): core times the forward from the l2norm of q and k to the output O; core+bwd adds the
backward from dO to the gradients (l2norm backward included; uploads and the conv excluded in both);
module-b1 and module-b3 time the whole module layer (conv included) as a training step runs it: B1 the
forward keeping activations then the backward, B3 the forward in checkpoint mode, the recompute and the
backward, every upload, exchange and copy included. --kernels picks the forward's kernels (fp32, tc,
mma, v5) and, with mma, the backward's walks, dV'_local and chunk gradients (l2norm backward, casts and the conv stay
on the CUDA cores).`,
		Example: `  kcp bench
  kcp bench --docs 40000,45000,35908 --kernels tc --modes core,core+bwd,module-b1,module-b3`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	f := cmd.Flags()
	f.StringVar(&o.docs, "docs", "32768", "document lengths, comma-separated (one rank holds them all)")
	f.StringVar(&o.kernels, "kernels", kcp.KernelsAuto, "kernel sets to time, comma-separated: auto (the set kcp run picks on this GPU), fp32 (CUDA cores), tc (tensor-core forward), mma (v4: forward, backward walks, dV'_local and chunk gradients on mma.sync), v5 (mma with bf16 H and V' for the output and the chunk gradients grouped by QK head); mma and v5 need blobs built with them")
	f.StringVar(&o.modes, "modes", benchCore, "what to time, comma-separated: "+benchModesHelp)
	f.StringVar(&o.blob, "blob", "", "force a blob slot (e.g. compute_80)")
	f.IntVar(&o.reps, "reps", 20, "timed runs")
	f.IntVar(&o.warmup, "warmup", 3, "untimed runs first")
	f.Float64Var(&o.copyTBs, "copy-tbs", 0, "device copy bandwidth for the memory floor, TB/s (bytes read + written); 0: measured in this run (a 512 MiB device-to-device copy, the median of 5 after 2 warm-ups)")
	f.Float64Var(&o.mmaTFLOPs, "mma-tflops", 0, "bf16 matrix rate for the compute floor, TFLOP/s; 0: measured in this run through cuBLAS (bf16 GEMMs of 8192^3, the median of 5 after 2 warm-ups; "+envCublas+" names the library), else 758 (PyTorch's on the H200, scripts/ceilings.py) where cuBLAS cannot run")
	f.BoolVar(&o.json, "json", false, "write JSON to stdout")
	f.IntVar(&o.forceVH, "force-vh", 0, "run every walk at this width (64 or 128) instead of the plan's decision; 0: the decision")
	f.BoolVar(&o.launchOrder, "launch-order", false, "v5: run the walks' CTAs in launch order instead of kcp's dispatch order (same bits; to measure what the order saves where segments differ in length)")
	f.BoolVar(&o.singleWidth, "single-width", false, "v5: run every walk at the width rule's one width (kcp.GPUOptions.SingleWidth); by default the core stage's state walk and the tape walk split between the widths where sm_90a's cost model puts a split 2% below the better single width (same bits)")
	f.StringToIntVar(&o.split, "split", nil, "v5: run walks split between the widths, WALK=K,...: K value heads of every segment at vh 128 and the rest at vh 64 (walks summary, state, offset, tape; kcp.GPUOptions.SplitHeads; same bits; to measure splits; wins over the model's splits)")
	f.BoolVar(&o.splitPriority, "split-priority", false, "launch a split walk's vh 128 half on a side stream of the greatest priority beside the vh 64 half's, instead of on the rank's stream (kcp.GPUOptions.SplitPriority)")
	f.BoolVar(&o.splitGrads, "split-grads", false, "v5, core stage: chunk gradients on hi / lo products (gdn_chunk_grads_mma6, ~5e-6 of float64) instead of bf16 ones (gdn_chunk_grads_mma8, ~3e-3, 1.5 ms faster at 32K, and the forward then keeps only its bf16 states); the module stage runs mma6 either way")
	f.BoolVar(&o.splitTape, "split-tape", false, "v5, core stage: the tape and offset walks on hi / lo split products (gdn_tape_walk_planes, kcp.GPUOptions.SplitTape) instead of single bf16 ones (gdn_tape_walk_planes_h: no splits, since the chunk gradients read the walk's outputs in bf16; other gradient bits, within the same bounds)")
	f.BoolVar(&o.splitDvLocal, "split-dvlocal", false, "v5: dV'_local on the forward's fp32 qn, kn with split products (gdn_dvlocal_mma_gk, kcp.GPUOptions.SplitDvLocal) instead of q's and k's raw bf16 rows (gdn_dvlocal_mma_gr; other bits, as close to float64)")
	f.BoolVar(&o.tapeFormer, "tape-former", false, "v5: the vh 64 tape and offset walks form dV'_local themselves on their copying warpgroups (gdn_tape_walk_planes_hf / _f, gdn_offset_walk_planes_hf / _f, kcp.GPUOptions.TapeFormer; no dV'_local kernel where nothing else reads dvl, gdn_dvlocal_form on the pairs a vh 128 walk reads; other bits, the same precision). Needs blobs built with ptx/staging/tape_dvl_former.patch")
	f.BoolVar(&o.fp32QKGrads, "fp32-qk-grads", false, "v5: chunk gradients on the forward's fp32 qn, kn (gdn_chunk_grads_mma8 / mma6, kcp.GPUOptions.FP32QKGrads: the same bits; the kept forward then writes fp32 qn, kn) instead of q's and k's raw bf16 rows")
	return cmd
}

type benchRow struct {
	Kernels      string             `json:"kernels"`
	Mode         string             `json:"mode"`
	Tokens       int                `json:"tokens"`
	Docs         []int              `json:"docs"`
	Blob         string             `json:"blob"`
	Reps         int                `json:"reps"`
	MedianMillis float64            `json:"median_ms"`
	MinMillis    float64            `json:"min_ms"`
	Stages       map[string]float64 `json:"stage_median_ms"`
	StageOrder   []string           `json:"stages"`
	PeakBytes    int64              `json:"peak_bytes,omitempty"`
	SplitGrads   bool               `json:"split_grads,omitempty"`
	LaunchOrder  bool               `json:"launch_order,omitempty"`
	SingleWidth  bool               `json:"single_width,omitempty"`
	SplitPrio    bool               `json:"split_priority,omitempty"`
	SplitTape    bool               `json:"split_tape,omitempty"`
	SplitDvLocal bool               `json:"split_dvlocal,omitempty"`
	FP32QKGrads  bool               `json:"fp32_qk_grads,omitempty"`
	TapeFormer   bool               `json:"tape_former,omitempty"`
	// Split is, per walk that ran split between the widths, how many of its
	// (segment, head) walks ran at vh 128.
	Split     map[string]int `json:"split_walks_vh128,omitempty"`
	MemFloor  float64        `json:"memory_floor_ms"`
	CopyTBs   float64        `json:"copy_tbs"`                  // the bandwidth the memory floor is over
	CopyMeas  bool           `json:"copy_tbs_measured"`         // measured in this run (--copy-tbs 0)
	MMATFLOPs float64        `json:"mma_tflops"`                // the rate the compute floor is over
	MMAMeas   bool           `json:"mma_tflops_measured"`       // measured in this run (--mma-tflops 0)
	MMANote   string         `json:"mma_tflops_note,omitempty"` // why not, where it could not be
	FlopFloor float64        `json:"compute_floor_ms"`
	StateVH   int            `json:"state_walk_vh,omitempty"`
	ForceVH   int            `json:"force_vh,omitempty"`
}

func (o *benchOptions) run(cmd *cobra.Command) error {
	docs, err := parseDocs(o.docs)
	if err != nil {
		return err
	}
	if o.reps < 1 || o.warmup < 0 {
		return fmt.Errorf("--reps %d, --warmup %d: need at least one timed run", o.reps, o.warmup)
	}
	var splitHeads [sched.NumWalkKinds]int
	for name, k := range o.split {
		kind, err := sched.ParseWalkKind(name)
		if err != nil {
			return fmt.Errorf("--split %s=%d: %w", name, k, err)
		}
		splitHeads[kind] = k
	}
	if o.splitPriority && o.singleWidth && splitHeads == ([sched.NumWalkKinds]int{}) {
		return fmt.Errorf("--split-priority: no walk splits with --single-width unless --split forces one")
	}
	o.splitHeads = splitHeads
	if o.forceVH != 0 && o.forceVH != 64 && o.forceVH != 128 {
		return fmt.Errorf("--force-vh %d: want 64 or 128 (or 0 for the plan's decision)", o.forceVH)
	}
	var modes []string
	for _, m := range strings.Split(o.modes, ",") {
		m = strings.TrimSpace(m)
		switch m {
		case benchCore, benchCoreBwd, benchModuleB1, benchModuleB3:
			modes = append(modes, m)
		default:
			return fmt.Errorf("--modes: %q is not one of %s", m, benchModesHelp)
		}
	}
	if o.copyTBs < 0 || o.mmaTFLOPs < 0 {
		return fmt.Errorf("--copy-tbs %g, --mma-tflops %g: want a positive rate (--copy-tbs 0: measure it)", o.copyTBs, o.mmaTFLOPs)
	}
	plan, err := kcp.NewPlan(kcp.PlanConfig{Docs: docs, Ranks: 1, Layout: kcp.LayoutC})
	if err != nil {
		return err
	}
	measured, mmaMeasured, mmaNote := o.copyTBs == 0, false, ""
	var rows []benchRow
	for _, k := range strings.Split(o.kernels, ",") {
		k = strings.TrimSpace(k)
		if k == kcp.KernelsAuto {
			set, why, err := kcp.ChooseKernels(0, o.blob)
			if err != nil {
				return fmt.Errorf("--kernels auto: bench needs a usable CUDA GPU: %w", err)
			}
			fmt.Fprintln(cmd.ErrOrStderr(), "kernels", why)
			k = set
		}
		if err := new(kcp.GPUOptions).SetKernels(k); err != nil {
			return fmt.Errorf("--kernels: %w", err)
		}
		if o.copyTBs == 0 { // once, on the GPU the runs take (device 0)
			if o.copyTBs, err = measureCopyTBs(0, copyBytes, 2, 5); err != nil {
				return fmt.Errorf("measuring the device copy bandwidth (--copy-tbs 0): %w", err)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "device copy bandwidth %.2f TB/s (bytes read + written; %d MiB device to device, median of 5)\n",
				o.copyTBs, copyBytes>>20)
		}
		if o.mmaTFLOPs == 0 { // once, as the copy
			if o.mmaTFLOPs, err = measureGemmTFLOPs(0, 2, 5); err == nil {
				mmaMeasured = true
				fmt.Fprintf(cmd.ErrOrStderr(), "bf16 matrix rate %.0f TFLOP/s (cuBLAS GEMM %d^3, median of 5)\n", o.mmaTFLOPs, gemmDim)
			} else {
				o.mmaTFLOPs, mmaNote = defaultMMATFLOPs, fmt.Sprintf("not measured (%v): %g TFLOP/s, scripts/ceilings.py's on the H200", err, float64(defaultMMATFLOPs))
				fmt.Fprintf(cmd.ErrOrStderr(), "bf16 matrix rate %s\n", mmaNote)
			}
		}
		for _, m := range modes {
			row, err := o.benchOne(cmd, plan, k, m)
			if err != nil {
				return err
			}
			row.CopyTBs, row.CopyMeas = o.copyTBs, measured
			row.MMATFLOPs, row.MMAMeas, row.MMANote = o.mmaTFLOPs, mmaMeasured, mmaNote
			rows = append(rows, row)
		}
	}
	if o.json {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", " ")
		return enc.Encode(rows)
	}
	return writeBench(cmd.OutOrStdout(), rows)
}

// benchSample is one timed run: its stage times (in order) and peak memory.
type benchSample struct {
	stages  []kcp.StageTime
	total   float64
	peak    int64
	stateVH int // the state walk's width (0: not known)
	// split is, per walk kind, how many of its (segment, head) walks ran at
	// vh 128 where it ran split (kcp.GPUForward.Split, GPUGrads.Split).
	split [sched.NumWalkKinds]int
}

// sampleOnce runs mode once on g and returns what bench times of it.
func sampleOnce(g *kcp.GPU, mode string, in *kcp.Inputs, dout []float32) (benchSample, string, error) {
	ctx := context.Background()
	var s benchSample
	add := func(prefix string, tm kcp.RankTiming, keep func(string) bool) {
		for _, st := range tm.Stages {
			if keep(st.Stage) {
				s.stages = append(s.stages, kcp.StageTime{Stage: prefix + st.Stage, Millis: st.Millis})
				s.total += st.Millis
			}
		}
	}
	coreFwd := func(st string) bool { return slices.Contains(benchStages, st) }
	coreBwd := func(st string) bool { return st != "upload" }
	all := func(string) bool { return true }
	switch mode {
	case benchCore, benchCoreBwd, benchModuleB1:
		fw, err := g.Forward(ctx, in)
		if err != nil {
			return s, "", err
		}
		defer fw.Close()
		if len(fw.VH) > 0 {
			s.stateVH, s.split[sched.State] = fw.VH[0][sched.State], fw.Split[0][sched.State]
		}
		fwdKeep, prefix := coreFwd, ""
		if mode == benchModuleB1 {
			fwdKeep, prefix = all, "fwd "
		}
		if mode != benchCore {
			prefix = "fwd "
		}
		add(prefix, fw.Timing[0], fwdKeep)
		s.peak = fw.PeakBytes[0]
		if mode == benchCore {
			return s, fw.Blob, fw.Close()
		}
		gr, err := fw.Backward(ctx, dout)
		if err != nil {
			return s, "", err
		}
		bwdKeep := coreBwd
		if mode == benchModuleB1 {
			bwdKeep = all
		}
		add("bwd ", gr.Timing[0], bwdKeep)
		s.peak, s.split[sched.Tape] = gr.PeakBytes[0], gr.Split[0][sched.Tape]
		return s, fw.Blob, fw.Close()
	case benchModuleB3:
		ck, err := g.ForwardCheckpoint(ctx, in)
		if err != nil {
			return s, "", err
		}
		add("ckpt ", ck.Timing[0], all)
		fw, err := ck.Recompute(ctx)
		if err != nil {
			return s, "", err
		}
		defer fw.Close()
		add("recompute ", fw.Timing[0], all)
		gr, err := fw.Backward(ctx, dout)
		if err != nil {
			return s, "", err
		}
		add("bwd ", gr.Timing[0], all)
		s.peak, s.split[sched.Tape] = max(ck.PeakBytes[0], gr.PeakBytes[0]), gr.Split[0][sched.Tape]
		s.split[sched.State] = fw.Split[0][sched.State]
		return s, ck.Blob, fw.Close()
	}
	return s, "", fmt.Errorf("bench: unknown mode %q", mode)
}

func (o *benchOptions) benchOne(cmd *cobra.Command, plan *kcp.Plan, kernels, mode string) (benchRow, error) {
	stage := kcp.StageCore
	if mode == benchModuleB1 || mode == benchModuleB3 {
		stage = kcp.StageModule
	}
	in, dout := kcp.RandomInputs(plan, stage, 1)
	gopts := kcp.GPUOptions{Options: kcp.Options{Stage: stage, ForceVH: o.forceVH}, Blob: o.blob, KeepDevice: mode != benchCore}
	if err := gopts.SetKernels(kernels); err != nil {
		return benchRow{}, fmt.Errorf("--kernels: %w", err)
	}
	gopts.SplitGrads, gopts.SplitTape, gopts.SplitDvLocal, gopts.FP32QKGrads = o.splitGrads, o.splitTape, o.splitDvLocal, o.fp32QKGrads
	gopts.TapeFormer = o.tapeFormer && kernels == "v5" && mode != benchCore
	gopts.LaunchOrder, gopts.SingleWidth, gopts.SplitPriority = o.launchOrder, o.singleWidth, o.splitPriority
	gopts.SplitHeads = o.splitHeads
	g, err := kcp.NewGPU(plan, gopts)
	if err != nil {
		if errors.Is(err, loader.ErrNoDriver) || loader.IsCode(err, loader.ErrorNoDevice) {
			return benchRow{}, fmt.Errorf("bench needs a CUDA GPU: %w", err)
		}
		return benchRow{}, err
	}
	defer g.Close()
	row := benchRow{Kernels: kernels, Mode: mode, Tokens: plan.Tokens, Docs: plan.Config.Docs, Reps: o.reps, Stages: map[string]float64{},
		ForceVH: o.forceVH, SplitGrads: o.splitGrads && kernels == "v5" && stage == kcp.StageCore, LaunchOrder: o.launchOrder,
		SingleWidth: o.singleWidth, SplitPrio: o.splitPriority,
		SplitTape:    o.splitTape && kernels == "v5" && stage == kcp.StageCore && !o.splitGrads && mode != benchCore,
		SplitDvLocal: o.splitDvLocal && kernels == "v5" && mode != benchCore,
		FP32QKGrads:  o.fp32QKGrads && kernels == "v5" && mode != benchCore,
		TapeFormer:   o.tapeFormer && kernels == "v5" && mode != benchCore}
	stageTimes := map[string][]float64{}
	var totals []float64
	for i := 0; i < o.warmup+o.reps; i++ {
		smp, blob, err := sampleOnce(g, mode, in, dout)
		if err != nil {
			return row, fmt.Errorf("bench %s %s: %w", kernels, mode, err)
		}
		row.Blob = blob
		row.PeakBytes = max(row.PeakBytes, smp.peak)
		if smp.stateVH != 0 {
			row.StateVH = smp.stateVH
		}
		for k, n := range smp.split {
			if n > 0 {
				if row.Split == nil {
					row.Split = map[string]int{}
				}
				row.Split[sched.WalkKind(k).String()] = n
			}
		}
		if i >= o.warmup {
			for _, st := range smp.stages {
				if !slices.Contains(row.StageOrder, st.Stage) {
					row.StageOrder = append(row.StageOrder, st.Stage)
				}
				stageTimes[st.Stage] = append(stageTimes[st.Stage], st.Millis)
			}
			totals = append(totals, smp.total)
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "\rbench %s %s: run %d of %d", kernels, mode, i+1, o.warmup+o.reps)
	}
	fmt.Fprintln(cmd.ErrOrStderr())
	row.MedianMillis = stats.Median(totals)
	row.MinMillis = slices.Min(totals)
	for s, ts := range stageTimes {
		row.Stages[s] = stats.Median(ts)
	}
	T := float64(plan.Tokens)
	// Bytes that must move: q, k (bf16, 16 heads), v (bf16, 48 heads), g and
	// beta (fp32) in, o (bf16) out; the backward adds dO in and dq, dk, dv,
	// dg, dbeta out.
	bytes := T * (2*16*128*2 + 48*128*2 + 2*48*4 + 48*128*2)
	flopsPerChunk := fwdChunkFlops
	if mode != benchCore {
		bytes += T * (48*128*2 + 2*16*128*2 + 48*128*2 + 2*48*4)
		flopsPerChunk += bwdChunkFlops
	}
	chunks := 0
	for _, seg := range plan.Ranks[0].Segments {
		chunks += seg.Chunks
	}
	flops := float64(chunks) * 48 * flopsPerChunk
	row.MemFloor = bytes / (o.copyTBs * 1e12) * 1e3
	row.FlopFloor = flops / (o.mmaTFLOPs * 1e12) * 1e3
	return row, nil
}

func writeBench(w io.Writer, rows []benchRow) error {
	var b strings.Builder
	for _, r := range rows {
		how := "given"
		if r.CopyMeas {
			how = "measured"
		}
		mhow := "given"
		switch {
		case r.MMAMeas:
			mhow = "measured"
		case r.MMANote != "":
			mhow = "not measured"
		}
		fmt.Fprintf(&b, "%s, %s kernels, %d tokens in %d documents, blob %s, median of %d: %.3f ms (min %.3f); floors: memory %.3f ms (%.2f TB/s, %s), compute %.3f ms (%.0f TFLOP/s, %s)",
			r.Mode, r.Kernels, r.Tokens, len(r.Docs), r.Blob, r.Reps, r.MedianMillis, r.MinMillis, r.MemFloor, r.CopyTBs, how, r.FlopFloor,
			r.MMATFLOPs, mhow)
		if r.PeakBytes > 0 {
			fmt.Fprintf(&b, "; peak device memory %.2f GiB", float64(r.PeakBytes)/(1<<30))
		}
		if r.SplitGrads {
			b.WriteString("; chunk gradients on hi / lo products (--split-grads)")
		}
		if r.LaunchOrder {
			b.WriteString("; walks in launch order (--launch-order)")
		}
		if r.SplitTape {
			b.WriteString("; tape walk on hi / lo products (--split-tape)")
		}
		if r.SplitDvLocal {
			b.WriteString("; dV'_local on fp32 qn, kn (--split-dvlocal)")
		}
		if r.FP32QKGrads {
			b.WriteString("; chunk gradients on the forward's fp32 qn, kn (--fp32-qk-grads)")
		}
		if r.TapeFormer {
			b.WriteString("; dV'_local formed in the vh 64 tape and offset walks (--tape-former)")
		}
		for _, k := range sched.WalkKinds() {
			if n := r.Split[k.String()]; n > 0 {
				fmt.Fprintf(&b, "; %s walk split, %d (segment, head) walks at vh 128", k, n)
				if r.SplitPrio {
					b.WriteString(" (vh 128 on a prioritised stream)")
				}
			}
		}
		if r.SingleWidth {
			b.WriteString("; every walk at one width (--single-width)")
		}
		switch {
		case r.ForceVH != 0:
			fmt.Fprintf(&b, "; every walk at vh %d (forced)", r.ForceVH)
		case r.StateVH != 0:
			fmt.Fprintf(&b, "; state walk at vh %d", r.StateVH)
		}
		b.WriteString("\n")
		for _, s := range r.StageOrder {
			fmt.Fprintf(&b, "  %-28s %8.3f ms\n", s, r.Stages[s])
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
