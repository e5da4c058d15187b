package kcp

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"math"
	"slices"
	"sync"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
)

// The GPU backend's results on the host. Each rank's output and gradients
// stay as the GPU stores them (bf16 or fp32 rows in the rank's local token
// order) once copied back; they are checked there (never written, NaN),
// turned into the float64 global tensors of the CPU backend's API only when
// asked for (GPUForward.Output, GPUGrads.Gradients), and hashed per rank
// without that copy (RankDigest). Every pass over the rows runs on up to
// GOMAXPROCS goroutines over blocks of at most hostBlockTokens tokens of one
// segment; each block writes only its own rows or its own partial result,
// and partial results are merged in block order, so the outcome never
// depends on scheduling.

// hostBlockTokens is the most tokens of one block of the host passes and
// of the digest (RankDigest).
const hostBlockTokens = 1024

// tokenBlock is tokens [i0, i1) of segment seg.
type tokenBlock struct {
	seg    Segment
	i0, i1 int
}

// tokenBlocks cuts segs, in the order given, into blocks of at most
// hostBlockTokens tokens, each segment's from its first token.
func tokenBlocks(segs []Segment) []tokenBlock {
	var bs []tokenBlock
	for _, s := range segs {
		for i := 0; i < s.Len; i += hostBlockTokens {
			bs = append(bs, tokenBlock{s, i, min(i+hostBlockTokens, s.Len)})
		}
	}
	return bs
}

// globalBlocks are rank's blocks in global token order.
func globalBlocks(p *Plan, rank int) []tokenBlock {
	segs := slices.Clone(p.Ranks[rank].Segments)
	slices.SortFunc(segs, func(a, b Segment) int { return a.Start - b.Start })
	return tokenBlocks(segs)
}

// checkBlocks runs scan on every block in parallel, each with its own
// count, and merges the counts in block order: the first bad element named
// is the first in block order whatever the scheduling.
func checkBlocks(rank int, name string, blocks []tokenBlock, scan func(b tokenBlock, c *gradCheck)) error {
	cs := make([]gradCheck, len(blocks))
	_ = parallel(len(blocks), func(i int) error {
		scan(blocks[i], &cs[i])
		return nil
	})
	total := gradCheck{rank: rank, name: name}
	for _, c := range cs {
		total.unwritten += c.unwritten
		total.nan += c.nan
		if total.first == "" {
			total.first = c.first
		}
	}
	return total.err()
}

// checkBF16Rows checks w values a token of src, token lt's at
// src[lt*stride+off:]: an element still holding poisonBF16 was never
// written; any other NaN was computed. col names column j.
func checkBF16Rows(rank int, name string, blocks []tokenBlock, src []bf16.BF16, w, stride, off int, col func(j int) string) error {
	return checkBlocks(rank, name, blocks, func(b tokenBlock, c *gradCheck) {
		for i := b.i0; i < b.i1; i++ {
			lt, t := b.seg.LocalStart+i, b.seg.Start+i
			for j, x := range src[lt*stride+off : lt*stride+off+w] {
				if x.IsNaN() {
					c.bad(x == poisonBF16, func() string {
						return fmt.Sprintf("token %d (local %d, document %d) %s", t, lt, b.seg.Doc, col(j))
					})
				}
			}
		}
	})
}

// checkF32Rows is checkBF16Rows for fp32 rows of w values (poison
// PoisonF32).
func checkF32Rows(rank int, name string, blocks []tokenBlock, src []float32, w int, col func(j int) string) error {
	return checkBlocks(rank, name, blocks, func(b tokenBlock, c *gradCheck) {
		for i := b.i0; i < b.i1; i++ {
			lt, t := b.seg.LocalStart+i, b.seg.Start+i
			for j, x := range src[lt*w : (lt+1)*w] {
				if math.IsNaN(float64(x)) {
					c.bad(math.Float32bits(x) == PoisonF32, func() string {
						return fmt.Sprintf("token %d (local %d, document %d) %s", t, lt, b.seg.Doc, col(j))
					})
				}
			}
		}
	})
}

// fillBF16 writes w values a token of src (token lt's at src[lt*stride+off:])
// to dst's global rows of width w, as float64.
func fillBF16(blocks []tokenBlock, dst []float64, w int, src []bf16.BF16, stride, off int) {
	_ = parallel(len(blocks), func(bi int) error {
		b := blocks[bi]
		for i := b.i0; i < b.i1; i++ {
			lt, t := b.seg.LocalStart+i, b.seg.Start+i
			d := dst[t*w : (t+1)*w]
			for j, x := range src[lt*stride+off : lt*stride+off+w] {
				d[j] = float64(x.Float32())
			}
		}
		return nil
	})
}

// fillF32 is fillBF16 for fp32 rows of w values.
func fillF32(blocks []tokenBlock, dst []float64, w int, src []float32) {
	_ = parallel(len(blocks), func(bi int) error {
		b := blocks[bi]
		for i := b.i0; i < b.i1; i++ {
			lt, t := b.seg.LocalStart+i, b.seg.Start+i
			d := dst[t*w : (t+1)*w]
			for j, x := range src[lt*w : (lt+1)*w] {
				d[j] = float64(x)
			}
		}
		return nil
	})
}

// headCol names column j of rows of 128-wide heads: "QK head 1 column 3".
func headCol(kind string) func(j int) string {
	return func(j int) string { return fmt.Sprintf("%s head %d column %d", kind, j/gpuD, j%gpuD) }
}

// gpuOutRows is a forward's output as the GPU stores it: every local rank's
// bf16 o [Tr, HV*128] in local token order.
type gpuOutRows struct {
	plan *Plan
	rows [][]bf16.BF16 // [rank]; nil for a rank not run here
	once sync.Once
	out  *Output
}

func newGPUOutRows(p *Plan) *gpuOutRows {
	return &gpuOutRows{plan: p, rows: make([][]bf16.BF16, len(p.Ranks))}
}

// set checks rank's output (an element still poisoned was never written;
// any other NaN was computed) and keeps it.
func (o *gpuOutRows) set(rank int, rows []bf16.BF16) error {
	row := o.plan.Config.HV * gpuD
	err := checkBF16Rows(rank, "output", tokenBlocks(o.plan.Ranks[rank].Segments), rows, row, row, 0,
		func(j int) string { return fmt.Sprintf("head %d column %d", j/gpuD, j%gpuD) })
	if err != nil {
		return err
	}
	o.rows[rank] = rows
	return nil
}

// setEmpty records rank, which holds no tokens, as run here: its rows are
// empty, not missing (digestParts tells the two apart).
func (o *gpuOutRows) setEmpty(rank int) error { return o.set(rank, []bf16.BF16{}) }

// output is the float64 output in global order (ranks not run here: zero),
// made on the first call.
func (o *gpuOutRows) output() *Output {
	o.once.Do(func() {
		p := o.plan
		row := p.Config.HV * gpuD
		o.out = &Output{O: make([]float64, p.OutputShape().Size())}
		for r, rows := range o.rows {
			if rows != nil {
				fillBF16(tokenBlocks(p.Ranks[r].Segments), o.out.O, row, rows, row, 0)
			}
		}
	})
	return o.out
}

// digestParts is rank's output for rankDigest.
func (o *gpuOutRows) digestParts(rank int) ([]digestPart, error) {
	rows := o.rows[rank]
	if rows == nil {
		return nil, fmt.Errorf("kcp: rank digest: rank %d did not run in this process", rank)
	}
	row := o.plan.Config.HV * gpuD
	return []digestPart{bf16Part(globalBlocks(o.plan, rank), rows, row, row, 0)}, nil
}

// gpuGradRows are a backward's gradients as the GPU stores them: every
// local rank's gradRows and, in the module stage, the conv weight gradient
// summed over the ranks (the same on every rank). out is the output of the
// forward the backward ran from.
type gpuGradRows struct {
	plan   *Plan
	stage  Stage
	out    *gpuOutRows
	rows   []*gradRows // [rank]; nil for a rank not run here
	dconvW []float32
	once   sync.Once
	g      *Grads
}

// gradients are the float64 gradients in global order (ranks not run here:
// zero), made on the first call.
func (gr *gpuGradRows) gradients() *Grads {
	gr.once.Do(func() {
		p := gr.plan
		gr.g = newGrads(p, gr.stage)
		for r, rows := range gr.rows {
			if rows != nil {
				fillGrads(p, r, gr.g, *rows)
			}
		}
		for i, v := range gr.dconvW {
			gr.g.DConvW[i] = float64(v)
		}
	})
	return gr.g
}

// setEmpty records rank, which holds no tokens, as run here with empty
// gradient rows (those of the stage: dx in the module stage, dq, dk, dv in
// the core stage).
func (gr *gpuGradRows) setEmpty(rank int, module bool) {
	rows := &gradRows{DG: []float32{}, DBeta: []float32{}}
	if module {
		rows.DX = []bf16.BF16{}
	} else {
		rows.DQ, rows.DK, rows.DV = []bf16.BF16{}, []bf16.BF16{}, []bf16.BF16{}
	}
	gr.rows[rank] = rows
}

// digestParts is rank's output and gradients for rankDigest, in the order
// of RankDigest.
func (gr *gpuGradRows) digestParts(rank int) ([]digestPart, error) {
	parts, err := gr.out.digestParts(rank)
	if err != nil {
		return nil, err
	}
	rows := gr.rows[rank]
	if rows == nil {
		return nil, fmt.Errorf("kcp: rank digest: rank %d has no gradients in this process", rank)
	}
	p := gr.plan
	cfg := p.Config
	nq, nv, HV := cfg.HQK*gpuD, cfg.HV*gpuD, cfg.HV
	bs := globalBlocks(p, rank)
	if rows.DX != nil {
		C := p.ConvChannels()
		parts = append(parts, bf16Part(bs, rows.DX, nq, C, 0), bf16Part(bs, rows.DX, nq, C, nq), bf16Part(bs, rows.DX, nv, C, 2*nq))
	} else {
		parts = append(parts, bf16Part(bs, rows.DQ, nq, nq, 0), bf16Part(bs, rows.DK, nq, nq, 0), bf16Part(bs, rows.DV, nv, nv, 0))
	}
	parts = append(parts, f32Part(bs, rows.DG, HV), f32Part(bs, rows.DBeta, HV))
	if gr.stage == StageModule {
		if len(gr.dconvW) != p.ConvChannels()*ConvWidth {
			return nil, fmt.Errorf("kcp: rank digest: the conv weight gradient has %d values, want %d", len(gr.dconvW), p.ConvChannels()*ConvWidth)
		}
		parts = append(parts, wholePart(func(d *digestWriter) {
			for _, v := range gr.dconvW {
				d.f64(float64(v))
			}
		}))
	}
	return parts, nil
}

// digestPart is one tensor of a rank digest: n blocks, put(i, d) writing
// block i's values to d.
type digestPart struct {
	n   int
	put func(i int, d *digestWriter)
}

// digestWriter hashes float64 values as their little-endian bits.
type digestWriter struct {
	h   hash.Hash
	buf []byte
}

// f64 hashes v.
func (d *digestWriter) f64(v float64) {
	d.buf = binary.LittleEndian.AppendUint64(d.buf, math.Float64bits(v))
	if len(d.buf) >= 1<<15 {
		d.h.Write(d.buf)
		d.buf = d.buf[:0]
	}
}

// sum is the sha256 of every value written.
func (d *digestWriter) sum() (s [sha256.Size]byte) {
	d.h.Write(d.buf)
	d.h.Sum(s[:0])
	return s
}

// bf16Part hashes w values a token of src (token lt's at src[lt*stride+off:])
// over blocks.
func bf16Part(blocks []tokenBlock, src []bf16.BF16, w, stride, off int) digestPart {
	return digestPart{len(blocks), func(bi int, d *digestWriter) {
		b := blocks[bi]
		for i := b.i0; i < b.i1; i++ {
			lt := b.seg.LocalStart + i
			for _, x := range src[lt*stride+off : lt*stride+off+w] {
				d.f64(float64(x.Float32()))
			}
		}
	}}
}

// f32Part hashes fp32 rows of w values over blocks.
func f32Part(blocks []tokenBlock, src []float32, w int) digestPart {
	return digestPart{len(blocks), func(bi int, d *digestWriter) {
		b := blocks[bi]
		lt := b.seg.LocalStart
		for _, x := range src[(lt+b.i0)*w : (lt+b.i1)*w] {
			d.f64(float64(x))
		}
	}}
}

// f64Part hashes the global rows (width w) of data over blocks.
func f64Part(blocks []tokenBlock, data []float64, w int) digestPart {
	return digestPart{len(blocks), func(bi int, d *digestWriter) {
		b := blocks[bi]
		for _, v := range data[(b.seg.Start+b.i0)*w : (b.seg.Start+b.i1)*w] {
			d.f64(v)
		}
	}}
}

// wholePart is a tensor hashed as one block.
func wholePart(put func(d *digestWriter)) digestPart {
	return digestPart{1, func(_ int, d *digestWriter) { put(d) }}
}

// rankDigest hashes parts: sha256 of the concatenated part digests, each
// the sha256 of its concatenated block digests, each the sha256 of the
// block's values (little-endian float64 bits). The blocks are hashed in
// parallel.
func rankDigest(parts []digestPart) [sha256.Size]byte {
	type job struct{ part, block int }
	var jobs []job
	first := make([]int, len(parts)) // index of each part's first job
	for pi, pt := range parts {
		first[pi] = len(jobs)
		for b := range pt.n {
			jobs = append(jobs, job{pi, b})
		}
	}
	sums := make([][sha256.Size]byte, len(jobs))
	_ = parallel(len(jobs), func(i int) error {
		j := jobs[i]
		d := &digestWriter{h: sha256.New(), buf: make([]byte, 0, 1<<15+8)}
		parts[j.part].put(j.block, d)
		sums[i] = d.sum()
		return nil
	})
	outer := sha256.New()
	for pi, pt := range parts {
		h := sha256.New()
		for _, s := range sums[first[pi] : first[pi]+pt.n] {
			h.Write(s[:])
		}
		outer.Write(h.Sum(nil))
	}
	var d [sha256.Size]byte
	outer.Sum(d[:0])
	return d
}
