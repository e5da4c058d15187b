package kcp

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/fakecuda"
	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/gdnkcp/gdnkcp/sched"
)

// blobDirWith writes the embedded blobs and their manifest into a temporary
// directory, adding to each blob's entries the named kernels it lacks (their
// parameters from gpuArgSamples' or gpuBwdArgSamples' layouts), so that the
// fake driver, which resolves any name, can run the host side of kernels
// built after the committed blobs; with blobs that have them it changes
// nothing.
func blobDirWith(t *testing.T, names ...string) string {
	t.Helper()
	st := ptx.Embedded()
	m, err := st.Manifest()
	require.NoError(t, err)
	dir := t.TempDir()
	samples := gpuArgSamples()
	for name, a := range gpuBwdArgSamples() {
		samples[name] = a
	}
	for bi := range m.Blobs {
		b := &m.Blobs[bi]
		raw, err := st.Load(b)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, b.File), raw, 0o644))
		for _, name := range names {
			if _, ok := b.Entry(name); ok {
				continue
			}
			args, ok := samples[name]
			require.True(t, ok, "%s: no argument sample", name)
			e := ptx.Entry{Name: name}
			for i, p := range args.Layout() {
				typ := map[int]string{4: "u32", 8: "u64"}[p.Size]
				e.Params = append(e.Params, ptx.Param{Name: fmt.Sprintf("%s_param_%d", name, i), Type: typ, Size: p.Size,
					Align: p.Align, Offset: p.Offset})
			}
			b.Entries = append(b.Entries, e)
		}
	}
	raw, err := json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ptx.ManifestName), raw, 0o644))
	return dir
}

// TestSingleTapeEntries: the v5 set's backward holds the single-product
// tape walk's two entries and the offset walk's one beside the split walks'
// and runs them for the core stage (the tape walk's at either width), the
// split walks' for the module stage; SplitTape takes them out (the split
// walks in both stages); SplitGrads (mma6 in the core stage too) and the
// other sets never run them.
func TestSingleTapeEntries(t *testing.T) {
	for _, c := range []struct {
		set   string
		split bool // SplitGrads
		hi    bool // the single-product entries expected
	}{{"v5", false, true}, {"v5", true, false}, {"mma", false, false}, {"fp32", false, false}} {
		var plain, hi GPUOptions
		require.NoError(t, plain.SetKernels(c.set))
		require.NoError(t, hi.SetKernels(c.set))
		plain.SplitGrads, hi.SplitGrads = c.split, c.split
		plain.SplitTape = true
		pe, he := plain.kernelSet().backwardEntries(), hi.kernelSet().backwardEntries()
		ks := hi.kernelSet()
		for _, module := range []bool{false, true} {
			for _, vh := range []int{64, 128} {
				want := ks.tapeEntry(vh)
				if c.hi && !module {
					want = map[int]string{64: entryTapePlanesH, 128: entryTapePlanesH128}[vh]
				}
				require.Equal(t, want, ks.tapeEntryFor(vh, module), "%s split %v: module %v, vh %d", c.set, c.split, module, vh)
				require.Equal(t, plain.kernelSet().tapeEntry(vh), plain.kernelSet().tapeEntryFor(vh, module), c.set)
			}
			wantOff := ks.offset
			if c.hi && !module {
				wantOff = entryOffsetPlanesH
			}
			require.Equal(t, wantOff, ks.offsetEntryFor(module), "%s split %v: module %v", c.set, c.split, module)
			require.Equal(t, plain.kernelSet().offset, plain.kernelSet().offsetEntryFor(module), c.set)
		}
		if !c.hi {
			require.Equal(t, pe, he, "%s split %v", c.set, c.split)
			continue
		}
		require.Len(t, he, len(pe)+3, c.set)
		require.Contains(t, he, gpuEntry{entryOffsetPlanesH, tapePlanesSmem(128)})
		require.Contains(t, he, gpuEntry{entryTapePlanesH, tapePlanesSmem(64)})
		require.Contains(t, he, gpuEntry{entryTapePlanesH128, tapePlanesSmem(128)})
	}
}

// TestFakeDriverSingleTape runs the default tape walk's host side on the
// fake driver (in a child process; blobs from blobDirWith): B1 in the core
// stage launches the
// single-product entry of each width the tape walk runs at (forced vh 64,
// vh 128, split between them) and the single-product offset walk, never the
// split-product ones, and the module stage launches only those; nothing is
// left held.
func TestFakeDriverSingleTape(t *testing.T) {
	fk := fakeChild(t, "TestFakeDriverSingleTape")
	if fk == nil {
		return
	}
	t.Setenv(ptx.EnvBlobDir, blobDirWith(t, entryTapePlanesH, entryTapePlanesH128, entryOffsetPlanesH, entryDVLocalMMAGR))
	p := bwdPlan(t, []int{100, 70, 64}, 2, LayoutC, 2, 4)
	offsets := 0 // ranks with an offset walk
	for r := range p.Ranks {
		if len(p.Ranks[r].Offset) > 0 {
			offsets++
		}
	}
	require.Positive(t, offsets, "the plan has a document across ranks")
	var o GPUOptions
	require.NoError(t, o.SetKernels("v5"))
	g, err := NewGPU(p, o)
	require.NoError(t, err)
	for _, c := range []struct {
		name    string
		stage   Stage
		vh      int
		split   bool
		entries []string // the tape walk's entries launched
	}{
		{"core/vh64", StageCore, 64, false, []string{entryTapePlanesH}},
		{"core/vh128", StageCore, 128, false, []string{entryTapePlanesH128}},
		{"core/split", StageCore, 0, true, []string{entryTapePlanesH, entryTapePlanesH128}},
		{"module/vh64", StageModule, 64, false, []string{entryTapePlanes}},
		{"module/split", StageModule, 0, true, []string{entryTapePlanes, entryTapePlanes128}},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := GPUOptions{Options: Options{Stage: c.stage, ForceVH: c.vh}, KeepDevice: true}
			if c.split {
				opts.SplitHeads[sched.Tape] = 1
			}
			gs, err := g.ForPlan(p, opts)
			require.NoError(t, err)
			defer func() { require.NoError(t, gs.Close()) }()
			in, dout := RandomInputs(p, c.stage, 3)
			f, err := gs.Forward(context.Background(), in)
			require.NoError(t, err)
			n := backwardLaunches(t, fk, f, dout)
			requireLaunched(t, n, c.entries, entryTapePlanes, entryTapePlanes128, entryTapePlanesH, entryTapePlanesH128)
			off, other := entryOffsetPlanesH, entryOffsetPlanes
			if c.stage == StageModule {
				off, other = other, off
			}
			require.NotEmpty(t, n[off], "%s not launched: %v", off, n)
			require.Empty(t, n[other], "%s launched: %v", other, n)
			require.NoError(t, f.Close())
		})
	}
	require.NoError(t, g.Close())
	held := fk.Held()
	require.Zero(t, held.Allocs+held.Modules+held.Streams, "everything released: %+v", held)
}

// backwardLaunches runs the backward of the kept forward f on dO dout
// through the fake driver fk and returns its launches' grids by kernel.
func backwardLaunches(t *testing.T, fk *fakecuda.Lib, f *GPUForward, dout []float32) map[string][][3]uint32 {
	t.Helper()
	from := fk.LogLen()
	gr, err := f.Backward(context.Background(), dout)
	require.NoError(t, err)
	require.NotNil(t, gr.Gradients())
	n := map[string][][3]uint32{}
	for _, op := range fk.Log(from) {
		if op.Kind == fakecuda.OpLaunch {
			n[op.Function] = append(n[op.Function], op.Grid)
		}
	}
	return n
}

// requireLaunched requires each kernel of among to have been launched (n:
// the grids by kernel) if want names it, and not otherwise.
func requireLaunched(t *testing.T, n map[string][][3]uint32, want []string, among ...string) {
	t.Helper()
	for _, e := range among {
		if slices.Contains(want, e) {
			require.NotEmpty(t, n[e], "%s not launched: %v", e, n)
		} else {
			require.Empty(t, n[e], "%s launched: %v", e, n)
		}
	}
}

// tapeWidthRuns runs B1 of plan p in stage on g with every walk forced to
// vh 64, to vh 128, at the rule's widths, and with the tape walk split
// between the widths (SplitHeads), requires the last three to give the
// first's bits, and returns the four.
func tapeWidthRuns(t *testing.T, name string, g *GPU, p *Plan, stage Stage, in *Inputs, dout []float32) []*GPUGrads {
	t.Helper()
	var runs []*GPUGrads
	for _, o := range []Options{{ForceVH: 64}, {ForceVH: 128}, {}} {
		o.Stage = stage
		_, gr := gpuB1(t, g, p, GPUOptions{Options: o}, in, dout)
		runs = append(runs, gr)
	}
	split := GPUOptions{Options: Options{Stage: stage}}
	split.SplitHeads[sched.Tape] = 1
	_, gs := gpuB1(t, g, p, split, in, dout)
	runs = append(runs, gs)
	for j, what := range []string{"vh 128", "the rule's widths", "split"} {
		requireSameGradBits(t, name+": vh 64 vs "+what, runs[0], runs[j+1])
	}
	return runs
}

// requireB3Bits runs B3 (checkpoint, recompute, backward) on base's kernels
// with every walk at vh 64 and requires its gradients to be b1's bits.
func requireB3Bits(t *testing.T, name string, base *GPU, p *Plan, stage Stage, in *Inputs, dout []float32, b1 *GPUGrads) {
	t.Helper()
	g, err := base.ForPlan(p, GPUOptions{Options: Options{Stage: stage, ForceVH: 64}, KeepDevice: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, g.Close()) }()
	requireSameGradBits(t, name+": B3 vs B1", b3Grads(t, g, in, dout), b1)
}

// TestGPUSingleTape runs B1 with the default (single-product) tape walk on
// the backward packs at R 1, 2 and 8 on every layout, core stage (heads
// 1 / 2, and 2 / 4 on the first pack), with the default blob and the
// compute_80 PTX forced: the gradients within issue 6's bounds of the CPU
// backend's float64 ones (logged beside SplitTape's), the same bits with the
// tape walk forced to vh 64, vh 128 and split between them, and B3
// (checkpoint, recompute, backward) B1's bits. In the module stage
// SplitTape changes nothing: the split walk's bits either way.
func TestGPUSingleTape(t *testing.T) {
	seed := gpuTestSeed(t)
	var hiOpts, plainOpts GPUOptions
	require.NoError(t, hiOpts.SetKernels("v5"))
	require.NoError(t, plainOpts.SetKernels("v5"))
	plainOpts.SplitTape = true
	p0 := bwdPlan(t, bwdPacks[0].docs, 1, LayoutC, 1, 2)
	gh := openTestGPUs(t, p0, hiOpts)
	gp := openTestGPUs(t, p0, plainOpts)
	require.Equal(t, len(gh), len(gp))
	for hi, heads := range []struct {
		hqk, hv int
		packs   int
	}{{1, 2, len(bwdPacks) - 1}, {2, 4, 1}} {
		for pi, pk := range bwdPacks[:heads.packs] {
			p1 := bwdPlan(t, pk.docs, 1, LayoutC, heads.hqk, heads.hv)
			in, dout := RandomInputs(p1, StageCore, seed+uint64(10*hi+pi))
			ref := cpuGrads(t, p1, Options{Stage: StageCore}, in, dout)
			for _, layout := range Layouts() {
				for _, R := range []int{1, 2, 8} {
					t.Run(fmt.Sprintf("H%d-%d/%s/%s/R%d", heads.hqk, heads.hv, pk.name, layout, R), func(t *testing.T) {
						p := bwdPlan(t, pk.docs, R, layout, heads.hqk, heads.hv)
						for i, tg := range gh {
							_, base := gpuB1(t, gp[i].g, p, GPUOptions{}, in, dout)
							logGrads(t, gp[i].name+" split tape walk", base.Gradients(), ref)
							runs := tapeWidthRuns(t, tg.name, tg.g, p, StageCore, in, dout)
							checkGrads(t, tg.name+" single-product tape walk", runs[0].Gradients(), ref)
							requireB3Bits(t, tg.name, tg.g, p, StageCore, in, dout, runs[0])
						}
					})
				}
			}
		}
	}
	t.Run("module stage: the split walk either way", func(t *testing.T) {
		p := bwdPlan(t, bwdPacks[0].docs, 2, LayoutD, 1, 2)
		in, dout := RandomInputs(p, StageModule, seed+77)
		for i, tg := range gh {
			_, a := gpuB1(t, tg.g, p, GPUOptions{Options: Options{Stage: StageModule}}, in, dout)
			_, b := gpuB1(t, gp[i].g, p, GPUOptions{Options: Options{Stage: StageModule}}, in, dout)
			requireSameGradBits(t, tg.name+": module stage, default vs SplitTape", a, b)
		}
	})
}

// TestRawQKEntries: the v5 set's dV'_local is gdn_dvlocal_mma_gr (grid NC
// x HQK, its own shared memory) unless SplitDvLocal (gdn_dvlocal_mma_gk);
// its chunk gradients are mma8r / mma6r (mma6r for the module stage, and
// for both with SplitGrads) whatever dV'_local runs, and mma8 / mma6 with
// FP32QKGrads; the other sets ignore both.
func TestRawQKEntries(t *testing.T) {
	for _, c := range []struct {
		set                    string
		split, v5              bool
		core, module           string // the chunk gradients of each stage by default
		plainCore, plainModule string // and with FP32QKGrads
	}{
		{"v5", false, true, entryGradsMMA8R, entryGradsMMA6R, entryGradsMMA8, entryGradsMMA6},
		{"v5", true, true, entryGradsMMA6R, entryGradsMMA6R, entryGradsMMA6, entryGradsMMA6},
		{"mma", false, false, "", "", "", ""},
		{"fp32", false, false, "", "", "", ""},
	} {
		var plain, raw, normDvl GPUOptions
		require.NoError(t, plain.SetKernels(c.set))
		require.NoError(t, raw.SetKernels(c.set))
		require.NoError(t, normDvl.SetKernels(c.set))
		plain.SplitGrads, raw.SplitGrads, normDvl.SplitGrads = c.split, c.split, c.split
		plain.FP32QKGrads, normDvl.SplitDvLocal = true, true
		pk, rk, nk := plain.kernelSet(), raw.kernelSet(), normDvl.kernelSet()
		require.NotEqual(t, plain.kernelFlags(), raw.kernelFlags(), c.set)
		require.NotEqual(t, plain.kernelFlags(), normDvl.kernelFlags(), c.set)
		if !c.v5 {
			require.Equal(t, pk.backwardEntries(), rk.backwardEntries(), c.set)
			require.Equal(t, pk.backwardEntries(), nk.backwardEntries(), c.set)
			require.False(t, rk.rawQKDvLocal || rk.rawQKGrads || pk.rawQKDvLocal, c.set)
			continue
		}
		require.True(t, pk.rawQKDvLocal && pk.dvlocalQK && !pk.dvlocalKt && !pk.rawQKGrads, c.set)
		require.True(t, rk.rawQKDvLocal && rk.rawQKGrads, c.set)
		require.True(t, !nk.rawQKDvLocal && nk.dvlocalKt && nk.rawQKGrads, c.set)
		require.Equal(t, gpuEntry{entryDVLocalMMAGR, dvlocalMMAGRSmem}, pk.backwardEntries()[0], c.set)
		require.Equal(t, gpuEntry{entryDVLocalMMAGR, dvlocalMMAGRSmem}, rk.backwardEntries()[0], c.set)
		require.Equal(t, gpuEntry{entryDVLocalMMAGK, dvlocalMMAGSmem}, nk.backwardEntries()[0], c.set)
		require.Equal(t, c.core, rk.gradsFor(false), "%s split %v: core", c.set, c.split)
		require.Equal(t, c.module, rk.gradsFor(true), "%s split %v: module", c.set, c.split)
		require.Equal(t, c.plainCore, pk.gradsFor(false), "%s split %v: core", c.set, c.split)
		require.Equal(t, c.plainModule, pk.gradsFor(true), "%s split %v: module", c.set, c.split)
		for _, e := range []string{c.core, c.module} {
			require.Contains(t, rk.backwardEntries(), gpuEntry{e, rk.gradsSmem}, c.set)
			require.NotContains(t, pk.backwardEntries(), gpuEntry{e, rk.gradsSmem}, c.set)
		}
		raw.SplitDvLocal = true // the raw chunk gradients beside the fp32 qn, kn dV'_local
		require.Equal(t, entryDVLocalMMAGK, raw.kernelSet().dvlocal, c.set)
		require.Equal(t, c.core, raw.kernelSet().gradsFor(false), c.set)
	}
}

// TestFakeDriverRawQK runs the v5 default's raw-row backward on the fake
// driver (in a child process; blobs from blobDirWith): the kept forward
// runs the _gnk prep and output (they write q's and k's rstd), B1 in both
// stages launches gdn_dvlocal_mma_gr on a (chunk, QK head) grid and the
// chunk gradients on the raw rows (mma8r in the core stage, mma6r in the
// module stage), never their qn / kn twins, and the kept forward holds
// less device memory than with FP32QKGrads (no fp32 qn, kn); nothing is
// left held.
func TestFakeDriverRawQK(t *testing.T) {
	fk := fakeChild(t, "TestFakeDriverRawQK")
	if fk == nil {
		return
	}
	t.Setenv(ptx.EnvBlobDir, blobDirWith(t, entryDVLocalMMAGR, entryGradsMMA8R, entryGradsMMA6R, entryTapePlanesH,
		entryTapePlanesH128, entryOffsetPlanesH))
	p := bwdPlan(t, []int{100, 70, 64}, 2, LayoutC, 2, 4)
	var o, plain GPUOptions
	require.NoError(t, o.SetKernels("v5"))
	require.NoError(t, plain.SetKernels("v5"))
	plain.FP32QKGrads = true
	g, err := NewGPU(p, o)
	require.NoError(t, err)
	gp, err := NewGPU(p, plain)
	require.NoError(t, err)
	for _, c := range []struct {
		stage       Stage
		grads, twin string
	}{{StageCore, entryGradsMMA8R, entryGradsMMA8}, {StageModule, entryGradsMMA6R, entryGradsMMA6}} {
		t.Run(string(c.stage), func(t *testing.T) {
			in, dout := RandomInputs(p, c.stage, 5)
			forward := func(base *GPU) *GPUForward {
				gs, err := base.ForPlan(p, GPUOptions{Options: Options{Stage: c.stage}, KeepDevice: true})
				require.NoError(t, err)
				t.Cleanup(func() { require.NoError(t, gs.Close()) })
				f, err := gs.Forward(context.Background(), in)
				require.NoError(t, err)
				t.Cleanup(func() { require.NoError(t, f.Close()) })
				return f
			}
			fp := forward(gp)
			from0 := fk.LogLen()
			f := forward(g)
			fwd := map[string]int{}
			for _, op := range fk.Log(from0) {
				if op.Kind == fakecuda.OpLaunch {
					fwd[op.Function]++
				}
			}
			// The backward reads q's and k's rstd: the kept forward runs the entries that write them
			// (the forward-alone _gn entries write no q_rstd, and dq came back zero on the GPU).
			require.Positive(t, fwd[entryOutputMMA16GNK], "the kept forward's output writes q_rstd: %v", fwd)
			require.Positive(t, fwd[entryPrepMMAGNK], "the kept forward's prep writes k_rstd: %v", fwd)
			require.Zero(t, fwd[entryOutputMMA16GN]+fwd[entryPrepMMAGN], "forward-alone entries in a kept forward: %v", fwd)
			for r := range p.Ranks {
				if p.Ranks[r].Tokens > 0 {
					require.Less(t, f.PeakBytes[r], fp.PeakBytes[r], "rank %d: the kept forward's peak device memory", r)
				}
			}
			from := fk.LogLen()
			_, err := f.Backward(context.Background(), dout)
			require.NoError(t, err)
			var grids [][3]uint32
			n := map[string]int{}
			for _, op := range fk.Log(from) {
				if op.Kind == fakecuda.OpLaunch {
					n[op.Function]++
					if op.Function == entryDVLocalMMAGR {
						grids = append(grids, op.Grid)
					}
				}
			}
			require.NotEmpty(t, grids, "gdn_dvlocal_mma_gr not launched: %v", n)
			for _, gr := range grids {
				require.Equal(t, uint32(2), gr[1], "a CTA a chunk and QK head")
			}
			require.Zero(t, n[entryDVLocalMMAGK], "the K^T planes' dV'_local ran")
			require.Positive(t, n[c.grads], "%s not launched: %v", c.grads, n)
			require.Zero(t, n[c.twin], "%s ran: %v", c.twin, n)
		})
	}
	require.NoError(t, g.Close())
	require.NoError(t, gp.Close())
	held := fk.Held()
	require.Zero(t, held.Allocs+held.Modules+held.Streams, "everything released: %+v", held)
}

// TestGPURawQK runs B1 with the v5 defaults on the backward packs at R 1
// and 4, every layout, both stages, with the default blob and the
// compute_80 PTX forced: the same gradient bits as FP32QKGrads' kernels'
// (mma8r and mma6r stage the values gdn_l2norm_fwd writes, so mma8's and
// mma6's bits), at
// vh 64 and vh 128, and B3 B1's bits; and the default dV'_local
// (gdn_dvlocal_mma_gr) against SplitDvLocal's: both within issue 6's bounds
// of the CPU backend's (the module stage against the reference fed the
// GPU's own bf16 conv output, as TestGPUBackward).
func TestGPURawQK(t *testing.T) {
	seed := gpuTestSeed(t)
	var rawOpts, plainOpts, normOpts GPUOptions
	require.NoError(t, rawOpts.SetKernels("v5"))
	require.NoError(t, plainOpts.SetKernels("v5"))
	require.NoError(t, normOpts.SetKernels("v5"))
	plainOpts.FP32QKGrads, normOpts.SplitDvLocal = true, true
	p0 := bwdPlan(t, bwdPacks[0].docs, 1, LayoutC, 1, 2)
	gr := openTestGPUs(t, p0, rawOpts)
	gp := openTestGPUs(t, p0, plainOpts)
	gn := openTestGPUs(t, p0, normOpts)
	require.Equal(t, len(gr), len(gp))
	require.Equal(t, len(gr), len(gn))
	for pi, pk := range bwdPacks[:len(bwdPacks)-1] {
		for si, stage := range []Stage{StageCore, StageModule} {
			p1 := bwdPlan(t, pk.docs, 1, LayoutC, 1, 2)
			in, dout := RandomInputs(p1, stage, seed+uint64(10*pi+si))
			opts := Options{Stage: stage}
			ref := cpuGrads(t, p1, opts, in, dout)
			for _, layout := range Layouts() {
				for _, R := range []int{1, 4} {
					t.Run(fmt.Sprintf("%s/%s/%s/R%d", pk.name, stage, layout, R), func(t *testing.T) {
						p := bwdPlan(t, pk.docs, R, layout, 1, 2)
						for i, tg := range gr {
							check := func(name string, gr *GPUGrads, y []float32) {
								if y != nil {
									oy := opts
									oy.convOut = y
									checkGradsTol(t, name+" vs its own bf16 conv output", gr.Gradients(),
										cpuGrads(t, p1, oy, in, dout), gpuGradQKVTol, gpuGradStoredTol)
								} else {
									checkGrads(t, name, gr.Gradients(), ref)
								}
							}
							var runs [2]*GPUGrads
							var y []float32
							for j, vh := range []int{64, 128} {
								o := opts
								o.ForceVH = vh
								var yj []float32
								_, runs[j], yj = gpuB1Conv(t, tg.g, p, GPUOptions{Options: o}, in, dout)
								if j == 0 {
									y = yj
								}
							}
							requireSameGradBits(t, tg.name+": vh 64 vs 128", runs[0], runs[1])
							o := opts
							o.ForceVH = 64
							_, base, _ := gpuB1Conv(t, gp[i].g, p, GPUOptions{Options: o}, in, dout)
							requireSameGradBits(t, tg.name+": the default (raw rows) vs FP32QKGrads", runs[0], base)
							check(tg.name+" default dV'_local", runs[0], y)
							_, norm, yn := gpuB1Conv(t, gn[i].g, p, GPUOptions{Options: o}, in, dout)
							check(tg.name+" SplitDvLocal", norm, yn)
							requireB3Bits(t, tg.name, tg.g, p, stage, in, dout, runs[0])
						}
					})
				}
			}
		}
	}
}
