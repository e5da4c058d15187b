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

// convInput returns the T+3 rows the conv reads for a segment: halo (3 x C; nil means zeros, as at a
// document's start) followed by x (T x C).
func convInput(x, w, halo *mat.Dense) (*mat.Dense, error) {
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
	xp := mat.NewDense(t+ConvHalo, ch, nil)
	if halo != nil {
		rowsOf(xp, 0, ConvHalo).Copy(halo)
	}
	rowsOf(xp, ConvHalo, t+ConvHalo).Copy(x)
	return xp, nil
}

// convPre returns the pre-activation z_t[c] = sum_{i=0..3} w[c,i] xp_{t+i}[c], with xp the padded input
// (xp_{t+i} = x_{t-3+i}).
func convPre(xp, w *mat.Dense, t int) *mat.Dense {
	_, ch := xp.Dims()
	z := mat.NewDense(t, ch, nil)
	for r := 0; r < t; r++ {
		zr := z.RawRowView(r)
		for c := range zr {
			acc := 0.0
			for i := 0; i < ConvWidth; i++ {
				acc += w.At(c, i) * xp.At(r+i, c)
			}
			zr[c] = acc
		}
	}
	return z
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
	t, _ := x.Dims()
	y := convPre(xp, w, t)
	y.Apply(func(_, _ int, z float64) float64 { return z * sigmoid(z) }, y)
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
	dz := convPre(xp, w, t)
	dz.Apply(func(r, c int, z float64) float64 {
		sg := sigmoid(z)
		return dy.At(r, c) * sg * (1 + z*(1-sg))
	}, dz)
	dxp := mat.NewDense(t+ConvHalo, ch, nil)
	dw = mat.NewDense(ch, ConvWidth, nil)
	for r := 0; r < t; r++ {
		for c := 0; c < ch; c++ {
			g := dz.At(r, c)
			for i := 0; i < ConvWidth; i++ {
				dxp.Set(r+i, c, dxp.At(r+i, c)+w.At(c, i)*g)
				dw.Set(c, i, dw.At(c, i)+g*xp.At(r+i, c))
			}
		}
	}
	if halo != nil {
		dhalo = mat.DenseCopyOf(rowsOf(dxp, 0, ConvHalo))
	}
	dx = mat.DenseCopyOf(rowsOf(dxp, ConvHalo, t+ConvHalo))
	return dx, dhalo, dw, nil
}
