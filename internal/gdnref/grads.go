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
	ws := getScratch()
	defer putScratch(ws)
	for ci := range s.Chunks {
		c := &s.Chunks[ci]
		r0, r1 := c.Start, c.Start+c.Len
		ws.reset()
		chunkGrads(ws, c, s.Scale, st.H[ci], rowsOf(st.VNew, r0, r1), tp.D[ci], rowsOf(tp.DVNew, r0, r1),
			rowsOf(dO, r0, r1), rowsOf(dq, r0, r1), rowsOf(dk, r0, r1), rowsOf(gr.DV, r0, r1), gr.DG[r0:r1], gr.DBeta[r0:r1])
	}
	gr.DQ, gr.DK = rawGradQK(s.Q, s.K, s.QInv, s.KInv, dq, dk)
	return gr, nil
}

// chunkGrads writes the gradients of one chunk (see ChunkGrads) into dq, dk (w.r.t. the normalised q, k),
// dv, dg and dbeta, all views of the chunk's rows. Its temporaries live on ws.
func chunkGrads(ws *scratch, c *Chunk, scale float64, h, vnew, d, dvnew, dO, dq, dk, dv *mat.Dense, dg, dbeta []float64) {
	n := c.Len
	dkk, dvv := c.K.RawMatrix().Cols, c.V.RawMatrix().Cols
	gam := c.gammaDiff(ws.dense(n, n)) // Γ ⊙ causal (incl. diagonal)
	eg := ws.floats(n)
	for i := range eg {
		eg[i] = math.Exp(c.Gamma[i])
	}
	dgam := ws.floats(n)
	clear(dgam)
	addRowSums := func(e *mat.Dense) { // dgamma_i += sum_j E_ij, dgamma_j -= sum_i E_ij
		for i := 0; i < n; i++ {
			row := e.RawRowView(i)[:n]
			for j, v := range row {
				dgam[i] += v
				dgam[j] -= v
			}
		}
	}
	nk := ws.dense(n, dkk) // n x K temporaries, reused in turn
	nn := ws.dense(n, n)   // n x n temporaries, reused in turn

	// --- Output, inter-chunk term: O += scale Qg H.
	dQg := ws.dense(n, dkk)
	mulNT(ws, dQg, dO, h)
	scaleTo(dQg, scale, dQg)
	scaleRowsTo(nk, eg, dQg)
	addTo(dq, nk)
	for i := 0; i < n; i++ {
		dgam[i] += dot(dQg.RawRowView(i), c.Qg.RawRowView(i))
	}

	// --- Output, intra-chunk term: O += scale (Q Kᵀ ⊙ Γ ⊙ causal) V'.
	qk := ws.dense(n, n)
	mulNT(ws, qk, c.Q, c.K)
	g1 := ws.dense(n, n)
	mulNT(ws, g1, dO, vnew)
	scaleTo(g1, scale, g1)
	g1.MulElem(g1, gam) // zero above the diagonal
	mulNN(nk, g1, c.K)
	addTo(dq, nk)
	mulTN(nk, g1, c.Q)
	addTo(dk, nk)
	nn.MulElem(g1, qk) // E
	addRowSums(nn)

	// --- State update: H+ = exp(gamma_last) H + Ktᵀ V'.
	dKt := ws.dense(n, dkk)
	mulNT(ws, dKt, vnew, d)
	tail := ws.floats(n)
	for i := range tail {
		tail[i] = math.Exp(c.Gamma[n-1] - c.Gamma[i])
	}
	scaleRowsTo(nk, tail, dKt)
	addTo(dk, nk)
	for i := 0; i < n; i++ {
		v := dot(dKt.RawRowView(i), c.Kt.RawRowView(i))
		dgam[i] -= v
		dgam[n-1] += v
	}
	dgam[n-1] += c.Decay * frobenius(d, h)

	// --- V' = U - W H with U = A diag(beta) V and W = A diag(beta exp(gamma)) K.
	dW := ws.dense(n, dkk)
	mulNT(ws, dW, dvnew, h)
	scaleTo(dW, -1, dW)
	xu := ws.dense(n, dvv)
	mulTN(xu, c.A, dvnew) // Aᵀ dU
	scaleRowsTo(dv, c.Beta, xu)
	for i := 0; i < n; i++ {
		dbeta[i] += dot(xu.RawRowView(i), c.V.RawRowView(i))
	}
	xw := ws.dense(n, dkk)
	mulTN(xw, c.A, dW) // Aᵀ dW
	bg := ws.floats(n)
	for i := range bg {
		bg[i] = c.Beta[i] * eg[i]
	}
	scaleRowsTo(nk, bg, xw)
	addTo(dk, nk)
	for i := 0; i < n; i++ {
		r := dot(xw.RawRowView(i), c.K.RawRowView(i))
		dbeta[i] += eg[i] * r
		dgam[i] += bg[i] * r
	}
	bv := ws.dense(n, dvv)
	scaleRowsTo(bv, c.Beta, c.V)
	dA := ws.dense(n, n)
	mulNT(ws, dA, dvnew, bv)
	scaleRowsTo(nk, bg, c.K)
	mulNT(ws, nn, dW, nk)
	addTo(dA, nn)

	// --- A = (I + L)⁻¹: dL = -Aᵀ dA Aᵀ on the strict lower triangle.
	mulTN(nn, c.A, dA)
	dL := ws.dense(n, n)
	mulNT(ws, dL, nn, c.A)
	scaleTo(dL, -1, dL)
	kk := ws.dense(n, n)
	mulNT(ws, kk, c.K, c.K)
	dKK := ws.zeros(n, n)
	e2 := ws.zeros(n, n)
	for i := 0; i < n; i++ {
		dLi, gi, kki := dL.RawRowView(i), gam.RawRowView(i), kk.RawRowView(i)
		dKKi, e2i := dKK.RawRowView(i), e2.RawRowView(i)
		for j := 0; j < i; j++ {
			fij := dLi[j] * gi[j]
			dbeta[i] += fij * kki[j]
			dKKi[j] = c.Beta[i] * fij
			e2i[j] = c.Beta[i] * fij * kki[j] // dL_ij L_ij
		}
	}
	mulNN(nk, dKK, c.K)
	addTo(dk, nk)
	mulTN(nk, dKK, c.K)
	addTo(dk, nk)
	addRowSums(e2)

	// --- gamma = in-chunk cumsum of g, so dg_j = sum_{i >= j} dgamma_i.
	acc := 0.0
	for i := n - 1; i >= 0; i-- {
		acc += dgam[i]
		dg[i] = acc
	}
}
