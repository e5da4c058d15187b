package gdnref

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/mat"
)

// ConvWidth is the width of the depthwise causal conv in front of the GDN.
const ConvWidth = 4

// ConvHalo is the number of tokens before a segment that its conv reads: ConvWidth - 1.
const ConvHalo = ConvWidth - 1

func sigmoid(z float64) float64 { return 1 / (1 + math.Exp(-z)) }

// convInput checks the shapes of a conv call and returns the T+3 rows the conv reads for a segment, as row
// slices that share storage with halo (3 x C; nil means zeros, as at a document's start) and x (T x C).
func convInput(x, w, halo *mat.Dense) ([][]float64, error) {
	if x == nil || w == nil {
		return nil, fmt.Errorf("gdnref: conv: x and w must be set")
	}
	t, ch := x.Dims()
	if r, c := w.Dims(); r != ch || c != ConvWidth {
		return nil, fmt.Errorf("gdnref: conv: w is %dx%d, want %dx%d (channels x width)", r, c, ch, ConvWidth)
	}
	if err := checkState("conv halo", halo, ConvHalo, ch); err != nil {
		return nil, err
	}
	xp := make([][]float64, t+ConvHalo)
	for r := 0; r < ConvHalo; r++ {
		if halo != nil {
			xp[r] = halo.RawRowView(r)
		} else {
			xp[r] = make([]float64, ch)
		}
	}
	for r := 0; r < t; r++ {
		xp[ConvHalo+r] = x.RawRowView(r)
	}
	return xp, nil
}

// convWeights returns w (C x 4) as one row-major slice: w[c,i] at c*ConvWidth+i.
func convWeights(w *mat.Dense) []float64 {
	raw := w.RawMatrix()
	if raw.Stride == ConvWidth {
		return raw.Data[:raw.Rows*ConvWidth]
	}
	out := make([]float64, 0, raw.Rows*ConvWidth)
	for c := 0; c < raw.Rows; c++ {
		out = append(out, w.RawRowView(c)...)
	}
	return out
}

// convPreRow writes into z (C) the pre-activation of token r, z[c] = sum_{i=0..3} w[c,i] xp_{r+i}[c] (in
// that order, from 0), with xp the padded input rows (xp_{r+i} = x_{r-3+i}).
func convPreRow(z []float64, xp [][]float64, w []float64, r int) {
	x0, x1, x2, x3 := xp[r][:len(z)], xp[r+1][:len(z)], xp[r+2][:len(z)], xp[r+3][:len(z)]
	w = w[:ConvWidth*len(z)]
	for c := range z {
		wc := w[c*ConvWidth : c*ConvWidth+ConvWidth : c*ConvWidth+ConvWidth]
		acc := 0.0
		acc += wc[0] * x0[c]
		acc += wc[1] * x1[c]
		acc += wc[2] * x2[c]
		acc += wc[3] * x3[c]
		z[c] = acc
	}
}

// Conv1dForward is the depthwise causal conv1d of width 4 with SiLU over the channels of one segment:
//
//	y_t[c] = silu(z_t[c]),   z_t[c] = sum_{i=0..3} w[c,i] x_{t-3+i}[c],   silu(z) = z sigmoid(z)
//
// x is T x C (tokens x channels), w is C x 4, and halo (3 x C) holds the tokens x_{-3}, x_{-2}, x_{-1}: the
// last three tokens of the same document before the segment (zero rows where the document has fewer); nil
// means zeros, for a segment that starts its document. It returns y (T x C).
func Conv1dForward(x, w, halo *mat.Dense) (*mat.Dense, error) {
	xp, err := convInput(x, w, halo)
	if err != nil {
		return nil, err
	}
	t, ch := x.Dims()
	wd := convWeights(w)
	y := mat.NewDense(t, ch, nil)
	for r := 0; r < t; r++ {
		yr := y.RawRowView(r)
		convPreRow(yr, xp, wd, r)
		for c, z := range yr {
			yr[c] = z * sigmoid(z)
		}
	}
	return y, nil
}

// Conv1dBackward is the reverse mode of Conv1dForward for dL/dy = dy (T x C). With
// silu'(z) = sigmoid(z) (1 + z (1 - sigmoid(z))) and dz = dy ⊙ silu'(z):
//
//	dx_{t-3+i}[c] += w[c,i] dz_t[c],     dw[c,i] = sum_t dz_t[c] x_{t-3+i}[c]    (t ascending)
//
// It returns dx (T x C), dhalo (3 x C: the gradient of the halo tokens, to be added to the gradients of the
// segment(s) that own them; nil when halo is nil, as the zero padding before a document is no input) and dw
// (C x 4, this segment's part: the caller sums the parts of all segments in a fixed order).
func Conv1dBackward(x, w, halo, dy *mat.Dense) (dx, dhalo, dw *mat.Dense, err error) {
	xp, err := convInput(x, w, halo)
	if err != nil {
		return nil, nil, nil, err
	}
	t, ch := x.Dims()
	if err := checkOut("conv dy", dy, t, ch); err != nil {
		return nil, nil, nil, err
	}
	wd := convWeights(w)
	// dxp holds the gradients of the padded rows: the halo's (dhalo, or scratch when there is no halo)
	// then x's (dx).
	dh := mat.NewDense(ConvHalo, ch, nil)
	dx = mat.NewDense(t, ch, nil)
	dxp := make([][]float64, t+ConvHalo)
	for r := 0; r < ConvHalo; r++ {
		dxp[r] = dh.RawRowView(r)
	}
	for r := 0; r < t; r++ {
		dxp[ConvHalo+r] = dx.RawRowView(r)
	}
	dw = mat.NewDense(ch, ConvWidth, nil)
	dwd := dw.RawMatrix().Data[:ch*ConvWidth]
	dz := make([]float64, ch)
	for r := 0; r < t; r++ {
		convPreRow(dz, xp, wd, r)
		dyr := dy.RawRowView(r)[:ch]
		for c, z := range dz {
			sg := sigmoid(z)
			dz[c] = dyr[c] * sg * (1 + z*(1-sg))
		}
		x0, x1, x2, x3 := xp[r][:ch], xp[r+1][:ch], xp[r+2][:ch], xp[r+3][:ch]
		d0, d1, d2, d3 := dxp[r][:ch], dxp[r+1][:ch], dxp[r+2][:ch], dxp[r+3][:ch]
		for c, g := range dz {
			wc := wd[c*ConvWidth : c*ConvWidth+ConvWidth : c*ConvWidth+ConvWidth]
			dwc := dwd[c*ConvWidth : c*ConvWidth+ConvWidth : c*ConvWidth+ConvWidth]
			d0[c] += wc[0] * g
			dwc[0] += g * x0[c]
			d1[c] += wc[1] * g
			dwc[1] += g * x1[c]
			d2[c] += wc[2] * g
			dwc[2] += g * x2[c]
			d3[c] += wc[3] * g
			dwc[3] += g * x3[c]
		}
	}
	if halo != nil {
		dhalo = dh
	}
	return dx, dhalo, dw, nil
}
