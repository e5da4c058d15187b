package kcp

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/archdetect"
	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/internal/convref"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/gdnkcp/gdnkcp/sched"
)

// gpuRandomDocs draws a pack of 1..7 documents with lengths around a chunk,
// including 1-token and exactly-one-chunk documents.
func gpuRandomDocs(rng *rand.Rand) []int {
	docs := make([]int, 1+rng.IntN(7))
	for i := range docs {
		switch rng.IntN(4) {
		case 0:
			docs[i] = 1 + rng.IntN(5)
		case 1:
			docs[i] = 64 * (1 + rng.IntN(3))
		default:
			docs[i] = 1 + rng.IntN(300)
		}
	}
	return docs
}

// The chunk tables cover every segment from its own start with chunks of
// 1..64 tokens; the conv tables pass the conv reference's validation; the
// summary list is the plan's; and the compose CSR, read through the gathered
// layout (rank*maxSummary + list index), folds exactly the chain's earlier
// segments in chain order: checked with scalar affine maps, which do not
// commute, so a wrong order or index changes the result.
func TestGPUTables(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 17))
	for trial := 0; trial < 25; trial++ {
		docs := gpuRandomDocs(rng)
		for _, layout := range Layouts() {
			for R := 1; R <= 8; R++ {
				name := fmt.Sprintf("%v/%s/R%d", docs, layout, R)
				p, err := NewPlan(PlanConfig{Docs: docs, Ranks: R, Layout: layout, HQK: 1, HV: 2, DK: 16, DV: 16})
				require.NoError(t, err, name)
				// A scalar affine map x -> a x + b per segment with a successor.
				type affine struct{ a, b float64 }
				maps := map[SegRef]affine{}
				for r := range p.Ranks {
					for s := range p.Ranks[r].Segments {
						maps[SegRef{r, s}] = affine{0.5 + rng.Float64(), rng.NormFloat64()}
					}
				}
				tables := make([]*gpuTables, R)
				for r := range p.Ranks {
					tables[r], err = buildGPUTables(p, r)
					require.NoError(t, err, name)
				}
				maxSum := p.maxWalk(sched.Summary)
				gathered := make([]affine, R*maxSum)
				for r, tb := range tables {
					require.Equal(t, maxSum, tb.MaxSummary, name)
					for li, s := range tb.Summary {
						gathered[r*maxSum+li] = maps[SegRef{r, int(s)}]
					}
				}
				for r, tb := range tables {
					rp := &p.Ranks[r]
					require.Equal(t, rp.Tokens, tb.Tokens, name)
					require.Equal(t, len(rp.Segments), tb.NS, name)
					require.Len(t, tb.ChunkTok0, tb.NC, name)
					require.Len(t, tb.ChunkLen, tb.NC, name)
					require.NoError(t, convref.Validate(nil, nil, nil, tb.SegStart, tb.SegLen, tb.TokSeg, tb.Tokens, 0, tb.NS), name)
					want := make([]int32, len(rp.Summary))
					for i, s := range rp.Summary {
						want[i] = int32(s)
						require.NotNil(t, rp.Segments[s].Succ, name)
					}
					require.Equal(t, want, append([]int32{}, tb.Summary...), name)
					require.Len(t, tb.CompOff, tb.NS+1, name)
					require.EqualValues(t, len(tb.CompIdx), tb.CompOff[tb.NS], name)
					nc := 0
					for s, seg := range rp.Segments {
						require.EqualValues(t, nc, tb.SegChunk0[s], name)
						require.EqualValues(t, seg.Chunks, tb.SegNChunk[s], name)
						covered := 0
						for c := nc; c < nc+seg.Chunks; c++ {
							require.EqualValues(t, seg.LocalStart+covered, tb.ChunkTok0[c], "%s seg %d chunk %d", name, s, c)
							require.True(t, tb.ChunkLen[c] >= 1 && tb.ChunkLen[c] <= ChunkSize, name)
							if c < nc+seg.Chunks-1 {
								require.EqualValues(t, ChunkSize, tb.ChunkLen[c], name)
							}
							covered += int(tb.ChunkLen[c])
						}
						require.Equal(t, seg.Len, covered, name)
						nc += seg.Chunks
						// Compose: fold through the CSR and through the chain.
						var got, ref float64
						for x := tb.CompOff[s]; x < tb.CompOff[s+1]; x++ {
							idx := int(tb.CompIdx[x])
							require.True(t, idx >= 0 && idx < R*maxSum, name)
							m := gathered[idx]
							got = m.a*got + m.b
						}
						pos, err := p.chainPos(seg.Doc, SegRef{r, s})
						require.NoError(t, err)
						require.EqualValues(t, pos, tb.CompOff[s+1]-tb.CompOff[s], "%s: rank %d seg %d folds %d summaries", name, r, s, pos)
						for _, ref2 := range p.Chains[seg.Doc][:pos] {
							m := maps[ref2]
							ref = m.a*ref + m.b
						}
						require.Equal(t, math.Float64bits(ref), math.Float64bits(got), "%s: rank %d seg %d", name, r, s)
						if seg.Pred == nil {
							require.Equal(t, tb.CompOff[s], tb.CompOff[s+1], name)
						}
					}
					require.Equal(t, nc, tb.NC, name)
				}
			}
		}
	}
	_, err := buildGPUTables(smallPlan(t, []int{5}, 1, LayoutC, 16), 1)
	require.ErrorContains(t, err, "rank 1 outside")
}

// The summary exchange's layout: every rank sends maxSummary P slots then
// maxSummary Q slots; after the gather, block rr of the P (Q) blocks holds
// rank rr's list entries, so entry rr*maxSummary + li is rank rr's li-th.
func TestGPUSummaryLayout(t *testing.T) {
	const hv, R, maxSum = 2, 3, 2
	per := summarySlot(hv)
	nlist := []int{2, 0, 1}
	var all []float32
	for r := 0; r < R; r++ {
		qOff, size := summarySend(maxSum, hv)
		require.Equal(t, maxSum*per, qOff)
		send := make([]float32, size)
		for li := 0; li < nlist[r]; li++ {
			for i := 0; i < per; i++ {
				send[li*per+i] = float32(1000*r + 10*li + 1)
				send[qOff+li*per+i] = -float32(1000*r + 10*li + 1)
			}
		}
		all = append(all, send...)
	}
	ps, qs, err := summaryBlocks(all, R, maxSum, hv)
	require.NoError(t, err)
	allP, allQ := slicesConcat(ps), slicesConcat(qs)
	require.Len(t, allP, R*maxSum*per)
	for r := 0; r < R; r++ {
		for li := 0; li < maxSum; li++ {
			want := float32(0)
			if li < nlist[r] {
				want = float32(1000*r + 10*li + 1)
			}
			idx := r*maxSum + li
			require.Equal(t, want, allP[idx*per], "P entry %d", idx)
			require.Equal(t, want, allP[idx*per+per-1], "P entry %d", idx)
			require.Equal(t, -want, allQ[idx*per+per/2], "Q entry %d", idx)
		}
	}
	_, _, err = summaryBlocks(all[:len(all)-1], R, maxSum, hv)
	require.ErrorContains(t, err, "summary exchange")
}

func slicesConcat(s [][]float32) []float32 {
	var out []float32
	for _, x := range s {
		out = append(out, x...)
	}
	return out
}

// Inputs gathered for a rank are its tokens in buffer order, converted to
// bf16 bits exactly (the inputs hold bf16 values); the module's x is q|k|v
// per token; the conv halo built from the all-gather holds the min(3,
// DocOffset) tokens before each segment, right-aligned, zeros above.
func TestGPUGatherInputsAndHalo(t *testing.T) {
	for _, layout := range Layouts() {
		for _, R := range []int{1, 2, 3, 5, 8} {
			p, err := NewPlan(PlanConfig{Docs: []int{2, 70, 1, 2600, 5}, Ranks: R, Layout: layout, HQK: 1, HV: 2, DK: 16, DV: 16})
			require.NoError(t, err)
			in, _ := RandomInputs(p, StageModule, uint64(R))
			cfg := p.Config
			nq, nv, C := cfg.HQK*cfg.DK, cfg.HV*cfg.DV, p.ConvChannels()
			var sends []float32
			for r := range p.Ranks {
				sends = append(sends, haloSend(p, r, in)...)
			}
			for r, rp := range p.Ranks {
				name := fmt.Sprintf("%s/R%d/rank %d", layout, R, r)
				core := gatherGPUInputs(p, r, StageCore, &Inputs{Q: in.Q, K: in.K, V: in.V, G: in.G, Beta: in.Beta})
				mod := gatherGPUInputs(p, r, StageModule, in)
				require.Len(t, core.Q, rp.Tokens*nq, name)
				require.Len(t, mod.X, rp.Tokens*C, name)
				require.Equal(t, bf16.FromFloat32s(in.ConvW), mod.ConvW, name)
				for _, seg := range rp.Segments {
					for i := 0; i < seg.Len; i++ {
						lt, gt := seg.LocalStart+i, seg.Start+i
						for j := 0; j < nq; j++ {
							require.Equal(t, in.Q[gt*nq+j], core.Q[lt*nq+j].Float32(), name)
							require.Equal(t, in.K[gt*nq+j], core.K[lt*nq+j].Float32(), name)
							require.Equal(t, in.Q[gt*nq+j], mod.X[lt*C+j].Float32(), name)
							require.Equal(t, in.K[gt*nq+j], mod.X[lt*C+nq+j].Float32(), name)
						}
						for j := 0; j < nv; j++ {
							require.Equal(t, in.V[gt*nv+j], core.V[lt*nv+j].Float32(), name)
							require.Equal(t, in.V[gt*nv+j], mod.X[lt*C+2*nq+j].Float32(), name)
						}
						for h := 0; h < cfg.HV; h++ {
							require.Equal(t, in.G[gt*cfg.HV+h], mod.G[lt*cfg.HV+h], name)
							require.Equal(t, in.Beta[gt*cfg.HV+h], core.Beta[lt*cfg.HV+h], name)
						}
					}
				}
				halo, err := haloFromGathered(p, r, sends)
				require.NoError(t, err, name)
				require.Len(t, halo, len(rp.Segments)*ConvHalo*C, name)
				for s, seg := range rp.Segments {
					n := min(ConvHalo, seg.DocOffset)
					for row := 0; row < ConvHalo; row++ {
						for c := 0; c < C; c++ {
							want := float32(0)
							if row >= ConvHalo-n {
								gt := seg.Start - (ConvHalo - row)
								want = preConvValue(in, p, gt, c)
							}
							require.Equal(t, want, halo[(s*ConvHalo+row)*C+c].Float32(), "%s seg %d row %d ch %d", name, s, row, c)
						}
					}
				}
			}
			_, err = haloFromGathered(p, 0, sends[:len(sends)-1])
			require.ErrorContains(t, err, "halo exchange")
		}
	}
}

// preConvValue is channel c of global token t of the q|k|v concatenation.
func preConvValue(in *Inputs, p *Plan, t, c int) float32 {
	cfg := p.Config
	nq, nv := cfg.HQK*cfg.DK, cfg.HV*cfg.DV
	switch {
	case c < nq:
		return in.Q[t*nq+c]
	case c < 2*nq:
		return in.K[t*nq+c-nq]
	}
	return in.V[t*nv+c-2*nq]
}

// bf16 conversion of the inputs rounds to nearest even (exact for bf16
// values), as the kernels' own conversions do.
func TestGPUInputsBF16(t *testing.T) {
	p, err := NewPlan(PlanConfig{Docs: []int{1}, Ranks: 1, Layout: LayoutC, HQK: 1, HV: 1, DK: 16, DV: 16})
	require.NoError(t, err)
	in := &Inputs{Q: make([]float32, 16), K: make([]float32, 16), V: make([]float32, 16), G: []float32{-0.1}, Beta: []float32{0.5}}
	cases := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80},
		{-2.5, 0xc020},
		{1 + 1.0/256, 0x3f80},            // a tie rounds to even (down)
		{1 + 3.0/256, 0x3f82},            // a tie rounds to even (up)
		{1 + 1.0/256 + 1.0/4096, 0x3f81}, // above the tie rounds up
		{float32(math.Inf(1)), 0x7f80},
	}
	for i, c := range cases {
		in.Q[i] = c.in
	}
	got := gatherGPUInputs(p, 0, StageCore, in)
	for i, c := range cases {
		require.Equal(t, c.want, uint16(got.Q[i]), "%v", c.in)
	}
}

// The Go argument lists match the extern "C" signatures in ptx/src (pointer 8
// bytes, int and float 4, unsigned long long 8) and, where the embedded
// manifest has the entry, its recorded layout: launches are checked against
// the manifest, so a mismatch here would fail on the GPU.
func TestGPUArgsMatchSources(t *testing.T) {
	sigs := kernelSignatures(t)
	m, err := ptx.Embedded().Manifest()
	require.NoError(t, err)
	for name, args := range gpuArgSamples() {
		require.NoError(t, args.Err(), name)
		got := args.Layout()
		want, ok := sigs[name]
		require.True(t, ok, "%s: no extern \"C\" signature in ptx/src", name)
		require.Len(t, got, len(want), "%s: parameter count", name)
		for i := range want {
			require.Equal(t, want[i].Size, got[i].Size, "%s parameter %d (%s)", name, i, want[i].Name)
			require.Equal(t, want[i].Offset, got[i].Offset, "%s parameter %d (%s)", name, i, want[i].Name)
		}
		for _, b := range m.Blobs {
			e, ok := b.Entry(name)
			if !ok {
				t.Logf("%s: blob %s has no entry %s yet (blobs predate the kernel)", name, b.Target, name)
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

// kernelSignatures are the extern "C" entries of ptx/src and of any kernels
// staged in ptx/staging (waiting for a GPU session to build them into the
// blobs) that kcp already names; ptx/staging is usually absent.
func kernelSignatures(t *testing.T) map[string][]loader.ParamSpec {
	t.Helper()
	sigs := parseKernelSignatures(t, filepath.Join("..", "ptx", "src"))
	staging := filepath.Join("..", "ptx", "staging")
	if files, _ := filepath.Glob(filepath.Join(staging, "*.cu")); len(files) > 0 {
		for name, spec := range parseKernelSignatures(t, staging) {
			_, dup := sigs[name]
			require.False(t, dup, "%s is both in ptx/src and ptx/staging", name)
			sigs[name] = spec
		}
	}
	return sigs
}

// parseKernelSignatures reads the extern "C" __global__ entries of the .cu
// files in dir and lays out their parameters.
func parseKernelSignatures(t *testing.T, dir string) map[string][]loader.ParamSpec {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.cu"))
	require.NoError(t, err)
	if len(files) == 0 {
		t.Skipf("needs the kernel sources in %s (run from the package directory of a full checkout)", dir)
	}
	re := regexp.MustCompile(`(?s)extern "C" __global__ void(?:\s+__launch_bounds__\([^)]*\))?\s+(\w+)\s*\(([^)]*)\)`)
	// An entry defined by a macro (#define MACRO(NAME, ...) whose body is
	// the extern "C" definition of NAME): each line MACRO(name, ...) is an
	// entry name with the body's parameters.
	defRe := regexp.MustCompile(`#define (\w+)\((\w+)[,)]`)
	// A parameter-list macro (#define NAME_PARAMS type a, type b, ...,
	// continued over lines) stands in an entry's parameters for its list.
	paramsRe := regexp.MustCompile(`(?m)^#define (\w+_PARAMS)\b((?:[^\n]*\\\n)*[^\n]*)`)
	out := map[string][]loader.ParamSpec{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		var pairs []string
		for _, m := range paramsRe.FindAllStringSubmatch(string(raw), -1) {
			pairs = append(pairs, m[1], strings.TrimSpace(strings.ReplaceAll(m[2], "\\\n", " ")))
		}
		lists := strings.NewReplacer(pairs...)
		src := strings.ReplaceAll(string(raw), "\\\n", "\n")
		defs := defRe.FindAllStringSubmatchIndex(src, -1)
		for _, mi := range re.FindAllStringSubmatchIndex(src, -1) {
			name, specs := src[mi[2]:mi[3]], entryParams(t, f, src[mi[2]:mi[3]], lists.Replace(src[mi[4]:mi[5]]))
			// The last #define before the entry makes it a macro's body
			// where the entry's name is that macro's first parameter.
			macro := ""
			for _, d := range defs {
				if d[0] < mi[0] && src[d[4]:d[5]] == name {
					macro = src[d[2]:d[3]]
				} else if d[0] < mi[0] {
					macro = ""
				}
			}
			if macro == "" {
				out[name] = specs
				continue
			}
			uses := regexp.MustCompile(`(?m)^`+macro+`\((\w+)`).FindAllStringSubmatch(src, -1)
			require.NotEmpty(t, uses, "%s: the entry macro %s is never used", f, macro)
			for _, u := range uses {
				out[u[1]] = specs
			}
		}
	}
	return out
}

// entryParams lays out the parameters (params, a C parameter list) of the
// entry name of file f.
func entryParams(t *testing.T, f, name, params string) []loader.ParamSpec {
	t.Helper()
	var specs []loader.ParamSpec
	off := 0
	for _, p := range strings.Split(params, ",") {
		p = strings.TrimSpace(p)
		size := 0
		switch {
		case strings.Contains(p, "*"), strings.Contains(p, "long long"):
			size = 8
		case strings.Contains(p, "int"), strings.Contains(p, "float"), strings.Contains(p, "unsigned"):
			size = 4
		default:
			t.Fatalf("%s: %s: cannot size parameter %q", f, name, p)
		}
		off = (off + size - 1) / size * size
		fields := strings.Fields(strings.NewReplacer("*", " ").Replace(p))
		specs = append(specs, loader.ParamSpec{Name: fields[len(fields)-1], Size: size, Align: size, Offset: off})
		off += size
	}
	return specs
}

// The shared-memory sizes match the launch table in gdn_fwd.cu's header.
func TestGPUSharedMemorySizes(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "ptx", "src", "gdn_fwd.cu"))
	if errors.Is(err, os.ErrNotExist) {
		t.Skipf("needs ptx/src/gdn_fwd.cu (run from the package directory of a full checkout): %v", err)
	}
	require.NoError(t, err)
	src := string(raw)
	num := func(pattern string) int {
		m := regexp.MustCompile(pattern).FindStringSubmatch(src)
		require.NotNil(t, m, pattern)
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		return n
	}
	require.Equal(t, num(`kPrepSmem\s*=\s*(\d+)\s*\n`), prepSmem)
	require.Equal(t, num(`kComposeSmem\s*=\s*(\d+)\s*\n`), composeSmem)
	require.Equal(t, num(`kOutputSmem\s*=\s*(\d+)\s*\n`), outputSmem)
	require.Equal(t, num(`= (\d+) \(vh 64\)`), walkSmem(64))
	require.Equal(t, num(`or (\d+) \(vh 128\)`), walkSmem(128))
	require.Equal(t, []int{50176, 65536, 147712, 114944, 164096}, []int{prepSmem, composeSmem, outputSmem, walkSmem(64), walkSmem(128)})
	// The tensor-core variants, where their sources are present.
	for _, c := range []struct {
		file, pattern string
		got           int
	}{
		{"gdn_walk_tc.cu", `\((\d+) at vh 64`, walkTCSmem(64)},
		{"gdn_walk_tc.cu", `, (\d+) at vh 128\)`, walkTCSmem(128)},
		{"gdn_chunk_tc.cu", `kPrepTCSmem\s*=\s*(\d+)\s*\n`, prepTCSmem},
		{"gdn_chunk_tc.cu", `kOutputTCSmem\s*=\s*(\d+)\s*\n`, outputTCSmem},
		{"gdn_walk_mma.cu", `\((\d+) at vh 64`, walkMMASmem(64)},
		{"gdn_walk_mma.cu", `, (\d+) at vh 128\)`, walkMMASmem(128)},
		{"gdn_bwalk_mma.cu", `bwalk_mma_smem\(64\) == (\d+)`, bwdWalkMMASmem(64)},
		{"gdn_bwalk_mma.cu", `bwalk_mma_smem\(128\) == (\d+)`, bwdWalkMMASmem(128)},
		{"gdn_tape_planes.cu", `tape_planes_smem\(64\) == (\d+)`, tapePlanesSmem(64)},
		{"gdn_tape_planes.cu", `tape_planes_smem\(128\) == (\d+)`, tapePlanesSmem(128)},
		{"gdn_prep_mma.cu", `kPrepMMASmem\s*=\s*(\d+)\s*\n`, prepMMASmem},
		{"gdn_prep_mma.cu", `kPrepMMAGSmem = (\d+) bytes`, prepMMAGSmem},
		{"gdn_prep_mma.cu", `static_assert\(kPrepMMAGSmem == (\d+)`, prepMMAGSmem},
		{"gdn_prep_mma.cu", `constexpr int kMaxGB = (\d+);`, prepMaxGroup},
		{"gdn_output_mma.cu", `kOutputMMASmem = (\d+) bytes`, outputMMASmem},
		{"gdn_output_mma.cu", `kOutputMMA16Smem = (\d+) bytes`, outputMMA16Smem},
		{"gdn_output_mma.cu", `static_assert\(kOutputMMA16Smem == (\d+)`, outputMMA16Smem},
		{"gdn_dvlocal_mma.cu", `kDvlMMASmem = (\d+) bytes`, dvlocalMMASmem},
		{"gdn_dvlocal_mma.cu", `static_assert\(kDvlMMASmem == (\d+)`, dvlocalMMASmem},
		{"gdn_dvlocal_mma.cu", `kDvlMMAGSmem = (\d+) bytes`, dvlocalMMAGSmem},
		{"gdn_dvlocal_mma.cu", `static_assert\(kDvlMMAGSmem == (\d+)`, dvlocalMMAGSmem},
		{"gdn_dvlocal_mma.cu", `kDvlMMAGRSmem = (\d+) bytes`, dvlocalMMAGRSmem},
		{"gdn_dvlocal_mma.cu", `static_assert\(kDvlMMAGRSmem == (\d+)`, dvlocalMMAGRSmem},
		{"gdn_chunk_grads_mma.cu", `kGradMMASmem = (\d+) bytes`, chunkGradMMASmem},
		{"gdn_chunk_grads_mma.cu", `static_assert\(kGradMMASmem == (\d+)`, chunkGradMMASmem},
		{"gdn_chunk_grads_mma5.cu", `kGradMMA5Smem = (\d+) bytes`, chunkGradMMA5Smem},
		{"gdn_chunk_grads_mma5.cu", `static_assert\(kGradMMA5Smem == (\d+)`, chunkGradMMA5Smem},
	} {
		// A kernel's source is in ptx/src once built into the blobs, in
		// ptx/staging while it waits for that (the v4 / v5 files landed on
		// 2026-12-01).
		raw, err := os.ReadFile(filepath.Join("..", "ptx", "src", c.file))
		if errors.Is(err, os.ErrNotExist) {
			raw, err = os.ReadFile(filepath.Join("..", "ptx", "staging", c.file))
		}
		if errors.Is(err, os.ErrNotExist) {
			t.Logf("%s not present", c.file)
			continue
		}
		require.NoError(t, err)
		m := regexp.MustCompile(c.pattern).FindStringSubmatch(string(raw))
		require.NotNil(t, m, "%s: %s", c.file, c.pattern)
		require.Equal(t, m[1], strconv.Itoa(c.got), "%s: %s", c.file, c.pattern)
	}
}

// NewGPU refuses bad plans and options before touching the driver; without
// a driver library it returns an error wrapping loader.ErrNoDriver, and with
// one but no GPU the driver's CUDA_ERROR_NO_DEVICE.
func TestNewGPUErrors(t *testing.T) {
	p128, err := NewPlan(PlanConfig{Docs: []int{10}, Ranks: 1, Layout: LayoutC})
	require.NoError(t, err)
	ones := make([]int, maxRankSegments+1) // a one-token document a segment, one more than a grid has rows
	for i := range ones {
		ones[i] = 1
	}
	many, err := NewPlan(PlanConfig{Docs: ones, Ranks: 1, Layout: LayoutC, HQK: 1, HV: 1, DK: 128, DV: 128})
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		plan *Plan
		opts GPUOptions
		want string
	}{
		{"nil plan", nil, GPUOptions{}, "plan is nil"},
		{"dk 16", smallPlan(t, []int{10}, 1, LayoutC, 16), GPUOptions{}, "need DK = DV = 128"},
		{"force vh", p128, GPUOptions{Options: Options{ForceVH: 96}}, "ForceVH 96"},
		{"stage", p128, GPUOptions{Options: Options{Stage: "attention"}}, "unknown stage"},
		{"65,536 segments", many, GPUOptions{}, "rank 0 holds 65536 segments; the GPU walks launch a grid row a segment, at most 65535"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := NewGPU(tc.plan, tc.opts)
			require.ErrorContains(t, err, tc.want)
			require.Nil(t, g)
		})
	}
	var g *GPU
	require.NoError(t, g.Close())
	_, err = g.Forward(t.Context(), nil)
	require.ErrorContains(t, err, "nil backend")
	_, err = g.ForPlan(p128, GPUOptions{})
	require.ErrorContains(t, err, "nil backend")
	require.ErrorContains(t, g.Err(), "nil backend")
	// The accessors of a nil backend give zero values, not a panic.
	set, why := g.Kernels()
	require.Equal(t, [2]string{"", ""}, [2]string{set, why})
	require.Nil(t, g.Plan())
	require.Nil(t, g.Profile())
	require.Equal(t, Options{}, g.Options())
	require.Nil(t, g.Devices())
	require.Nil(t, g.DeviceProfiles())
	require.Nil(t, g.RankDevices())
	require.Nil(t, g.LocalRanks())
	require.False(t, g.Local(0))
	require.Equal(t, CommKind(""), g.Comm())
	require.False(t, g.DeviceExchange())
	var f *GPUForward
	require.NoError(t, f.Close())
	_, _, err = f.SegmentStates(0, 0, 0)
	require.Error(t, err)
	require.Nil(t, f.Output())
	_, err = f.RankDigest(0)
	require.ErrorContains(t, err, "empty result")
	_, err = f.Backward(t.Context(), nil)
	require.ErrorContains(t, err, "empty forward result")
	_, err = f.ConvOutput()
	require.Error(t, err)
	var ck *GPUCheckpoint
	require.Nil(t, ck.Output())
	_, err = ck.Recompute(t.Context())
	require.ErrorContains(t, err, "the checkpoint is empty")
	var gg *GPUGrads
	require.Nil(t, gg.Gradients())
	_, err = gg.RankDigest(0)
	require.Error(t, err)
	var c *CPU
	require.Nil(t, c.Plan())
	require.Equal(t, Options{}, c.Options())
	_, err = c.Forward(t.Context(), nil)
	require.ErrorContains(t, err, "kcp: cpu: nil backend")
	_, err = c.ForwardCheckpoint(t.Context(), nil)
	require.ErrorContains(t, err, "kcp: cpu: nil backend")
	var act *Activations
	_, err = act.Backward(t.Context(), nil)
	require.ErrorContains(t, err, "the activations are empty")

	_, derr := loader.DeviceCount()
	switch {
	case errors.Is(derr, loader.ErrNoDriver):
		// No driver library: every GPU entry point says so.
		g, err = NewGPU(p128, GPUOptions{})
		require.Error(t, err)
		require.Nil(t, g)
		require.True(t, errors.Is(err, loader.ErrNoDriver), "want an error wrapping loader.ErrNoDriver, got %v", err)
		_, err = ProbeGPU(0, "")
		require.True(t, errors.Is(err, loader.ErrNoDriver), "%v", err)
	case loader.IsCode(derr, loader.ErrorNoDevice):
		// A driver library but no GPU (a container with the driver mounted,
		// a machine with the toolkit installed): the driver's own error.
		g, err = NewGPU(p128, GPUOptions{})
		require.Error(t, err)
		require.Nil(t, g)
		require.True(t, loader.IsCode(err, loader.ErrorNoDevice), "want CUDA_ERROR_NO_DEVICE, got %v", err)
		_, err = ProbeGPU(0, "")
		require.True(t, loader.IsCode(err, loader.ErrorNoDevice), "%v", err)
	default:
		t.Logf("a CUDA device is present (%v): the no-driver and no-device errors are not testable here", derr)
	}
}

// Every entry is listed once, and missingEntries names the ones a blob
// lacks.
func TestGPUEntries(t *testing.T) {
	names := GPUForwardEntries()
	require.Len(t, names, 8)
	seen := map[string]bool{}
	for _, n := range names {
		require.False(t, seen[n], n)
		seen[n] = true
	}
	b := &ptx.Blob{Entries: []ptx.Entry{{Name: entryConv}, {Name: entryPoison}}}
	require.Equal(t, []string{entryL2Norm, entryPrep, entrySummary, entryCompose, entryState, entryOutput},
		missingEntries(b, GPUOptions{}.kernelSet().entries()))
	tc := GPUOptions{TensorCoreWalks: true, TensorCoreChunk: true}.kernelSet()
	require.Equal(t, []string{entryL2Norm, entryPrepTC, entrySummaryTC, entryCompose, entryStateTC, entryOutputTC},
		missingEntries(b, tc.entries()))
	require.Equal(t, entrySummary, GPUOptions{TensorCoreChunk: true}.kernelSet().summary)
	require.Equal(t, entryPrep, GPUOptions{TensorCoreWalks: true}.kernelSet().prep)
	// The v4 set, named by SetKernels; an MMA switch wins over the
	// TensorCore one of its stage.
	for _, c := range []struct {
		name  string
		want  []string // the forward's missing entries
		bwalk [4]string
	}{
		{"fp32", []string{entryL2Norm, entryPrep, entrySummary, entryCompose, entryState, entryOutput},
			[4]string{entryOffset, entryTape, entryDVLocal, entryChunkGrads}},
		{"tc", []string{entryL2Norm, entryPrepTC, entrySummaryTC, entryCompose, entryStateTC, entryOutputTC},
			[4]string{entryOffset, entryTape, entryDVLocal, entryChunkGrads}},
		{"mma", []string{entryL2Norm, entryPrepMMA, entrySummaryMMA, entryCompose, entryStateMMA, entryOutputMMA},
			[4]string{entryOffsetMMA, entryTapeMMA, entryDVLocalMMA, entryGradsMMA}},
		{"v5", []string{entryL2Norm, entryPrepMMAG, entrySummaryPlanes, entryCompose, entryStatePlanes, entryOutputMMA16G, entryPrepMMA,
			entryPrepMMAGN, entryOutputMMA16GN, entryPrepMMAGNK, entryOutputMMA16GNK},
			[4]string{entryOffsetPlanes, entryTapePlanes, entryDVLocalMMAGR, entryGradsMMA8R}},
	} {
		o := GPUOptions{TensorCoreWalks: true, MMAChunk: true} // cleared by SetKernels
		require.NoError(t, o.SetKernels(c.name))
		ks := o.kernelSet()
		require.Equal(t, c.want, missingEntries(b, ks.entries()), c.name)
		require.Equal(t, c.bwalk, [4]string{ks.offset, ks.tape, ks.dvlocal, ks.grads}, c.name)
		// One tape entry a width in the v5 set (each spill-free alone); one
		// entry at both widths elsewhere.
		tape128 := ks.tape
		if c.name == "v5" {
			tape128 = entryTapePlanes128
		}
		require.Equal(t, [2]string{ks.tape, tape128}, [2]string{ks.tapeEntry(64), ks.tapeEntry(128)}, c.name)
		require.Equal(t, c.name == "v5", slices.ContainsFunc(ks.backwardEntries(), func(e gpuEntry) bool {
			return e.name == entryTapePlanes128 && e.smem == tapePlanesSmem(128)
		}), c.name)
		require.Equal(t, c.name == "v5", ks.out16, c.name)
		require.Equal(t, c.name == "v5", ks.outputQK, c.name)
		require.Equal(t, c.name == "v5", ks.prepQK, c.name)
		require.Equal(t, c.name == "v5", ks.normQK, c.name)
		require.Equal(t, c.name == "v5", ks.planes, c.name)
		require.Equal(t, c.name == "v5", ks.grads5, c.name)
		require.Equal(t, c.name == "v5", ks.tokenSlots, c.name)
		require.Equal(t, c.name == "v5", ks.statesBF16, c.name)
		// Without Kt, and with Kt for up to prepMaxGroup value heads a QK
		// head (the grouped prep writes them all in its first head's pass),
		// the set's prep runs; with Kt past that the grouped prep gives way
		// to gdn_prep_mma.
		for _, w := range []struct {
			kt    bool
			group int
		}{{false, 3}, {false, prepMaxGroup + 1}, {true, 3}, {true, prepMaxGroup}} {
			e, smem, qk := ks.prepFor(w.kt, w.group)
			require.Equal(t, []any{ks.prep, ks.prepSmem, ks.prepQK}, []any{e, smem, qk}, "%s %+v", c.name, w)
		}
		e, smem, qk := ks.prepFor(true, prepMaxGroup+1)
		if c.name == "v5" {
			require.Equal(t, []any{entryPrepMMA, prepMMASmem, false}, []any{e, smem, qk}, c.name)
		} else {
			require.Equal(t, []any{ks.prep, ks.prepSmem, ks.prepQK}, []any{e, smem, qk}, c.name)
		}
	}
	// SplitGrads: v5's chunk gradients on hi / lo products (mma6), the rest
	// of the set as it is; the other sets ignore it.
	for _, name := range KernelSets {
		var plain, split GPUOptions
		require.NoError(t, plain.SetKernels(name))
		split.SplitGrads = true
		require.NoError(t, split.SetKernels(name))
		require.True(t, split.SplitGrads, "SetKernels keeps SplitGrads")
		pk, sk := plain.kernelSet(), split.kernelSet()
		if name == "v5" {
			// Core: mma8r, or mma6r with SplitGrads; module: mma6r either way
			// (on q's and k's raw rows, the default since v5.37).
			require.Equal(t, [4]string{entryGradsMMA8R, entryGradsMMA6R, entryGradsMMA6R, entryGradsMMA6R},
				[4]string{pk.gradsFor(false), pk.gradsFor(true), sk.gradsFor(false), sk.gradsFor(true)})
			// Both resolved where mma8r runs, each once.
			require.Equal(t, []gpuEntry{{entryGradsMMA8R, chunkGradMMA5Smem}, {entryGradsMMA6R, chunkGradMMA5Smem}},
				pk.backwardEntries()[3:5])
			require.False(t, sk.statesBF16, "SplitGrads: mma6 reads fp32 states")
			// Neither mma8 nor the single-product offset and tape walks (three
			// entries), which run only before mma8's bf16 reads.
			require.Equal(t, len(pk.allEntries())-4, len(sk.allEntries()))
		} else {
			require.Equal(t, pk.allEntries(), sk.allEntries(), name)
			require.Equal(t, pk.grads, pk.gradsFor(true), name)
			require.Equal(t, pk.grads, sk.gradsFor(false), name)
		}
		require.NotEqual(t, plain.kernelFlags(), split.kernelFlags(), name)
	}
	both := GPUOptions{TensorCoreWalks: true, TensorCoreChunk: true, MMAWalks: true, MMAChunk: true}.kernelSet()
	require.Equal(t, [4]string{entryPrepMMA, entrySummaryMMA, entryStateMMA, entryOutputMMA}, [4]string{both.prep, both.summary, both.state, both.output})
	require.Equal(t, [2]int{prepMMASmem, outputMMASmem}, [2]int{both.prepSmem, both.outputSmem})
	require.Equal(t, walkMMASmem(128), both.walkSmem(128))
	var o GPUOptions
	require.ErrorContains(t, o.SetKernels("v4"), `kernel set "v4": want one of fp32, tc, mma, v5`)
	// MMAForward5 alone swaps the walks and the output, with their shared
	// memory.
	o16 := GPUOptions{MMAForward5: true}.kernelSet()
	require.Equal(t, [5]string{entryPrep, entrySummaryMMA16, entryStateMMA16, entryOutputMMA16G, entryOffset},
		[5]string{o16.prep, o16.summary, o16.state, o16.output, o16.offset})
	require.Equal(t, [3]int{walkMMASmem(64), walkMMASmem(128), outputMMA16Smem}, [3]int{o16.walkSmem(64), o16.walkSmem(128), o16.outputSmem})
	require.True(t, o16.out16)
	require.True(t, o16.outputQK)
}

// TestGPUFP32States: which forwards write the fp32 per-chunk states and V'
// (rk.h, rk.vnew): every forward of a set whose output reads them; with the
// v5 set only a forward kept for a backward that reads them: the module
// stage's (gdn_chunk_grads_mma6), or the core stage's under SplitGrads;
// never the core stage's gdn_chunk_grads_mma8, which reads the bf16 copies.
func TestGPUFP32States(t *testing.T) {
	for _, c := range []struct {
		set   string
		split bool
		// want[keep][module]
		want [2][2]bool
	}{
		{"fp32", false, [2][2]bool{{true, true}, {true, true}}},
		{"tc", false, [2][2]bool{{true, true}, {true, true}}},
		{"mma", false, [2][2]bool{{true, true}, {true, true}}},
		{"v5", false, [2][2]bool{{false, false}, {false, true}}},
		{"v5", true, [2][2]bool{{false, false}, {true, true}}},
	} {
		o := GPUOptions{SplitGrads: c.split}
		require.NoError(t, o.SetKernels(c.set))
		ks := o.kernelSet()
		for ki, keep := range []bool{false, true} {
			for mi, stage := range []Stage{StageCore, StageModule} {
				require.Equal(t, c.want[ki][mi], ks.fp32States(keep, stage), "%s split %v keep %v %s", c.set, c.split, keep, stage)
			}
		}
	}
}

// The CPU accessor returns the start and final states of a segment: zero at
// a document's start, and the state walk's end state, which feeds the next
// segment of the chain (its start state).
func TestCPUSegmentStates(t *testing.T) {
	p := smallPlan(t, []int{150}, 2, LayoutC, 16)
	in, _ := RandomInputs(p, StageCore, 4)
	be, err := NewCPU(p, Options{})
	require.NoError(t, err)
	act, err := be.Forward(t.Context(), in)
	require.NoError(t, err)
	for h := 0; h < p.Config.HV; h++ {
		s0, f0, err := act.SegmentStates(0, 0, h)
		require.NoError(t, err)
		require.Len(t, s0, 16*16)
		require.Equal(t, make([]float64, 256), s0)
		s1, _, err := act.SegmentStates(1, 0, h)
		require.NoError(t, err)
		requireClose(t, "chain", s1, f0, 1e-12)
	}
	_, _, err = act.SegmentStates(2, 0, 0)
	require.ErrorContains(t, err, "rank 2 outside")
	_, _, err = act.SegmentStates(0, 1, 0)
	require.ErrorContains(t, err, "segment 1 outside")
	_, _, err = act.SegmentStates(0, 0, 4)
	require.ErrorContains(t, err, "value head 4")
}

// The output check: a still-poisoned element is reported as never written,
// another NaN as NaN, both with the rank, token and head; good values land
// in global order.
func TestGPUScatterOutput(t *testing.T) {
	p, err := NewPlan(PlanConfig{Docs: []int{3, 4}, Ranks: 2, Layout: LayoutZ, HQK: 1, HV: 2, DK: 128, DV: 128})
	require.NoError(t, err)
	row := 2 * gpuD
	for _, tc := range []struct {
		name string
		bad  bf16.BF16
		want string
	}{
		{"clean", 0, ""},
		{"poison", poisonBF16, "1 elements never written, 0 NaN"},
		{"nan", bf16.NaN, "0 elements never written, 1 NaN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := &GPUForward{out: newGPUOutRows(p)}
			rr := &rankRun{g: &GPU{plan: p}, rk: &gpuRank{rank: 1}, res: res}
			rp := &p.Ranks[1]
			o := make([]bf16.BF16, rp.Tokens*row)
			for i := range o {
				o[i] = bf16.Float32ToBF16(float32(i%5) + 1)
			}
			if tc.want != "" {
				o[1*row+gpuD+7] = tc.bad // local token 1, head 1, column 7
			}
			err := rr.scatterOutput(o)
			if tc.want == "" {
				require.NoError(t, err)
				seg := rp.Segments[0]
				require.Equal(t, float64(o[0].Float32()), res.Output().O[seg.Start*row])
				return
			}
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, "rank 1")
			for _, seg := range rp.Segments {
				if seg.LocalStart <= 1 && 1 < seg.LocalStart+seg.Len {
					require.ErrorContains(t, err, fmt.Sprintf("token %d (local 1, document %d) head 1 column 7",
						seg.Start+1-seg.LocalStart, seg.Doc))
				}
			}
		})
	}
}

// TestGPUWalkDispatch: the walks' dispatch order is nil where launch order
// finishes as early (one document; segments of one length) and a permutation
// of the launch's CTAs where it does not (the 120,908-token pack: 1891 ->
// 1686 chunk times at vh 64 on the H200's 132 one-CTA slots); slots follow
// the variant (one walk CTA an SM on sm_90a, two where no cost rule is
// measured).
func TestGPUWalkDispatch(t *testing.T) {
	h200 := sched.Profile{Variant: sched.VariantSM90a, SMs: 132}
	require.Equal(t, 132, walkSlots(h200))
	generic, err := sched.NewProfile("generic", 100)
	require.NoError(t, err)
	require.Equal(t, 200, walkSlots(generic))
	for _, c := range []struct {
		name    string
		segs    []int32
		vh      int
		permute bool
	}{
		{"one document", []int32{512}, 64, false},
		{"equal documents", []int32{128, 128, 128}, 64, false},
		{"120,908 tokens vh 64", []int32{625, 704, 562}, 64, true},
		{"120,908 tokens vh 128", []int32{625, 704, 562}, 128, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			order, err := walkDispatch(h200, c.segs, 48, gpuD/c.vh)
			require.NoError(t, err)
			if !c.permute {
				require.Nil(t, order)
				return
			}
			n := 48 * len(c.segs) * gpuD / c.vh
			require.Len(t, order, n)
			seen := make([]bool, n)
			for _, x := range order {
				require.False(t, seen[x], "CTA %d twice", x)
				seen[x] = true
			}
		})
	}
	_, err = walkDispatch(h200, []int32{3, -1}, 48, 2)
	require.ErrorContains(t, err, "chain 1 has -1 chunks")
	// A summary or offset walk: two column sets a segment, its list's chains.
	require.Equal(t, []int32{704, 562, 704}, listChains([]int32{625, 704, 562}, []int32{1, 2, 1}))
	order, err := walkDispatch(h200, listChains([]int32{625, 704, 562}, []int32{0, 1, 2}), 48, 4)
	require.NoError(t, err)
	require.Len(t, order, 48*3*4)
}

// TestMissingKernelsError: the error for a blob without the set's entries
// wraps ErrMissingKernels, names the blob and the entries, and says where the
// blobs came from: the embedded ones, or GDNKCP_BLOB_DIR's directory.
func TestMissingKernelsError(t *testing.T) {
	for _, c := range []struct {
		name, dir, want string
	}{
		{"embedded", "", "the embedded blobs predate these kernels"},
		{"blob dir", "/tmp/new-blobs", "the blobs in /tmp/new-blobs (GDNKCP_BLOB_DIR) predate these kernels"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(ptx.EnvBlobDir, c.dir)
			err := missingKernelsError("sm_90a", "gdnkcp.sm_90a.cubin", []string{"gdn_a", "gdn_b"})
			require.ErrorIs(t, err, ErrMissingKernels)
			require.ErrorContains(t, err, "blob sm_90a (gdnkcp.sm_90a.cubin) lacks gdn_a, gdn_b: "+c.want)
			require.NotContains(t, err.Error(), "ptx/staging")
		})
	}
	// A staged entry names the patch the rebuild needs first, once.
	err := missingKernelsError("sm_90a", "f", []string{entryTapePlanesHF, "gdn_a", entryDVLocalForm})
	require.ErrorContains(t, err, "rebuild them from ptx/src after applying ptx/staging/tape_dvl_former.patch (scripts/land-v4.sh) with tools/ptxgen")
}
