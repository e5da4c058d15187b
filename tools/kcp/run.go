package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gdnkcp/gdnkcp/internal/stats"
	"github.com/gdnkcp/gdnkcp/kcp"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/sched"
)

func init() { register(newRunCmd) }

type runOptions struct {
	pack, docs, layout, stage, mode, backend, arch, rule string
	dump, inputs, blob, kernels                          string
	cp, sms, hqk, hv, dk, dv, forceVH, device            int
	reps, warmup, ranksPerGPU                            int
	devices, comm, faultKill, faultError                 string
	timeout                                              time.Duration
	seed                                                 uint64
	json, checkFinite, noProgress, check, hostExchange   bool
	splitGrads, singleWidth, splitPriority               bool
	serialRanks                                          bool
}

// probeGPU says whether GPU device can run the GPU backend with the given
// blob override (a variable so tests can stand in a GPU or its absence).
var probeGPU = kcp.ProbeGPU

func newRunCmd() *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run [flags]",
		Short: "Run a GDN layer forward and backward over a CP plan, and check it against the naive reference",
		Long: `run lays a pack out over CP ranks, runs the layer's forward and backward on the chosen
backend, and compares every output and gradient with the naive token-by-token recurrence
in float64 (--check, on by default). It prints the plan, each walk's width, checksums, the
largest relative errors and the time taken.

With no flags it runs the default pack: P1's six documents scaled to 2,048 tokens, heads
16/48, dims 128, CP 2, layout D, the module stage (conv + GDN), mode B1.

Backends: cpu is the float64 reference backend (forward and backward). gpu runs every rank
of the plan on one GPU (ranks on their own streams, exchanging through host memory) with
the embedded kernels, forward and backward, and reports per-rank CUDA-event times (the
slowest rank's median over --reps repetitions after --warmup), the widths every walk
launched with and each rank's peak device memory. auto (the default) takes gpu when a GPU
with kernels in the embedded blobs is present and the run is one it can do (dims 128),
else cpu. --blob forces a blob slot (e.g. compute_80).

Modes: b1 = forward keeping what backward needs, then backward; b3 = forward in
checkpoint mode, recompute from the handle (no communication), then backward.

--dump DIR writes the inputs, the output and the gradients as .npy files (bf16 inputs as
float32 holding the exact bf16 values; float64 results from the CPU backend, the GPU's
bf16 output as float32 and its bf16/fp32 gradients as float64) and a meta.json. --inputs DIR reads q, k, v, g, beta (conv_w for --stage module) and dout from
.npy files instead of drawing random ones; head counts and dims follow from the shapes,
and the documents from DIR/meta.json unless --pack or --docs is given.`,
		Example: `  kcp run
  kcp run --pack P1 --cp 4 --layout Z --stage core --mode b3 --json
  kcp run --docs 300,100,700 --cp 3 --layout C --hqk 2 --hv 6 --dk 32 --dv 32 --dump out/
  kcp run --inputs out/
  kcp run --backend gpu --pack P1@8192 --cp 4 --layout Z --blob compute_80`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	f := cmd.Flags()
	f.StringVar(&o.pack, "pack", "", "pack: P1..P5, or NAME@TOKENS to scale one (default P1@2048)")
	f.StringVar(&o.docs, "docs", "", "document lengths in tokens, comma-separated (instead of --pack)")
	f.IntVar(&o.cp, "cp", 2, "CP ranks R, 1..64 (GPU backend: default WORLD_SIZE under a launcher, else --ranks-per-gpu x the GPUs used)")
	f.StringVar(&o.layout, "layout", "D", "layout: C, Z or D")
	f.StringVar(&o.stage, "stage", "module", "core (GDN only) or module (conv1d + SiLU, then GDN)")
	f.StringVar(&o.mode, "mode", "b1", "b1 (forward keeping activations, backward) or b3 (checkpoint, recompute, backward)")
	f.StringVar(&o.backend, "backend", "auto", "auto (gpu when usable, else cpu), cpu (float64 reference) or gpu")
	f.IntVar(&o.device, "device", 0, "GPU backend: run every rank on this one CUDA device")
	addPlacementFlags(cmd, &o)
	f.StringVar(&o.faultKill, "fault-kill", "", "fault test: RANK:STAGE, the process running RANK kills itself (SIGKILL) when the rank reaches STAGE (e.g. 1:tape walk)")
	f.StringVar(&o.faultError, "fault-error", "", "fault test: RANK:STAGE, the rank fails with an error at STAGE")
	f.StringVar(&o.kernels, "kernels", kcp.KernelsAuto, "GPU backend: auto (the fastest set the blob has and the GPU's shared memory allows: v5 on Hopper and data-centre Blackwell, fp32 on Ampere), fp32 (CUDA-core kernels), tc (tensor-core forward, output error ~3.7e-3), mma (v4: forward, backward walks, dV'_local and chunk gradients on mma.sync) or v5 (mma with bf16 H and V' for the output and the chunk gradients grouped by QK head, ~10x faster than fp32)")
	f.BoolVar(&o.check, "check", true, "compare the output and every gradient with the naive float64 reference")
	f.Uint64Var(&o.seed, "seed", 1, "seed of the random inputs")
	f.IntVar(&o.hqk, "hqk", kcp.DefaultHQK, "query/key heads")
	f.IntVar(&o.hv, "hv", kcp.DefaultHV, "value heads (a multiple of --hqk)")
	f.IntVar(&o.dk, "dk", kcp.DefaultDK, "key head dim: 128 (16, 32, 64 for small CPU runs)")
	f.IntVar(&o.dv, "dv", kcp.DefaultDV, "value head dim: 128 (16, 32, 64 for small CPU runs)")
	f.StringVar(&o.arch, "arch", "", "width-rule variant for the walk widths: "+strings.Join(sched.Variants(), ", ")+" (default: the GPU present, else sm_90a)")
	f.IntVar(&o.sms, "sms", 0, "SM count for the width rule (default: the architecture's)")
	f.StringVar(&o.rule, "rule", "b", "width rule: a or b")
	f.IntVar(&o.forceVH, "force-vh", 0, "run every walk at vh 64 or 128 instead of the rule's width")
	f.BoolVar(&o.splitGrads, "split-grads", false, "GPU backend, v5 kernels, core stage: chunk gradients on hi / lo products (gdn_chunk_grads_mma6, ~5e-6 of float64) instead of bf16 ones (gdn_chunk_grads_mma8, ~3e-3, faster, and the forward then keeps only its bf16 states); the module stage runs mma6 either way")
	f.BoolVar(&o.singleWidth, "single-width", false, "GPU backend, v5 kernels: run every walk at the width rule's one width (kcp.GPUOptions.SingleWidth); by default the core stage's state walk and the offset and tape walks split between the widths where the width rule's cost model gains 2% or more (same bits)")
	f.BoolVar(&o.splitPriority, "split-priority", false, "GPU backend: launch a split walk's vh 128 half on a side stream of the greatest priority (kcp.GPUOptions.SplitPriority)")
	f.BoolVar(&o.serialRanks, "serial-ranks", false, "GPU backend: ranks sharing a GPU run one rank at a time (a rank gives the GPU up only while it waits in an exchange), so each stage but the exchanges times one rank's work alone (kcp.GPUOptions.SerialRanks; the exchanges then hold the waits, the totals are longer, the bits the same)")
	f.StringVar(&o.dump, "dump", "", "write inputs, outputs and gradients as .npy files and meta.json into this folder")
	f.StringVar(&o.inputs, "inputs", "", "read the inputs from .npy files in this folder")
	f.BoolVar(&o.checkFinite, "check-finite", true, "reject inputs holding NaN or Inf")
	f.IntVar(&o.reps, "reps", 1, "GPU backend: timed repetitions of the whole run (times are the slowest rank's median over them)")
	f.IntVar(&o.warmup, "warmup", 0, "GPU backend: untimed repetitions before the timed ones")
	f.BoolVar(&o.json, "json", false, "write one JSON object to stdout, nothing else")
	f.BoolVar(&o.noProgress, "no-progress", false, "no progress bar on stderr")
	return cmd
}

// addPlacementFlags defines the flags that place a GPU run's ranks and pick
// what they load: --devices, --ranks-per-gpu, --comm, --timeout and --blob,
// read by placeGPU and gpuOptions. kcp run and kcp sweep share them.
func addPlacementFlags(cmd *cobra.Command, o *runOptions) {
	f := cmd.Flags()
	f.StringVar(&o.devices, "devices", "", "GPU backend: CUDA devices the ranks run on, comma-separated, rank blocks in order (default: every visible GPU)")
	f.IntVar(&o.ranksPerGPU, "ranks-per-gpu", 1, "GPU backend: ranks per GPU when --cp is not given (more than 1 exchanges through host memory)")
	f.StringVar(&o.comm, "comm", "auto", "GPU backend: how ranks exchange: auto (NCCL when every rank has its own GPU, else host memory), loopback or nccl")
	f.BoolVar(&o.hostExchange, "host-exchange", false, "GPU backend: send the state summaries and adjoint offsets through host memory also over NCCL (default there: all-gathers of device memory), for comparisons")
	f.DurationVar(&o.timeout, "timeout", 0, "GPU backend: bound on every exchange wait, e.g. 2m (0: host memory unbounded, NCCL 5m); a rank that waits longer fails and stops the others")
	f.StringVar(&o.blob, "blob", "", "GPU backend: force a blob slot, e.g. compute_80 (default: "+"$GDNKCP_BLOB, else the automatic choice)")
}

// runReport is what run prints; its JSON names are part of the CLI's interface.
type runReport struct {
	Backend        string             `json:"backend"`
	BackendChoice  string             `json:"backend_choice,omitempty"` // why auto chose the backend
	GPU            *runGPU            `json:"gpu,omitempty"`
	Note           string             `json:"note,omitempty"`
	Pack           string             `json:"pack"`
	Docs           []int              `json:"docs"`
	Tokens         int                `json:"tokens"`
	CP             int                `json:"cp"`
	Layout         string             `json:"layout"`
	Stage          string             `json:"stage"`
	Mode           string             `json:"mode"`
	Seed           uint64             `json:"seed"`
	Inputs         string             `json:"inputs,omitempty"`
	Heads          [2]int             `json:"heads"` // [H_qk, HV]
	Dims           [2]int             `json:"dims"`  // [K, V]
	Profile        string             `json:"profile"`
	Rule           string             `json:"rule"`
	ForceVH        int                `json:"force_vh,omitempty"`
	Ranks          []runRank          `json:"ranks"`
	MaxRelErrOut   float64            `json:"max_rel_err_out"`
	MaxRelErrGrad  float64            `json:"max_rel_err_grad"`
	RelErr         map[string]float64 `json:"rel_err"`
	ChecksumOut    float64            `json:"checksum_out"`
	ChecksumGrad   float64            `json:"checksum_grad"`
	Checksums      map[string]float64 `json:"checksums"`
	Seconds        float64            `json:"seconds"`
	SecondsBackend float64            `json:"seconds_backend"`
	SecondsRef     float64            `json:"seconds_reference"`

	// noGrads (no gradients: the GPU backend) and noCheck (--check=false)
	// make MarshalJSON write the missing numbers as null.
	noGrads, noCheck bool
}

// MarshalJSON writes the report; gradient fields without gradients, and
// error fields without a check, are null.
func (r runReport) MarshalJSON() ([]byte, error) {
	type plain runReport
	out := struct {
		plain
		MaxRelErrOut  *float64 `json:"max_rel_err_out"`
		MaxRelErrGrad *float64 `json:"max_rel_err_grad"`
		ChecksumGrad  *float64 `json:"checksum_grad"`
	}{plain: plain(r)}
	if !r.noCheck {
		out.MaxRelErrOut = &r.MaxRelErrOut
		if !r.noGrads {
			out.MaxRelErrGrad = &r.MaxRelErrGrad
		}
	}
	if !r.noGrads {
		out.ChecksumGrad = &r.ChecksumGrad
	}
	return json.Marshal(out)
}

// runGPU is the GPU backend's part of the report. Times are CUDA-event
// milliseconds on each rank's stream (uploads, kernels, exchanges and
// copies included), medians over the timed repetitions.
type runGPU struct {
	Device  string `json:"device"`  // archdetect's line: name, CC, SMs, blob and why
	Blob    string `json:"blob"`    // the blob slot loaded
	Kernels string `json:"kernels"` // the kernel set: fp32, tc, mma or v5
	// KernelsChoice says why --kernels auto chose Kernels (empty when the
	// set was named).
	KernelsChoice string `json:"kernels_choice,omitempty"`
	Reps          int    `json:"reps"`
	Warmup        int    `json:"warmup"`
	// Devices are this process's GPUs, RankDevices each rank's (-1: a rank
	// another process runs), Comm how the ranks exchanged (loopback, nccl,
	// or communicator: one rank a process under a launcher).
	Devices     []int  `json:"devices"`
	RankDevices []int  `json:"rank_devices"`
	Comm        string `json:"comm"`
	// Exchange is how the summaries and offsets travelled: "device" (NCCL
	// all-gathers of device memory) or "host" (through host memory).
	Exchange string `json:"exchange"`
	// SerialRanks says the ranks sharing a GPU ran their stages one at a
	// time (--serial-ranks).
	SerialRanks bool `json:"serial_ranks,omitempty"`
	// Digests are, per rank run here, a sha256 of its rows of the output
	// and of every gradient (kcp.RankDigest): equal digests mean bitwise
	// equal results, across processes, devices and exchanges.
	Digests map[string]string `json:"digests"`
	// Ranks are the per-rank times, stages and peak memory of the ranks run
	// here.
	Ranks []runGPURank `json:"ranks"`
	// SlowestMs is the median over repetitions of the slowest rank's total;
	// SlowestRank is the rank that was slowest most often.
	SlowestMs   float64 `json:"slowest_ms"`
	SlowestRank int     `json:"slowest_rank"`
	// ExchangeShare is the slowest rank's exchange time (every stage named
	// "exchange ...") over its total.
	ExchangeShare float64 `json:"exchange_share"`
	// KernelsMs is the largest of the ranks' KernelsMs, and KernelsRank its
	// rank: with SerialRanks, the plan's kernel time as on devices of the
	// ranks' own.
	KernelsMs   float64 `json:"kernels_ms"`
	KernelsRank int     `json:"kernels_rank"`
}

// runGPURank is one rank's GPU timeline.
type runGPURank struct {
	Rank int `json:"rank"`
	// ForwardMs, RecomputeMs (B3 only) and BackwardMs are medians of the
	// phases' totals; TotalMs the median of their sum.
	ForwardMs   float64 `json:"forward_ms"`
	RecomputeMs float64 `json:"recompute_ms,omitempty"`
	BackwardMs  float64 `json:"backward_ms"`
	TotalMs     float64 `json:"total_ms"`
	ExchangeMs  float64 `json:"exchange_ms"`
	// KernelsMs sums the stage medians but the exchanges and the uploads:
	// the rank's kernels and the copies between them (with SerialRanks its
	// work alone on its device; else other ranks' work on a shared device
	// runs inside these stages too).
	KernelsMs float64 `json:"kernels_ms"`
	// Stages are the per-stage medians in stream order, named "forward: X",
	// "recompute: X" or "backward: X".
	Stages    []runStage `json:"stages"`
	PeakBytes int64      `json:"peak_bytes"`
}

// runStage is one stage's median time.
type runStage struct {
	Stage  string  `json:"stage"`
	Millis float64 `json:"ms"`
}

type runRank struct {
	Rank     int       `json:"rank"`
	Tokens   int       `json:"tokens"`
	Segments int       `json:"segments"`
	Walks    []runWalk `json:"walks"`
}

type runWalk struct {
	Walk   string `json:"walk"`
	NWalk  int    `json:"n_walk"`
	VH     *int   `json:"vh"` // null for an empty walk list
	Reason string `json:"reason"`
	// Split is, for a walk split between the widths (unless --single-width), how
	// many of its (segment, head) walks ran at vh 128; VH is the rule's.
	Split int `json:"split_vh128,omitempty"`
}

func (o *runOptions) run(cmd *cobra.Command) error {
	start := time.Now()
	changed := cmd.Flags().Changed
	switch o.backend {
	case "auto", "cpu", "gpu":
	default:
		return fmt.Errorf("--backend %q: want auto, cpu or gpu", o.backend)
	}
	stage, err := kcp.ParseStage(o.stage)
	if err != nil {
		return fmt.Errorf("--stage: %w", err)
	}
	if o.mode != "b1" && o.mode != "b3" {
		return fmt.Errorf("--mode %q: want b1 or b3", o.mode)
	}
	if o.reps < 1 || o.warmup < 0 {
		return fmt.Errorf("--reps %d, --warmup %d: need at least one timed repetition", o.reps, o.warmup)
	}
	if o.splitPriority && o.singleWidth {
		return fmt.Errorf("--split-priority: no walk splits with --single-width")
	}
	layout, err := kcp.ParseLayout(o.layout)
	if err != nil {
		return fmt.Errorf("--layout: %w", err)
	}
	rule, err := sched.ParseRule(o.rule)
	if err != nil {
		return fmt.Errorf("--rule: %w", err)
	}
	prof, err := o.widthProfile(changed)
	if err != nil {
		return err
	}
	var (
		in   *kcp.Inputs
		dout []float32
		plan *kcp.Plan
		name string
		pl   gpuPlacement
	)
	// Under a launcher, or when the GPU backend may run (dims 128, or
	// dims still to be read from --inputs), place the ranks on GPUs.
	if pl, o.cp, err = o.placeGPU(changed, o.cp, o.backend != "cpu" && (o.inputs != "" || (o.dk == 128 && o.dv == 128))); err != nil {
		return err
	}
	if o.inputs != "" {
		plan, name, in, dout, err = o.loadInputs(changed, layout, stage)
		if err != nil {
			return err
		}
	} else {
		var docs []int
		name, docs, err = o.runDocs(changed)
		if err != nil {
			return err
		}
		plan, err = kcp.NewPlan(kcp.PlanConfig{Docs: docs, Ranks: o.cp, Layout: layout, HQK: o.hqk, HV: o.hv, DK: o.dk, DV: o.dv})
		if err != nil {
			return err
		}
		in, dout = kcp.RandomInputs(plan, stage, o.seed)
	}
	if err := in.Validate(plan, stage, o.checkFinite); err != nil {
		return err
	}
	if err := plan.CheckDOut(dout, o.checkFinite); err != nil {
		return err
	}
	backend, choice := o.chooseBackend(plan)
	if pl.env != nil {
		backend, choice = "gpu", fmt.Sprintf("launched: rank %d of %d on GPU %d (NCCL_COMM_ID %s)", pl.env.Rank, pl.env.WorldSize, pl.env.LocalRank, pl.env.NCCLCommID)
	}
	if backend == "cpu" {
		if gpuFlags := changedGPUFlags(cmd); len(gpuFlags) > 0 {
			if o.backend == "cpu" {
				return fmt.Errorf("%s: GPU backend flags, and --backend cpu runs the CPU reference", strings.Join(gpuFlags, ", "))
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "kcp run: %s; %s not used\n", choice, strings.Join(gpuFlags, ", "))
		}
	}
	opts := kcp.Options{Stage: stage, Profile: prof, Rule: rule, ForceVH: o.forceVH}
	bar := o.newBar(cmd.ErrOrStderr(), plan, backend)
	opts.Progress = bar.step
	var rep *runReport
	if backend == "gpu" {
		rep, err = o.runGPU(cmd.ErrOrStderr(), pl, plan, name, stage, prof, rule, opts, in, dout, bar)
	} else {
		rep, err = o.runCPU(plan, name, stage, prof, rule, opts, in, dout, bar)
	}
	if err != nil {
		return err
	}
	rep.BackendChoice = choice
	rep.Seconds = time.Since(start).Seconds()
	if o.json {
		return writeJSON(cmd.OutOrStdout(), rep)
	}
	return writeRunText(cmd.OutOrStdout(), rep)
}

// changedGPUFlags are the flags given on cmd's line that only the GPU
// backend reads (their help starts "GPU backend"), as --name.
func changedGPUFlags(cmd *cobra.Command) []string {
	var out []string
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if strings.HasPrefix(f.Usage, "GPU backend") {
			out = append(out, "--"+f.Name)
		}
	})
	return out
}

// chooseBackend resolves --backend auto: gpu when a GPU with the kernels is
// present and the run is one the GPU backend does (dims 128), else cpu. It returns the backend and, for auto, why.
func (o *runOptions) chooseBackend(plan *kcp.Plan) (string, string) {
	if o.backend != "auto" {
		return o.backend, ""
	}
	cfg := plan.Config
	switch {
	case cfg.DK != 128 || cfg.DV != 128:
		return "cpu", fmt.Sprintf("auto: cpu (the GPU kernels need dims 128, these are %d/%d)", cfg.DK, cfg.DV)
	}
	p, err := probeGPU(o.device, o.blob)
	switch {
	case errors.Is(err, loader.ErrNoDriver):
		return "cpu", "auto: cpu (no CUDA driver)"
	case loader.IsCode(err, loader.ErrorNoDevice):
		return "cpu", "auto: cpu (a CUDA driver library but no GPU)"
	case err != nil:
		return "cpu", fmt.Sprintf("auto: cpu (no usable GPU: %v)", err)
	}
	return "gpu", fmt.Sprintf("auto: gpu (%s)", p)
}

// runCPU runs the CPU reference backend: forward (b1, or b3 through the
// checkpoint and recompute), backward, and the naive reference with --check.
func (o *runOptions) runCPU(plan *kcp.Plan, name string, stage kcp.Stage, prof sched.Profile, rule sched.Rule,
	opts kcp.Options, in *kcp.Inputs, dout []float32, bar *runBar) (*runReport, error) {
	be, err := kcp.NewCPU(plan, opts)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	t0 := time.Now()
	var act *kcp.Activations
	if o.mode == "b1" {
		act, err = be.Forward(ctx, in)
	} else {
		var ck *kcp.Checkpoint
		if ck, err = be.ForwardCheckpoint(ctx, in); err == nil {
			act, err = ck.Recompute(ctx)
		}
	}
	if err != nil {
		return nil, err
	}
	grads, err := act.Backward(ctx, dout)
	if err != nil {
		return nil, err
	}
	tBackend := time.Since(t0)
	// Keep only the output and the decisions: the rest of the activations (every state of every chunk)
	// need not stay live through the naive reference.
	out, decisions := act.Out, act.Decisions
	act = nil
	if o.check {
		// Collect the backend's memory now, so that the naive reference reuses its
		// pages (already mapped) instead of growing the heap onto fresh ones.
		runtime.GC()
	}
	var (
		refOut   *kcp.Output
		refGrads *kcp.Grads
		tRef     time.Duration
	)
	if o.check {
		bar.describe("naive reference")
		t1 := time.Now()
		if refOut, refGrads, err = kcp.Reference(ctx, plan, in, dout, kcp.Options{Stage: stage}); err != nil {
			return nil, err
		}
		tRef = time.Since(t1)
	}
	bar.finish()
	rep, err := o.report("cpu", name, plan, stage, prof, rule, decisions, nil, nil, out, grads, refOut, refGrads)
	if err != nil {
		return nil, err
	}
	rep.SecondsBackend, rep.SecondsRef = tBackend.Seconds(), tRef.Seconds()
	if o.dump != "" {
		if err := dumpRun(o.dump, rep, plan, stage, in, dout, out.O, "float64", grads); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// gpuStep is one GPU run of the mode: the output, the gradients (float64
// tensors made on demand), the per-rank digests, the widths launched and
// every rank's timelines.
type gpuStep struct {
	output    func() *kcp.Output
	gradients func() *kcp.Grads
	digest    func(rank int) (string, error) // kcp.RankDigest of the output and gradients
	decisions [][sched.NumWalkKinds]sched.Decision
	vh        [][sched.NumWalkKinds]int
	split     [][sched.NumWalkKinds]int // walks at vh 128 of split walks (kcp.GPUForward.Split, GPUGrads.Split)
	phases    [][]kcp.RankTiming        // forward, (recompute,) backward; each indexed by rank
	names     []string
	peak      []int64
	blob      string
}

// rankTotal is rank r's time in the step: the sum of its phases' CUDA-event
// totals (forward, recompute, backward), in milliseconds.
func (st *gpuStep) rankTotal(r int) float64 {
	t := 0.0
	for _, ph := range st.phases {
		t += ph[r].TotalMillis
	}
	return t
}

// rankExchange is rank r's exchange time in the step: its stages named
// "exchange ..." over every phase, in milliseconds.
func (st *gpuStep) rankExchange(r int) float64 {
	t := 0.0
	for _, ph := range st.phases {
		for _, s := range ph[r].Stages {
			if strings.HasPrefix(s.Stage, "exchange") {
				t += s.Millis
			}
		}
	}
	return t
}

// runGPUStep runs b1 (forward kept on the device, backward) or b3 (forward
// in checkpoint mode, recompute, backward) once.
func runGPUStep(ctx context.Context, g *kcp.GPU, mode string, in *kcp.Inputs, dout []float32) (*gpuStep, error) {
	st := &gpuStep{}
	var fw *kcp.GPUForward
	if mode == "b1" {
		var err error
		if fw, err = g.Forward(ctx, in); err != nil {
			return nil, err
		}
		st.phases, st.names = append(st.phases, fw.Timing), append(st.names, "forward")
		st.output, st.decisions, st.blob = fw.Output, fw.Decisions, fw.Blob
		st.vh, st.split = slices.Clone(fw.VH), slices.Clone(fw.Split)
	} else {
		ck, err := g.ForwardCheckpoint(ctx, in)
		if err != nil {
			return nil, err
		}
		if fw, err = ck.Recompute(ctx); err != nil {
			return nil, err
		}
		st.phases = append(st.phases, ck.Timing, fw.Timing)
		st.names = append(st.names, "forward", "recompute")
		st.output, st.decisions, st.blob = ck.Output, ck.Decisions, ck.Blob
		st.vh, st.split = slices.Clone(ck.VH), slices.Clone(ck.Split)
	}
	gr, err := fw.Backward(ctx, dout)
	if err != nil {
		return nil, errors.Join(err, fw.Close())
	}
	if err := fw.Close(); err != nil {
		return nil, err
	}
	st.gradients, st.digest, st.peak = gr.Gradients, gr.RankDigest, gr.PeakBytes
	st.phases, st.names = append(st.phases, gr.Timing), append(st.names, "backward")
	for r := range st.vh {
		for _, k := range []sched.WalkKind{sched.Offset, sched.Tape} {
			st.vh[r][k], st.split[r][k] = gr.VH[r][k], gr.Split[r][k]
		}
	}
	return st, nil
}

// runGPU runs the GPU backend (b1 or b3, --warmup untimed and --reps timed
// repetitions; the results of the last are reported) and, with --check, the
// naive reference.
func (o *runOptions) runGPU(stderr io.Writer, pl gpuPlacement, plan *kcp.Plan, name string, stage kcp.Stage, prof sched.Profile, rule sched.Rule,
	opts kcp.Options, in *kcp.Inputs, dout []float32, bar *runBar) (rep *runReport, err error) {
	kopts := kcp.GPUOptions{Options: opts, Device: o.device, Blob: o.blob, KeepDevice: true}
	if err := kopts.SetKernels(o.kernels); err != nil { // auto: NewGPU chooses on the first rank's device
		return nil, fmt.Errorf("--kernels: %w", err)
	}
	kopts.SplitGrads, kopts.SingleWidth, kopts.SplitPriority = o.splitGrads, o.singleWidth, o.splitPriority
	kopts.SerialRanks = o.serialRanks
	hook, err := o.stageHook(stderr)
	if err != nil {
		return nil, err
	}
	kopts.StageHook = hook
	gopts, closeComm, err := o.gpuOptions(pl, kopts)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, closeComm()) }()
	g, err := kcp.NewGPU(plan, gopts)
	if err != nil {
		return nil, gpuOpenError(err)
	}
	defer func() { _ = g.Close() }() // the run's own errors matter more
	prof = g.Options().Profile       // as the GPU decides widths (LeanForward set by the backend)
	kernels, kernelsWhy := g.Kernels()
	if o.kernels != kcp.KernelsAuto {
		kernelsWhy = ""
	}
	ctx := context.Background()
	t0 := time.Now()
	var steps []*gpuStep
	for i := range o.warmup + o.reps {
		if i > 0 {
			bar.describe(fmt.Sprintf("repetition %d of %d", i+1, o.warmup+o.reps))
		}
		st, err := runGPUStep(ctx, g, o.mode, in, dout)
		if err != nil {
			return nil, err
		}
		if i >= o.warmup {
			steps = append(steps, st)
		}
	}
	tBackend := time.Since(t0)
	last := steps[len(steps)-1]
	var (
		refOut   *kcp.Output
		refGrads *kcp.Grads
		tRef     time.Duration
	)
	local := g.LocalRanks()
	if o.check {
		bar.describe("naive reference")
		t1 := time.Now()
		if refOut, refGrads, err = kcp.Reference(ctx, plan, in, dout, kcp.Options{Stage: stage}); err != nil {
			return nil, err
		}
		refOut, refGrads = maskRanks(plan, local, refOut, refGrads)
		tRef = time.Since(t1)
	}
	bar.finish()
	lastOut, lastGrads := last.output(), last.gradients()
	rep, err = o.report("gpu", name, plan, stage, prof, rule, last.decisions, last.vh, last.split, lastOut, lastGrads, refOut, refGrads)
	if err != nil {
		return nil, err
	}
	rep.SecondsBackend, rep.SecondsRef = tBackend.Seconds(), tRef.Seconds()
	rep.GPU = gpuReport(g.Profile().String(), kernels, o.warmup, local, steps)
	rep.GPU.KernelsChoice = kernelsWhy
	rep.GPU.Devices, rep.GPU.Comm, rep.GPU.RankDevices = g.Devices(), string(g.Comm()), g.RankDevices()
	rep.GPU.Exchange = exchangeKind(g)
	rep.GPU.SerialRanks = o.serialRanks
	rep.GPU.Digests = map[string]string{}
	for _, r := range local {
		d, err := last.digest(r)
		if err != nil {
			return nil, err
		}
		rep.GPU.Digests[fmt.Sprint(r)] = d
	}
	if o.dump != "" {
		o32 := make([]float32, len(lastOut.O))
		for i, v := range lastOut.O {
			o32[i] = float32(v) // exact: the values are bf16
		}
		if err := dumpRun(o.dump, rep, plan, stage, in, dout, o32, "float32 holding bf16 values", lastGrads); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// gpuOpenError says what stops the GPU backend from starting: no driver, no
// GPU, or err itself.
func gpuOpenError(err error) error {
	if errors.Is(err, loader.ErrNoDriver) {
		return fmt.Errorf("--backend gpu: no CUDA driver on this machine: %w; use --backend cpu", err)
	}
	if loader.IsCode(err, loader.ErrorNoDevice) {
		return fmt.Errorf("--backend gpu: the CUDA driver sees no GPU on this machine: %w; use --backend cpu", err)
	}
	return fmt.Errorf("--backend gpu: %w", err)
}

// gpuReport summarises the timed repetitions: per-rank medians of each
// phase, stage and total, the slowest rank's median total and its
// exchange share.
func gpuReport(device, kernels string, warmup int, local []int, steps []*gpuStep) *runGPU {
	last := steps[len(steps)-1]
	R := len(last.phases[0])
	gi := &runGPU{Device: device, Blob: last.blob, Kernels: kernels, Reps: len(steps), Warmup: warmup}
	totals := make([][]float64, R) // [rank][rep]
	for _, st := range steps {
		for _, r := range local {
			totals[r] = append(totals[r], st.rankTotal(r))
		}
	}
	gi.SlowestMs, gi.SlowestRank = slowestOf(local, totals)
	slowIdx := 0
	for i, r := range local {
		if r == gi.SlowestRank {
			slowIdx = i
		}
		rk := runGPURank{Rank: r, TotalMs: stats.Median(totals[r]), PeakBytes: last.peak[r]}
		for pi, name := range last.names {
			var phase []float64
			stages := map[string][]float64{}
			var order []string
			for _, st := range steps {
				tm := st.phases[pi][r]
				phase = append(phase, tm.TotalMillis)
				for _, s := range tm.Stages {
					key := name + ": " + s.Stage
					if _, ok := stages[key]; !ok {
						order = append(order, key)
					}
					stages[key] = append(stages[key], s.Millis)
				}
			}
			switch name {
			case "forward":
				rk.ForwardMs = stats.Median(phase)
			case "recompute":
				rk.RecomputeMs = stats.Median(phase)
			case "backward":
				rk.BackwardMs = stats.Median(phase)
			}
			for _, key := range order {
				m := stats.Median(stages[key])
				rk.Stages = append(rk.Stages, runStage{key, m})
				switch _, stage, _ := strings.Cut(key, ": "); {
				case strings.HasPrefix(stage, "exchange"):
					rk.ExchangeMs += m
				case stage != "upload":
					rk.KernelsMs += m
				}
			}
		}
		gi.Ranks = append(gi.Ranks, rk)
		if rk.KernelsMs > gi.KernelsMs || len(gi.Ranks) == 1 {
			gi.KernelsMs, gi.KernelsRank = rk.KernelsMs, r
		}
	}
	if s := gi.Ranks[slowIdx]; s.TotalMs > 0 {
		gi.ExchangeShare = s.ExchangeMs / s.TotalMs
	}
	return gi
}

// slowestOf returns, of the ranks listed (totals[r][i] is rank r's total in
// repetition i, every listed rank with the same number of repetitions), the
// median over the repetitions of the slowest rank's total, and the rank that
// was the slowest most often (the lowest rank on ties, in a repetition and in
// the count).
func slowestOf(ranks []int, totals [][]float64) (float64, int) {
	if len(ranks) == 0 {
		return 0, 0
	}
	reps := len(totals[ranks[0]])
	slowest := make([]float64, reps)
	count := map[int]int{}
	for i := range reps {
		best := -1
		for _, r := range ranks {
			if t := totals[r][i]; best < 0 || t > slowest[i] {
				best, slowest[i] = r, t
			}
		}
		count[best]++
	}
	slow := ranks[0]
	for _, r := range ranks {
		if count[r] > count[slow] {
			slow = r
		}
	}
	return stats.Median(slowest), slow
}

// widthProfile is --arch/--sms, else the GPU present, else DefaultProfile.
func (o *runOptions) widthProfile(changed func(string) bool) (sched.Profile, error) {
	if changed("arch") {
		prof, err := sched.NewProfile(strings.TrimSpace(o.arch), o.sms)
		if err != nil {
			return sched.Profile{}, fmt.Errorf("--arch %s: %w", o.arch, err)
		}
		return prof, nil
	}
	prof, _, err := detectGPU()
	if err != nil {
		prof = kcp.DefaultProfile
	}
	if changed("sms") {
		prof.SMs = o.sms
	}
	return prof, prof.Validate()
}

// runDocs is --pack (NAME or NAME@TOKENS) or --docs, else the default pack.
func (o *runOptions) runDocs(changed func(string) bool) (string, []int, error) {
	switch {
	case changed("pack") && changed("docs"):
		return "", nil, errors.New("give --pack or --docs, not both")
	case changed("docs"):
		docs, err := parseDocs(o.docs)
		return "custom", docs, err
	case changed("pack"):
		pk, err := parsePackSpec(o.pack)
		return pk.Name, pk.Docs, err
	}
	pk := kcp.DefaultRunPack()
	return pk.Name, pk.Docs, nil
}

// parsePackSpec reads --pack: "P3" or "P3@4096" (P3 scaled to 4096 tokens).
func parsePackSpec(s string) (kcp.Pack, error) {
	pk, err := parsePack(s)
	if err != nil {
		return kcp.Pack{}, fmt.Errorf("--pack %w", err)
	}
	return pk, nil
}

// parsePack reads "P3" or "P3@4096" (P3 scaled to 4096 tokens); its errors
// start with s.
func parsePack(s string) (kcp.Pack, error) {
	name, size, scaled := strings.Cut(strings.TrimSpace(s), "@")
	pk, err := kcp.PackByName(name)
	if err != nil {
		return kcp.Pack{}, fmt.Errorf("%s: %w", s, err)
	}
	if !scaled {
		return pk, nil
	}
	var n int
	if _, err := fmt.Sscanf(size, "%d", &n); err != nil || fmt.Sprint(n) != size {
		return kcp.Pack{}, fmt.Errorf("%s: %q after @ is not a token count", s, size)
	}
	pk, err = kcp.ScalePack(pk, n)
	if err != nil {
		return kcp.Pack{}, fmt.Errorf("%s: %w", s, err)
	}
	return pk, nil
}

func (o *runOptions) report(backend, name string, plan *kcp.Plan, stage kcp.Stage, prof sched.Profile, rule sched.Rule,
	decisions [][sched.NumWalkKinds]sched.Decision, launched, split [][sched.NumWalkKinds]int,
	out *kcp.Output, grads *kcp.Grads, refOut *kcp.Output, refGrads *kcp.Grads) (*runReport, error) {
	cfg := plan.Config
	rep := &runReport{
		Backend: backend, Pack: name, Docs: cfg.Docs, Tokens: plan.Tokens, CP: cfg.Ranks,
		Layout: string(cfg.Layout), Stage: string(stage), Mode: o.mode, Seed: o.seed, Inputs: o.inputs,
		Heads: [2]int{cfg.HQK, cfg.HV}, Dims: [2]int{cfg.DK, cfg.DV},
		Profile: prof.String(), Rule: rule.String(), ForceVH: o.forceVH,
		RelErr: map[string]float64{}, Checksums: map[string]float64{},
		noGrads: grads == nil, noCheck: refOut == nil,
	}
	for r, rp := range plan.Ranks {
		rr := runRank{Rank: r, Tokens: rp.Tokens, Segments: len(rp.Segments)}
		for _, k := range sched.WalkKinds() {
			d := decisions[r][k]
			w := runWalk{Walk: k.String(), NWalk: d.NWalk, Reason: d.Reason}
			if vh := d.VH; vh != 0 {
				if o.forceVH != 0 {
					vh = o.forceVH
					w.Reason = fmt.Sprintf("forced by --force-vh (rule: %s)", d.Reason)
				}
				if launched != nil && launched[r][k] == 0 {
					w.Reason += " (not launched: forward only)"
				}
				if split != nil && split[r][k] > 0 {
					w.Split = split[r][k]
					w.Reason += fmt.Sprintf(" (split between the widths: %d of its (segment, head) walks at vh 128)", w.Split)
				}
				w.VH = &vh
			}
			rr.Walks = append(rr.Walks, w)
		}
		rep.Ranks = append(rep.Ranks, rr)
	}
	rep.ChecksumOut = checksum(out.O)
	rep.Checksums["o"] = rep.ChecksumOut
	if refOut != nil {
		rep.MaxRelErrOut = kcp.RelErr(out.O, refOut.O)
		rep.RelErr["o"] = rep.MaxRelErrOut
	}
	if grads == nil {
		return rep, nil
	}
	var errs []kcp.TensorErr
	if refGrads != nil {
		var err error
		if errs, err = kcp.GradErrors(grads, refGrads); err != nil {
			return nil, err
		}
	}
	for i, t := range grads.Tensors() {
		if errs != nil {
			e := errs[i]
			rep.RelErr[e.Name] = e.RelErr
			if e.RelErr > rep.MaxRelErrGrad || math.IsNaN(e.RelErr) {
				rep.MaxRelErrGrad = e.RelErr
			}
		}
		cs := checksum(t.Data)
		rep.Checksums[t.Name] = cs
		rep.ChecksumGrad += cs
	}
	return rep, nil
}

// checksumBlock is the elements of one of checksum's partial sums.
const checksumBlock = 1 << 20

// checksum is the sum of the elements: blocks of checksumBlock summed in index
// order on every core, the block sums added in block order. A fixed order, so
// equal tensors give equal checksums bit for bit; below checksumBlock elements
// it is the plain sum in index order. (A 240K-token pack's output and
// gradients took 4.7 s in one goroutine.)
func checksum(x []float64) float64 {
	n := (len(x) + checksumBlock - 1) / checksumBlock
	part := make([]float64, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), n) {
		wg.Go(func() {
			for b := range next {
				var s float64
				for _, v := range x[b*checksumBlock : min((b+1)*checksumBlock, len(x))] {
					s += v
				}
				part[b] = s
			}
		})
	}
	for b := range n {
		next <- b
	}
	close(next)
	wg.Wait()
	var s float64
	for _, p := range part {
		s += p
	}
	return s
}

func writeRunText(w io.Writer, r *runReport) error {
	var b strings.Builder
	fmt.Fprintf(&b, "kcp run: backend %s, pack %s (%d documents, %d tokens), CP %d, layout %s, stage %s, mode %s\n",
		r.Backend, r.Pack, len(r.Docs), r.Tokens, r.CP, r.Layout, r.Stage, r.Mode)
	if r.BackendChoice != "" {
		fmt.Fprintf(&b, "%s\n", r.BackendChoice)
	}
	if r.GPU != nil {
		fmt.Fprintf(&b, "gpu: %s\n", r.GPU.Device)
	}
	src := fmt.Sprintf("random, seed %d", r.Seed)
	if r.Inputs != "" {
		src = "from " + r.Inputs
	}
	fmt.Fprintf(&b, "heads %d/%d, dims %d/%d, inputs %s; widths: %s, rule %s\n",
		r.Heads[0], r.Heads[1], r.Dims[0], r.Dims[1], src, r.Profile, r.Rule)
	for _, rk := range r.Ranks {
		fmt.Fprintf(&b, "rank %d: %d tokens, %d segments\n", rk.Rank, rk.Tokens, rk.Segments)
		for _, wk := range rk.Walks {
			vh := "-"
			if wk.VH != nil {
				vh = fmt.Sprint(*wk.VH)
			}
			fmt.Fprintf(&b, "  %-8s n_walk %-3d vh %-4s %s\n", wk.Walk, wk.NWalk, vh, wk.Reason)
		}
	}
	names := gradNames(r)
	fmt.Fprintf(&b, "checksums: o %.9g", r.ChecksumOut)
	if !r.noGrads {
		fmt.Fprintf(&b, "; grads %.9g (", r.ChecksumGrad)
		for i, n := range names {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s %.6g", n, r.Checksums[n])
		}
		b.WriteString(")")
	}
	b.WriteString("\n")
	switch {
	case r.noCheck:
		b.WriteString("relative error vs naive float64 recurrence: not checked (--check=false)\n")
	case r.noGrads:
		fmt.Fprintf(&b, "relative error vs naive float64 recurrence: out %.3g\n", r.MaxRelErrOut)
	default:
		fmt.Fprintf(&b, "relative error vs naive float64 recurrence: out %.3g, grads %.3g (", r.MaxRelErrOut, r.MaxRelErrGrad)
		for i, n := range names {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s %.2g", n, r.RelErr[n])
		}
		b.WriteString(")\n")
	}
	if r.Note != "" {
		fmt.Fprintf(&b, "gradients: %s\n", r.Note)
	}
	if gi := r.GPU; gi != nil {
		if gi.KernelsChoice != "" {
			fmt.Fprintf(&b, "kernels %s\n", gi.KernelsChoice)
		}
		fmt.Fprintf(&b, "gpu ranks on devices %v, exchanging through %s (%s exchange)\n", gi.RankDevices, gi.Comm, orUnknown(gi.Exchange))
		if gi.SerialRanks {
			b.WriteString("gpu ranks sharing a device ran their stages one at a time (--serial-ranks): each stage but the exchanges is one rank's work alone; the exchanges hold the waits\n")
			fmt.Fprintf(&b, "gpu kernels alone (every stage but the exchanges and uploads): slowest rank %d, %.3f ms\n", gi.KernelsRank, gi.KernelsMs)
		}
		for _, rk := range gi.Ranks {
			fmt.Fprintf(&b, "  rank %d digest %s\n", rk.Rank, gi.Digests[fmt.Sprint(rk.Rank)])
		}
		fmt.Fprintf(&b, "gpu %s (%s forward kernels, blob %s): slowest rank %d, %.3f ms (median of %d after %d warm-up; CUDA events: uploads, kernels, exchanges, copies); exchanges %.1f%%\n",
			strings.ToUpper(r.Mode), gi.Kernels, gi.Blob, gi.SlowestRank, gi.SlowestMs, gi.Reps, gi.Warmup, 100*gi.ExchangeShare)
		for _, rk := range gi.Ranks {
			fmt.Fprintf(&b, "  rank %d: total %.3f ms = forward %.3f", rk.Rank, rk.TotalMs, rk.ForwardMs)
			if rk.RecomputeMs > 0 {
				fmt.Fprintf(&b, " + recompute %.3f", rk.RecomputeMs)
			}
			fmt.Fprintf(&b, " + backward %.3f ms; exchanges %.3f ms; kernels %.3f ms; peak device memory %.3f GiB\n", rk.BackwardMs, rk.ExchangeMs,
				rk.KernelsMs, float64(rk.PeakBytes)/(1<<30))
		}
	}
	fmt.Fprintf(&b, "time: %.2f s (backend %.2f s, naive reference %.2f s)\n", r.Seconds, r.SecondsBackend, r.SecondsRef)
	_, err := io.WriteString(w, b.String())
	return err
}

func gradNames(r *runReport) []string {
	names := []string{"dq", "dk", "dv", "dg", "dbeta"}
	if _, ok := r.Checksums["dconv_w"]; ok {
		names = append(names, "dconv_w")
	}
	return names
}

// runBar is the progress bar on stderr: one step per stage per rank, and one
// for the naive reference (taken at the end, also without --check).
type runBar struct {
	mu  sync.Mutex
	bar *progressbar.ProgressBar
}

func (o *runOptions) newBar(w io.Writer, plan *kcp.Plan, backend string) *runBar {
	if o.noProgress {
		return &runBar{}
	}
	steps := len(kcp.ForwardStages) + len(kcp.BackwardStages)
	if o.mode == "b3" {
		steps += len(kcp.RecomputeStages)
	}
	if backend == "gpu" {
		steps *= o.warmup + o.reps
	}
	return newRunBar(w, steps*len(plan.Ranks)+1)
}

// newRunBar returns a progress bar on w of total steps (the last one taken
// by finish).
func newRunBar(w io.Writer, total int) *runBar {
	return &runBar{bar: progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription("forward"),
		progressbar.OptionShowCount(),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionThrottle(100*time.Millisecond),
	)}
}

func (b *runBar) step(rank int, stage string) {
	if b.bar == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.bar.Describe(fmt.Sprintf("rank %d: %s", rank, stage))
	_ = b.bar.Add(1)
}

func (b *runBar) describe(s string) {
	if b.bar == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.bar.Describe(s)
}

func (b *runBar) finish() {
	if b.bar == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	_ = b.bar.Add(1)
	_ = b.bar.Finish()
}
