package kcp

import (
	"context"
	"fmt"

	"gonum.org/v1/gonum/mat"

	"github.com/gdnkcp/gdnkcp/comm"
	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/internal/gdnref"
	"github.com/gdnkcp/gdnkcp/sched"
)

func (c *CPU) gdnOptions() gdnref.Options {
	return gdnref.Options{Scale: c.opts.Scale, NoL2Norm: c.opts.NoL2Norm}
}

// preConv returns segment seg's pre-conv tokens, Len x C with channels q|k|v.
func (c *CPU) preConv(seg *Segment, in *Inputs) *mat.Dense {
	cfg := c.plan.Config
	nq, nv := cfg.HQK*cfg.DK, cfg.HV*cfg.DV
	x := mat.NewDense(seg.Len, 2*nq+nv, nil)
	for i := 0; i < seg.Len; i++ {
		t := seg.Start + i
		row := x.RawRowView(i)
		copyF32(row[:nq], in.Q[t*nq:(t+1)*nq])
		copyF32(row[nq:2*nq], in.K[t*nq:(t+1)*nq])
		copyF32(row[2*nq:], in.V[t*nv:(t+1)*nv])
	}
	return x
}

func copyF32(dst []float64, src []float32) {
	for i, v := range src {
		dst[i] = float64(v)
	}
}

// convWeights returns the conv weights as a C x 4 matrix.
func (c *CPU) convWeights(in *Inputs) *mat.Dense {
	w := mat.NewDense(c.plan.ConvChannels(), ConvWidth, nil)
	copyF32(w.RawMatrix().Data, in.ConvW)
	return w
}

// maxSegments is the most segments any rank holds: the slot count of the
// per-segment exchanges, which every rank computes alike from the plan.
func (p *Plan) maxSegments() int {
	n := 0
	for r := range p.Ranks {
		n = max(n, len(p.Ranks[r].Segments))
	}
	return n
}

// maxWalk is the longest walk list of kind k over the ranks.
func (p *Plan) maxWalk(k sched.WalkKind) int {
	n := 0
	for r := range p.Ranks {
		n = max(n, len(p.Ranks[r].Walk(k)))
	}
	return n
}

// walkSlot returns, for walk kind k, slot[rank][seg] = the segment's index in
// its rank's walk list, or -1.
func (p *Plan) walkSlot(k sched.WalkKind) [][]int {
	slot := make([][]int, len(p.Ranks))
	for r := range p.Ranks {
		slot[r] = make([]int, len(p.Ranks[r].Segments))
		for s := range slot[r] {
			slot[r][s] = -1
		}
		for i, s := range p.Ranks[r].Walk(k) {
			slot[r][s] = i
		}
	}
	return slot
}

// chainPos returns the index of ref in its document's chain.
func (p *Plan) chainPos(doc int, ref SegRef) (int, error) {
	for i, x := range p.Chains[doc] {
		if x == ref {
			return i, nil
		}
	}
	return 0, fmt.Errorf("kcp: segment %d of rank %d is not in document %d's chain", ref.Seg, ref.Rank, doc)
}

// haloRows maps a segment's halo pieces onto rows of its 3-row halo: it calls
// fn(row, piece, offset) for every halo token in global order.
func haloRows(seg *Segment, fn func(row int, pc HaloPiece, off int) error) error {
	row := ConvHalo - seg.HaloLen()
	for _, pc := range seg.Halo {
		for o := pc.Offset; o < pc.Offset+pc.Count; o++ {
			if err := fn(row, pc, o); err != nil {
				return err
			}
			row++
		}
	}
	return nil
}

// tailRow is the row of a segment's 3-token tail that holds token off of a
// segment of length n, or an error when off is not among its last 3 tokens.
func tailRow(n, off int) (int, error) {
	row := ConvHalo - (n - off)
	if row < 0 || row >= ConvHalo || off < 0 {
		return 0, fmt.Errorf("kcp: halo token %d of a %d-token segment is not in its last %d", off, n, ConvHalo)
	}
	return row, nil
}

// exchangeHalo sends every segment's last 3 pre-conv tokens to every rank and
// builds each local segment's halo from the pieces the plan names.
func (c *CPU) exchangeHalo(ctx context.Context, cm comm.Communicator, cr *cpuRank, in *Inputs) error {
	p := c.plan
	C := p.ConvChannels()
	slots := p.maxSegments()
	per := ConvHalo * C
	send := make([]float64, slots*per)
	for s, cs := range cr.segs {
		n := min(ConvHalo, cs.seg.Len)
		x := c.preConv(&Segment{Start: cs.seg.End() - n, Len: n}, in)
		for j := 0; j < n; j++ {
			copy(send[s*per+(ConvHalo-n+j)*C:], x.RawRowView(j))
		}
	}
	all, err := comm.AllGatherFloat64(ctx, cm, send)
	if err != nil {
		return fmt.Errorf("rank %d: halo exchange: %w", cm.Rank(), err)
	}
	for _, cs := range cr.segs {
		if len(cs.seg.Halo) == 0 {
			continue
		}
		cs.halo = mat.NewDense(ConvHalo, C, nil)
		err := haloRows(cs.seg, func(row int, pc HaloPiece, off int) error {
			tr, err := tailRow(p.Ranks[pc.Rank].Segments[pc.Seg].Len, off)
			if err != nil {
				return err
			}
			base := (pc.Rank*slots+pc.Seg)*per + tr*C
			copy(cs.halo.RawRowView(row), all[base:base+C])
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// convForward runs the conv of every segment (module stage only).
func (c *CPU) convForward(cr *cpuRank, in *Inputs) error {
	if c.opts.Stage != StageModule {
		return nil
	}
	w := c.convWeights(in)
	C := c.plan.ConvChannels()
	if o := c.opts.convOut; o != nil && len(o) != c.plan.Tokens*C {
		return fmt.Errorf("rank %d: conv output override: %d values for %d tokens x %d channels", cr.rp.Rank, len(o),
			c.plan.Tokens, C)
	}
	return parallel(len(cr.segs), func(s int) error {
		cs := cr.segs[s]
		y, err := gdnref.Conv1dForward(c.preConv(cs.seg, in), w, cs.halo)
		if err != nil {
			return fmt.Errorf("rank %d segment %d: conv: %w", cr.rp.Rank, s, err)
		}
		if o := c.opts.convOut; o != nil {
			for i := range cs.seg.Len {
				copyF32(y.RawRowView(i), o[(cs.seg.Start+i)*C:(cs.seg.Start+i+1)*C])
			}
		} else if c.opts.convBF16 {
			for i := range cs.seg.Len {
				row := y.RawRowView(i)
				for j, v := range row {
					row[j] = float64(bf16.Round(float32(v)))
				}
			}
		}
		cs.y = y
		return nil
	})
}

// headInput returns value head h's inputs over segment cs: from the conv
// output in the module stage, from the inputs in the core stage.
func (c *CPU) headInput(cs *cpuSeg, in *Inputs, h int) (gdnref.Head, error) {
	cfg := c.plan.Config
	qh, err := gdnref.QKHead(h, cfg.HV, cfg.HQK)
	if err != nil {
		return gdnref.Head{}, err
	}
	n := cs.seg.Len
	hd := gdnref.Head{
		Q: mat.NewDense(n, cfg.DK, nil), K: mat.NewDense(n, cfg.DK, nil), V: mat.NewDense(n, cfg.DV, nil),
		G: make([]float64, n), Beta: make([]float64, n),
	}
	nq, nv := cfg.HQK*cfg.DK, cfg.HV*cfg.DV
	for i := 0; i < n; i++ {
		t := cs.seg.Start + i
		if cs.y != nil {
			row := cs.y.RawRowView(i)
			copy(hd.Q.RawRowView(i), row[qh*cfg.DK:(qh+1)*cfg.DK])
			copy(hd.K.RawRowView(i), row[nq+qh*cfg.DK:nq+(qh+1)*cfg.DK])
			copy(hd.V.RawRowView(i), row[2*nq+h*cfg.DV:2*nq+(h+1)*cfg.DV])
		} else {
			copyF32(hd.Q.RawRowView(i), in.Q[t*nq+qh*cfg.DK:t*nq+(qh+1)*cfg.DK])
			copyF32(hd.K.RawRowView(i), in.K[t*nq+qh*cfg.DK:t*nq+(qh+1)*cfg.DK])
			copyF32(hd.V.RawRowView(i), in.V[t*nv+h*cfg.DV:t*nv+(h+1)*cfg.DV])
		}
		hd.G[i] = float64(in.G[t*cfg.HV+h])
		hd.Beta[i] = float64(in.Beta[t*cfg.HV+h])
	}
	return hd, nil
}

// prep runs the chunk prep of every segment and value head, then drops the
// conv output, which only the prep reads.
func (c *CPU) prep(cr *cpuRank, in *Inputs) error {
	hv := c.plan.Config.HV
	defer func() {
		for _, cs := range cr.segs {
			cs.y = nil
		}
	}()
	return parallel(len(cr.segs)*hv, func(i int) error {
		cs, h := cr.segs[i/hv], i%hv
		hd, err := c.headInput(cs, in, h)
		if err != nil {
			return err
		}
		s, err := gdnref.Prep(hd, c.gdnOptions())
		if err != nil {
			return fmt.Errorf("rank %d segment %d head %d: prep: %w", cr.rp.Rank, i/hv, h, err)
		}
		cs.heads[h] = &cpuHead{prep: s}
		return nil
	})
}

// tiles calls fn for each column tile [c0, c1) of cols at tile width w.
func tiles(cols, w int, fn func(c0, c1 int) error) error {
	for c0 := 0; c0 < cols; c0 += w {
		if err := fn(c0, min(c0+w, cols)); err != nil {
			return err
		}
	}
	return nil
}

// walkList runs fn for every (segment of rank walk list k, value head), in
// parallel, with the value-column and key-column tile widths tv and tk that
// the plan decides for k, and returns the results [list index][value head].
func walkList[T any](c *CPU, cr *cpuRank, k sched.WalkKind, fn func(seg, h, tv, tk int) (*T, error)) ([][]*T, error) {
	cfg := c.plan.Config
	r := cr.rp.Rank
	tv, err := c.tile(r, k, cfg.DV)
	if err != nil {
		return nil, err
	}
	tk, err := c.tile(r, k, cfg.DK)
	if err != nil {
		return nil, err
	}
	list := cr.rp.Walk(k)
	out := make([][]*T, len(list))
	for i := range out {
		out[i] = make([]*T, cfg.HV)
	}
	err = parallel(len(list)*cfg.HV, func(i int) error {
		li, h := i/cfg.HV, i%cfg.HV
		x, err := fn(list[li], h, tv, tk)
		out[li][h] = x
		return err
	})
	return out, err
}

// summaryWalk runs the summary walk over the rank's summary list:
// [list index][value head].
func (c *CPU) summaryWalk(cr *cpuRank) ([][]*gdnref.Summary, error) {
	cfg := c.plan.Config
	return walkList(c, cr, sched.Summary, func(seg, h, tv, tk int) (*gdnref.Summary, error) {
		prep := cr.segs[seg].heads[h].prep
		sum := gdnref.NewSummary(prep)
		if err := tiles(cfg.DV, tv, func(v0, v1 int) error { return gdnref.SummaryWalkQTile(prep, sum.Q, v0, v1) }); err != nil {
			return nil, err
		}
		return sum, tiles(cfg.DK, tk, func(c0, c1 int) error { return gdnref.SummaryWalkPTile(prep, sum.P, c0, c1) })
	})
}

// exchangeSummaries all-gathers the (P, Q) of every exported segment:
// [rank][list index][value head].
func (c *CPU) exchangeSummaries(ctx context.Context, cm comm.Communicator, sums [][]*gdnref.Summary) ([][][]*gdnref.Summary, error) {
	return exchangeMaps(ctx, c, cm, sched.Summary, "summary", sums,
		func(s *gdnref.Summary) [2]*mat.Dense { return [2]*mat.Dense{s.P, s.Q} },
		func(m [2]*mat.Dense) *gdnref.Summary { return &gdnref.Summary{P: m[0], Q: m[1]} })
}

// exchangeMaps all-gathers the per-segment affine maps of walk list k
// (summaries or offsets, local[list index][value head], each taken apart by
// split and rebuilt by join) through exchangeAffine: [rank][list index][value head].
func exchangeMaps[T any](ctx context.Context, c *CPU, cm comm.Communicator, k sched.WalkKind, what string, local [][]*T,
	split func(*T) [2]*mat.Dense, join func([2]*mat.Dense) *T) ([][][]*T, error) {
	mats := make([][][2]*mat.Dense, len(local))
	for li, heads := range local {
		mats[li] = make([][2]*mat.Dense, len(heads))
		for h, x := range heads {
			mats[li][h] = split(x)
		}
	}
	all, err := c.exchangeAffine(ctx, cm, k, what, mats)
	out := make([][][]*T, len(all))
	for r, list := range all {
		out[r] = make([][]*T, len(list))
		for li, heads := range list {
			out[r][li] = make([]*T, len(heads))
			for h, m := range heads {
				out[r][li][h] = join(m)
			}
		}
	}
	return out, err
}

// exchangeAffine all-gathers the affine maps of walk list k, a K x K and a
// K x V matrix per segment and value head, local[list index][value head],
// and returns every rank's: [rank][list index][value head]. Every rank sends
// as many slots as the longest list of kind k, which it knows from the plan.
func (c *CPU) exchangeAffine(ctx context.Context, cm comm.Communicator, k sched.WalkKind, what string, local [][][2]*mat.Dense) ([][][][2]*mat.Dense, error) {
	p := c.plan
	cfg := p.Config
	slots := p.maxWalk(k)
	if slots == 0 {
		return nil, nil
	}
	kk := cfg.DK * cfg.DK
	per := kk + cfg.DK*cfg.DV
	send := make([]float64, slots*cfg.HV*per)
	for li, heads := range local {
		for h, m := range heads {
			base := (li*cfg.HV + h) * per
			copy(send[base:], m[0].RawMatrix().Data)
			copy(send[base+kk:], m[1].RawMatrix().Data)
		}
	}
	all, err := comm.AllGatherFloat64(ctx, cm, send)
	if err != nil {
		return nil, fmt.Errorf("rank %d: %s exchange: %w", cm.Rank(), what, err)
	}
	out := make([][][][2]*mat.Dense, len(p.Ranks))
	for r := range p.Ranks {
		n := len(p.Ranks[r].Walk(k))
		out[r] = make([][][2]*mat.Dense, n)
		for li := 0; li < n; li++ {
			out[r][li] = make([][2]*mat.Dense, cfg.HV)
			for h := 0; h < cfg.HV; h++ {
				base := ((r*slots+li)*cfg.HV + h) * per
				out[r][li][h] = [2]*mat.Dense{
					mat.NewDense(cfg.DK, cfg.DK, all[base:base+kk]),
					mat.NewDense(cfg.DK, cfg.DV, all[base+kk:base+per]),
				}
			}
		}
	}
	return out, nil
}

// compose folds each local segment's chain in document order into its true
// start state (zero for a segment that starts its document).
func (c *CPU) compose(cr *cpuRank, all [][][]*gdnref.Summary) error {
	p := c.plan
	cfg := p.Config
	slot := p.walkSlot(sched.Summary)
	for s, cs := range cr.segs {
		if cs.seg.Pred == nil {
			for _, hd := range cs.heads {
				hd.start = mat.NewDense(cfg.DK, cfg.DV, nil)
			}
			continue
		}
		chain := p.Chains[cs.seg.Doc]
		pos, err := p.chainPos(cs.seg.Doc, SegRef{cr.rp.Rank, s})
		if err != nil {
			return err
		}
		for h, hd := range cs.heads {
			sums := make([]*gdnref.Summary, pos)
			for j := 0; j < pos; j++ {
				ref := chain[j]
				li := slot[ref.Rank][ref.Seg]
				if li < 0 {
					return fmt.Errorf("kcp: compose: segment %d of rank %d has a successor but no summary", ref.Seg, ref.Rank)
				}
				sums[j] = all[ref.Rank][li][h]
			}
			starts, err := gdnref.ComposeForward(nil, sums, cfg.DK, cfg.DV)
			if err != nil {
				return err
			}
			hd.start = starts[pos]
		}
	}
	return nil
}

// stateWalk runs the state walk of every segment and value head from its
// true start state, then the output, which it writes to out.
func (c *CPU) stateWalk(cr *cpuRank, out *Output) error {
	cfg := c.plan.Config
	tv, err := c.tile(cr.rp.Rank, sched.State, cfg.DV)
	if err != nil {
		return err
	}
	return parallel(len(cr.segs)*cfg.HV, func(i int) error {
		cs, h := cr.segs[i/cfg.HV], i%cfg.HV
		hd := cs.heads[h]
		st := gdnref.NewStates(hd.prep)
		if err := tiles(cfg.DV, tv, func(v0, v1 int) error { return gdnref.StateWalkTile(hd.prep, hd.start, st, v0, v1) }); err != nil {
			return err
		}
		o, err := gdnref.Output(hd.prep, st)
		if err != nil {
			return err
		}
		hd.states = st
		for j := 0; j < cs.seg.Len; j++ {
			t := cs.seg.Start + j
			copy(out.O[(t*cfg.HV+h)*cfg.DV:(t*cfg.HV+h+1)*cfg.DV], o.RawRowView(j))
		}
		return nil
	})
}
