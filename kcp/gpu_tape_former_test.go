package kcp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/gdnkcp/gdnkcp/sched"
)

// TestTapeFormerEntries: with TapeFormer the v5 set's vh 64 tape and offset
// walks are the walks that form dV'_local themselves, on single products in
// the core stage and on split ones in the module stage (and in the core
// stage with SplitTape or SplitGrads), and gdn_dvlocal_form joins the
// backward's entries; vh 128 keeps its walks. SplitDvLocal leaves no former
// (NewGPU then refuses TapeFormer), and the other sets ignore it.
func TestTapeFormerEntries(t *testing.T) {
	for _, c := range []struct {
		name         string
		set          string
		modify       func(*GPUOptions)
		former       bool
		core, coreOf string // the core stage's vh 64 tape and offset walks with the former
	}{
		{"v5", "v5", func(*GPUOptions) {}, true, entryTapePlanesHF, entryOffsetPlanesHF},
		{"v5 SplitTape", "v5", func(o *GPUOptions) { o.SplitTape = true }, true, entryTapePlanesF, entryOffsetPlanesF},
		{"v5 SplitGrads", "v5", func(o *GPUOptions) { o.SplitGrads = true }, true, entryTapePlanesF, entryOffsetPlanesF},
		{"v5 SplitDvLocal", "v5", func(o *GPUOptions) { o.SplitDvLocal = true }, false, "", ""},
		{"mma", "mma", func(*GPUOptions) {}, false, "", ""},
		{"fp32", "fp32", func(*GPUOptions) {}, false, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var plain, f GPUOptions
			require.NoError(t, plain.SetKernels(c.set))
			require.NoError(t, f.SetKernels(c.set))
			c.modify(&plain)
			c.modify(&f)
			f.TapeFormer = true
			require.NotEqual(t, plain.kernelFlags(), f.kernelFlags())
			pk, fk := plain.kernelSet(), f.kernelSet()
			if !c.former {
				require.Empty(t, fk.dvlocalForm)
				require.Equal(t, pk.backwardEntries(), fk.backwardEntries())
				return
			}
			require.Equal(t, c.core, fk.tapeEntryFor(64, false))
			require.Equal(t, c.coreOf, fk.offsetEntryAt(64, false))
			require.Equal(t, entryTapePlanesF, fk.tapeEntryFor(64, true))
			require.Equal(t, entryOffsetPlanesF, fk.offsetEntryAt(64, true))
			for _, module := range []bool{false, true} {
				require.Equal(t, pk.tapeEntryFor(128, module), fk.tapeEntryFor(128, module), "vh 128, module %v", module)
				require.Equal(t, pk.offsetEntryFor(module), fk.offsetEntryAt(128, module), "vh 128, module %v", module)
				require.Equal(t, pk.offsetEntryFor(module), pk.offsetEntryAt(64, module), "no former, module %v", module)
				require.Equal(t, pk.tapeEntryFor(64, module), plain.kernelSet().tapeEntryFor(64, module))
			}
			fe := fk.backwardEntries()
			for _, e := range []string{c.core, c.coreOf, entryTapePlanesF, entryOffsetPlanesF} {
				require.Contains(t, fe, gpuEntry{e, tapePlanesSmem(64)})
			}
			require.Contains(t, fe, gpuEntry{entryDVLocalForm, dvlocalFormSmem})
			require.Equal(t, pk.dvlocal, fk.dvlocal, "dV'_local's entry stays where nothing forms dvl")
		})
	}
}

// TestTapeFormerSmem: dvlocalFormSmem is the source's kDvlFormSmem: in
// ptx/src/gdn_tape_planes.cu once the former has landed, in the staged
// patch's added lines until then.
func TestTapeFormerSmem(t *testing.T) {
	re := regexp.MustCompile(`static_assert\(kDvlFormSmem == (\d+)`)
	src, err := os.ReadFile(filepath.Join("..", "ptx", "src", "gdn_tape_planes.cu"))
	require.NoError(t, err)
	where := "ptx/src/gdn_tape_planes.cu"
	m := re.FindSubmatch(src)
	if m == nil {
		where = "ptx/staging/tape_dvl_former.patch"
		patch, err := os.ReadFile(filepath.Join("..", where))
		require.NoError(t, err, "the former is in neither ptx/src nor ptx/staging")
		m = re.FindSubmatch(patch)
	}
	require.NotNil(t, m, "%s: no kDvlFormSmem", where)
	n, err := strconv.Atoi(string(m[1]))
	require.NoError(t, err)
	require.Equal(t, n, dvlocalFormSmem, where)
}

// TestFakeDriverTapeFormer runs TapeFormer's host side on the fake driver
// (in a child process; the staged entries added to the blobs by
// blobDirWith): the vh 64 tape and offset walks are the formers' entries
// (single products in the core stage, split ones in the module stage) and
// no dV'_local kernel runs where nothing else reads dvl (one rank or two, vh
// 64); gdn_dvlocal_form runs where a vh 128 tape or offset walk reads it,
// on all pairs at vh 128 and on a list of some in a split launch; NewGPU
// refuses TapeFormer beside SplitDvLocal; nothing is left held.
func TestFakeDriverTapeFormer(t *testing.T) {
	fk := fakeChild(t, "TestFakeDriverTapeFormer")
	if fk == nil {
		return
	}
	t.Setenv(ptx.EnvBlobDir, blobDirWith(t, entryTapePlanesHF, entryOffsetPlanesHF, entryTapePlanesF, entryOffsetPlanesF,
		entryDVLocalForm, entryTapePlanesH, entryTapePlanesH128, entryOffsetPlanesH, entryDVLocalMMAGR))
	var o GPUOptions
	require.NoError(t, o.SetKernels("v5"))
	o.TapeFormer = true
	bad := o
	bad.SplitDvLocal = true
	p1 := bwdPlan(t, []int{100, 70, 64}, 1, LayoutC, 2, 4)
	_, err := NewGPU(p1, bad)
	require.ErrorContains(t, err, "TapeFormer")
	p2 := bwdPlan(t, []int{100, 70, 64}, 2, LayoutC, 2, 4)
	for _, c := range []struct {
		name    string
		p       *Plan
		stage   Stage
		vh      int
		split   bool     // the tape and offset walks split between the widths (one head a segment at vh 128)
		entries []string // launched: the tape and offset walks' entries and dV'_local's
		some    bool     // gdn_dvlocal_form on a list of some (chunk, head) pairs, not its full grid
	}{
		{"core/R1/vh64", p1, StageCore, 64, false, []string{entryTapePlanesHF}, false},
		{"core/R1/vh128", p1, StageCore, 128, false, []string{entryTapePlanesH128, entryDVLocalForm}, false},
		{"core/R1/split", p1, StageCore, 0, true, []string{entryTapePlanesHF, entryTapePlanesH128, entryDVLocalForm}, true},
		{"core/R2/vh64", p2, StageCore, 64, false, []string{entryTapePlanesHF, entryOffsetPlanesHF}, false},
		{"core/R2/vh128", p2, StageCore, 128, false, []string{entryTapePlanesH128, entryOffsetPlanesH, entryDVLocalForm}, false},
		{"core/R2/split", p2, StageCore, 0, true, []string{entryTapePlanesHF, entryTapePlanesH128, entryOffsetPlanesHF,
			entryOffsetPlanesH, entryDVLocalForm}, true},
		{"module/R2/vh64", p2, StageModule, 64, false, []string{entryTapePlanesF, entryOffsetPlanesF}, false},
		{"module/R2/split", p2, StageModule, 0, true, []string{entryTapePlanesF, entryTapePlanes128, entryOffsetPlanesF,
			entryOffsetPlanes, entryDVLocalForm}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, err := NewGPU(c.p, o)
			require.NoError(t, err)
			defer func() { require.NoError(t, g.Close()) }()
			opts := GPUOptions{Options: Options{Stage: c.stage, ForceVH: c.vh}, KeepDevice: true}
			if c.split {
				opts.SplitHeads[sched.Tape], opts.SplitHeads[sched.Offset] = 1, 1
			}
			gs, err := g.ForPlan(c.p, opts)
			require.NoError(t, err)
			defer func() { require.NoError(t, gs.Close()) }()
			in, dout := RandomInputs(c.p, c.stage, 3)
			f, err := gs.Forward(context.Background(), in)
			require.NoError(t, err)
			defer func() { require.NoError(t, f.Close()) }()
			n := backwardLaunches(t, fk, f, dout)
			requireLaunched(t, n, c.entries, entryTapePlanes, entryTapePlanes128, entryTapePlanesH, entryTapePlanesH128,
				entryTapePlanesHF, entryTapePlanesF, entryOffsetPlanes, entryOffsetPlanesH, entryOffsetPlanesHF,
				entryOffsetPlanesF, entryDVLocalForm, entryDVLocalMMAGR)
			HV := uint32(c.p.Config.HV)
			for _, g := range n[entryDVLocalForm] { // (NC, HV) for every pair, (pairs, 1) for a list of some
				if c.some {
					require.Equal(t, uint32(1), g[1], "gdn_dvlocal_form's grid %v: not a pair list", g)
					require.Positive(t, g[0])
				} else {
					require.Equal(t, HV, g[1], "gdn_dvlocal_form's grid %v: not every pair", g)
				}
			}
		})
	}
	held := fk.Held()
	require.Zero(t, held.Allocs+held.Modules+held.Streams, "everything released: %+v", held)
}

// TestGPUTapeFormer runs B1 with TapeFormer (blobs built with
// ptx/staging/tape_dvl_former.patch; it skips on blobs without its
// entries) on the backward packs at R 1 and 2 on every layout, core stage,
// and on one pack at R 2 in the module stage (the split-product walks'
// former):
// the gradients within issue 6's bounds of the CPU backend's float64 ones
// and near the default's (dvl from gdn_dvlocal_mma_gr: other bits, the same
// precision), the same bits with the tape walk forced to vh 64, vh 128 and
// split between them, and B3 B1's bits.
func TestGPUTapeFormer(t *testing.T) {
	seed := gpuTestSeed(t)
	var fo, do GPUOptions
	require.NoError(t, fo.SetKernels("v5"))
	require.NoError(t, do.SetKernels("v5"))
	fo.TapeFormer = true
	p0 := bwdPlan(t, bwdPacks[0].docs, 1, LayoutC, 1, 2)
	gd := openTestGPUs(t, p0, do)
	g, err := NewGPU(p0, fo)
	if errors.Is(err, ErrMissingKernels) {
		t.Skipf("TapeFormer needs blobs built with ptx/staging/tape_dvl_former.patch (%s, %s): %v", entryTapePlanesHF, entryDVLocalForm, err)
	}
	require.NoError(t, err)
	require.NoError(t, g.Close())
	gf := openTestGPUs(t, p0, fo)
	require.Equal(t, len(gd), len(gf))
	for pi, pk := range bwdPacks {
		p1 := bwdPlan(t, pk.docs, 1, LayoutC, 2, 4)
		in, dout := RandomInputs(p1, StageCore, seed+uint64(pi))
		ref := cpuGrads(t, p1, Options{Stage: StageCore}, in, dout)
		for _, layout := range Layouts() {
			for _, R := range []int{1, 2} {
				t.Run(fmt.Sprintf("%s/%s/R%d", pk.name, layout, R), func(t *testing.T) {
					p := bwdPlan(t, pk.docs, R, layout, 2, 4)
					for i, tg := range gf {
						_, base := gpuB1(t, gd[i].g, p, GPUOptions{Options: Options{Stage: StageCore}}, in, dout)
						runs := tapeWidthRuns(t, tg.name, tg.g, p, StageCore, in, dout)
						checkGrads(t, tg.name+" tape walk forming dV'_local", runs[0].Gradients(), ref)
						logGrads(t, tg.name+" default dV'_local", base.Gradients(), ref)
						requireB3Bits(t, tg.name, tg.g, p, StageCore, in, dout, runs[0])
					}
				})
			}
		}
	}
	t.Run("module stage", func(t *testing.T) {
		p := bwdPlan(t, bwdPacks[0].docs, 2, LayoutD, 1, 2)
		in, dout := RandomInputs(p, StageModule, seed+77)
		ref := cpuGrads(t, p, Options{Stage: StageModule}, in, dout)
		for i, tg := range gf {
			_, base := gpuB1(t, gd[i].g, p, GPUOptions{Options: Options{Stage: StageModule}}, in, dout)
			runs := tapeWidthRuns(t, tg.name+" module stage", tg.g, p, StageModule, in, dout)
			checkGrads(t, tg.name+" module stage, walks forming dV'_local", runs[0].Gradients(), ref)
			logGrads(t, tg.name+" module stage, default dV'_local", base.Gradients(), ref)
			requireB3Bits(t, tg.name+" module stage", tg.g, p, StageModule, in, dout, runs[0])
		}
	})
}
