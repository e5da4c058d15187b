package kcp

import (
	"context"
	"fmt"

	"gonum.org/v1/gonum/mat"

	"github.com/gdnkcp/gdnkcp/comm"
	"github.com/gdnkcp/gdnkcp/internal/gdnref"
	"github.com/gdnkcp/gdnkcp/sched"
)

// bwdHead is one value head's backward state on one segment.
type bwdHead struct {
	dO, dvLocal *mat.Dense
	dEnd        *mat.Dense // true terminal adjoint
	grads       *gdnref.Grads
}

// Backward runs the backward for dout (the gradient of the output, [T, HV,
// DV], bf16 values as float32) over every rank and returns the gradients of
// the inputs. It communicates the offsets of the segments that have a chain
// predecessor (and, in the module stage, the conv halo gradients and the conv
// weight gradient), and reads every walk's width from the plan's memo.
func (a *Activations) Backward(ctx context.Context, dout []float32) (*Grads, error) {
	if a == nil || a.be == nil {
		return nil, fmt.Errorf("kcp: backward: the activations are empty")
	}
	c := a.be
	p := c.plan
	if err := p.CheckDOut(dout, false); err != nil {
		return nil, err
	}
	cfg := p.Config
	T := p.Tokens
	g := &Grads{
		DQ: make([]float64, T*cfg.HQK*cfg.DK), DK: make([]float64, T*cfg.HQK*cfg.DK),
		DV: make([]float64, T*cfg.HV*cfg.DV), DG: make([]float64, T*cfg.HV), DBeta: make([]float64, T*cfg.HV),
	}
	if c.opts.Stage == StageModule {
		g.DConvW = make([]float64, p.ConvChannels()*ConvWidth)
	}
	comms, err := comm.NewLoopback(len(p.Ranks))
	if err != nil {
		return nil, err
	}
	err = comm.RunRanks(ctx, comms, func(ctx context.Context, cm comm.Communicator) error {
		return c.backwardRank(ctx, cm, a.ranks[cm.Rank()], a.in, dout, g)
	})
	if err != nil {
		return nil, fmt.Errorf("kcp: cpu backward: %w", err)
	}
	return g, nil
}

func (c *CPU) backwardRank(ctx context.Context, cm comm.Communicator, cr *cpuRank, in *Inputs, dout []float32, g *Grads) error {
	p := c.plan
	cfg := p.Config
	r := cr.rp.Rank
	bw := make([][]*bwdHead, len(cr.segs))
	for s := range bw {
		bw[s] = make([]*bwdHead, cfg.HV)
	}
	// dV'_local from dO through the in-chunk attention term.
	err := parallel(len(cr.segs)*cfg.HV, func(i int) error {
		s, h := i/cfg.HV, i%cfg.HV
		cs := cr.segs[s]
		dO := mat.NewDense(cs.seg.Len, cfg.DV, nil)
		for j := 0; j < cs.seg.Len; j++ {
			t := cs.seg.Start + j
			copyF32(dO.RawRowView(j), dout[(t*cfg.HV+h)*cfg.DV:(t*cfg.HV+h+1)*cfg.DV])
		}
		dvl, err := gdnref.DVLocal(cs.heads[h].prep, dO)
		if err != nil {
			return err
		}
		bw[s][h] = &bwdHead{dO: dO, dvLocal: dvl}
		return nil
	})
	if err != nil {
		return err
	}
	c.opts.progress(r, "dv local")
	offs, err := c.offsetWalk(cr, bw)
	if err != nil {
		return err
	}
	c.opts.progress(r, "offset walk")
	all, err := c.exchangeOffsets(ctx, cm, offs)
	if err != nil {
		return err
	}
	c.opts.progress(r, "exchange offsets")
	if err := c.reverseCompose(cr, bw, all); err != nil {
		return err
	}
	c.opts.progress(r, "reverse compose")
	tv, err := c.tile(r, sched.Tape, cfg.DV)
	if err != nil {
		return err
	}
	tapes := make([][]*gdnref.Tape, len(cr.segs))
	for s := range tapes {
		tapes[s] = make([]*gdnref.Tape, cfg.HV)
	}
	err = parallel(len(cr.segs)*cfg.HV, func(i int) error {
		s, h := i/cfg.HV, i%cfg.HV
		hd, b := cr.segs[s].heads[h], bw[s][h]
		tp := gdnref.NewTape(hd.prep)
		err := tiles(cfg.DV, tv, func(v0, v1 int) error {
			return gdnref.TapeWalkTile(hd.prep, b.dvLocal, b.dO, b.dEnd, tp, v0, v1)
		})
		tapes[s][h] = tp
		return err
	})
	if err != nil {
		return err
	}
	c.opts.progress(r, "tape walk")
	err = parallel(len(cr.segs)*cfg.HV, func(i int) error {
		s, h := i/cfg.HV, i%cfg.HV
		hd, b := cr.segs[s].heads[h], bw[s][h]
		gr, err := gdnref.ChunkGrads(hd.prep, hd.states, tapes[s][h], b.dO)
		if err != nil {
			return fmt.Errorf("rank %d segment %d head %d: chunk grads: %w", r, s, h, err)
		}
		b.grads = gr
		tapes[s][h] = nil
		return nil
	})
	if err != nil {
		return err
	}
	c.opts.progress(r, "chunk grads")
	dqk, err := c.sumQK(cr, bw)
	if err != nil {
		return err
	}
	c.writeGateGrads(cr, bw, g)
	if c.opts.Stage == StageModule {
		err = c.convBackward(ctx, cm, cr, bw, dqk, in, g)
	} else {
		c.writeQKVGrads(cr, bw, dqk, g)
	}
	c.opts.progress(r, "conv backward")
	return err
}

// offsetWalk runs the offset walk over the rank's offset list:
// [list index][value head].
func (c *CPU) offsetWalk(cr *cpuRank, bw [][]*bwdHead) ([][]*gdnref.Offset, error) {
	cfg := c.plan.Config
	return walkList(c, cr, sched.Offset, func(seg, h, tv, tk int) (*gdnref.Offset, error) {
		prep, b := cr.segs[seg].heads[h].prep, bw[seg][h]
		off := gdnref.NewOffset(prep)
		if err := tiles(cfg.DV, tv, func(v0, v1 int) error {
			return gdnref.OffsetWalkRTile(prep, b.dvLocal, b.dO, off.R, v0, v1)
		}); err != nil {
			return nil, err
		}
		return off, tiles(cfg.DK, tk, func(c0, c1 int) error { return gdnref.OffsetWalkPTTile(prep, off.PT, c0, c1) })
	})
}

// exchangeOffsets all-gathers the (P^T, R) of every segment with a
// predecessor: [rank][list index][value head].
func (c *CPU) exchangeOffsets(ctx context.Context, cm comm.Communicator, offs [][]*gdnref.Offset) ([][][]*gdnref.Offset, error) {
	return exchangeMaps(ctx, c, cm, sched.Offset, "offset", offs,
		func(o *gdnref.Offset) [2]*mat.Dense { return [2]*mat.Dense{o.PT, o.R} },
		func(m [2]*mat.Dense) *gdnref.Offset { return &gdnref.Offset{PT: m[0], R: m[1]} })
}

// reverseCompose folds each local segment's successors, from the document's
// end, into its true terminal adjoint (zero for a document's last segment).
func (c *CPU) reverseCompose(cr *cpuRank, bw [][]*bwdHead, all [][][]*gdnref.Offset) error {
	p := c.plan
	cfg := p.Config
	slot := p.walkSlot(sched.Offset)
	for s, cs := range cr.segs {
		if cs.seg.Succ == nil {
			for _, b := range bw[s] {
				b.dEnd = mat.NewDense(cfg.DK, cfg.DV, nil)
			}
			continue
		}
		chain := p.Chains[cs.seg.Doc]
		pos, err := p.chainPos(cs.seg.Doc, SegRef{cr.rp.Rank, s})
		if err != nil {
			return err
		}
		for h, b := range bw[s] {
			offs := make([]*gdnref.Offset, 0, len(chain)-pos-1)
			for j := pos + 1; j < len(chain); j++ {
				ref := chain[j]
				li := slot[ref.Rank][ref.Seg]
				if li < 0 {
					return fmt.Errorf("kcp: reverse compose: segment %d of rank %d has a predecessor but no offset", ref.Seg, ref.Rank)
				}
				offs = append(offs, all[ref.Rank][li][h])
			}
			ends, err := gdnref.ComposeBackward(nil, offs, cfg.DK, cfg.DV)
			if err != nil {
				return err
			}
			b.dEnd = ends[0]
		}
	}
	return nil
}

// sumQK sums dq and dk over the value heads of each QK head in fixed order:
// [segment][0 for dq, 1 for dk][QK head].
func (c *CPU) sumQK(cr *cpuRank, bw [][]*bwdHead) ([][2][]*mat.Dense, error) {
	cfg := c.plan.Config
	out := make([][2][]*mat.Dense, len(cr.segs))
	for s := range cr.segs {
		dq := make([]*mat.Dense, cfg.HV)
		dk := make([]*mat.Dense, cfg.HV)
		for h, b := range bw[s] {
			dq[h], dk[h] = b.grads.DQ, b.grads.DK
		}
		var err error
		if out[s][0], err = gdnref.SumOverValueHeads(dq, cfg.HQK); err != nil {
			return nil, err
		}
		if out[s][1], err = gdnref.SumOverValueHeads(dk, cfg.HQK); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// writeGateGrads writes dg and dbeta of the rank's tokens.
func (c *CPU) writeGateGrads(cr *cpuRank, bw [][]*bwdHead, g *Grads) {
	hv := c.plan.Config.HV
	for s, cs := range cr.segs {
		for h, b := range bw[s] {
			for j := 0; j < cs.seg.Len; j++ {
				t := cs.seg.Start + j
				g.DG[t*hv+h] = b.grads.DG[j]
				g.DBeta[t*hv+h] = b.grads.DBeta[j]
			}
		}
	}
}

// writeQKVGrads writes dq, dk and dv of the rank's tokens (core stage).
func (c *CPU) writeQKVGrads(cr *cpuRank, bw [][]*bwdHead, dqk [][2][]*mat.Dense, g *Grads) {
	cfg := c.plan.Config
	nq, nv := cfg.HQK*cfg.DK, cfg.HV*cfg.DV
	for s, cs := range cr.segs {
		for j := 0; j < cs.seg.Len; j++ {
			t := cs.seg.Start + j
			for qh := 0; qh < cfg.HQK; qh++ {
				copy(g.DQ[t*nq+qh*cfg.DK:], dqk[s][0][qh].RawRowView(j))
				copy(g.DK[t*nq+qh*cfg.DK:], dqk[s][1][qh].RawRowView(j))
			}
			for h := 0; h < cfg.HV; h++ {
				copy(g.DV[t*nv+h*cfg.DV:], bw[s][h].grads.DV.RawRowView(j))
			}
		}
	}
}

// convBackward runs the conv backward of the rank's segments, sends each
// halo gradient to the segments that own those tokens, adds the halo
// gradients it receives in fixed (rank, segment) order, writes the pre-conv
// dq, dk, dv, and sums the conv weight gradient over segments and then ranks
// in fixed order.
func (c *CPU) convBackward(ctx context.Context, cm comm.Communicator, cr *cpuRank, bw [][]*bwdHead, dqk [][2][]*mat.Dense, in *Inputs, g *Grads) error {
	p := c.plan
	cfg := p.Config
	C := p.ConvChannels()
	nq, nv := cfg.HQK*cfg.DK, cfg.HV*cfg.DV
	w := c.convWeights(in)
	slots := p.maxSegments()
	per := ConvHalo * C
	dxs := make([]*mat.Dense, len(cr.segs))
	sendHalo := make([]float64, slots*per)
	dwRank := make([]float64, C*ConvWidth)
	dws := make([]*mat.Dense, len(cr.segs))
	err := parallel(len(cr.segs), func(s int) error {
		cs := cr.segs[s]
		dy := mat.NewDense(cs.seg.Len, C, nil)
		for j := 0; j < cs.seg.Len; j++ {
			row := dy.RawRowView(j)
			for qh := 0; qh < cfg.HQK; qh++ {
				copy(row[qh*cfg.DK:], dqk[s][0][qh].RawRowView(j))
				copy(row[nq+qh*cfg.DK:], dqk[s][1][qh].RawRowView(j))
			}
			for h := 0; h < cfg.HV; h++ {
				copy(row[2*nq+h*cfg.DV:], bw[s][h].grads.DV.RawRowView(j))
			}
		}
		dx, dhalo, dw, err := gdnref.Conv1dBackward(c.preConv(cs.seg, in), w, cs.halo, dy)
		if err != nil {
			return fmt.Errorf("rank %d segment %d: conv backward: %w", cr.rp.Rank, s, err)
		}
		dxs[s], dws[s] = dx, dw
		if dhalo != nil {
			copy(sendHalo[s*per:(s+1)*per], dhalo.RawMatrix().Data)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, dw := range dws { // segments in buffer order
		for i, v := range dw.RawMatrix().Data {
			dwRank[i] += v
		}
	}
	all, err := comm.AllGatherFloat64(ctx, cm, sendHalo)
	if err != nil {
		return fmt.Errorf("rank %d: halo gradient exchange: %w", cm.Rank(), err)
	}
	me := cr.rp.Rank
	for rr := range p.Ranks {
		for ss := range p.Ranks[rr].Segments {
			seg := &p.Ranks[rr].Segments[ss]
			err := haloRows(seg, func(row int, pc HaloPiece, off int) error {
				if pc.Rank != me {
					return nil
				}
				src := all[(rr*slots+ss)*per+row*C : (rr*slots+ss)*per+(row+1)*C]
				dst := dxs[pc.Seg].RawRowView(off)
				for i, v := range src {
					dst[i] += v
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
	}
	for s, cs := range cr.segs {
		for j := 0; j < cs.seg.Len; j++ {
			t := cs.seg.Start + j
			row := dxs[s].RawRowView(j)
			copy(g.DQ[t*nq:(t+1)*nq], row[:nq])
			copy(g.DK[t*nq:(t+1)*nq], row[nq:2*nq])
			copy(g.DV[t*nv:(t+1)*nv], row[2*nq:])
		}
	}
	dwAll, err := comm.AllGatherFloat64(ctx, cm, dwRank)
	if err != nil {
		return fmt.Errorf("rank %d: conv weight gradient exchange: %w", cm.Rank(), err)
	}
	if me == 0 {
		for rr := range p.Ranks { // ranks in order
			for i := range g.DConvW {
				g.DConvW[i] += dwAll[rr*C*ConvWidth+i]
			}
		}
	}
	return nil
}
