package kcp

import (
	"context"
	"fmt"
	"math"

	"gonum.org/v1/gonum/mat"

	"github.com/gdnkcp/gdnkcp/internal/gdnref"
)

// Reference computes the output and the gradients of the whole pack with the
// naive token-by-token recurrence in float64, document by document, with no
// chunks, no ranks and no exchange: the ground truth the CP backends are
// checked against. dout may be nil to skip the backward.
func Reference(ctx context.Context, p *Plan, in *Inputs, dout []float32, opts Options) (*Output, *Grads, error) {
	be, err := NewCPU(p, opts)
	if err != nil {
		return nil, nil, err
	}
	c := be
	if err := in.Validate(p, c.opts.Stage, false); err != nil {
		return nil, nil, err
	}
	if dout != nil {
		if err := p.CheckDOut(dout, false); err != nil {
			return nil, nil, err
		}
	}
	cfg := p.Config
	T := p.Tokens
	out := &Output{O: make([]float64, T*cfg.HV*cfg.DV)}
	var g *Grads
	if dout != nil {
		g = &Grads{
			DQ: make([]float64, T*cfg.HQK*cfg.DK), DK: make([]float64, T*cfg.HQK*cfg.DK),
			DV: make([]float64, T*cfg.HV*cfg.DV), DG: make([]float64, T*cfg.HV), DBeta: make([]float64, T*cfg.HV),
		}
	}
	var w *mat.Dense
	if c.opts.Stage == StageModule {
		w = c.convWeights(in)
		if g != nil {
			g.DConvW = make([]float64, p.ConvChannels()*ConvWidth)
		}
	}
	opt := c.gdnOptions()
	docs := make([]*cpuSeg, len(cfg.Docs))
	err = parallel(len(docs), func(d int) error {
		cs := &cpuSeg{seg: &Segment{Doc: d, Start: p.DocStarts[d], Len: cfg.Docs[d]}}
		docs[d] = cs
		if w == nil {
			return nil
		}
		var err error
		cs.x = c.preConv(cs.seg, in)
		if cs.y, err = gdnref.Conv1dForward(cs.x, w, nil); err != nil {
			return fmt.Errorf("kcp: reference: document %d: conv: %w", d, err)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	// One job per (document, value head); each writes only its own entries.
	grads := make([][]*gdnref.Grads, len(docs))
	for d := range grads {
		grads[d] = make([]*gdnref.Grads, cfg.HV)
	}
	err = parallel(len(docs)*cfg.HV, func(i int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		d, h := i/cfg.HV, i%cfg.HV
		cs := docs[d]
		hd, err := c.headInput(cs, in, h)
		if err != nil {
			return err
		}
		var (
			o  *mat.Dense
			gr *gdnref.Grads
		)
		if dout == nil {
			if o, _, err = gdnref.Forward(hd, nil, opt); err != nil {
				return fmt.Errorf("kcp: reference: document %d head %d: %w", d, h, err)
			}
		} else {
			dO := mat.NewDense(cs.seg.Len, cfg.DV, nil)
			for j := 0; j < cs.seg.Len; j++ {
				t := cs.seg.Start + j
				copyF32(dO.RawRowView(j), dout[(t*cfg.HV+h)*cfg.DV:(t*cfg.HV+h+1)*cfg.DV])
			}
			// Forward and Backward in one call (one forward pass fewer, the same bits).
			if o, _, gr, err = gdnref.ForwardBackward(hd, nil, dO, nil, opt); err != nil {
				return fmt.Errorf("kcp: reference: document %d head %d: %w", d, h, err)
			}
		}
		for j := 0; j < cs.seg.Len; j++ {
			t := cs.seg.Start + j
			copy(out.O[(t*cfg.HV+h)*cfg.DV:(t*cfg.HV+h+1)*cfg.DV], o.RawRowView(j))
		}
		grads[d][h] = gr
		return nil
	})
	if err != nil || dout == nil {
		return out, nil, err
	}
	// One job per document: each writes its own tokens' gradients and its
	// conv weight gradient, which are then summed in document order.
	dws := make([]*mat.Dense, len(docs))
	err = parallel(len(docs), func(d int) error {
		cs := docs[d]
		cr := &cpuRank{segs: []*cpuSeg{cs}}
		bw := [][]*bwdHead{make([]*bwdHead, cfg.HV)}
		for h := range bw[0] {
			bw[0][h] = &bwdHead{grads: grads[d][h]}
		}
		dqk, err := c.sumQK(cr, bw)
		if err != nil {
			return err
		}
		c.writeGateGrads(cr, bw, g)
		if w == nil {
			c.writeQKVGrads(cr, bw, dqk, g)
			return nil
		}
		if dws[d], err = c.refConvBackward(cs, bw[0], dqk[0], w, g); err != nil {
			return fmt.Errorf("kcp: reference: document %d: %w", d, err)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	for _, dw := range dws { // documents in order
		if dw == nil {
			continue
		}
		for i, v := range dw.RawMatrix().Data {
			g.DConvW[i] += v
		}
	}
	return out, g, nil
}

// refConvBackward is the conv backward of one whole document (no halo): it
// writes the document's tokens of dq, dk and dv and returns its conv weight
// gradient.
func (c *CPU) refConvBackward(cs *cpuSeg, bw []*bwdHead, dqk [2][]*mat.Dense, w *mat.Dense, g *Grads) (*mat.Dense, error) {
	cfg := c.plan.Config
	C := c.plan.ConvChannels()
	nq, nv := cfg.HQK*cfg.DK, cfg.HV*cfg.DV
	dy := mat.NewDense(cs.seg.Len, C, nil)
	for j := 0; j < cs.seg.Len; j++ {
		row := dy.RawRowView(j)
		for qh := 0; qh < cfg.HQK; qh++ {
			copy(row[qh*cfg.DK:], dqk[0][qh].RawRowView(j))
			copy(row[nq+qh*cfg.DK:], dqk[1][qh].RawRowView(j))
		}
		for h := 0; h < cfg.HV; h++ {
			copy(row[2*nq+h*cfg.DV:], bw[h].grads.DV.RawRowView(j))
		}
	}
	dx, _, dw, err := gdnref.Conv1dBackward(cs.x, w, nil, dy)
	if err != nil {
		return nil, err
	}
	for j := 0; j < cs.seg.Len; j++ {
		t := cs.seg.Start + j
		row := dx.RawRowView(j)
		copy(g.DQ[t*nq:(t+1)*nq], row[:nq])
		copy(g.DK[t*nq:(t+1)*nq], row[nq:2*nq])
		copy(g.DV[t*nv:(t+1)*nv], row[2*nq:])
	}
	return dw, nil
}

// RelErr is the norm-wise relative error ||got - want|| / ||want|| (0 when
// both are zero, +Inf when only want is). NaN anywhere gives NaN.
func RelErr(got, want []float64) float64 {
	if len(got) != len(want) {
		return math.NaN()
	}
	var num, den float64
	for i := range got {
		d := got[i] - want[i]
		num += d * d
		den += want[i] * want[i]
	}
	switch {
	case math.IsNaN(num) || math.IsNaN(den):
		return math.NaN()
	case den == 0 && num == 0:
		return 0
	case den == 0:
		return math.Inf(1)
	}
	return math.Sqrt(num / den)
}

// Named is a named float64 tensor.
type Named struct {
	Name string
	Data []float64
}

// Tensors lists the gradients by name (dq, dk, dv, dg, dbeta, and dconv_w
// when set), in that order.
func (g *Grads) Tensors() []Named {
	if g == nil {
		return nil
	}
	t := []Named{{"dq", g.DQ}, {"dk", g.DK}, {"dv", g.DV}, {"dg", g.DG}, {"dbeta", g.DBeta}}
	if g.DConvW != nil {
		t = append(t, Named{"dconv_w", g.DConvW})
	}
	return t
}

// TensorErr is one tensor's relative error.
type TensorErr struct {
	Name   string
	RelErr float64
}

// GradErrors returns the relative error of every gradient of got against want.
func GradErrors(got, want *Grads) ([]TensorErr, error) {
	gt, wt := got.Tensors(), want.Tensors()
	if len(gt) != len(wt) {
		return nil, fmt.Errorf("kcp: gradient sets differ: %d vs %d tensors", len(gt), len(wt))
	}
	out := make([]TensorErr, len(gt))
	for i := range gt {
		out[i] = TensorErr{gt[i].Name, RelErr(gt[i].Data, wt[i].Data)}
	}
	return out, nil
}
