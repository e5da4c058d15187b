package cpuemu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/mat"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/internal/gdnref"
)

// The backward kernels (ptx/src/gdn_bwd.cu) against docs/gpu-backward.md and
// internal/gdnref.
//
// Tolerances. Each kernel is compared with gdnref fed exactly the fp32
// tensors that kernel read (the emulated forward's and the earlier backward
// kernels' outputs), so its error is its own fp32 rounding: 1e-7..1e-6 for
// the walks and dV'_local, a few 1e-6 for the chunk gradients, whose dgamma
// and dbeta sum many terms of both signs and go through the triangular
// solves (dL = -Aᵀ dA Aᵀ). bwdTol = 1e-4 is two orders above that and an
// order below 1e-3, while a wrong row of a chunk or a wrong term of dgamma
// is far above it. The end-to-end comparison (the naive float64 backward of
// gdnref of the raw inputs, document by document) also carries the forward's
// fp32 rounding through every stage: bwdE2ETol = 2e-4.
const (
	bwdTol    = 1e-4
	bwdE2ETol = 2e-4
)

func requireBackward(t *testing.T) string {
	t.Helper()
	if !haveBackward() {
		t.Skip("ptx/src/gdn_bwd.cu does not exist yet: the backward kernels are not emulated")
	}
	return built(t, "runner_all")
}

// TestBackwardKernelsOnCPU runs the forward and then the backward stream of
// docs/gpu-backward.md (dV'_local, offset walk at vh 64 and 128, reverse
// compose, tape walk at vh 64 and 128, chunk grads, qk reduce with the
// l2norm backward, and in the module case the conv backward and dw reduce on
// the assembled dy) on the emulator.
func TestBackwardKernelsOnCPU(t *testing.T) {
	bin := requireBackward(t)
	for i := range fwdCases {
		c := &fwdCases[i]
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := newData(t, c)
			j := newJob(t)
			addForward(j, d)
			cv := addBackward(j, d)
			r := j.run(bin)
			t.Logf("runner:\n%s", r.log)
			f := readForward(t, r, d)
			b := readBackward(t, r, d)
			et := &errTable{}
			checkBackward(t, et, d, f, b)
			if cv != nil {
				checkConv(t, et, cv, r)
			}
			et.log(t)
		})
	}
}

// addBackward adds the backward stream after addForward's launches. For a
// module case it returns the conv backward's inputs (x, taps, halo: random,
// as the conv backward recomputes its forward from them).
func addBackward(j *job, d *gdnData) *convCase {
	c, l := d.c, d.l
	T, HQK, HV := l.T, c.hqk, c.hv
	off := make([]int32, len(c.offList))
	for i, s := range c.offList {
		off[i] = int32(s)
	}
	j.i32("off_list", off)
	j.bf16("dout", d.dout)
	noff := max(len(off), 1)
	outs := []bufSpec{{"dvl", T * HV * dHead}, {"dend", l.NS * HV * dHead * dHead},
		{"dqv", T * HV * dHead}, {"dkv", T * HV * dHead}, {"dg", T * HV}, {"dbeta", T * HV}}
	for _, vh := range []int{64, 128} {
		sfx := vhName(vh)
		outs = append(outs, bufSpec{"out_pt" + sfx, noff * HV * dHead * dHead}, bufSpec{"out_r" + sfx, noff * HV * dHead * dHead},
			bufSpec{"d_chunk" + sfx, l.NC * HV * dHead * dHead}, bufSpec{"dvnew" + sfx, T * HV * dHead},
			bufSpec{"dstart" + sfx, l.NS * HV * dHead * dHead})
	}
	if c.module {
		outs = append(outs, bufSpec{"dy", T * d.convC})
	} else {
		outs = append(outs, bufSpec{"dv", T * HV * dHead}, bufSpec{"dq", T * HQK * dHead}, bufSpec{"dk", T * HQK * dHead})
	}
	for _, o := range outs {
		j.out(o.name, 4*o.elems)
	}
	scale := f32a(d.scale)

	j.poison("dvl", poisonF32)
	j.launch("dvlocal", "gdn_dvlocal_bwd", grid3(l.NC, HV, 1), 256, "kDvlSmem",
		buf("qn"), buf("kn"), buf("gcum"), buf("dout"), buf("chunk_tok0"), buf("chunk_len"), buf("dvl"),
		i32a(HQK), i32a(HV), scale)
	for _, vh := range []int{64, 128} {
		sfx := vhName(vh)
		j.poison("out_pt"+sfx, poisonF32)
		j.poison("out_r"+sfx, poisonF32)
		if len(off) > 0 {
			j.launch("offset"+sfx, "gdn_offset_walk", grid3(2*dHead/vh, len(off), HV), 256, smemOf("bwd_walk_smem", vh),
				buf("w"), buf("kt"), buf("qn"), buf("gcum"), buf("dvl"), buf("dout"), buf("chunk_tok0"), buf("chunk_len"),
				buf("seg_chunk0"), buf("seg_nchunk"), buf("off_list"), buf("out_pt"+sfx), buf("out_r"+sfx),
				i32a(HQK), i32a(HV), i32a(vh), scale)
		}
	}
	j.poison("dend", poisonF32)
	j.launch("rcompose", "gdn_compose_fwd", grid3(2, l.NS, HV), 256, "kComposeSmem",
		buf("out_pt64"), buf("out_r64"), buf("rcomp_off"), buf("rcomp_idx"), buf("dend"), i32a(HV))
	for _, vh := range []int{64, 128} {
		sfx := vhName(vh)
		for _, o := range []string{"d_chunk", "dvnew", "dstart"} {
			j.poison(o+sfx, poisonF32)
		}
		j.launch("tape"+sfx, "gdn_tape_walk", grid3(dHead/vh, l.NS, HV), 256, smemOf("bwd_walk_smem", vh),
			buf("w"), buf("kt"), buf("qn"), buf("gcum"), buf("dvl"), buf("dout"), buf("chunk_tok0"), buf("chunk_len"),
			buf("seg_chunk0"), buf("seg_nchunk"), buf("dend"), buf("d_chunk"+sfx), buf("dvnew"+sfx), buf("dstart"+sfx),
			i32a(HQK), i32a(HV), i32a(vh), scale)
	}
	for _, o := range []string{"dqv", "dkv", "dg", "dbeta"} {
		j.poison(o, poisonF32)
	}
	// dv, dq, dk: their own tensors (core) or the columns of the conv's dy (module).
	dvArg, dvStride := buf("dv"), HV*dHead
	dqArg, dkArg, dqStride := buf("dq"), buf("dk"), HQK*dHead
	if c.module {
		j.poison("dy", poisonF32)
		dvArg, dvStride = bufAt("dy", 4*2*d.nq), d.convC
		dqArg, dkArg, dqStride = buf("dy"), bufAt("dy", 4*d.nq), d.convC
	} else {
		j.poison("dv", poisonF32)
		j.poison("dq", poisonF32)
		j.poison("dk", poisonF32)
	}
	j.launch("chunk_grads", "gdn_chunk_grads", grid3(l.NC, HV, 1), 256, "kGradSmem",
		buf("qn"), buf("kn"), bufAt("qkv", 2*d.vOff), i32a(d.vStride), buf("gcum"), buf("beta"), buf("h128"),
		buf("vnew128"), buf("d_chunk128"), buf("dvnew128"), buf("dout"), buf("chunk_tok0"), buf("chunk_len"),
		buf("dqv"), buf("dkv"), dvArg, i32a(dvStride), buf("dg"), buf("dbeta"), i32a(HQK), i32a(HV), scale)
	l2 := 0
	if c.l2norm {
		l2 = 1
	}
	j.launch("qk_bwd", "gdn_qk_bwd", grid1(ceilDiv(T*HQK*2, 8)), 256, "0",
		buf("dqv"), buf("dkv"), buf("qn"), buf("kn"), buf("q_rstd"), buf("k_rstd"), dqArg, dkArg, i32a(dqStride),
		i32a(T), i32a(HQK), i32a(HV), i32a(l2))
	if !c.module {
		return nil
	}
	// The module's conv backward on the assembled dy.
	cv := newConvCase(d.rng, l, d.convC, c.chains)
	addConvBackward(j, cv, "dy")
	return cv
}

// bwdOut is the backward's results, widened (walks: vh 128; vh 64 is
// checked bitwise equal).
type bwdOut struct {
	dvl, outPT, outR, dend, dChunk, dvnew, dstart []float64
	dqv, dkv, dv, dg, dbeta, dq, dk               []float64
}

func readBackward(t *testing.T, r *result, d *gdnData) *bwdOut {
	c, l := d.c, d.l
	b := &bwdOut{}
	for _, p := range []struct {
		dst  *[]float64
		name string
	}{
		{&b.dvl, "dvl"}, {&b.dend, "dend"}, {&b.dChunk, "d_chunk128"}, {&b.dvnew, "dvnew128"},
		{&b.dstart, "dstart128"}, {&b.dqv, "dqv"}, {&b.dkv, "dkv"}, {&b.dg, "dg"}, {&b.dbeta, "dbeta"},
	} {
		*p.dst = widen(r.f32s(p.name))
	}
	names := []string{"d_chunk", "dvnew", "dstart"}
	if len(c.offList) > 0 {
		b.outPT, b.outR = widen(r.f32s("out_pt128")), widen(r.f32s("out_r128"))
		names = append(names, "out_pt", "out_r")
	}
	for _, n := range names {
		require.Equal(t, r.raw[n+"64"], r.raw[n+"128"], "%s: the vh 64 and vh 128 walks differ", n)
	}
	if !c.module {
		b.dv, b.dq, b.dk = widen(r.f32s("dv")), widen(r.f32s("dq")), widen(r.f32s("dk"))
		return b
	}
	dy := widen(r.f32s("dy")) // every column written: q, k by qk_bwd, v by chunk_grads
	b.dq, b.dk, b.dv = make([]float64, l.T*d.nq), make([]float64, l.T*d.nq), make([]float64, l.T*d.nv)
	for tok := 0; tok < l.T; tok++ {
		row := dy[tok*d.convC:][:d.convC]
		copy(b.dq[tok*d.nq:], row[:d.nq])
		copy(b.dk[tok*d.nq:], row[d.nq:2*d.nq])
		copy(b.dv[tok*d.nv:], row[2*d.nq:])
	}
	return b
}

func checkBackward(t *testing.T, et *errTable, d *gdnData, f *fwdOut, b *bwdOut) {
	c, l := d.c, d.l
	T, HQK, HV := l.T, c.hqk, c.hv
	dout := bf16Widen(d.dout)
	segK := make([][]*gdnref.Segment, l.NS) // from qn, kn, gcum, v, beta: dV'_local, chunk grads
	segW := make([][]*gdnref.Segment, l.NS) // with the prep's W, Kt: the walks
	for s := range segK {
		for h := 0; h < HV; h++ {
			segK[s] = append(segK[s], kernelSegment(t, d, f, s, h, false))
			segW[s] = append(segW[s], kernelSegment(t, d, f, s, h, true))
		}
	}
	segRows := func(v []float64, s, h int) *mat.Dense {
		return rows(v, int(l.segStart[s]), int(l.segLen[s]), h, HV)
	}

	// dV'_local.
	dvl := make([]float64, len(b.dvl))
	for s := 0; s < l.NS; s++ {
		for h := 0; h < HV; h++ {
			m, err := gdnref.DVLocal(segK[s][h], segRows(dout, s, h))
			require.NoError(t, err)
			putRows(dvl, m, int(l.segStart[s]), h, HV)
		}
	}
	requireRel(t, et, "dvlocal dvl", b.dvl, dvl, bwdTol)

	// Offset walk (R and Pᵀ) from the kernels' W, Kt, qn, gamma, dvl.
	if len(c.offList) > 0 {
		pt, rr := make([]float64, len(b.outPT)), make([]float64, len(b.outR))
		for li, s := range c.offList {
			for h := 0; h < HV; h++ {
				o, err := gdnref.OffsetWalk(segW[s][h], segRows(b.dvl, s, h), segRows(dout, s, h), 128)
				require.NoError(t, err)
				putState(pt, o.PT, li, h, HV)
				putState(rr, o.R, li, h, HV)
			}
		}
		requireRel(t, et, "offset PT", b.outPT, pt, bwdTol)
		requireRel(t, et, "offset R", b.outR, rr, bwdTol)
	}

	// Reverse compose from the kernels' offsets.
	dend := make([]float64, len(b.dend))
	for s := 0; s < l.NS; s++ {
		ch, pos := c.chainOf(s)
		for h := 0; h < HV; h++ {
			var offs []*gdnref.Offset
			for _, x := range ch[1:] {
				li := listIndex(c.offList, x)
				offs = append(offs, &gdnref.Offset{PT: state(b.outPT, li, h, HV), R: state(b.outR, li, h, HV)})
			}
			ends, err := gdnref.ComposeBackward(nil, offs, dHead, dHead)
			require.NoError(t, err)
			putState(dend, ends[pos], s, h, HV)
		}
	}
	requireRel(t, et, "rcompose dend", b.dend, dend, bwdTol)

	// Tape walk from the kernels' dend.
	dChunk, dvnew, dstart := make([]float64, len(b.dChunk)), make([]float64, len(b.dvnew)), make([]float64, len(b.dstart))
	for s := 0; s < l.NS; s++ {
		c0, _ := l.chunks(s)
		for h := 0; h < HV; h++ {
			tp, err := gdnref.TapeWalk(segW[s][h], segRows(b.dvl, s, h), segRows(dout, s, h), state(b.dend, s, h, HV), 128)
			require.NoError(t, err)
			for ci, m := range tp.D {
				putState(dChunk, m, c0+ci, h, HV)
			}
			putRows(dvnew, tp.DVNew, int(l.segStart[s]), h, HV)
			putState(dstart, tp.DStart, s, h, HV)
		}
	}
	requireRel(t, et, "tape d_chunk", b.dChunk, dChunk, bwdTol)
	requireRel(t, et, "tape dvnew", b.dvnew, dvnew, bwdTol)
	requireRel(t, et, "tape dstart", b.dstart, dstart, bwdTol)

	// Chunk grads from the kernels' forward states and tape: gdnref.ChunkGrads
	// on the same tensors (NoL2Norm, so DQ, DK are w.r.t. qn, kn).
	dqv, dkv, dv := make([]float64, len(b.dqv)), make([]float64, len(b.dkv)), make([]float64, T*HV*dHead)
	dg, dbeta := make([]float64, len(b.dg)), make([]float64, len(b.dbeta))
	for s := 0; s < l.NS; s++ {
		c0, _ := l.chunks(s)
		t0 := int(l.segStart[s])
		for h := 0; h < HV; h++ {
			sg := segK[s][h]
			st := gdnref.NewStates(sg)
			tp := gdnref.NewTape(sg)
			for ci := range st.H {
				st.H[ci] = state(f.h, c0+ci, h, HV)
				tp.D[ci] = state(b.dChunk, c0+ci, h, HV)
			}
			st.VNew = segRows(f.vnew, s, h)
			tp.DVNew = segRows(b.dvnew, s, h)
			gr, err := gdnref.ChunkGrads(sg, st, tp, segRows(dout, s, h))
			require.NoError(t, err)
			putRows(dqv, gr.DQ, t0, h, HV)
			putRows(dkv, gr.DK, t0, h, HV)
			putRows(dv, gr.DV, t0, h, HV)
			putCol(dg, gr.DG, t0, h, HV)
			putCol(dbeta, gr.DBeta, t0, h, HV)
		}
	}
	requireRel(t, et, "chunk_grads dqv", b.dqv, dqv, bwdTol)
	requireRel(t, et, "chunk_grads dkv", b.dkv, dkv, bwdTol)
	requireRel(t, et, "chunk_grads dv", b.dv, dv, bwdTol)
	requireRel(t, et, "chunk_grads dg", b.dg, dg, bwdTol)
	requireRel(t, et, "chunk_grads dbeta", b.dbeta, dbeta, bwdTol)

	// qk reduce + l2norm backward from the kernels' dqv, dkv, qn, kn, rstd.
	dq, dk := make([]float64, T*HQK*dHead), make([]float64, T*HQK*dHead)
	group := HV / HQK
	for qh := 0; qh < HQK; qh++ {
		for _, p := range []struct{ dyv, y, rstd, dst []float64 }{
			{b.dqv, f.qn, f.qRstd, dq}, {b.dkv, f.kn, f.kRstd, dk},
		} {
			var per []*mat.Dense
			for h := qh * group; h < (qh+1)*group; h++ {
				per = append(per, rows(p.dyv, 0, T, h, HV))
			}
			sum, err := gdnref.SumOverValueHeads(per, 1)
			require.NoError(t, err)
			dx := sum[0]
			if c.l2norm {
				dx = gdnref.L2NormBackward(rows(p.y, 0, T, qh, HQK), col(p.rstd, 0, T, qh, HQK), sum[0])
			}
			putRows(p.dst, dx, 0, qh, HQK)
		}
	}
	requireRel(t, et, "qk_bwd dq", b.dq, dq, bwdTol)
	requireRel(t, et, "qk_bwd dk", b.dk, dk, bwdTol)

	// End to end: gdnref's token-by-token backward of each document (its
	// segments concatenated) from the raw inputs.
	eq, ek, ev := make([]float64, len(dq)), make([]float64, len(dk)), make([]float64, len(dv))
	eg, eb := make([]float64, len(dg)), make([]float64, len(dbeta))
	var gotS0, wantS0 []float64
	for s := 0; s < l.NS; s++ {
		ch, pos := c.chainOf(s)
		if pos != 0 {
			continue
		}
		for h := 0; h < HV; h++ {
			hd, spans := docHead(d, ch, h)
			gr, err := gdnref.Backward(hd, nil, docRows(dout, spans, h, HV), nil, d.opts())
			require.NoError(t, err)
			qh := h / group
			at := 0
			for _, sp := range spans {
				for i := 0; i < sp[1]; i++ {
					tok := sp[0] + i
					for x := 0; x < dHead; x++ {
						eq[(tok*HQK+qh)*dHead+x] += gr.DQ.At(at+i, x)
						ek[(tok*HQK+qh)*dHead+x] += gr.DK.At(at+i, x)
						ev[(tok*HV+h)*dHead+x] = gr.DV.At(at+i, x)
					}
					eg[tok*HV+h] = gr.DG[at+i]
					eb[tok*HV+h] = gr.DBeta[at+i]
				}
				at += sp[1]
			}
			gotS0 = append(gotS0, state(b.dstart, s, h, HV).RawMatrix().Data...)
			wantS0 = append(wantS0, gr.DS0.RawMatrix().Data...)
		}
	}
	requireRel(t, et, "end-to-end dq", b.dq, eq, bwdE2ETol)
	requireRel(t, et, "end-to-end dk", b.dk, ek, bwdE2ETol)
	requireRel(t, et, "end-to-end dv", b.dv, ev, bwdE2ETol)
	requireRel(t, et, "end-to-end dg", b.dg, eg, bwdE2ETol)
	requireRel(t, et, "end-to-end dbeta", b.dbeta, eb, bwdE2ETol)
	requireRel(t, et, "end-to-end dstart", gotS0, wantS0, bwdE2ETol)
}

// docHead concatenates the raw inputs of the chain's segments (value head
// h); spans are the segments' (start, length) in the buffer.
func docHead(d *gdnData, chain []int, h int) (gdnref.Head, [][2]int) {
	var spans [][2]int
	var hs []gdnref.Head
	for _, s := range chain {
		spans = append(spans, [2]int{int(d.l.segStart[s]), int(d.l.segLen[s])})
		hs = append(hs, rawHead(d, s, h))
	}
	stack := func(get func(gdnref.Head) *mat.Dense) *mat.Dense {
		var data []float64
		n := 0
		for _, x := range hs {
			r, _ := get(x).Dims()
			n += r
			data = append(data, mat.DenseCopyOf(get(x)).RawMatrix().Data...)
		}
		return mat.NewDense(n, dHead, data)
	}
	out := gdnref.Head{
		Q: stack(func(x gdnref.Head) *mat.Dense { return x.Q }),
		K: stack(func(x gdnref.Head) *mat.Dense { return x.K }),
		V: stack(func(x gdnref.Head) *mat.Dense { return x.V }),
	}
	for _, x := range hs {
		out.G = append(out.G, x.G...)
		out.Beta = append(out.Beta, x.Beta...)
	}
	return out, spans
}

// docRows stacks the spans' rows of head h of a [T, H, 128] tensor.
func docRows(v []float64, spans [][2]int, h, H int) *mat.Dense {
	var data []float64
	n := 0
	for _, sp := range spans {
		data = append(data, rows(v, sp[0], sp[1], h, H).RawMatrix().Data...)
		n += sp[1]
	}
	return mat.NewDense(n, dHead, data)
}

// ---- conv backward ---------------------------------------------------------------------------------

// convCase is the conv backward's inputs over a layout's segments.
type convCase struct {
	l       *layout
	C       int
	x, w    []bf16.BF16 // [T, C], [C, 4]
	halo    []bf16.BF16 // [NS, 3, C]: zeros for a segment that starts its document
	dy      []float32   // [T, C] (nil: dy is a buffer of the job already)
	dyName  string
	hasHalo []bool
}

func newConvCase(rng interface{ NormFloat64() float64 }, l *layout, C int, chains [][]int) *convCase {
	cv := &convCase{l: l, C: C, hasHalo: make([]bool, l.NS)}
	cv.x = make([]bf16.BF16, l.T*C)
	for i := range cv.x {
		cv.x[i] = bf16.Float32ToBF16(float32(2 * rng.NormFloat64()))
	}
	cv.w = make([]bf16.BF16, C*4)
	for i := range cv.w {
		cv.w[i] = bf16.Float32ToBF16(float32(0.5 * rng.NormFloat64()))
	}
	cv.halo = make([]bf16.BF16, l.NS*3*C)
	for _, ch := range chains { // a segment continuing a document has a halo
		for _, s := range ch[1:] {
			cv.hasHalo[s] = true
			for i := 0; i < 3*C; i++ {
				cv.halo[s*3*C+i] = bf16.Float32ToBF16(float32(2 * rng.NormFloat64()))
			}
		}
	}
	return cv
}

// addConvBackward adds the conv backward over dy (a buffer of the job) and
// the dw reduce over the chunks.
func addConvBackward(j *job, cv *convCase, dy string) {
	l, C := cv.l, cv.C
	cv.dyName = dy
	j.bf16("conv_x", cv.x)
	j.bf16("conv_w", cv.w)
	j.bf16("conv_halo", cv.halo)
	j.out("conv_dx", 4*l.T*C)
	j.out("conv_dhalo", 4*l.NS*3*C)
	j.out("conv_dw_part", 4*l.NC*C*4)
	j.out("conv_dw", 4*C*4)
	for _, o := range []string{"conv_dx", "conv_dhalo", "conv_dw_part", "conv_dw"} {
		j.poison(o, poisonF32)
	}
	j.launch("conv_bwd", "gdn_conv1d_silu_bwd", grid3(l.NC, ceilDiv(C, 256), 1), 256, "0",
		buf("conv_x"), buf("conv_w"), buf("conv_halo"), buf("seg_start"), buf("seg_len"), buf("tok_seg"),
		buf("chunk_tok0"), buf("chunk_len"), buf(dy), buf("conv_dx"), buf("conv_dhalo"), buf("conv_dw_part"),
		i32a(l.T), i32a(C), i32a(l.NS), i32a(l.NC))
	j.launch("dw_reduce", "gdn_dw_reduce", grid1(ceilDiv(4*C, 256)), 256, "0",
		buf("conv_dw_part"), i32a(l.NC), i32a(4*C), buf("conv_dw"))
}

// convTol: each dx, dhalo element sums 4 products and dw one product per
// token of a chunk and then the chunk parts, all in fp32 (unit roundoff
// 6e-8); SiLU' goes through the host's expf (within an ulp or two of the
// GPU's): 1e-6 is expected, 1e-5 allows for the long dw sums.
const convTol = 1e-5

// checkConv compares the conv backward with gdnref.Conv1dBackward segment by
// segment, given the kernel's dy.
func checkConv(t *testing.T, et *errTable, cv *convCase, r *result) {
	l, C := cv.l, cv.C
	dy := widen(cv.dy)
	if cv.dy == nil {
		dy = widen(r.f32s(cv.dyName))
	}
	dx, dhalo, dw := widen(r.f32s("conv_dx")), widen(r.f32s("conv_dhalo")), widen(r.f32s("conv_dw"))
	_ = r.f32s("conv_dw_part") // fully written
	wantDx, wantDhalo, wantDw := make([]float64, len(dx)), make([]float64, len(dhalo)), make([]float64, len(dw))
	wm := mat.NewDense(C, 4, bf16Widen(cv.w))
	for s := 0; s < l.NS; s++ {
		t0, n := int(l.segStart[s]), int(l.segLen[s])
		x := mat.NewDense(n, C, bf16Widen(cv.x[t0*C:(t0+n)*C]))
		halo := mat.NewDense(3, C, bf16Widen(cv.halo[s*3*C:(s+1)*3*C])) // zeros without a halo: dhalo is still defined
		g := mat.NewDense(n, C, append([]float64(nil), dy[t0*C:(t0+n)*C]...))
		gx, gh, gw, err := gdnref.Conv1dBackward(x, wm, halo, g)
		require.NoError(t, err)
		copy(wantDx[t0*C:], gx.RawMatrix().Data)
		copy(wantDhalo[s*3*C:], gh.RawMatrix().Data)
		for i, v := range gw.RawMatrix().Data {
			wantDw[i] += v
		}
	}
	requireRel(t, et, "conv_bwd dx", dx, wantDx, convTol)
	requireRel(t, et, "conv_bwd dhalo", dhalo, wantDhalo, convTol)
	requireRel(t, et, "dw_reduce dw", dw, wantDw, convTol)
	// Per segment too, so that a wrong short segment does not hide in the norm.
	for s := 0; s < l.NS; s++ {
		t0, n := int(l.segStart[s]), int(l.segLen[s])
		requireRel(t, et, "conv_bwd dx (per segment)", dx[t0*C:(t0+n)*C], wantDx[t0*C:(t0+n)*C], convTol)
		requireRel(t, et, "conv_bwd dhalo (per segment)", dhalo[s*3*C:(s+1)*3*C], wantDhalo[s*3*C:(s+1)*3*C], convTol)
	}
}

// TestConvBackwardOnCPU runs gdn_conv1d_silu_bwd and gdn_dw_reduce on
// segments shorter than the halo, spanning several chunks, with and without
// a halo, for C a multiple of 8 and not.
func TestConvBackwardOnCPU(t *testing.T) {
	bin := requireBackward(t)
	for _, C := range []int{40, 37} {
		t.Run(fmt.Sprintf("C%d", C), func(t *testing.T) {
			t.Parallel()
			c := &gdnCase{lens: []int{1, 2, 70, 5, 64, 130}, chains: [][]int{{0, 1, 2}, {3, 4}},
				sumList: []int{0, 1, 3}, offList: []int{1, 2, 4}}
			l := newLayout(t, c)
			rng := rand.New(rand.NewPCG(uint64(C), 11))
			cv := newConvCase(rng, l, C, c.chains)
			dy := make([]float32, l.T*C)
			for i := range dy {
				dy[i] = float32(rng.NormFloat64())
			}
			j := newJob(t)
			addTables(j, l)
			j.f32("dy", dy)
			cv.dy = dy
			addConvBackward(j, cv, "dy")
			r := j.run(bin)
			t.Logf("runner:\n%s", r.log)
			et := &errTable{}
			checkConv(t, et, cv, r)
			et.log(t)
		})
	}
}

// TestAddRowsOnCPU: gdn_add_rows adds its sources into the named rows in
// order, one fp32 running sum per element from dst's value, and touches
// nothing else; compared bit for bit with the same float32 sums in Go.
func TestAddRowsOnCPU(t *testing.T) {
	bin := requireBackward(t)
	const C, dstStride, srcStride, dstRows, srcRows = 300, 310, 305, 9, 7
	rng := rand.New(rand.NewPCG(5, 5))
	dst := make([]float32, dstRows*dstStride)
	src := make([]float32, srcRows*srcStride)
	for i := range dst {
		dst[i] = float32(rng.NormFloat64())
	}
	for i := range src {
		src[i] = float32(rng.NormFloat64() * 1e3) // large and small addends: the order shows in the bits
	}
	dstRow := []int32{4, 0, 8, 2}
	off := []int32{0, 3, 3, 4, 7} // the second destination receives nothing
	srcRow := []int32{6, 1, 3, 0, 2, 5, 2}
	want := append([]float32(nil), dst...)
	for d := range dstRow {
		for c := 0; c < C; c++ {
			acc := want[int(dstRow[d])*dstStride+c]
			for x := off[d]; x < off[d+1]; x++ {
				acc += src[int(srcRow[x])*srcStride+c]
			}
			want[int(dstRow[d])*dstStride+c] = acc
		}
	}
	j := newJob(t)
	j.f32("dst", dst)
	j.outs = append(j.outs, "dst")
	j.f32("src", src)
	j.i32("dst_row", dstRow)
	j.i32("off", off)
	j.i32("src_row", srcRow)
	j.launch("add_rows", "gdn_add_rows", grid3(len(dstRow), ceilDiv(C, 256), 1), 256, "0",
		buf("dst"), i32a(dstStride), buf("src"), i32a(srcStride), buf("dst_row"), buf("off"), buf("src_row"),
		i32a(len(dstRow)), i32a(C))
	got := r32(j.run(bin), "dst")
	for i := range want {
		require.Equalf(t, math.Float32bits(want[i]), math.Float32bits(got[i]), "dst row %d col %d: %g, want %g",
			i/dstStride, i%dstStride, got[i], want[i])
	}
}

// r32 reads an output as float32 without the poison checks.
func r32(r *result, name string) []float32 {
	b := r.raw[name]
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = f32Of(b, i)
	}
	return out
}

// TestF32ToBF16OnCPU: gdn_f32_to_bf16 rounds to nearest, ties to even (NaN
// to 0x7fff), over a grid-stride loop; the reference picks the nearer of the
// two neighbouring bf16 values in float64, not by the bit trick.
func TestF32ToBF16OnCPU(t *testing.T) {
	bin := requireBackward(t)
	special := []uint32{
		0x3f808000, 0x3f818000, 0xbf808000, 0xbf818000, // ties: kept bit even (down), odd (up)
		0x3f807fff, 0x3f808001, 0x3f817fff, 0x3f818001, // either side of a tie
		0x00008000, 0x00018000, 0x80008000, 0x00000001, // subnormal ties and the smallest subnormal
		0x7f7fffff, 0x7f7f8000, 0x7f7f7fff, 0xff7fffff, // rounding to Inf, and just not
		0x7f800000, 0xff800000, 0x00000000, 0x80000000, // Inf, zeros
		0x7fc00000, 0x7fa00001, 0xffffffff, 0x7f800001, // NaNs (quiet, signalling)
	}
	rng := rand.New(rand.NewPCG(9, 9))
	// 1001: odd, a tail after the groups of four; 6147: more groups of four than threads (two steps of the
	// grid-stride loop) and a tail of 3. The element after the last one stays poisoned.
	// Misaligned (src 4 bytes, dst 2 bytes past a 256-byte boundary): the one-at-a-time path only.
	for _, c := range []struct{ n, off int }{{1001, 0}, {6147, 0}, {1001, 1}} {
		f32ToBF16Case(t, bin, rng, special, c.n, c.off)
	}
}

// f32ToBF16Case converts n values, src and dst off elements past their
// buffers' (256-byte aligned) starts; the element before dst's start and the
// one after its end keep their poison.
func f32ToBF16Case(t *testing.T, bin string, rng *rand.Rand, special []uint32, n, off int) {
	src := make([]float32, n)
	for i := range src {
		switch {
		case i < len(special):
			src[i] = math.Float32frombits(special[i])
		case i%3 == 0: // random ties
			src[i] = math.Float32frombits(rng.Uint32()&0xffff0000 | 0x8000)
		default:
			src[i] = math.Float32frombits(rng.Uint32())
		}
	}
	j := newJob(t)
	j.f32("src", append(make([]float32, off), src...))
	j.out("dst", 4*ceilDiv(off+len(src)+1, 2)) // whole words: the poison kernel fills words
	j.poison("dst", poisonBF16x2)
	j.launch("f32_to_bf16", "gdn_f32_to_bf16", grid1(3), 256, "0", bufAt("src", 4*off), bufAt("dst", 2*off), u64(uint64(len(src))))
	r := j.run(bin)
	for i, x := range src {
		require.Equalf(t, roundBF16(x), bf16Of(r.raw["dst"], off+i), "n %d off %d element %d: %08x", n, off, i, math.Float32bits(x))
	}
	for i := 0; i < off; i++ {
		require.Equal(t, bf16.BF16(poisonBF16), bf16Of(r.raw["dst"], i), "n %d off %d: wrote before dst", n, off)
	}
	require.Equal(t, bf16.BF16(poisonBF16), bf16Of(r.raw["dst"], off+len(src)), "n %d off %d: wrote past n", n, off)
}

// roundBF16 is round to nearest even by comparing distances in float64.
func roundBF16(x float32) bf16.BF16 {
	u := math.Float32bits(x)
	if x != x {
		return bf16.NaN
	}
	lo := u & 0xffff0000
	if lo == u {
		return bf16.BF16(lo >> 16)
	}
	hi := lo + 0x10000 // the next bf16 away from zero (Inf past the largest)
	dl := math.Abs(float64(x) - float64(math.Float32frombits(lo)))
	var dh float64
	if hi&0x7fffffff == 0x7f800000 {
		// Inf is nearer exactly when x is at least halfway to 2^128.
		dh = math.Abs(math.Ldexp(1, 128) - math.Abs(float64(x)))
	} else {
		dh = math.Abs(float64(math.Float32frombits(hi)) - float64(x))
	}
	switch {
	case dl < dh:
		return bf16.BF16(lo >> 16)
	case dh < dl:
		return bf16.BF16(hi >> 16)
	case (lo>>16)&1 == 0:
		return bf16.BF16(lo >> 16)
	default:
		return bf16.BF16(hi >> 16)
	}
}
