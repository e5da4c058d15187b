package kcp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/internal/convref"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/sched"
)

// GPU tests: they need libcuda.so.1, a CUDA GPU and blobs holding the GDN
// kernels, and skip with a message otherwise. Build and run on the GPU
// machine:
//
//	CGO_ENABLED=0 go test -ldflags='-s -w' -c -o .gpu/kcp.test ./kcp
//	(cd kcp && ../.gpu/kcp.test -test.run GPU -test.v)
//
// Inputs are fresh each run (seed from the clock, logged; GDNKCP_TEST_SEED
// repeats one). Heads 16/48, dims 128, packs of a few hundred tokens.

// Tolerances of the GPU forward.
const (
	gpuOutTol   = 5e-3 // bf16 output against the float64 naive reference
	gpuStateTol = 1e-4 // fp32 boundary states against the CPU backend's
)

// gpuTestSeed is the clock, or GDNKCP_TEST_SEED.
func gpuTestSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GDNKCP_TEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "GDNKCP_TEST_SEED")
		seed = v
	}
	t.Logf("input seed %d (GDNKCP_TEST_SEED=%d repeats this run)", seed, seed)
	return seed
}

// testGPU is one loaded blob to run the GPU tests on.
type testGPU struct {
	name string // "default (sm_90a)" or "compute_80"
	g    *GPU
}

// fp32Unless is opts with the fp32 kernel set where they choose no kernels:
// the GPU tests' baseline set (GPUOptions' zero value takes KernelsAuto,
// which TestNewGPUKernels and the v5 tests cover).
func fp32Unless(opts GPUOptions) GPUOptions {
	if k, err := opts.kernelChoice(); err == nil && k == KernelsAuto {
		opts.Kernels = "fp32"
	}
	return opts
}

// openTestGPUs loads the default blob and, unless it already is the PTX, the
// compute_80 PTX (the portable path the Blackwell blobs use), once each, for
// plan and opts (fp32Unless); later plans reuse them through ForPlan. It skips the test
// without a driver, a GPU or kernels in the blobs.
func openTestGPUs(t *testing.T, plan *Plan, opts GPUOptions) []testGPU {
	t.Helper()
	if _, err := loader.DeviceCount(); err != nil {
		t.Skipf("needs libcuda.so.1 and a CUDA GPU: %v", err)
	}
	var out []testGPU
	for _, blob := range []string{"", "compute_80"} {
		o := fp32Unless(opts)
		o.Blob = blob
		g, err := NewGPU(plan, o)
		if err != nil {
			if errors.Is(err, ErrMissingKernels) || errors.Is(err, loader.ErrNoDriver) {
				if blob == "" {
					t.Skipf("needs blobs with the GDN forward and backward kernels (ptx/src rebuilt with tools/ptxgen): %v", err)
				}
				t.Logf("compute_80 not tested: %v", err)
				continue
			}
			require.NoError(t, err, "blob %q", blob)
		}
		t.Cleanup(func() { require.NoError(t, g.Close()) })
		target := g.Profile().Target
		if blob != "" && len(out) > 0 && out[0].g.Profile().Target == target {
			continue // the default already is the forced blob (GDNKCP_BLOB)
		}
		name := target
		if blob == "" {
			name = "default " + target
		}
		t.Logf("%s: %s", name, g.Profile())
		out = append(out, testGPU{name, g})
	}
	return out
}

// gpuPacks are the test packs: documents shorter than a chunk, exactly a
// chunk, one spanning all ranks, and one so small that some ranks hold no
// tokens (they launch nothing but take part in the exchanges).
var gpuPacks = []struct {
	name string
	docs []int
}{
	{"short docs", []int{5, 40, 64, 1, 63, 65, 30}},
	{"one chunk", []int{64, 64, 64}},
	{"spans all", []int{333}},
	{"tiny (empty ranks)", []int{1, 2}},
}

// gpuPlan is a plan with the production heads and dims.
func gpuPlan(t *testing.T, docs []int, R int, layout Layout) *Plan {
	t.Helper()
	p, err := NewPlan(PlanConfig{Docs: docs, Ranks: R, Layout: layout, HQK: 16, HV: 48, DK: 128, DV: 128})
	require.NoError(t, err)
	return p
}

// gpuRun is one GPU forward at each width: the rule's, and 64 and 128 forced.
type gpuRun struct{ rule, vh64, vh128 *GPUForward }

// forwardAllWidths runs plan on base's blob at the rule's width and at both
// forced widths, and requires all three bitwise identical.
func forwardAllWidths(t *testing.T, base *GPU, plan *Plan, opts GPUOptions, in *Inputs) gpuRun {
	t.Helper()
	var runs [3]*GPUForward
	for i, vh := range []int{0, 64, 128} {
		o := opts
		o.ForceVH = vh
		g, err := base.ForPlan(plan, o)
		require.NoError(t, err)
		f, err := g.Forward(context.Background(), in)
		require.NoError(t, err, "vh %d", vh)
		if i > 0 {
			requireSameBits(t, fmt.Sprintf("vh %d vs the rule's width", vh), runs[0], f)
			require.Equal(t, runs[0].PeakBytes, f.PeakBytes, "vh %d vs the rule's width: peak device memory per rank", vh)
		}
		runs[i] = f
		require.NoError(t, g.Close())
	}
	// The forced widths really launched as forced.
	for r := range plan.Ranks {
		if len(plan.Ranks[r].Segments) > 0 {
			require.Equal(t, 64, runs[1].VH[r][sched.State])
			require.Equal(t, 128, runs[2].VH[r][sched.State])
		}
	}
	return gpuRun{runs[0], runs[1], runs[2]}
}

// requireSameBits requires two forwards' outputs and states to be bitwise
// identical.
func requireSameBits(t *testing.T, what string, a, b *GPUForward) {
	t.Helper()
	requireBitwise(t, what+": o", a.Output().O, b.Output().O)
	require.Equal(t, len(a.States), len(b.States))
	for r := range a.States {
		for _, pair := range [][2][]float32{{a.States[r].Start, b.States[r].Start}, {a.States[r].Final, b.States[r].Final}} {
			require.Equal(t, len(pair[0]), len(pair[1]), "%s: rank %d states", what, r)
			for i := range pair[0] {
				if math.Float32bits(pair[0][i]) != math.Float32bits(pair[1][i]) {
					t.Fatalf("%s: rank %d state element %d differs: %v vs %v", what, r, i, pair[0][i], pair[1][i])
				}
			}
		}
	}
}

// requireFiniteStates requires every state value to be finite.
func requireFiniteStates(t *testing.T, f *GPUForward) {
	t.Helper()
	for r, st := range f.States {
		for _, s := range [][]float32{st.Start, st.Final} {
			for i, v := range s {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("rank %d state element %d is %v", r, i, v)
				}
			}
		}
	}
}

// checkAgainst requires the GPU output within gpuOutTol of ref and the
// states within gpuStateTol of the CPU backend's.
func checkAgainst(t *testing.T, what string, f *GPUForward, ref *Output, cpu *Activations) {
	t.Helper()
	requireFiniteStates(t, f)
	eo := RelErr(f.Output().O, ref.O)
	es, ef, err := StateErrors(f, cpu)
	require.NoError(t, err)
	t.Logf("%s: out %.3g, start states %.3g, final states %.3g", what, eo, es, ef)
	require.False(t, math.IsNaN(eo), "%s: output NaN", what)
	require.LessOrEqual(t, eo, gpuOutTol, "%s: output relative error", what)
	require.LessOrEqual(t, es, gpuStateTol, "%s: start states relative error", what)
	require.LessOrEqual(t, ef, gpuStateTol, "%s: final states relative error", what)
}

// TestGPUForwardCore runs the core stage on every pack, layout and R in
// {1, 2, 4, 8}, with the default blob and the compute_80 PTX forced: the
// output within 5e-3 of the float64 naive reference, the fp32 start and
// final states within 1e-4 of the CPU backend's, no NaN, every output element
// written (poisoned first), and the rule's width, vh 64 and vh 128 bitwise
// identical.
func TestGPUForwardCore(t *testing.T) {
	seed := gpuTestSeed(t)
	gpus := openTestGPUs(t, gpuPlan(t, gpuPacks[0].docs, 1, LayoutC), GPUOptions{})
	for pi, pk := range gpuPacks {
		p0 := gpuPlan(t, pk.docs, 1, LayoutC)
		in, _ := RandomInputs(p0, StageCore, seed+uint64(pi))
		ref, _, err := Reference(context.Background(), p0, in, nil, Options{})
		require.NoError(t, err)
		for _, layout := range Layouts() {
			for _, R := range []int{1, 2, 4, 8} {
				t.Run(fmt.Sprintf("%s/%s/R%d", pk.name, layout, R), func(t *testing.T) {
					p := gpuPlan(t, pk.docs, R, layout)
					be, err := NewCPU(p, Options{})
					require.NoError(t, err)
					cpu, err := be.Forward(context.Background(), in)
					require.NoError(t, err)
					for _, tg := range gpus {
						run := forwardAllWidths(t, tg.g, p, GPUOptions{}, in)
						checkAgainst(t, tg.name, run.rule, ref, cpu)
					}
				})
			}
		}
	}
}

// TestGPUForwardModule runs the module stage (conv + SiLU with the halo
// exchange, then the GDN) once per layout on both blobs: the conv output
// against the conv reference over whole documents (which checks the halos),
// the output within 5e-3 of the naive float64 reference (whose conv is not
// rounded to bf16), the states within 1e-4 of the CPU backend's run on the
// GPU's own bf16 conv output, and the widths bitwise identical.
func TestGPUForwardModule(t *testing.T) {
	seed := gpuTestSeed(t)
	docs := gpuPacks[0].docs
	p0 := gpuPlan(t, docs, 1, LayoutC)
	gpus := openTestGPUs(t, p0, GPUOptions{KeepDevice: true})
	in, _ := RandomInputs(p0, StageModule, seed)
	opts := Options{Stage: StageModule}
	ref, _, err := Reference(context.Background(), p0, in, nil, opts)
	require.NoError(t, err)
	convRef := moduleConvReference(t, p0, in)
	for i, layout := range Layouts() {
		R := []int{2, 4, 8}[i]
		t.Run(fmt.Sprintf("%s/R%d", layout, R), func(t *testing.T) {
			p := gpuPlan(t, docs, R, layout)
			for _, tg := range gpus {
				run := forwardAllWidths(t, tg.g, p, GPUOptions{Options: opts, KeepDevice: true}, in)
				y, err := run.rule.ConvOutput()
				require.NoError(t, err)
				require.NoError(t, convRef.Compare(bf16.FromFloat32s(y)), "%s: conv output", tg.name)
				be, err := NewCPU(p, Options{})
				require.NoError(t, err)
				cpu, err := be.Forward(context.Background(), coreInputsFromConv(p, y, in))
				require.NoError(t, err)
				checkAgainst(t, tg.name, run.rule, ref, cpu)
				for _, f := range []*GPUForward{run.rule, run.vh64, run.vh128} {
					require.NoError(t, f.Close())
				}
			}
		})
	}
}

// moduleConvReference is the conv reference over whole documents (zero
// halos), [T, C].
func moduleConvReference(t *testing.T, p *Plan, in *Inputs) *convref.Result {
	t.Helper()
	C := p.ConvChannels()
	x := make([]bf16.BF16, p.Tokens*C)
	for tok := 0; tok < p.Tokens; tok++ {
		for c := 0; c < C; c++ {
			x[tok*C+c] = bf16.Float32ToBF16(preConvValue(in, p, tok, c))
		}
	}
	segStart, segLen, tokSeg, err := convref.SegmentTables(p.Config.Docs)
	require.NoError(t, err)
	nd := len(p.Config.Docs)
	ref, err := convref.Conv1dSiLU(x, bf16.FromFloat32s(in.ConvW), make([]bf16.BF16, nd*ConvHalo*C), segStart, segLen, tokSeg, p.Tokens, C, nd)
	require.NoError(t, err)
	return ref
}

// coreInputsFromConv splits a conv output y [T, C] into core-stage q, k, v.
func coreInputsFromConv(p *Plan, y []float32, in *Inputs) *Inputs {
	cfg := p.Config
	nq, nv, C := cfg.HQK*cfg.DK, cfg.HV*cfg.DV, p.ConvChannels()
	out := &Inputs{Q: make([]float32, p.Tokens*nq), K: make([]float32, p.Tokens*nq), V: make([]float32, p.Tokens*nv), G: in.G, Beta: in.Beta}
	for tok := 0; tok < p.Tokens; tok++ {
		row := y[tok*C : (tok+1)*C]
		copy(out.Q[tok*nq:], row[:nq])
		copy(out.K[tok*nq:], row[nq:2*nq])
		copy(out.V[tok*nv:], row[2*nq:])
	}
	return out
}

// TestGPURepeatable runs one module-stage forward ten times per blob: every
// run gives the same bits (output and states).
func TestGPURepeatable(t *testing.T) {
	seed := gpuTestSeed(t)
	p := gpuPlan(t, gpuPacks[0].docs, 4, LayoutD)
	opts := GPUOptions{Options: Options{Stage: StageModule}}
	gpus := openTestGPUs(t, p, opts)
	in, _ := RandomInputs(p, StageModule, seed)
	for _, tg := range gpus {
		first, err := tg.g.Forward(context.Background(), in)
		require.NoError(t, err, tg.name)
		for i := 1; i < 10; i++ {
			f, err := tg.g.Forward(context.Background(), in)
			require.NoError(t, err, tg.name)
			requireSameBits(t, fmt.Sprintf("%s: run %d vs run 0", tg.name, i), first, f)
		}
		tm := first.Timing
		require.Len(t, tm, 4)
		for _, rt := range tm {
			require.Len(t, rt.Stages, len(GPUForwardStages))
			require.Greater(t, rt.TotalMillis, 0.0)
		}
		t.Logf("%s: rank 0 forward %.3f ms (events), stages %v", tg.name, tm[0].TotalMillis, tm[0].Stages)
	}
}

// TestGPUTensorCoreForward runs the tensor-core kernel sets "tc" (the v3
// walks and chunk prep/output), "mma" (v4 on mma.sync) and "v5" (each
// skipped while the blobs lack it) on the default blob: every layout at R 1,
// 2, 4 and 8 on the short-documents pack (documents shorter than, exactly and
// just over a chunk), and at R 8 on the pack whose one document spans every
// rank; the same tolerances as the fp32 kernels, the widths bitwise
// identical.
func TestGPUTensorCoreForward(t *testing.T) {
	seed := gpuTestSeed(t)
	if _, err := loader.DeviceCount(); err != nil {
		t.Skipf("needs libcuda.so.1 and a CUDA GPU: %v", err)
	}
	type packCase struct {
		name string
		p0   *Plan
		in   *Inputs
		ref  *Output
		Rs   []int
	}
	var packs []packCase
	for _, pk := range []struct {
		i  int
		Rs []int
	}{{0, []int{1, 2, 4, 8}}, {2, []int{8}}} {
		p0 := gpuPlan(t, gpuPacks[pk.i].docs, 1, LayoutC)
		in, _ := RandomInputs(p0, StageCore, seed+uint64(pk.i))
		ref, _, err := Reference(context.Background(), p0, in, nil, Options{})
		require.NoError(t, err)
		packs = append(packs, packCase{gpuPacks[pk.i].name, p0, in, ref, pk.Rs})
	}
	for _, set := range []string{"tc", "mma", "v5"} {
		t.Run(set, func(t *testing.T) {
			var opts GPUOptions
			require.NoError(t, opts.SetKernels(set))
			for _, pc := range packs {
				base, err := NewGPU(pc.p0, opts)
				if errors.Is(err, ErrMissingKernels) || errors.Is(err, loader.ErrNoDriver) {
					t.Skipf("needs blobs with the %s kernels: %v", set, err)
				}
				require.NoError(t, err)
				for _, layout := range Layouts() {
					for _, R := range pc.Rs {
						t.Run(fmt.Sprintf("%s/%s/R%d", pc.name, layout, R), func(t *testing.T) {
							p := gpuPlan(t, pc.p0.Config.Docs, R, layout)
							be, err := NewCPU(p, Options{})
							require.NoError(t, err)
							cpu, err := be.Forward(context.Background(), pc.in)
							require.NoError(t, err)
							run := forwardAllWidths(t, base, p, GPUOptions{}, pc.in)
							checkAgainst(t, set+" kernels "+base.Profile().Target, run.rule, pc.ref, cpu)
						})
					}
				}
				require.NoError(t, base.Close())
			}
		})
	}
}
