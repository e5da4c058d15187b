package gdnref

import (
	"math"

	"gonum.org/v1/gonum/mat"
)

// L2Norm normalises every row of x: y_t = x_t / sqrt(sum_i x_ti² + 1e-6). It returns y and the inverse
// norms inv_t = 1 / sqrt(sum_i x_ti² + 1e-6) that L2NormBackward needs.
func L2Norm(x *mat.Dense) (y *mat.Dense, inv []float64) {
	r, c := x.Dims()
	y = mat.NewDense(r, c, nil)
	inv = make([]float64, r)
	for t := 0; t < r; t++ {
		xt := x.RawRowView(t)
		inv[t] = 1 / math.Sqrt(dot(xt, xt)+L2NormEps)
		yt := y.RawRowView(t)
		for i, v := range xt {
			yt[i] = v * inv[t]
		}
	}
	return y, inv
}

// L2NormBackward maps the gradient dy with respect to y = L2Norm(x) to the gradient with respect to x.
// With n = sqrt(sum x² + eps), dy_i/dx_j = (δ_ij - y_i y_j) / n, so
//
//	dx_t = (dy_t - y_t (y_t · dy_t)) * inv_t.
func L2NormBackward(y *mat.Dense, inv []float64, dy *mat.Dense) *mat.Dense {
	r, c := y.Dims()
	return l2NormBackwardTo(mat.NewDense(r, c, nil), y, inv, dy)
}

// l2NormBackwardTo is L2NormBackward into dx, which may be dy, and returns dx.
func l2NormBackwardTo(dx, y *mat.Dense, inv []float64, dy *mat.Dense) *mat.Dense {
	r, _ := y.Dims()
	for t := 0; t < r; t++ {
		yt, dyt, dxt := y.RawRowView(t), dy.RawRowView(t), dx.RawRowView(t)
		p := dot(yt, dyt)
		for i := range dxt {
			dxt[i] = (dyt[i] - yt[i]*p) * inv[t]
		}
	}
	return dx
}

// normalisedQK returns q and k as the kernel sees them (l2-normalised unless opt.NoL2Norm), with the inverse
// norms (nil without l2norm).
func normalisedQK(h Head, opt Options) (q, k *mat.Dense, qInv, kInv []float64) {
	if opt.NoL2Norm {
		return mat.DenseCopyOf(h.Q), mat.DenseCopyOf(h.K), nil, nil
	}
	q, qInv = L2Norm(h.Q)
	k, kInv = L2Norm(h.K)
	return q, k, qInv, kInv
}

// rawGradQK maps gradients with respect to the normalised q, k back through the l2norm (identity without),
// in place: it returns dq and dk.
func rawGradQK(q, k *mat.Dense, qInv, kInv []float64, dq, dk *mat.Dense) (*mat.Dense, *mat.Dense) {
	if qInv == nil {
		return dq, dk
	}
	return l2NormBackwardTo(dq, q, qInv, dq), l2NormBackwardTo(dk, k, kInv, dk)
}
