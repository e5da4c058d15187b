package kcp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/archdetect"
	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/gdnkcp/gdnkcp/sched"
)

// The backward tables against the plan and the CPU backend's logic, for
// random packs over every layout and 1..8 ranks:
//   - the offset list is the plan's (segments with a predecessor);
//   - the reverse compose CSR, read through the gathered layout
//     (rank*MaxOffset + list index), folds exactly the chain's later
//     segments from the document's end, as reverseCompose and
//     gdnref.ComposeBackward do: checked with scalar affine maps, which do
//     not commute, so a wrong order or index changes the bits;
//   - the halo-gradient add table, applied as gdn_add_rows does (one running
//     fp32 sum per element from dx's value), gives bitwise the fp32 sums of
//     convBackward's loop (ranks, segments, halo rows ascending), and uses
//     every received row exactly once.
func TestGPUBwdTables(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 29))
	for trial := 0; trial < 25; trial++ {
		docs := gpuRandomDocs(rng)
		if trial%5 == 0 { // many tiny documents: halos spanning several segments
			docs = []int{1, 2, 1, 5, 1, 1, 3, 70, 2}
		}
		for _, layout := range Layouts() {
			for R := 1; R <= 8; R++ {
				name := fmt.Sprintf("%v/%s/R%d", docs, layout, R)
				p, err := NewPlan(PlanConfig{Docs: docs, Ranks: R, Layout: layout, HQK: 1, HV: 2, DK: 16, DV: 16})
				require.NoError(t, err, name)
				checkBwdTables(t, rng, p, name)
			}
		}
	}
	_, err := buildGPUBwdTables(smallPlan(t, []int{5}, 1, LayoutC, 16), 1)
	require.ErrorContains(t, err, "rank 1 outside")
	_, err = buildGPUBwdTables(smallPlan(t, []int{5}, 1, LayoutC, 16), -1)
	require.ErrorContains(t, err, "rank -1 outside")
}

func checkBwdTables(t *testing.T, rng *rand.Rand, p *Plan, name string) {
	t.Helper()
	R := len(p.Ranks)
	type affine struct{ a, b float64 }
	maps := map[SegRef]affine{}
	for r := range p.Ranks {
		for s := range p.Ranks[r].Segments {
			maps[SegRef{r, s}] = affine{0.5 + rng.Float64(), rng.NormFloat64()}
		}
	}
	tables := make([]*gpuBwdTables, R)
	for r := range p.Ranks {
		var err error
		tables[r], err = buildGPUBwdTables(p, r)
		require.NoError(t, err, name)
	}
	maxOff := p.maxWalk(sched.Offset)
	gathered := make([]affine, R*maxOff)
	for r, tb := range tables {
		require.Equal(t, maxOff, tb.MaxOffset, name)
		require.Equal(t, p.maxSegments(), tb.HaloSlots, name)
		for li, s := range tb.Offset {
			gathered[r*maxOff+li] = maps[SegRef{r, int(s)}]
		}
	}
	// Halo gradients: every rank's dhalo rows, distinct fp32 values.
	C := 3
	slots := p.maxSegments()
	var all []float32
	for r := range p.Ranks {
		dhalo := make([]float32, len(p.Ranks[r].Segments)*ConvHalo*C)
		for i := range dhalo {
			dhalo[i] = float32(rng.NormFloat64())
		}
		send := haloGradSend(tables[r], dhalo, C)
		require.Len(t, send, slots*ConvHalo*C, name)
		all = append(all, send...)
	}
	for r, tb := range tables {
		rp := &p.Ranks[r]
		want := make([]int32, len(rp.Offset))
		for i, s := range rp.Offset {
			want[i] = int32(s)
			require.NotNil(t, rp.Segments[s].Pred, name)
		}
		require.Equal(t, want, append([]int32{}, tb.Offset...), name)
		require.Len(t, tb.RCompOff, len(rp.Segments)+1, name)
		require.EqualValues(t, len(tb.RCompIdx), tb.RCompOff[len(rp.Segments)], name)
		for s, seg := range rp.Segments {
			var got, ref float64
			for x := tb.RCompOff[s]; x < tb.RCompOff[s+1]; x++ {
				idx := int(tb.RCompIdx[x])
				require.True(t, idx >= 0 && idx < R*maxOff, name)
				m := gathered[idx]
				got = m.a*got + m.b
			}
			pos, err := p.chainPos(seg.Doc, SegRef{r, s})
			require.NoError(t, err)
			chain := p.Chains[seg.Doc]
			require.EqualValues(t, len(chain)-1-pos, tb.RCompOff[s+1]-tb.RCompOff[s], "%s: rank %d seg %d", name, r, s)
			for j := len(chain) - 1; j > pos; j-- {
				m := maps[chain[j]]
				ref = m.a*ref + m.b
			}
			require.Equal(t, math.Float64bits(ref), math.Float64bits(got), "%s: rank %d seg %d", name, r, s)
			if seg.Succ == nil {
				require.Equal(t, tb.RCompOff[s], tb.RCompOff[s+1], name)
			}
		}

		// Halo add table against convBackward's loop, in fp32.
		dx0 := make([]float32, rp.Tokens*C)
		for i := range dx0 {
			dx0[i] = float32(rng.NormFloat64())
		}
		wantDX := append([]float32{}, dx0...)
		per := ConvHalo * C
		for rr := range p.Ranks {
			for ss := range p.Ranks[rr].Segments {
				require.NoError(t, haloRows(&p.Ranks[rr].Segments[ss], func(row int, pc HaloPiece, off int) error {
					if pc.Rank != r {
						return nil
					}
					src := all[(rr*slots+ss)*per+row*C : (rr*slots+ss)*per+(row+1)*C]
					lt := rp.Segments[pc.Seg].LocalStart + off
					for i, v := range src {
						wantDX[lt*C+i] += v
					}
					return nil
				}))
			}
		}
		rows, err := haloGradRows(tb, all, R, C)
		require.NoError(t, err, name)
		require.Len(t, rows, len(tb.HaloSrc)*C, name)
		gotDX := append([]float32{}, dx0...)
		require.Len(t, tb.AddOff, len(tb.AddDst)+1, name)
		require.EqualValues(t, 0, tb.AddOff[0], name)
		require.EqualValues(t, len(tb.AddSrc), tb.AddOff[len(tb.AddDst)], name)
		used := make([]int, len(tb.HaloSrc))
		for d, dst := range tb.AddDst {
			if d > 0 {
				require.Less(t, tb.AddDst[d-1], dst, "%s: destinations ascending and unique", name)
			}
			require.True(t, dst >= 0 && int(dst) < rp.Tokens, name)
			require.Less(t, tb.AddOff[d], tb.AddOff[d+1], "%s: a destination without sources", name)
			for x := tb.AddOff[d]; x < tb.AddOff[d+1]; x++ {
				k := tb.AddSrc[x]
				if x > tb.AddOff[d] {
					require.Less(t, tb.AddSrc[x-1], k, "%s: sources in the fixed order", name)
				}
				used[k]++
				for i := 0; i < C; i++ {
					gotDX[int(dst)*C+i] += rows[int(k)*C+i]
				}
			}
		}
		for k, n := range used {
			require.Equal(t, 1, n, "%s: rank %d received row %d used %d times", name, r, k, n)
		}
		for i := range wantDX {
			require.Equal(t, math.Float32bits(wantDX[i]), math.Float32bits(gotDX[i]), "%s: rank %d dx element %d", name, r, i)
		}
		// The received rows are the halo rows of segments whose halo lies
		// (partly) on this rank, and nothing else.
		nrows := 0
		for rr := range p.Ranks {
			for _, seg := range p.Ranks[rr].Segments {
				for _, pc := range seg.Halo {
					if pc.Rank == r {
						nrows += pc.Count
					}
				}
			}
		}
		require.Len(t, tb.HaloSrc, nrows, name)
	}
}

// The halo-gradient exchange: a rank's send holds its dhalo in the first
// slots and zeros after; haloGradRows picks gathered rows by index and
// refuses a gather of the wrong length.
func TestGPUHaloGradLayout(t *testing.T) {
	tb := &gpuBwdTables{HaloSlots: 2, HaloSrc: []int32{5, 0, 9}}
	const C, R = 2, 2
	send := haloGradSend(tb, []float32{1, 2, 3, 4, 5, 6}, C) // one segment
	require.Equal(t, []float32{1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 0}, send)
	all := make([]float32, R*tb.HaloSlots*ConvHalo*C)
	for i := range all {
		all[i] = float32(i)
	}
	rows, err := haloGradRows(tb, all, R, C)
	require.NoError(t, err)
	require.Equal(t, []float32{10, 11, 0, 1, 18, 19}, rows)
	_, err = haloGradRows(tb, all[1:], R, C)
	require.ErrorContains(t, err, "halo gradient exchange")
}

// dO is gathered in buffer order and converted to bf16 exactly.
func TestGPUGatherDOut(t *testing.T) {
	for _, layout := range Layouts() {
		p, err := NewPlan(PlanConfig{Docs: []int{3, 70, 1, 7000}, Ranks: 3, Layout: layout, HQK: 1, HV: 2, DK: 16, DV: 16}) // 7000: segments of several 1024-token blocks
		require.NoError(t, err)
		_, dout := RandomInputs(p, StageCore, 3)
		nv := p.Config.HV * p.Config.DV
		for r, rp := range p.Ranks {
			got := gatherDOut(p, r, dout)
			require.Len(t, got, rp.Tokens*nv)
			for _, seg := range rp.Segments {
				for i := 0; i < seg.Len; i++ {
					for j := 0; j < nv; j++ {
						require.Equal(t, dout[(seg.Start+i)*nv+j], got[(seg.LocalStart+i)*nv+j].Float32())
					}
				}
			}
		}
	}
}

// gatherDOutRows over the spans a stager copies (rows not a multiple of
// the chunk, every window size) gives gatherDOut's rows, and writes nothing
// outside its window.
func TestGatherDOutRowsWindows(t *testing.T) {
	p, err := NewPlan(PlanConfig{Docs: []int{3, 70, 1, 700}, Ranks: 2, Layout: LayoutD, HQK: 1, HV: 2, DK: 16, DV: 16})
	require.NoError(t, err)
	_, dout := RandomInputs(p, StageCore, 5)
	nv := p.Config.HV * p.Config.DV
	for r, rp := range p.Ranks {
		want := gatherDOut(p, r, dout)
		for _, chunkRows := range []int{1, 7, 64, 65, 333, rp.Tokens, rp.Tokens + 5} {
			spans := stageSpans(2*rp.Tokens*nv, 2*nv, 2*nv*chunkRows)
			got := make([]bf16.BF16, 0, len(want))
			for _, sp := range spans {
				require.Zero(t, sp[0]%(2*nv), "span offsets are whole rows")
				win := make([]bf16.BF16, sp[1]/2+3) // 3 guard values past the window
				for i := range win {
					win[i] = 0xFFFF
				}
				gatherDOutRows(p, r, dout, win[:sp[1]/2], sp[0]/(2*nv))
				require.Equal(t, []bf16.BF16{0xFFFF, 0xFFFF, 0xFFFF}, win[sp[1]/2:], "rank %d chunk %d rows: nothing past the window", r, chunkRows)
				got = append(got, win[:sp[1]/2]...)
			}
			require.Equal(t, want, got, "rank %d, chunks of %d rows", r, chunkRows)
		}
	}
}

func TestStageSpans(t *testing.T) {
	cases := []struct {
		n, align, chunk int
		want            [][2]int
	}{
		{0, 1, 16, nil},
		{10, 1, 16, [][2]int{{0, 10}}},
		{16, 1, 16, [][2]int{{0, 16}}},
		{40, 1, 16, [][2]int{{0, 16}, {16, 16}, {32, 8}}},
		{40, 6, 16, [][2]int{{0, 12}, {12, 12}, {24, 12}, {36, 4}}},
		{12, 12, 16, [][2]int{{0, 12}}},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, stageSpans(c.n, c.align, c.chunk), "n %d align %d chunk %d", c.n, c.align, c.chunk)
	}
}

// The backward's argument lists: every one builds without error, has the
// parameter count and names of its signature in docs/gpu-backward.md (the
// contract), and, where the sources and the manifest have the kernel, the
// layout of its extern "C" signature in ptx/src and of the manifest.
func TestGPUBwdArgsMatchContract(t *testing.T) {
	samples := gpuBwdArgSamples()
	fp32, mma := GPUOptions{}.kernelSet(), GPUOptions{MMABackwardWalks: true, MMABackwardChunk: true}.kernelSet()
	// + the v4 offset and tape walks, dV'_local and chunk gradients, and the v5 chunk gradients (mma5, 6, 7, 8) and
	// dV'_local (on kn, and on K^T's walk planes), and the offset and tape walks on the walk planes (the tape
	// walk's two entries, vh 64 and vh 128, and the single-product twins of the three), and dV'_local on the raw
	// rows, and mma8 and mma6 on them, and the tape and offset walks forming dV'_local with its kernel (staged)
	require.Len(t, samples, len(fp32.backwardEntries())+24)
	v5 := GPUOptions{}
	require.NoError(t, v5.SetKernels("v5"))
	v5s, v5r, v5f := v5, v5, v5
	v5s.SplitTape, v5s.SplitDvLocal, v5r.FP32QKGrads, v5f.TapeFormer = true, true, true, true
	for _, ks := range []kernelSet{fp32, mma, GPUOptions{MMAGroupedGrads: true}.kernelSet(), v5.kernelSet(), v5s.kernelSet(),
		v5r.kernelSet(), v5f.kernelSet()} {
		for _, e := range ks.backwardEntries() {
			require.Contains(t, samples, e.name)
		}
	}
	raw, err := os.ReadFile(filepath.Join("..", "docs", "gpu-backward.md"))
	if errors.Is(err, os.ErrNotExist) {
		t.Skipf("needs docs/gpu-backward.md (run from the package directory of a full checkout): %v", err)
	}
	require.NoError(t, err)
	doc := map[string][]string{}
	for _, m := range regexp.MustCompile("(?s)`(gdn_\\w+)\\(([^)`]*)\\)`").FindAllStringSubmatch(string(raw), -1) {
		var params []string
		for _, f := range strings.Split(m[2], ",") {
			params = append(params, strings.TrimSpace(f))
		}
		doc[m[1]] = params
	}
	// A v4 kernel takes its fp32 twin's arguments.
	twin := func(name string) string {
		switch name {
		case entryDVLocalMMA, entryDVLocalMMAG, entryDVLocalMMAGK:
			return entryDVLocal
		case entryGradsMMA:
			return entryChunkGrads
		case entryTapeMMA, entryOffsetMMA, entryTapePlanes, entryOffsetPlanes: // their own signatures: the fp32 twin's and trailing arguments
			return name
		case entryTapePlanes128, entryTapePlanesH, entryTapePlanesH128, entryTapePlanesHF, entryTapePlanesF: // the vh 64 entry's signature
			return entryTapePlanes
		case entryOffsetPlanesH, entryOffsetPlanesHF, entryOffsetPlanesF:
			return entryOffsetPlanes
		}
		return strings.TrimSuffix(name, "_mma")
	}
	for name, args := range samples {
		require.NoError(t, args.Err(), name)
		want, ok := doc[twin(name)]
		require.True(t, ok, "%s: no signature in docs/gpu-backward.md", name)
		require.Len(t, args.Layout(), len(want), "%s: parameters %v", name, want)
	}
	// The sources and the manifest, once the kernels exist.
	if _, err := os.Stat(filepath.Join("..", "ptx", "src", "gdn_bwd.cu")); err != nil {
		t.Logf("ptx/src/gdn_bwd.cu not present yet: only the contract was checked (%v)", err)
		return
	}
	sigs := kernelSignatures(t)
	m, err := ptx.Embedded().Manifest()
	require.NoError(t, err)
	missing := map[string][]string{} // blob target -> backward entries it lacks
	defer func() {
		for _, b := range m.Blobs {
			if miss := missing[b.Target]; len(miss) > 0 {
				slices.Sort(miss)
				t.Logf("blob %s has no entries %s yet (the blobs predate the kernels)", b.Target, strings.Join(miss, ", "))
			}
		}
	}()
	for name, args := range samples {
		got := args.Layout()
		want, ok := sigs[name]
		if patch := stagedEntries[name]; !ok && patch != "" {
			t.Logf("%s: staged in ptx/staging/%s, not in ptx/src yet: checked against the contract only", name, patch)
			continue
		}
		require.True(t, ok, "%s: no extern \"C\" signature in ptx/src", name)
		require.Len(t, got, len(want), "%s: parameter count", name)
		for i := range want {
			require.Equal(t, want[i].Size, got[i].Size, "%s parameter %d (%s)", name, i, want[i].Name)
			require.Equal(t, want[i].Offset, got[i].Offset, "%s parameter %d (%s)", name, i, want[i].Name)
			if d := doc[twin(name)]; d[i] != want[i].Name {
				t.Logf("%s parameter %d: the source names it %s, the contract %s", name, i, want[i].Name, d[i])
			}
		}
		for _, b := range m.Blobs {
			e, ok := b.Entry(name)
			if !ok {
				missing[b.Target] = append(missing[b.Target], name)
				continue
			}
			spec := archdetect.ParamSpecs(e.Params)
			require.Len(t, got, len(spec), "%s in blob %s", name, b.Target)
			for i := range spec {
				require.Equal(t, [3]int{spec[i].Size, spec[i].Align, spec[i].Offset}, [3]int{got[i].Size, got[i].Align, got[i].Offset},
					"%s parameter %d (%s) in blob %s", name, i, spec[i].Name, b.Target)
			}
		}
	}
}

// The backward's entries are listed once, apart from the forward's; the
// backend resolves both sets, and a blob with only the forward's lacks
// exactly the backward's.
func TestGPUBackwardEntries(t *testing.T) {
	names := GPUBackwardEntries()
	require.Len(t, names, 9)
	seen := map[string]bool{}
	for _, n := range GPUForwardEntries() {
		seen[n] = true
	}
	for _, n := range names {
		require.False(t, seen[n], n)
		seen[n] = true
	}
	var fwd []ptx.Entry
	for _, n := range GPUForwardEntries() {
		fwd = append(fwd, ptx.Entry{Name: n})
	}
	b := &ptx.Blob{Entries: fwd}
	require.Equal(t, names, missingEntries(b, GPUOptions{}.kernelSet().allEntries()))
	require.Empty(t, missingEntries(b, GPUOptions{}.kernelSet().entries()))
	tc := GPUOptions{TensorCoreWalks: true, TensorCoreChunk: true}.kernelSet().allEntries()
	require.Len(t, tc, len(GPUForwardEntries())+len(names))
	for _, e := range (GPUOptions{}).kernelSet().backwardEntries() {
		require.GreaterOrEqual(t, e.smem, 0, e.name)
	}
	// The v4 set swaps the offset and tape walks, dV'_local and the chunk
	// gradients, and their shared memory; each switch only its own.
	mma := GPUOptions{MMABackwardWalks: true}.kernelSet().backwardEntries()
	require.Equal(t, gpuEntry{entryDVLocal, dvlocalSmem}, mma[0])
	require.Equal(t, gpuEntry{entryOffsetMMA, bwdWalkMMASmem(64)}, mma[1]) // the larger: 64 holds the key split
	require.Equal(t, gpuEntry{entryTapeMMA, bwdWalkMMASmem(64)}, mma[2])
	require.Equal(t, gpuEntry{entryChunkGrads, chunkGradSmem}, mma[3])
	require.Equal(t, []int{231424, 214016}, []int{bwdWalkMMASmem(64), bwdWalkMMASmem(128)})
	chunk := GPUOptions{MMABackwardChunk: true}.kernelSet().backwardEntries()
	require.Equal(t, []gpuEntry{{entryDVLocalMMA, dvlocalMMASmem}, {entryOffset, bwdWalkSmem(128)},
		{entryTape, bwdWalkSmem(128)}, {entryGradsMMA, chunkGradMMASmem}}, chunk[:4])
	require.Equal(t, []int{82176, 227136}, []int{dvlocalMMASmem, chunkGradMMASmem})
	for _, s := range []int{dvlocalMMASmem, chunkGradMMASmem} {
		require.LessOrEqual(t, s, 232448)
	}
	require.LessOrEqual(t, 2*(dvlocalMMASmem+1024), 233472, "gdn_dvlocal_mma: two CTAs an SM")
	// The v5 chunk gradients replace the chunk gradients' entry and smem.
	g5 := GPUOptions{MMABackwardChunk: true, MMAGroupedGrads: true}.kernelSet()
	require.Equal(t, []gpuEntry{{entryDVLocalMMAG, dvlocalMMAGSmem}, {entryOffset, bwdWalkSmem(128)},
		{entryTape, bwdWalkSmem(128)}, {entryGradsMMA5, chunkGradMMA5Smem}}, g5.backwardEntries()[:4])
	require.True(t, g5.grads5)
	require.True(t, g5.dvlocalQK)
	require.LessOrEqual(t, 2*(dvlocalMMAGSmem+1024), 233472, "gdn_dvlocal_mma_g: two CTAs an SM")
	require.Positive(t, chunkGradMMA5Smem)
	require.LessOrEqual(t, chunkGradMMA5Smem, 232448)
}

// Backward, ForwardCheckpoint and Recompute refuse what they cannot run with
// errors, not panics: a nil or empty result, dout of the wrong length, a
// forward that kept no device buffers (KeepDevice unset) or was closed, an
// empty checkpoint.
func TestGPUBackwardErrors(t *testing.T) {
	p, err := NewPlan(PlanConfig{Docs: []int{3, 70}, Ranks: 2, Layout: LayoutZ, HQK: 1, HV: 2, DK: 128, DV: 128})
	require.NoError(t, err)
	_, dout := RandomInputs(p, StageCore, 1)
	ctx := context.Background()

	var f *GPUForward
	_, err = f.Backward(ctx, dout)
	require.ErrorContains(t, err, "empty forward result")
	_, err = (&GPUForward{}).Backward(ctx, dout)
	require.ErrorContains(t, err, "empty forward result")

	// What Forward returns without KeepDevice: no device state.
	notKept := &GPUForward{plan: p, stage: StageCore, ranks: make([]*gpuRank, 2)}
	_, err = notKept.Backward(ctx, dout[1:])
	require.ErrorContains(t, err, "dout has")
	require.ErrorContains(t, err, "[T, HV, V]")
	_, err = notKept.Backward(ctx, nil)
	require.ErrorContains(t, err, "dout has 0 elements")
	_, err = notKept.Backward(ctx, dout)
	require.ErrorContains(t, err, "kept no device buffers")
	require.ErrorContains(t, err, "KeepDevice")
	require.NoError(t, notKept.Close())
	_, err = notKept.Backward(ctx, dout)
	require.ErrorContains(t, err, "kept no device buffers")
	_, err = notKept.deviceBytes(0)
	require.ErrorContains(t, err, "rank 0 kept no device buffers")

	var g *GPU
	_, err = g.ForwardCheckpoint(ctx, nil)
	require.ErrorContains(t, err, "nil backend")
	var ck *GPUCheckpoint
	_, err = ck.Recompute(ctx)
	require.ErrorContains(t, err, "checkpoint is empty")
	_, err = (&GPUCheckpoint{}).Recompute(ctx)
	require.ErrorContains(t, err, "checkpoint is empty")
	_, err = (&GPUCheckpoint{g: &GPU{plan: p, dev: &gpuDevice{}, closed: true}}).Recompute(ctx)
	require.ErrorContains(t, err, "closed")
}

// The gradient check: a still-poisoned element is reported as never
// written, another NaN as NaN, each with the gradient, rank, token and head
// or conv channel; good values land in global order.
func TestGPUScatterGrads(t *testing.T) {
	p, err := NewPlan(PlanConfig{Docs: []int{3, 4}, Ranks: 2, Layout: LayoutZ, HQK: 1, HV: 2, DK: 128, DV: 128})
	require.NoError(t, err)
	cfg := p.Config
	nq, nv, C, HV := cfg.HQK*gpuD, cfg.HV*gpuD, p.ConvChannels(), cfg.HV
	const r = 1
	rp := &p.Ranks[r]
	Tr := rp.Tokens
	fill16 := func(n int) []bf16.BF16 {
		out := make([]bf16.BF16, n)
		for i := range out {
			out[i] = bf16.Float32ToBF16(float32(i%7) - 3)
		}
		return out
	}
	fill32 := func(n int) []float32 {
		out := make([]float32, n)
		for i := range out {
			out[i] = float32(i%5) + 0.5
		}
		return out
	}
	// local token 1 lives at global token t1 of document d1.
	var t1, d1 int
	for _, seg := range rp.Segments {
		if seg.LocalStart <= 1 && 1 < seg.LocalStart+seg.Len {
			t1, d1 = seg.Start+1-seg.LocalStart, seg.Doc
		}
	}
	at := fmt.Sprintf("token %d (local 1, document %d)", t1, d1)
	for _, tc := range []struct {
		name   string
		module bool
		spoil  func(g *gradRows)
		want   []string
	}{
		{"core clean", false, nil, nil},
		{"module clean", true, nil, nil},
		{"dq poison", false, func(g *gradRows) { g.DQ[1*nq+7] = poisonBF16 },
			[]string{"rank 1: dq: 1 elements never written, 0 NaN", at + " QK head 0 column 7"}},
		{"dv nan", false, func(g *gradRows) { g.DV[1*nv+gpuD+3] = bf16.NaN },
			[]string{"rank 1: dv: 0 elements never written, 1 NaN", at + " value head 1 column 3"}},
		{"dx poison in k", true, func(g *gradRows) { g.DX[1*C+nq+5] = poisonBF16 },
			[]string{"rank 1: dx: 1 elements never written", at + fmt.Sprintf(" channel %d (k head 0 column 5)", nq+5)}},
		{"dx nan in v", true, func(g *gradRows) { g.DX[1*C+2*nq+gpuD+1] = bf16.NaN },
			[]string{"rank 1: dx: 0 elements never written, 1 NaN", "(v head 1 column 1)"}},
		{"dg poison", false, func(g *gradRows) { g.DG[1*HV+1] = math.Float32frombits(PoisonF32) },
			[]string{"rank 1: dg: 1 elements never written", at + " value head 1"}},
		{"dbeta nan", true, func(g *gradRows) { g.DBeta[0] = float32(math.NaN()) },
			[]string{"rank 1: dbeta: 0 elements never written, 1 NaN"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stage := StageCore
			rows := gradRows{DG: fill32(Tr * HV), DBeta: fill32(Tr * HV)}
			if tc.module {
				stage = StageModule
				rows.DX = fill16(Tr * C)
			} else {
				rows.DQ, rows.DK, rows.DV = fill16(Tr*nq), fill16(Tr*nq), fill16(Tr*nv)
			}
			if tc.spoil != nil {
				tc.spoil(&rows)
			}
			g := newGrads(p, stage)
			err := scatterGrads(p, r, g, rows)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
			if tc.want != nil {
				return
			}
			require.NoError(t, err)
			for _, seg := range rp.Segments {
				for i := 0; i < seg.Len; i++ {
					lt, gt := seg.LocalStart+i, seg.Start+i
					require.Equal(t, float64(rows.DG[lt*HV+1]), g.DG[gt*HV+1])
					if tc.module {
						require.Equal(t, float64(rows.DX[lt*C+3].Float32()), g.DQ[gt*nq+3])
						require.Equal(t, float64(rows.DX[lt*C+nq+4].Float32()), g.DK[gt*nq+4])
						require.Equal(t, float64(rows.DX[lt*C+2*nq+gpuD+5].Float32()), g.DV[gt*nv+gpuD+5])
					} else {
						require.Equal(t, float64(rows.DV[lt*nv+gpuD+5].Float32()), g.DV[gt*nv+gpuD+5])
						require.Equal(t, float64(rows.DK[lt*nq+4].Float32()), g.DK[gt*nq+4])
					}
				}
			}
		})
	}
	// The conv weight and halo gradient checks name channel and tap, or
	// segment, row and channel.
	dw := make([]float32, 4*C)
	dw[4*5+2] = math.Float32frombits(PoisonF32)
	err = checkF32(3, "conv weight gradient", dw, func(i int) string { return fmt.Sprintf("channel %d tap %d", i/4, i%4) })
	require.ErrorContains(t, err, "rank 3: conv weight gradient: 1 elements never written, 0 NaN; first at channel 5 tap 2")
	dh := make([]float32, 2*ConvHalo*C)
	dh[ConvHalo*C+2*C+9] = float32(math.NaN())
	require.ErrorContains(t, checkHaloGrads(p, 0, dh), "rank 0: halo gradient: 0 elements never written, 1 NaN; first at segment 1 row 2 channel 9")
	require.NoError(t, checkHaloGrads(p, 0, make([]float32, ConvHalo*C)))
}

// The conv weight gradient is summed over the ranks in rank order, in
// float32: the same bits as the sequential sum, whichever rank computes it.
func TestGPUSumRanks(t *testing.T) {
	all := []float32{1e8, 1, -1e8, 1, 1, 2} // 3 ranks x 2
	sum, err := sumRanks(all, 3, 2)
	require.NoError(t, err)
	want0 := float32(1e8)
	want0 += -1e8
	want0 += 1
	require.Equal(t, []float32{want0, 1 + 1 + 2}, sum)
	_, err = sumRanks(all[1:], 3, 2)
	require.ErrorContains(t, err, "conv weight gradient exchange")
}

// The peak of a devMem without a device is zero, and held tolerates nil.
func TestDevMemHeld(t *testing.T) {
	var m *devMem
	now, peak := m.held()
	require.Zero(t, now)
	require.Zero(t, peak)
	m = &devMem{bytes: 10, peak: 30}
	require.NoError(t, m.free())
	now, peak = m.held()
	require.Zero(t, now)
	require.EqualValues(t, 30, peak)
}
