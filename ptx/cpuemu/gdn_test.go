package cpuemu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/mat"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/internal/gdnref"
)

// What the GDN tests share: one rank's buffer of segments, its tables (as
// kcp/gpu_tables.go builds them), random inputs, the forward pipeline of
// gdn_fwd.cu as a job, and the float64 references of internal/gdnref built
// from exactly the inputs a kernel was given.

const (
	dHead = 128 // K = V, hard-coded in the kernels
	chunk = gdnref.ChunkSize
)

// gdnCase is one rank's buffer.
type gdnCase struct {
	name    string
	lens    []int   // segment lengths, in buffer order
	chains  [][]int // documents spanning several segments, in chain order (others stand alone)
	sumList []int   // summary walk list: segments (must hold every segment with a successor)
	offList []int   // offset walk list: segments (must hold every segment with a predecessor)
	hqk, hv int
	module  bool // q|k|v read out of one [T, C] buffer (the conv output's layout), else separate tensors
	l2norm  bool
	seed    uint64
}

// layout is the case's tables.
type layout struct {
	T, NS, NC                                 int
	segStart, segLen, tokSeg                  []int32
	chunkTok0, chunkLen, segChunk0, segNChunk []int32
	compOff, compIdx                          []int32 // forward compose CSR (indices into sumList)
	rcompOff, rcompIdx                        []int32 // reverse compose CSR (indices into offList)
}

func newLayout(t *testing.T, c *gdnCase) *layout {
	l := &layout{NS: len(c.lens)}
	for s, n := range c.lens {
		require.Positive(t, n)
		l.segStart = append(l.segStart, int32(l.T))
		l.segLen = append(l.segLen, int32(n))
		l.segChunk0 = append(l.segChunk0, int32(l.NC))
		l.segNChunk = append(l.segNChunk, int32((n+chunk-1)/chunk))
		for c0 := 0; c0 < n; c0 += chunk {
			l.chunkTok0 = append(l.chunkTok0, int32(l.T+c0))
			l.chunkLen = append(l.chunkLen, int32(min(chunk, n-c0)))
			l.NC++
		}
		for i := 0; i < n; i++ {
			l.tokSeg = append(l.tokSeg, int32(s))
		}
		l.T += n
	}
	index := func(list []int, s int) int32 {
		for i, x := range list {
			if x == s {
				return int32(i)
			}
		}
		require.Failf(t, "bad case", "segment %d is not in the walk list %v", s, list)
		return -1
	}
	for s := 0; s < l.NS; s++ {
		l.compOff = append(l.compOff, int32(len(l.compIdx)))
		l.rcompOff = append(l.rcompOff, int32(len(l.rcompIdx)))
		ch, pos := c.chainOf(s)
		for _, p := range ch[:pos] { // predecessors, in chain order
			l.compIdx = append(l.compIdx, index(c.sumList, p))
		}
		for i := len(ch) - 1; i > pos; i-- { // successors, from the document's end
			l.rcompIdx = append(l.rcompIdx, index(c.offList, ch[i]))
		}
	}
	l.compOff = append(l.compOff, int32(len(l.compIdx)))
	l.rcompOff = append(l.rcompOff, int32(len(l.rcompIdx)))
	return l
}

// chainOf returns the chain of segment s and its position (a lone segment
// is a chain of one).
func (c *gdnCase) chainOf(s int) ([]int, int) {
	for _, ch := range c.chains {
		for i, x := range ch {
			if x == s {
				return ch, i
			}
		}
	}
	return []int{s}, 0
}

// chunks returns the chunk range [c0, c0+n) of segment s.
func (l *layout) chunks(s int) (int, int) { return int(l.segChunk0[s]), int(l.segNChunk[s]) }

// gdnData are the case's inputs, as the device holds them.
type gdnData struct {
	c                  *gdnCase
	l                  *layout
	qkv                []bf16.BF16 // module: [T, C] rows q|k|v; core: q then k then v, each its own tensor
	qOff, kOff, vOff   int         // element offsets of q, k, v in qkv
	qStride, vStride   int         // row strides (elements); k has q's
	g, beta            []float32   // [T, HV]
	dout               []bf16.BF16 // [T, HV, 128]: the backward's dO
	scale              float32
	rng                *rand.Rand
	nq, nv, convC, nqk int
}

func bf16Normal(rng *rand.Rand, n int, sd float64) []bf16.BF16 {
	out := make([]bf16.BF16, n)
	for i := range out {
		out[i] = bf16.Float32ToBF16(float32(sd * rng.NormFloat64()))
	}
	return out
}

func newData(t *testing.T, c *gdnCase) *gdnData {
	l := newLayout(t, c)
	rng := rand.New(rand.NewPCG(c.seed, 7))
	d := &gdnData{c: c, l: l, rng: rng, scale: float32(1 / math.Sqrt(dHead))}
	d.nq, d.nv = c.hqk*dHead, c.hv*dHead
	if c.module {
		d.convC = 2*d.nq + d.nv
		d.qkv = bf16Normal(rng, l.T*d.convC, 1)
		d.qOff, d.kOff, d.vOff = 0, d.nq, 2*d.nq
		d.qStride, d.vStride = d.convC, d.convC
	} else {
		d.qkv = bf16Normal(rng, l.T*(2*d.nq+d.nv), 1)
		d.qOff, d.kOff, d.vOff = 0, l.T*d.nq, 2*l.T*d.nq
		d.qStride, d.vStride = d.nq, d.nv
	}
	d.g = make([]float32, l.T*c.hv)
	d.beta = make([]float32, l.T*c.hv)
	for i := range d.g {
		d.g[i] = float32(-0.01 - 0.29*rng.Float64())
		d.beta[i] = float32(0.02 + 0.96*rng.Float64())
	}
	d.dout = bf16Normal(rng, l.T*d.nv, 1)
	return d
}

// raw returns element (t, col) of q (which 0), k (1) or v (2), as float64.
func (d *gdnData) raw(which, t, col int) float64 {
	off := [3]int{d.qOff, d.kOff, d.vOff}[which]
	stride := [3]int{d.qStride, d.qStride, d.vStride}[which]
	return float64(d.qkv[off+t*stride+col].Float32())
}

// rawRows returns rows [t0, t0+n) of q, k (head qh) or v (head h) as a matrix.
func (d *gdnData) rawRows(which, t0, n, head int) *mat.Dense {
	m := mat.NewDense(n, dHead, nil)
	for i := 0; i < n; i++ {
		for x := 0; x < dHead; x++ {
			m.Set(i, x, d.raw(which, t0+i, head*dHead+x))
		}
	}
	return m
}

// rows returns rows [t0, t0+n) of head h of a [T, H, 128] fp32 tensor.
func rows(v []float64, t0, n, h, H int) *mat.Dense {
	m := mat.NewDense(n, dHead, nil)
	for i := 0; i < n; i++ {
		copy(m.RawRowView(i), v[((t0+i)*H+h)*dHead:][:dHead])
	}
	return m
}

// putRows writes m into rows [t0, ...) of head h of a [T, H, 128] tensor.
func putRows(dst []float64, m *mat.Dense, t0, h, H int) {
	n, _ := m.Dims()
	for i := 0; i < n; i++ {
		copy(dst[((t0+i)*H+h)*dHead:][:dHead], m.RawRowView(i))
	}
}

// state returns matrix (x, h) of a [X, H, 128, 128] tensor; putState writes one.
func state(v []float64, x, h, H int) *mat.Dense {
	return mat.NewDense(dHead, dHead, append([]float64(nil), v[(x*H+h)*dHead*dHead:][:dHead*dHead]...))
}

func putState(dst []float64, m *mat.Dense, x, h, H int) {
	for k := 0; k < dHead; k++ {
		copy(dst[((x*H+h)*dHead+k)*dHead:][:dHead], m.RawRowView(k))
	}
}

// col returns entries [t0, t0+n) of head h of a [T, H] tensor; putCol writes them.
func col(v []float64, t0, n, h, H int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v[(t0+i)*H+h]
	}
	return out
}

func putCol(dst, v []float64, t0, h, H int) {
	for i, x := range v {
		dst[(t0+i)*H+h] = x
	}
}

// ---- the forward as a job -----------------------------------------------------------------------

// addTables loads the layout's tables.
func addTables(j *job, l *layout) {
	j.i32("chunk_tok0", l.chunkTok0)
	j.i32("chunk_len", l.chunkLen)
	j.i32("seg_chunk0", l.segChunk0)
	j.i32("seg_nchunk", l.segNChunk)
	j.i32("seg_start", l.segStart)
	j.i32("seg_len", l.segLen)
	j.i32("tok_seg", l.tokSeg)
	j.i32("comp_off", l.compOff)
	j.i32("comp_idx", l.compIdx)
	j.i32("rcomp_off", l.rcompOff)
	j.i32("rcomp_idx", l.rcompIdx)
}

// addInputs adds the tables and the forward's inputs (qkv, g, beta) of d.
func addInputs(j *job, d *gdnData) {
	addTables(j, d.l)
	j.bf16("qkv", d.qkv)
	j.f32("g", d.g)
	j.f32("beta", d.beta)
}

// addSumList adds d's summary list as "sum_list" and returns it.
func addSumList(j *job, d *gdnData) []int32 {
	sum := make([]int32, len(d.c.sumList))
	for i, s := range d.c.sumList {
		sum[i] = int32(s)
	}
	j.i32("sum_list", sum)
	return sum
}

// prepOuts are the fp32 l2norm and prep outputs the walks read
// (launchL2NormPrep writes them).
func prepOuts(d *gdnData) []bufSpec {
	T, HQK, HV := d.l.T, d.c.hqk, d.c.hv
	return []bufSpec{
		{"qn", T * HQK * dHead}, {"kn", T * HQK * dHead}, {"q_rstd", T * HQK}, {"k_rstd", T * HQK},
		{"gcum", T * HV}, {"w", T * HV * dHead}, {"u", T * HV * dHead}, {"kt", T * HV * dHead},
	}
}

// addForward adds the forward of gdn_fwd.cu (header comment's order and
// grids): l2norm, prep, summary walk (vh 64 and 128), compose, state walk
// (vh 64 and 128), output; every output poisoned before its launch. The
// compose reads the vh 64 summaries, the output the vh 128 states.
func addForward(j *job, d *gdnData) {
	c, l := d.c, d.l
	T, HQK, HV := l.T, c.hqk, c.hv
	addInputs(j, d)
	sum := addSumList(j, d)
	outs := append(prepOuts(d), bufSpec{"start", l.NS * HV * dHead * dHead})
	for _, vh := range []int{64, 128} {
		sfx := vhName(vh)
		outs = append(outs, bufSpec{"out_p" + sfx, max(len(sum), 1) * HV * dHead * dHead},
			bufSpec{"out_q" + sfx, max(len(sum), 1) * HV * dHead * dHead}, bufSpec{"h" + sfx, l.NC * HV * dHead * dHead},
			bufSpec{"vnew" + sfx, T * HV * dHead}, bufSpec{"final" + sfx, l.NS * HV * dHead * dHead})
	}
	for _, o := range outs {
		j.out(o.name, 4*o.elems)
	}
	j.out("o", 2*T*HV*dHead)

	for _, o := range []string{"qn", "kn", "q_rstd", "k_rstd", "gcum", "w", "u", "kt"} {
		j.poison(o, poisonF32)
	}
	launchL2NormPrep(j, d)
	for _, vh := range []int{64, 128} {
		sfx := vhName(vh)
		j.poison("out_p"+sfx, poisonF32)
		j.poison("out_q"+sfx, poisonF32)
		if len(sum) > 0 {
			j.launch("summary"+sfx, "gdn_summary_walk", grid3(2*dHead/vh, len(sum), HV), 256, smemOf("walk_smem", vh),
				buf("w"), buf("u"), buf("kt"), buf("gcum"), buf("chunk_tok0"), buf("chunk_len"), buf("seg_chunk0"),
				buf("seg_nchunk"), buf("sum_list"), buf("out_p"+sfx), buf("out_q"+sfx), i32a(HV), i32a(vh))
		}
	}
	j.poison("start", poisonF32)
	j.launch("compose", "gdn_compose_fwd", grid3(2, l.NS, HV), 256, "kComposeSmem",
		buf("out_p64"), buf("out_q64"), buf("comp_off"), buf("comp_idx"), buf("start"), i32a(HV))
	for _, vh := range []int{64, 128} {
		sfx := vhName(vh)
		for _, o := range []string{"h", "vnew", "final"} {
			j.poison(o+sfx, poisonF32)
		}
		j.launch("state"+sfx, "gdn_state_walk", grid3(dHead/vh, l.NS, HV), 256, smemOf("walk_smem", vh),
			buf("w"), buf("u"), buf("kt"), buf("gcum"), buf("chunk_tok0"), buf("chunk_len"), buf("seg_chunk0"),
			buf("seg_nchunk"), buf("start"), buf("h"+sfx), buf("vnew"+sfx), buf("final"+sfx), i32a(HV), i32a(vh))
	}
	j.poison("o", poisonBF16x2)
	j.launch("output", "gdn_output_fwd", grid3(l.NC, HV, 1), 256, "kOutputSmem",
		buf("qn"), buf("kn"), buf("gcum"), buf("vnew128"), buf("h128"), buf("chunk_tok0"), buf("chunk_len"),
		buf("o"), i32a(HQK), i32a(HV), f32a(d.scale))
}

// bufSpec names a buffer of elems elements.
type bufSpec struct {
	name  string
	elems int
}

func vhName(vh int) string {
	if vh == 64 {
		return "64"
	}
	return "128"
}

// fwdOut is the forward's fp32 results, widened.
type fwdOut struct {
	qn, kn, qRstd, kRstd, gcum, w, u, kt, start []float64
	outP, outQ, h, vnew, final                  []float64 // vh 128 (vh 64 is checked bitwise equal)
	o                                           []bf16.BF16
}

// readForward reads the forward's outputs (every one fully written, no NaN)
// and checks that the two walk widths agree bit for bit.
func readForward(t *testing.T, r *result, d *gdnData) *fwdOut {
	f := &fwdOut{}
	for _, p := range []struct {
		dst  *[]float64
		name string
	}{
		{&f.qn, "qn"}, {&f.kn, "kn"}, {&f.qRstd, "q_rstd"}, {&f.kRstd, "k_rstd"}, {&f.gcum, "gcum"},
		{&f.w, "w"}, {&f.u, "u"}, {&f.kt, "kt"}, {&f.start, "start"},
		{&f.h, "h128"}, {&f.vnew, "vnew128"}, {&f.final, "final128"},
	} {
		*p.dst = widen(r.f32s(p.name))
	}
	if len(d.c.sumList) > 0 {
		f.outP, f.outQ = widen(r.f32s("out_p128")), widen(r.f32s("out_q128"))
	}
	for _, n := range []string{"out_p", "out_q", "h", "vnew", "final"} {
		if (n == "out_p" || n == "out_q") && len(d.c.sumList) == 0 {
			continue
		}
		require.Equal(t, r.raw[n+"64"], r.raw[n+"128"], "%s: the vh 64 and vh 128 walks differ", n)
	}
	f.o = r.bf16s("o")
	return f
}

// ---- references from the kernels' own inputs ------------------------------------------------------

// gFromGamma returns log decays whose in-chunk cumsum, as Prep forms it in
// float64, is exactly gamma (fp32 values; each difference of two of them is
// exact in float64, and so is each partial sum).
func gFromGamma(gamma []float64, chunkLens []int) []float64 {
	g := make([]float64, len(gamma))
	at := 0
	for _, n := range chunkLens {
		for i := 0; i < n; i++ {
			if i == 0 {
				g[at] = gamma[at]
			} else {
				g[at+i] = gamma[at+i] - gamma[at+i-1]
			}
		}
		at += n
	}
	return g
}

// segChunkLens returns the chunk lengths of segment s.
func (l *layout) segChunkLens(s int) []int {
	c0, nc := l.chunks(s)
	out := make([]int, nc)
	for i := range out {
		out[i] = int(l.chunkLen[c0+i])
	}
	return out
}

// kernelSegment prepares segment s, value head h in float64 from the
// tensors the kernels read: the normalised q, k (qn, kn, as the l2norm
// kernel wrote them), v, beta and gamma (the prep kernel's gcum, turned back
// into log decays so that Prep's cumsum gives it exactly); with w, u, kt set,
// each chunk's W, U and Kt are replaced by them (the walks' inputs).
func kernelSegment(t *testing.T, d *gdnData, f *fwdOut, s, h int, wukt bool) *gdnref.Segment {
	l, c := d.l, d.c
	t0, n := int(l.segStart[s]), int(l.segLen[s])
	qh := h / (c.hv / c.hqk)
	hd := gdnref.Head{
		Q: rows(f.qn, t0, n, qh, c.hqk), K: rows(f.kn, t0, n, qh, c.hqk), V: d.rawRows(2, t0, n, h),
		G:    gFromGamma(col(f.gcum, t0, n, h, c.hv), l.segChunkLens(s)),
		Beta: col(widen(d.beta), t0, n, h, c.hv),
	}
	seg, err := gdnref.Prep(hd, gdnref.Options{NoL2Norm: true, Scale: float64(d.scale)})
	require.NoError(t, err)
	for ci := range seg.Chunks {
		ch := &seg.Chunks[ci]
		for i := range ch.Gamma { // Prep's cumsum reproduces the kernel's gamma exactly
			require.Equal(t, f.gcum[(t0+ch.Start+i)*c.hv+h], ch.Gamma[i])
		}
		if wukt {
			ch.W = rows(f.w, t0+ch.Start, ch.Len, h, c.hv)
			ch.U = rows(f.u, t0+ch.Start, ch.Len, h, c.hv)
			ch.Kt = rows(f.kt, t0+ch.Start, ch.Len, h, c.hv)
		}
	}
	return seg
}

// rawHead is segment s, value head h of the raw inputs (q, k before the
// l2norm).
func rawHead(d *gdnData, s, h int) gdnref.Head {
	l, c := d.l, d.c
	t0, n := int(l.segStart[s]), int(l.segLen[s])
	qh := h / (c.hv / c.hqk)
	return gdnref.Head{
		Q: d.rawRows(0, t0, n, qh), K: d.rawRows(1, t0, n, qh), V: d.rawRows(2, t0, n, h),
		G: col(widen(d.g), t0, n, h, c.hv), Beta: col(widen(d.beta), t0, n, h, c.hv),
	}
}

func (d *gdnData) opts() gdnref.Options {
	return gdnref.Options{NoL2Norm: !d.c.l2norm, Scale: float64(d.scale)}
}

// listIndex returns the position of segment s in list, or -1.
func listIndex(list []int, s int) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

// requireBF16Close checks bf16 results against float64 references: the
// normwise error may not exceed what rounding to bf16 alone allows (2^-9,
// the unit roundoff, plus slack for the fp32 arithmetic), and no element may
// be further than one bf16 ulp of the reference (plus a small absolute slack
// for elements that cancel to near zero).
func requireBF16Close(t *testing.T, et *errTable, name string, got []bf16.BF16, want []float64) {
	t.Helper()
	g := bf16Widen(got)
	e := relErr(g, want)
	et.note(name, e)
	require.Lessf(t, e, math.Ldexp(1, -9)+2e-5, "%s: relative error %.3g beyond bf16 rounding", name, e)
	var ss float64
	for _, w := range want {
		ss += w * w
	}
	abs := 1e-5 * math.Sqrt(ss/float64(len(want)))
	for i, w := range want {
		require.LessOrEqualf(t, math.Abs(g[i]-w), math.Ldexp(math.Abs(w), -8)+abs, "%s[%d]: %g, want %g", name, i, g[i], w)
	}
}

// launchL2NormPrep launches the fp32 l2norm (qn, kn, q_rstd, k_rstd) and
// chunk prep (gcum, w, u, kt) of d: the walks' inputs, into outputs the
// caller has added (and poisoned, where it checks them).
func launchL2NormPrep(j *job, d *gdnData) {
	c, l := d.c, d.l
	T, HQK, HV := l.T, c.hqk, c.hv
	l2 := 0
	if c.l2norm {
		l2 = 1
	}
	j.launch("l2norm", "gdn_l2norm_fwd", grid1(ceilDiv(T*HQK*2, 8)), 256, "0",
		bufAt("qkv", 2*d.qOff), bufAt("qkv", 2*d.kOff), i32a(d.qStride), i32a(d.qStride),
		buf("qn"), buf("kn"), buf("q_rstd"), buf("k_rstd"), i32a(T), i32a(HQK), i32a(l2))
	j.launch("prep", "gdn_prep_fwd", grid3(l.NC, HV, 1), 256, "kPrepSmem",
		buf("kn"), bufAt("qkv", 2*d.vOff), i32a(d.vStride), buf("g"), buf("beta"), buf("chunk_tok0"), buf("chunk_len"),
		buf("gcum"), buf("w"), buf("u"), buf("kt"), i32a(HQK), i32a(HV))
}
