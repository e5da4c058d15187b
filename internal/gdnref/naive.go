package gdnref

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/blas/blas64"
	"gonum.org/v1/gonum/mat"

	"github.com/gdnkcp/gdnkcp/internal/gemm"
)

// naiveCheckpoint is how often (in tokens) the naive backward keeps a state from its forward pass; the
// states in between are recomputed block by block, so memory stays O(T/64 + 64) states.
const naiveCheckpoint = 64

// naiveWork is the scratch vector of naiveStep, reused from token to token.
type naiveWork struct {
	u mat.VecDense // V
}

// naiveStep applies token t to the state src and writes the result to s (src may be s, for in place):
//
//	u = beta (v - exp(g) srcᵀ k)          (V)
//	s <- exp(g) src + k uᵀ                (= exp(g)(I - beta k kᵀ) src + beta k vᵀ)
//
// It allocates nothing. The scale of src and the rank-one update run as one pass (gemm.ScaleRankOne) with
// the operations, and the bits, of mat.Dense's Scale and then RankOne on s.
func naiveStep(s, src *mat.Dense, k, v *mat.VecDense, g, beta float64, w *naiveWork) {
	a := math.Exp(g)
	u := &w.u
	mulVecT(u, src, k)                                                                              // srcᵀ k
	u.AddScaledVec(v, -a, u)                                                                        // v - a srcᵀk
	u.ScaleVec(beta, u)                                                                             // beta (v - a srcᵀk)
	gemm.ScaleRankOne(s.RawMatrix(), src.RawMatrix(), a, 1, k.RawVector().Data, u.RawVector().Data) // a src + k uᵀ
}

// mulVecT sets y = aᵀ x (y is sized on first use): y.MulVec(a.T(), x), bit for bit (gonum's Dgemv sums
// each element over the rows in order, as gemm.TN does; gemm's TestGemvTMatchesGonumBitwise).
func mulVecT(y *mat.VecDense, a *mat.Dense, x *mat.VecDense) {
	r, c := a.Dims()
	if y.IsEmpty() {
		*y = *mat.NewVecDense(c, nil)
	}
	xv, yv := x.RawVector(), y.RawVector()
	if xv.Inc != 1 || yv.Inc != 1 || x.Len() != r || y.Len() != c {
		panic("gdnref: mulVecT: shape mismatch or strided vector")
	}
	gemm.TN(1, blas64.General{Rows: r, Cols: 1, Stride: 1, Data: xv.Data},
		a.RawMatrix(), 0, blas64.General{Rows: 1, Cols: c, Stride: c, Data: yv.Data})
}

// Forward runs the recurrence token by token (DESIGN.md §2):
//
//	S_t = exp(g_t) (I - beta_t k_t k_tᵀ) S_{t-1} + beta_t k_t v_tᵀ,    o_t = scale S_tᵀ q_t
//
// from the initial state s0 (K x V; nil means zero), with q, k l2-normalised unless opt.NoL2Norm. It returns
// the outputs O (T x V) and the final state S_T (K x V).
func Forward(h Head, s0 *mat.Dense, opt Options) (o, sFinal *mat.Dense, err error) {
	t, dk, dv, err := h.Dims()
	if err != nil {
		return nil, nil, err
	}
	if t == 0 {
		return nil, nil, fmt.Errorf("gdnref: Forward: empty head (T = 0)")
	}
	if err := checkState("initial state", s0, dk, dv); err != nil {
		return nil, nil, err
	}
	q, k, _, _ := normalisedQK(h, opt)
	scale := opt.scaleFor(dk)
	s := cloneOrZero(s0, dk, dv)
	o = mat.NewDense(t, dv, nil)
	var w naiveWork
	for i := 0; i < t; i++ {
		naiveStep(s, s, mat.NewVecDense(dk, k.RawRowView(i)), mat.NewVecDense(dv, h.V.RawRowView(i)), h.G[i], h.Beta[i], &w)
		mulVecT(o.RowView(i).(*mat.VecDense), s, mat.NewVecDense(dk, q.RawRowView(i)))
	}
	o.Scale(scale, o)
	return o, s, nil
}

// Backward is the exact reverse mode of Forward for the loss L with dL/dO = dO (T x V) and
// dL/dS_T = dSFinal (K x V; nil means zero). It returns the gradients for q, k (before the l2norm), v, g,
// beta and the initial state.
//
// Going backwards with D = dL/dS_t (the total adjoint of S_t), X = S_{t-1}, a = exp(g_t), b = beta_t:
//
//	dq_t = scale S_t do_t                       (then through the l2norm)
//	D   += scale q_t do_tᵀ
//	Dk   = Dᵀ k_t,   xk = Xᵀ k_t,   u = b (v_t - a xk)
//	dv_t = b Dk
//	dbeta_t = Dk · (v_t - a xk)
//	dg_t = a (<D, X> - b (Dk · xk))             (= a <D, (I - b k kᵀ) X> = <D, S_t> - b (Dk · v_t), without
//	                                             that form's cancellation: exactly 0 where X is, as for a
//	                                             document's first token)
//	dk_t = D u - a b X Dk                       (then through the l2norm)
//	D   <- a (D - b k_t Dkᵀ)                    (= a (I - b k kᵀ) D, the adjoint of S_{t-1})
//
// and finally dS0 = D.
func Backward(h Head, s0, dO, dSFinal *mat.Dense, opt Options) (*Grads, error) {
	_, _, g, err := backward("Backward", h, s0, dO, dSFinal, opt, false)
	return g, err
}

// ForwardBackward returns what Forward and then Backward return for the same arguments, bit for bit, with
// one pass over the tokens fewer: the outputs come from Backward's own forward pass.
func ForwardBackward(h Head, s0, dO, dSFinal *mat.Dense, opt Options) (o, sFinal *mat.Dense, g *Grads, err error) {
	return backward("ForwardBackward", h, s0, dO, dSFinal, opt, true)
}

// backward is Backward; with outputs, its forward pass also computes Forward's outputs and final state.
func backward(what string, h Head, s0, dO, dSFinal *mat.Dense, opt Options, outputs bool) (o, sFinal *mat.Dense, gr *Grads, err error) {
	t, dk, dv, err := h.Dims()
	if err != nil {
		return nil, nil, nil, err
	}
	if t == 0 {
		return nil, nil, nil, fmt.Errorf("gdnref: %s: empty head (T = 0)", what)
	}
	if err := checkState("initial state", s0, dk, dv); err != nil {
		return nil, nil, nil, err
	}
	if err := checkState("dSFinal", dSFinal, dk, dv); err != nil {
		return nil, nil, nil, err
	}
	if dO == nil {
		return nil, nil, nil, fmt.Errorf("gdnref: %s: dO must be set", what)
	}
	if r, c := dO.Dims(); r != t || c != dv {
		return nil, nil, nil, fmt.Errorf("gdnref: %s: dO is %dx%d, want %dx%d", what, r, c, t, dv)
	}
	q, k, qInv, kInv := normalisedQK(h, opt)
	scale := opt.scaleFor(dk)
	kRow := func(i int) *mat.VecDense { return mat.NewVecDense(dk, k.RawRowView(i)) }
	vRow := func(i int) *mat.VecDense { return mat.NewVecDense(dv, h.V.RawRowView(i)) }

	// Forward pass keeping the state before every naiveCheckpoint-th token. The checkpoints and the
	// states of a block live on pooled scratch memory.
	ws := getScratch()
	defer putScratch(ws)
	var (
		checkpoints []*mat.Dense
		w           naiveWork
	)
	s := cloneOrZero(s0, dk, dv)
	if outputs {
		o = mat.NewDense(t, dv, nil)
	}
	for i := 0; i < t; i++ {
		if i%naiveCheckpoint == 0 {
			cp := ws.dense(dk, dv)
			cp.Copy(s)
			checkpoints = append(checkpoints, cp)
		}
		naiveStep(s, s, kRow(i), vRow(i), h.G[i], h.Beta[i], &w)
		if outputs { // as Forward
			mulVecT(o.RowView(i).(*mat.VecDense), s, mat.NewVecDense(dk, q.RawRowView(i)))
		}
	}
	if outputs {
		o.Scale(scale, o)
		sFinal = s
	}
	// states[j] holds S_{t0+j} while block t0 runs: naiveCheckpoint + 1 states, reused by every block.
	states := make([]*mat.Dense, naiveCheckpoint+1)
	for j := range states {
		states[j] = ws.dense(dk, dv)
	}

	gr = &Grads{
		DQ: mat.NewDense(t, dk, nil), DK: mat.NewDense(t, dk, nil), DV: mat.NewDense(t, dv, nil),
		DG: make([]float64, t), DBeta: make([]float64, t),
	}
	d := cloneOrZero(dSFinal, dk, dv)
	for blk := len(checkpoints) - 1; blk >= 0; blk-- {
		// Recompute the states of this block: states[j] = S_{t0+j}, the state before token t0+j.
		t0 := blk * naiveCheckpoint
		t1 := min(t0+naiveCheckpoint, t)
		states[0].Copy(checkpoints[blk])
		for i := t0; i < t1; i++ {
			naiveStep(states[i-t0+1], states[i-t0], kRow(i), vRow(i), h.G[i], h.Beta[i], &w)
		}
		for i := t1 - 1; i >= t0; i-- {
			x, st := states[i-t0], states[i-t0+1] // S_{t-1}, S_t
			a, b := math.Exp(h.G[i]), h.Beta[i]
			ki, vi := kRow(i), vRow(i)
			doi := mat.NewVecDense(dv, dO.RawRowView(i))
			qi := mat.NewVecDense(dk, q.RawRowView(i))

			var dqi, dkD, xk, u, dki, xdk mat.VecDense
			dqi.MulVec(st, doi) // dq_t = scale S_t do_t
			dqi.ScaleVec(scale, &dqi)
			gr.DQ.SetRow(i, dqi.RawVector().Data)
			d.RankOne(d, scale, qi, doi) // D += scale q do^T

			mulVecT(&dkD, d, ki) // Dk = D^T k
			mulVecT(&xk, x, ki)  // xk = X^T k
			u.AddScaledVec(vi, -a, &xk)
			gr.DBeta[i] = mat.Dot(&dkD, &u) // Dk · (v - a xk)
			u.ScaleVec(b, &u)               // u = b (v - a xk)
			gr.DV.RowView(i).(*mat.VecDense).ScaleVec(b, &dkD)
			gr.DG[i] = a * (frobenius(d, x) - b*mat.Dot(&dkD, &xk))

			dki.MulVec(d, &u)   // D u
			xdk.MulVec(x, &dkD) // X Dk
			dki.AddScaledVec(&dki, -a*b, &xdk)
			gr.DK.SetRow(i, dki.RawVector().Data)

			gemm.RankOneScale(d.RawMatrix(), -b, ki.RawVector().Data, dkD.RawVector().Data, a) // a (D - b k Dk^T)
		}
	}
	gr.DS0 = d
	gr.DQ, gr.DK = rawGradQK(q, k, qInv, kInv, gr.DQ, gr.DK)
	return o, sFinal, gr, nil
}
