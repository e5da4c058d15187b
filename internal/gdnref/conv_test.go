package gdnref

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/mat"
)

// TestConvOrientation: w[c,3] weighs the current token and w[c,0] the token three back, as PyTorch's
// Conv1d(k=4, padding=3) truncated to the first T outputs.
func TestConvOrientation(t *testing.T) {
	x := mat.NewDense(5, 1, []float64{1, 0, 0, 0, 0})
	w := mat.NewDense(1, 4, []float64{1, 2, 3, 4})
	y, err := Conv1dForward(x, w, nil)
	require.NoError(t, err)
	for i, z := range []float64{4, 3, 2, 1, 0} {
		require.InDelta(t, z/(1+math.Exp(-z)), y.At(i, 0), 1e-15)
	}
	// With a halo, x_{-1} = 1 enters token 0 through w[c,2] and token 1 through w[c,1].
	halo := mat.NewDense(3, 1, []float64{0, 0, 1})
	y, err = Conv1dForward(mat.NewDense(5, 1, nil), w, halo)
	require.NoError(t, err)
	for i, z := range []float64{3, 2, 1, 0, 0} {
		require.InDelta(t, z/(1+math.Exp(-z)), y.At(i, 0), 1e-15)
	}
}

// TestConvSegmentsMatchDocument: a document's conv equals its segments' convs with 3-token halos (zero-padded
// where fewer than 3 tokens precede), and the segments' dx plus the halo gradients sent back to the tokens'
// owners, and their dw summed in order, equal the document's gradients.
func TestConvSegmentsMatchDocument(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	const n, ch = 40, 6
	lens := []int{2, 1, 17, 20} // the second and third segments see fewer than 3 tokens of their own past
	x := randDense(rng, n, ch, 1)
	w := randDense(rng, ch, ConvWidth, 0.5)
	dy := randDense(rng, n, ch, 1)
	yDoc, err := Conv1dForward(x, w, nil)
	require.NoError(t, err)
	dxDoc, dhDoc, dwDoc, err := Conv1dBackward(x, w, nil, dy)
	require.NoError(t, err)
	require.Nil(t, dhDoc)

	dx := mat.NewDense(n, ch, nil)
	dw := mat.NewDense(ch, ConvWidth, nil)
	at := 0
	for _, l := range lens {
		var halo *mat.Dense
		if at > 0 {
			halo = mat.NewDense(ConvHalo, ch, nil)
			for r := 0; r < ConvHalo; r++ {
				if src := at - ConvHalo + r; src >= 0 {
					halo.SetRow(r, x.RawRowView(src))
				}
			}
		}
		xs := rowsOf(x, at, at+l)
		ys, err := Conv1dForward(xs, w, halo)
		require.NoError(t, err)
		require.Less(t, relErr(ys, rowsOf(yDoc, at, at+l)), 1e-15)
		dxs, dhs, dws, err := Conv1dBackward(xs, w, halo, rowsOf(dy, at, at+l))
		require.NoError(t, err)
		seg := rowsOf(dx, at, at+l)
		seg.Add(seg, dxs)
		for r := 0; r < ConvHalo; r++ { // send the halo gradient to the owner of each halo token
			if dst := at - ConvHalo + r; dst >= 0 {
				row := rowsOf(dx, dst, dst+1)
				row.Add(row, rowsOf(dhs, r, r+1))
			}
		}
		dw.Add(dw, dws)
		at += l
	}
	require.Less(t, relErr(dx, dxDoc), 1e-14)
	require.Less(t, relErr(dw, dwDoc), 1e-14)
}
