package kcp

import (
	"fmt"
	"math"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/sched"
)

// gpuTables are the int32 tables one rank's kernels read (ptx/src/gdn_fwd.cu
// and conv1d.cu), built on the host from the plan.
type gpuTables struct {
	Tokens int // Tr, the rank's buffer length
	NS, NC int // segments and chunks of the rank

	// ChunkTok0, ChunkLen [NC]: first local token and length (1..64) of a
	// chunk. A segment's chunks are 64 tokens each from its start, the last
	// one shorter: the plane walks compute a chunk's (t0, n) from that and
	// the segment's first and last chunk (GDNKCP_WP_META_CALC in
	// ptx/src/gdn_walk_planes.cu), trapping on tables that break it.
	ChunkTok0, ChunkLen  []int32
	SegChunk0, SegNChunk []int32 // [NS]: first chunk and chunk count of a segment
	SegStart, SegLen     []int32 // [NS]: local start and length of a segment (conv)
	TokSeg               []int32 // [Tr]: the segment of each local token (conv)

	// Summary is the summary walk list: indices into the rank's segments.
	Summary []int32
	// CompOff [NS+1] and CompIdx are the compose CSR: segment s folds the
	// gathered summaries CompIdx[CompOff[s]:CompOff[s+1]] in chain order.
	// Index rr*MaxSummary + li names list entry li of rank rr.
	CompOff, CompIdx []int32
	// MaxSummary is the longest summary list over the ranks: the slots every
	// rank sends in the summary exchange.
	MaxSummary int
}

// maxInt32 is the largest value a table entry or a kernel's int parameter holds.
const maxInt32 = math.MaxInt32

// buildGPUTables lays out rank's tables. The gathered summary array has
// MaxSummary slots per rank, so a segment's summary sits at
// rank*MaxSummary + its index in its rank's summary list.
func buildGPUTables(p *Plan, rank int) (*gpuTables, error) {
	if rank < 0 || rank >= len(p.Ranks) {
		return nil, fmt.Errorf("kcp: gpu tables: rank %d outside the plan's %d ranks", rank, len(p.Ranks))
	}
	rp := &p.Ranks[rank]
	if rp.Tokens > maxInt32 {
		return nil, fmt.Errorf("kcp: gpu tables: rank %d holds %d tokens, more than the kernels' int32 range", rank, rp.Tokens)
	}
	maxSum := p.maxWalk(sched.Summary)
	if int64(len(p.Ranks))*int64(maxSum) > maxInt32 {
		return nil, fmt.Errorf("kcp: gpu tables: %d ranks x %d summary slots exceed int32", len(p.Ranks), maxSum)
	}
	tb := &gpuTables{
		Tokens: rp.Tokens, NS: len(rp.Segments), MaxSummary: maxSum,
		SegChunk0: make([]int32, len(rp.Segments)), SegNChunk: make([]int32, len(rp.Segments)),
		SegStart: make([]int32, len(rp.Segments)), SegLen: make([]int32, len(rp.Segments)),
		TokSeg:  make([]int32, rp.Tokens),
		CompOff: make([]int32, len(rp.Segments)+1),
	}
	at := 0
	for s := range rp.Segments {
		seg := &rp.Segments[s]
		if seg.LocalStart != at || seg.Len < 1 {
			return nil, fmt.Errorf("kcp: gpu tables: rank %d segment %d starts at %d with %d tokens, want a start at %d and at least 1 token",
				rank, s, seg.LocalStart, seg.Len, at)
		}
		tb.SegChunk0[s], tb.SegNChunk[s] = int32(tb.NC), int32(seg.Chunks)
		tb.SegStart[s], tb.SegLen[s] = int32(seg.LocalStart), int32(seg.Len)
		if seg.Chunks != (seg.Len+ChunkSize-1)/ChunkSize {
			return nil, fmt.Errorf("kcp: gpu tables: rank %d segment %d: %d chunks for %d tokens", rank, s, seg.Chunks, seg.Len)
		}
		for c := 0; c < seg.Chunks; c++ {
			n := min(ChunkSize, seg.Len-c*ChunkSize)
			if n < 1 {
				return nil, fmt.Errorf("kcp: gpu tables: rank %d segment %d: chunk %d of %d is empty (length %d)", rank, s, c, seg.Chunks, seg.Len)
			}
			tb.ChunkTok0 = append(tb.ChunkTok0, int32(seg.LocalStart+c*ChunkSize))
			tb.ChunkLen = append(tb.ChunkLen, int32(n))
		}
		tb.NC += seg.Chunks
		for i := 0; i < seg.Len; i++ {
			tb.TokSeg[at+i] = int32(s)
		}
		at += seg.Len
	}
	if at != rp.Tokens {
		return nil, fmt.Errorf("kcp: gpu tables: rank %d segments hold %d tokens, the rank %d", rank, at, rp.Tokens)
	}
	for _, s := range rp.Summary {
		tb.Summary = append(tb.Summary, int32(s))
	}
	slot := p.walkSlot(sched.Summary)
	for s := range rp.Segments {
		seg := &rp.Segments[s]
		tb.CompOff[s] = int32(len(tb.CompIdx))
		if seg.Pred == nil {
			continue
		}
		pos, err := p.chainPos(seg.Doc, SegRef{rank, s})
		if err != nil {
			return nil, err
		}
		for _, ref := range p.Chains[seg.Doc][:pos] {
			li := slot[ref.Rank][ref.Seg]
			if li < 0 {
				return nil, fmt.Errorf("kcp: gpu tables: segment %d of rank %d has a successor but no summary", ref.Seg, ref.Rank)
			}
			tb.CompIdx = append(tb.CompIdx, int32(ref.Rank*maxSum+li))
		}
	}
	tb.CompOff[len(rp.Segments)] = int32(len(tb.CompIdx))
	return tb, nil
}

// gpuRankInputs are one rank's inputs in buffer order (segment by segment),
// as the device takes them.
type gpuRankInputs struct {
	Q, K, V []bf16.BF16 // core: [Tr, HQK*128], [Tr, HQK*128], [Tr, HV*128]
	X       []bf16.BF16 // module: [Tr, C], channels q|k|v
	ConvW   []bf16.BF16 // module: [C, 4]
	G, Beta []float32   // [Tr, HV]
}

// gatherRows copies rows [start, start+n) of src (rows of width w) to dst at
// row at, rounding to bf16.
func gatherRows(dst []bf16.BF16, at int, src []float32, start, n, w int) {
	for i, v := range src[start*w : (start+n)*w] {
		dst[at*w+i] = bf16.Float32ToBF16(v)
	}
}

// gatherGPUInputs gathers rank's tokens of in, in buffer order, converting the
// bf16 tensors to bf16 bits (in parallel blocks of tokens). Core stage: q, k, v; module stage: x = q|k|v per
// token and the conv weights. g and beta in both.
func gatherGPUInputs(p *Plan, rank int, stage Stage, in *Inputs) *gpuRankInputs {
	cfg := p.Config
	rp := &p.Ranks[rank]
	Tr := rp.Tokens
	nq, nv := cfg.HQK*cfg.DK, cfg.HV*cfg.DV
	out := &gpuRankInputs{G: make([]float32, Tr*cfg.HV), Beta: make([]float32, Tr*cfg.HV)}
	bs := tokenBlocks(rp.Segments)
	if stage == StageModule {
		C := p.ConvChannels()
		out.X = make([]bf16.BF16, Tr*C)
		out.ConvW = bf16.FromFloat32s(in.ConvW)
		_ = parallel(len(bs), func(bi int) error {
			b := bs[bi]
			for i := b.i0; i < b.i1; i++ {
				t, row := b.seg.Start+i, out.X[(b.seg.LocalStart+i)*C:(b.seg.LocalStart+i+1)*C]
				for j, v := range in.Q[t*nq : (t+1)*nq] {
					row[j] = bf16.Float32ToBF16(v)
				}
				for j, v := range in.K[t*nq : (t+1)*nq] {
					row[nq+j] = bf16.Float32ToBF16(v)
				}
				for j, v := range in.V[t*nv : (t+1)*nv] {
					row[2*nq+j] = bf16.Float32ToBF16(v)
				}
			}
			return nil
		})
	} else {
		out.Q, out.K, out.V = make([]bf16.BF16, Tr*nq), make([]bf16.BF16, Tr*nq), make([]bf16.BF16, Tr*nv)
		_ = parallel(len(bs), func(bi int) error {
			b := bs[bi]
			at, start, n := b.seg.LocalStart+b.i0, b.seg.Start+b.i0, b.i1-b.i0
			gatherRows(out.Q, at, in.Q, start, n, nq)
			gatherRows(out.K, at, in.K, start, n, nq)
			gatherRows(out.V, at, in.V, start, n, nv)
			return nil
		})
	}
	for _, seg := range rp.Segments {
		copy(out.G[seg.LocalStart*cfg.HV:], in.G[seg.Start*cfg.HV:seg.End()*cfg.HV])
		copy(out.Beta[seg.LocalStart*cfg.HV:], in.Beta[seg.Start*cfg.HV:seg.End()*cfg.HV])
	}
	return out
}

// haloSend is what rank sends in the halo exchange: for each of its
// segments, in a slot of 3*C values (maxSegments slots in all, the same on
// every rank), the segment's last min(3, Len) pre-conv tokens, right-aligned
// (row 3-n+j holds token Len-n+j), zeros elsewhere. The values are the bf16
// inputs as float32, which the exchange carries exactly.
func haloSend(p *Plan, rank int, in *Inputs) []float32 {
	cfg := p.Config
	C := p.ConvChannels()
	nq, nv := cfg.HQK*cfg.DK, cfg.HV*cfg.DV
	per := ConvHalo * C
	send := make([]float32, p.maxSegments()*per)
	for s, seg := range p.Ranks[rank].Segments {
		n := min(ConvHalo, seg.Len)
		for j := 0; j < n; j++ {
			t := seg.End() - n + j
			row := send[s*per+(ConvHalo-n+j)*C : s*per+(ConvHalo-n+j+1)*C]
			for i, v := range in.Q[t*nq : (t+1)*nq] {
				row[i] = bf16.Round(v)
			}
			for i, v := range in.K[t*nq : (t+1)*nq] {
				row[nq+i] = bf16.Round(v)
			}
			for i, v := range in.V[t*nv : (t+1)*nv] {
				row[2*nq+i] = bf16.Round(v)
			}
		}
	}
	return send
}

// haloFromGathered builds rank's conv halo, bf16 [NS, 3, C], from the
// gathered halo sends of every rank (haloSend's layout, rank after rank):
// the pieces the plan names, zeros where the document has fewer (or no)
// earlier tokens.
func haloFromGathered(p *Plan, rank int, all []float32) ([]bf16.BF16, error) {
	C := p.ConvChannels()
	slots := p.maxSegments()
	per := ConvHalo * C
	if len(all) != len(p.Ranks)*slots*per {
		return nil, fmt.Errorf("kcp: halo exchange: got %d values, want %d ranks x %d slots x %d", len(all), len(p.Ranks), slots, per)
	}
	segs := p.Ranks[rank].Segments
	halo := make([]bf16.BF16, len(segs)*per)
	for s := range segs {
		err := haloRows(&segs[s], func(row int, pc HaloPiece, off int) error {
			tr, err := tailRow(p.Ranks[pc.Rank].Segments[pc.Seg].Len, off)
			if err != nil {
				return err
			}
			base := (pc.Rank*slots+pc.Seg)*per + tr*C
			for i, v := range all[base : base+C] {
				halo[s*per+row*C+i] = bf16.Float32ToBF16(v)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("kcp: rank %d segment %d halo: %w", rank, s, err)
		}
	}
	return halo, nil
}

// summarySlot is the number of float32 values of one summary matrix (P or Q)
// of one list entry: HV matrices of 128 x 128.
func summarySlot(hv int) int { return hv * gpuD * gpuD }

// summarySend returns the layout of a rank's summary send: maxSummary P
// slots from offset 0, then maxSummary Q slots from offset qOff, each slot
// summarySlot(hv) values, size values in all. A rank's own P and Q
// ([nlist, HV, 128, 128] each) fill its first nlist slots; the rest is zero.
func summarySend(maxSummary, hv int) (qOff, size int) {
	qOff = maxSummary * summarySlot(hv)
	return qOff, 2 * qOff
}

// summaryBlocks views the gathered summary sends (packSummaries' layout,
// rank after rank) as each rank's P block and Q block, maxSummary slots each,
// without copying: uploading block rr of each to offset rr*maxSummary of
// all_p and all_q gives [R*maxSummary, HV, 128, 128] arrays in which entry
// rr*maxSummary + li is list entry li of rank rr.
func summaryBlocks(all []float32, ranks, maxSummary, hv int) (p, q [][]float32, err error) {
	block := maxSummary * summarySlot(hv)
	if len(all) != ranks*2*block {
		return nil, nil, fmt.Errorf("kcp: summary exchange: got %d values, want %d ranks x 2 x %d", len(all), ranks, block)
	}
	p, q = make([][]float32, ranks), make([][]float32, ranks)
	for rr := 0; rr < ranks; rr++ {
		p[rr] = all[2*rr*block : (2*rr+1)*block]
		q[rr] = all[(2*rr+1)*block : (2*rr+2)*block]
	}
	return p, q, nil
}
