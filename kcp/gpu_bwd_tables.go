package kcp

import (
	"fmt"
	"slices"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/sched"
)

// gpuBwdTables are the int32 tables one rank's backward kernels read on top
// of the forward's gpuTables (docs/gpu-backward.md), built on the host from
// the plan.
type gpuBwdTables struct {
	// Offset is the offset walk list: the rank's segments with a chain
	// predecessor, as indices into its segments in buffer order (the plan's
	// RankPlan.Offset).
	Offset []int32
	// RCompOff [NS+1] and RCompIdx are the reverse compose CSR: segment s
	// folds the gathered offsets RCompIdx[RCompOff[s]:RCompOff[s+1]], its
	// chain successors from the document's last segment down to the next one
	// (none for a document's last segment, whose terminal adjoint is zero).
	// Index rr*MaxOffset + li names offset list entry li of rank rr.
	RCompOff, RCompIdx []int32
	// MaxOffset is the longest offset list over the ranks: the slots every
	// rank sends in the offset exchange.
	MaxOffset int

	// The halo-gradient add table of gdn_add_rows (module stage). Every rank
	// sends HaloSlots slots of 3 conv-channel rows (its segments' dhalo,
	// [NS, 3, C], then zeros); gathered, row x of slot ss of rank rr is
	// gathered row (rr*HaloSlots + ss)*3 + x.
	HaloSlots int
	// HaloSrc are the gathered rows this rank receives, in the fixed order
	// of the CPU backend's convBackward: ranks ascending, their segments
	// ascending, halo rows ascending. The rank uploads exactly these rows,
	// in this order (the compact src of gdn_add_rows).
	HaloSrc []int32
	// AddDst [ndst] are the local dx rows (tokens) that receive halo
	// gradients, ascending; destination d adds the compact rows
	// AddSrc[AddOff[d]:AddOff[d+1]] (indices into HaloSrc) in that order.
	AddDst, AddOff, AddSrc []int32
}

// buildGPUBwdTables lays out rank's backward tables. The gathered offset
// array has MaxOffset slots per rank, so a segment's offset sits at
// rank*MaxOffset + its index in its rank's offset list, as the summaries do
// in the forward.
func buildGPUBwdTables(p *Plan, rank int) (*gpuBwdTables, error) {
	if rank < 0 || rank >= len(p.Ranks) {
		return nil, fmt.Errorf("kcp: gpu backward tables: rank %d outside the plan's %d ranks", rank, len(p.Ranks))
	}
	rp := &p.Ranks[rank]
	maxOff := p.maxWalk(sched.Offset)
	slots := p.maxSegments()
	if int64(len(p.Ranks))*int64(maxOff) > maxInt32 {
		return nil, fmt.Errorf("kcp: gpu backward tables: %d ranks x %d offset slots exceed int32", len(p.Ranks), maxOff)
	}
	if int64(len(p.Ranks))*int64(slots)*ConvHalo > maxInt32 {
		return nil, fmt.Errorf("kcp: gpu backward tables: %d ranks x %d halo slots x %d rows exceed int32", len(p.Ranks), slots, ConvHalo)
	}
	tb := &gpuBwdTables{MaxOffset: maxOff, HaloSlots: slots, RCompOff: make([]int32, len(rp.Segments)+1)}
	for _, s := range rp.Offset {
		if rp.Segments[s].Pred == nil {
			return nil, fmt.Errorf("kcp: gpu backward tables: rank %d segment %d is on the offset list but has no predecessor", rank, s)
		}
		tb.Offset = append(tb.Offset, int32(s))
	}
	slot := p.walkSlot(sched.Offset)
	for s := range rp.Segments {
		seg := &rp.Segments[s]
		tb.RCompOff[s] = int32(len(tb.RCompIdx))
		if seg.Succ == nil {
			continue
		}
		pos, err := p.chainPos(seg.Doc, SegRef{rank, s})
		if err != nil {
			return nil, err
		}
		chain := p.Chains[seg.Doc]
		for j := len(chain) - 1; j > pos; j-- {
			ref := chain[j]
			li := slot[ref.Rank][ref.Seg]
			if li < 0 {
				return nil, fmt.Errorf("kcp: gpu backward tables: segment %d of rank %d has a predecessor but no offset", ref.Seg, ref.Rank)
			}
			tb.RCompIdx = append(tb.RCompIdx, int32(ref.Rank*maxOff+li))
		}
	}
	tb.RCompOff[len(rp.Segments)] = int32(len(tb.RCompIdx))

	// Halo gradients: every (rank, segment, row) whose halo token lives on
	// this rank, in the CPU's order; then grouped by destination row.
	bySrc := map[int32][]int32{} // local dx row -> indices into HaloSrc
	for rr := range p.Ranks {
		for ss := range p.Ranks[rr].Segments {
			err := haloRows(&p.Ranks[rr].Segments[ss], func(row int, pc HaloPiece, off int) error {
				if pc.Rank != rank {
					return nil
				}
				if pc.Seg < 0 || pc.Seg >= len(rp.Segments) || off < 0 || off >= rp.Segments[pc.Seg].Len {
					return fmt.Errorf("halo token %d of segment %d is outside rank %d's segments", off, pc.Seg, rank)
				}
				dst := int32(rp.Segments[pc.Seg].LocalStart + off)
				bySrc[dst] = append(bySrc[dst], int32(len(tb.HaloSrc)))
				tb.HaloSrc = append(tb.HaloSrc, int32((rr*slots+ss)*ConvHalo+row))
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("kcp: gpu backward tables: rank %d segment %d halo: %w", rr, ss, err)
			}
		}
	}
	for dst := range bySrc {
		tb.AddDst = append(tb.AddDst, dst)
	}
	slices.Sort(tb.AddDst)
	tb.AddOff = make([]int32, 0, len(tb.AddDst)+1)
	for _, dst := range tb.AddDst {
		tb.AddOff = append(tb.AddOff, int32(len(tb.AddSrc)))
		tb.AddSrc = append(tb.AddSrc, bySrc[dst]...)
	}
	tb.AddOff = append(tb.AddOff, int32(len(tb.AddSrc)))
	return tb, nil
}

// haloGradSend is what a rank sends in the halo-gradient exchange: its
// segments' dhalo ([NS, 3, C], as the conv backward wrote it) in the first
// NS of HaloSlots slots, zeros after.
func haloGradSend(tb *gpuBwdTables, dhalo []float32, C int) []float32 {
	send := make([]float32, tb.HaloSlots*ConvHalo*C)
	copy(send, dhalo)
	return send
}

// haloGradRows picks the rows a rank receives (tb.HaloSrc, in order) out of
// the gathered halo-gradient sends of every rank: the compact src of
// gdn_add_rows, [len(HaloSrc), C].
func haloGradRows(tb *gpuBwdTables, all []float32, ranks, C int) ([]float32, error) {
	if want := ranks * tb.HaloSlots * ConvHalo * C; len(all) != want {
		return nil, fmt.Errorf("kcp: halo gradient exchange: got %d values, want %d ranks x %d slots x %d rows x %d channels",
			len(all), ranks, tb.HaloSlots, ConvHalo, C)
	}
	out := make([]float32, len(tb.HaloSrc)*C)
	for k, row := range tb.HaloSrc {
		copy(out[k*C:(k+1)*C], all[int(row)*C:(int(row)+1)*C])
	}
	return out, nil
}

// gatherDOut gathers rank's tokens of dout ([T, HV, 128], global order) in
// buffer order as bf16 bits (exact for bf16 values, else rounded to nearest
// even).
func gatherDOut(p *Plan, rank int, dout []float32) []bf16.BF16 {
	nv := p.Config.HV * p.Config.DV
	out := make([]bf16.BF16, p.Ranks[rank].Tokens*nv)
	gatherDOutRows(p, rank, dout, out, 0)
	return out
}

// gatherDOutRows is gatherDOut's rows [row0, row0 + len(dst)/nv) of the
// rank's buffer, written to dst (a stager's chunk), in parallel blocks of
// at most 64 rows (a 16 MB chunk holds ~1,400 rows of 48 x 128).
func gatherDOutRows(p *Plan, rank int, dout []float32, dst []bf16.BF16, row0 int) {
	const rows = 64
	nv := p.Config.HV * p.Config.DV
	row1 := row0 + len(dst)/nv
	var bs []tokenBlock
	for _, sg := range p.Ranks[rank].Segments {
		lo, hi := max(sg.LocalStart, row0), min(sg.LocalStart+sg.Len, row1)
		for i := lo; i < hi; i += rows {
			bs = append(bs, tokenBlock{sg, i - sg.LocalStart, min(i+rows, hi) - sg.LocalStart})
		}
	}
	_ = parallel(len(bs), func(bi int) error {
		b := bs[bi]
		gatherRows(dst, b.seg.LocalStart+b.i0-row0, dout, b.seg.Start+b.i0, b.i1-b.i0, nv)
		return nil
	})
}
