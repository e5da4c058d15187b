package gdnref

import (
	"math"

	"gonum.org/v1/gonum/mat"
)

// ChunkGrads computes the gradients of the segment's inputs, chunk by chunk (chunk-parallel), from the
// state walk's States (H per chunk, V'), the tape walk's Tape (D per chunk = adjoint at the chunk's end,
// dV') and dO. Per chunk, with Γ, Qg, Kt, A, W as in Prep, H the chunk's start state and D its end adjoint:
//
// Through O = scale (Qg H + (Q Kᵀ ⊙ Γ ⊙ causal) V'):
//
//	dQg = scale dO Hᵀ:            dq_i += exp(gamma_i) dQg_i,    dgamma_i += dQg_i · Qg_i
//	G1  = (scale dO V'ᵀ) ⊙ Γ ⊙ causal:   dq += G1 K,   dk += G1ᵀ Q
//	E   = G1 ⊙ Q Kᵀ:              dgamma_i += sum_j E_ij,   dgamma_j -= sum_i E_ij
//
// Through H+ = exp(gamma_last) H + Ktᵀ V' (Kt_i = exp(gamma_last - gamma_i) k_i):
//
//	dKt = V' Dᵀ:                  dk_i += exp(gamma_last - gamma_i) dKt_i
//	s_i = dKt_i · Kt_i:           dgamma_i -= s_i,   dgamma_last += sum_i s_i + exp(gamma_last) <D, H>
//
// Through V' = U - W H, U = A diag(beta) V, W = A diag(beta ⊙ exp(gamma)) K:
//
//	dU = dV',   dW = -dV' Hᵀ
//	XU = Aᵀ dU:   dv_i = beta_i XU_i,                       dbeta_i += XU_i · v_i
//	XW = Aᵀ dW:   dk_i += beta_i exp(gamma_i) XW_i,        r_i = XW_i · k_i,
//	              dbeta_i += exp(gamma_i) r_i,             dgamma_i += beta_i exp(gamma_i) r_i
//	dA = dU (diag(beta) V)ᵀ + dW (diag(beta ⊙ exp(gamma)) K)ᵀ
//
// Through A = (I + L)⁻¹ (dA = -A dL A, so dL = -Aᵀ dA Aᵀ on the strict lower triangle, where L lives),
// L_ij = beta_i (k_i · k_j) Γ_ij for j < i:
//
//	F_ij = dL_ij Γ_ij:            dbeta_i += sum_j F_ij (k_i · k_j)
//	dKK = diag(beta) F:           dk += dKK K + dKKᵀ K
//	E2_ij = dL_ij L_ij:           dgamma_i += sum_j E2_ij,   dgamma_j -= sum_i E2_ij
//
// Finally dg_j = sum_{i >= j in the chunk} dgamma_i (the reverse in-chunk cumsum), and dq, dk go through the
// l2norm backward. DS0 is the tape walk's DStart. Sums run in a fixed order.
func ChunkGrads(s *Segment, st *States, tp *Tape, dO *mat.Dense) (*Grads, error) {
	if err := s.checkStates("ChunkGrads", st); err != nil {
		return nil, err
	}
	if err := s.checkTape("ChunkGrads", tp); err != nil {
		return nil, err
	}
	if err := s.tokenMatrix("ChunkGrads: dO", dO, s.Dv); err != nil {
		return nil, err
	}
	dq := mat.NewDense(s.T, s.Dk, nil)
	dk := mat.NewDense(s.T, s.Dk, nil)
	gr := &Grads{DV: mat.NewDense(s.T, s.Dv, nil), DG: make([]float64, s.T), DBeta: make([]float64, s.T),
		DS0: mat.DenseCopyOf(tp.DStart)}
	for ci := range s.Chunks {
		c := &s.Chunks[ci]
		r0, r1 := c.Start, c.Start+c.Len
		chunkGrads(c, s.Scale, st.H[ci], rowsOf(st.VNew, r0, r1), tp.D[ci], rowsOf(tp.DVNew, r0, r1),
			rowsOf(dO, r0, r1), rowsOf(dq, r0, r1), rowsOf(dk, r0, r1), rowsOf(gr.DV, r0, r1), gr.DG[r0:r1], gr.DBeta[r0:r1])
	}
	gr.DQ, gr.DK = rawGradQK(s.Q, s.K, s.QInv, s.KInv, dq, dk)
	return gr, nil
}

// chunkGrads writes the gradients of one chunk (see ChunkGrads) into dq, dk (w.r.t. the normalised q, k),
// dv, dg and dbeta, all views of the chunk's rows.
func chunkGrads(c *Chunk, scale float64, h, vnew, d, dvnew, dO, dq, dk, dv *mat.Dense, dg, dbeta []float64) {
	n := c.Len
	gam := c.gammaDiff() // Γ ⊙ causal (incl. diagonal)
	eg := make([]float64, n)
	for i := range eg {
		eg[i] = math.Exp(c.Gamma[i])
	}
	dgam := make([]float64, n)
	addRowSums := func(e *mat.Dense) { // dgamma_i += sum_j E_ij, dgamma_j -= sum_i E_ij
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				dgam[i] += e.At(i, j)
				dgam[j] -= e.At(i, j)
			}
		}
	}
	// --- Output, inter-chunk term: O += scale Qg H.
	dQg := mul(dO, h.T())
	dQg.Scale(scale, dQg)
	dq.Add(dq, scaleRows(eg, dQg))
	for i, v := range rowDot(dQg, c.Qg) {
		dgam[i] += v
	}

	// --- Output, intra-chunk term: O += scale (Q Kᵀ ⊙ Γ ⊙ causal) V'.
	qk := mul(c.Q, c.K.T())
	g1 := mul(dO, vnew.T())
	g1.Scale(scale, g1)
	g1.MulElem(g1, gam) // zero above the diagonal
	dq.Add(dq, mul(g1, c.K))
	dk.Add(dk, mul(g1.T(), c.Q))
	var e mat.Dense
	e.MulElem(g1, qk)
	addRowSums(&e)

	// --- State update: H+ = exp(gamma_last) H + Ktᵀ V'.
	dKt := mul(vnew, d.T())
	tail := make([]float64, n)
	for i := range tail {
		tail[i] = math.Exp(c.Gamma[n-1] - c.Gamma[i])
	}
	dk.Add(dk, scaleRows(tail, dKt))
	for i, v := range rowDot(dKt, c.Kt) {
		dgam[i] -= v
		dgam[n-1] += v
	}
	dgam[n-1] += c.Decay * frobenius(d, h)

	// --- V' = U - W H with U = A diag(beta) V and W = A diag(beta exp(gamma)) K.
	dW := mul(dvnew, h.T())
	dW.Scale(-1, dW)
	xu := mul(c.A.T(), dvnew) // Aᵀ dU
	dv.Copy(scaleRows(c.Beta, xu))
	for i, v := range rowDot(xu, c.V) {
		dbeta[i] += v
	}
	xw := mul(c.A.T(), dW) // Aᵀ dW
	bg := make([]float64, n)
	for i := range bg {
		bg[i] = c.Beta[i] * eg[i]
	}
	dk.Add(dk, scaleRows(bg, xw))
	for i, r := range rowDot(xw, c.K) {
		dbeta[i] += eg[i] * r
		dgam[i] += bg[i] * r
	}
	dA := mul(dvnew, scaleRows(c.Beta, c.V).T())
	dA.Add(dA, mul(dW, scaleRows(bg, c.K).T()))

	// --- A = (I + L)⁻¹: dL = -Aᵀ dA Aᵀ on the strict lower triangle.
	dL := mul(mul(c.A.T(), dA), c.A.T())
	dL.Scale(-1, dL)
	kk := mul(c.K, c.K.T())
	dKK := mat.NewDense(n, n, nil)
	e2 := mat.NewDense(n, n, nil)
	for i := 0; i < n; i++ {
		for j := 0; j < i; j++ {
			fij := dL.At(i, j) * gam.At(i, j)
			dbeta[i] += fij * kk.At(i, j)
			dKK.Set(i, j, c.Beta[i]*fij)
			e2.Set(i, j, c.Beta[i]*fij*kk.At(i, j)) // dL_ij L_ij
		}
	}
	dk.Add(dk, mul(dKK, c.K))
	dk.Add(dk, mul(dKK.T(), c.K))
	addRowSums(e2)

	// --- gamma = in-chunk cumsum of g, so dg_j = sum_{i >= j} dgamma_i.
	acc := 0.0
	for i := n - 1; i >= 0; i-- {
		acc += dgam[i]
		dg[i] = acc
	}
}
