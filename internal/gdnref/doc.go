// Package gdnref is the float64 specification of the Gated DeltaNet (GDN) math used by gdnkcp: per document
// (or segment of a document) and per value head, in float64, written to be read. Every GPU result and the
// CPU backend of kcp are checked against it.
//
// # The recurrence (DESIGN.md §2)
//
// Per value head, with key dim K and value dim V, the state S is K x V and token t updates it as
//
//	S_t = exp(g_t) (I - beta_t k_t k_tᵀ) S_{t-1} + beta_t k_t v_tᵀ,     o_t = scale * S_tᵀ q_t
//
// where q_t and k_t are first l2-normalised, x / sqrt(sum x² + 1e-6), unless Options.NoL2Norm is set, and
// scale defaults to 1/sqrt(K). Forward and Backward run this token by token (the "naive" form).
//
// # The chunked form
//
// A segment (a contiguous run of one document) is cut into chunks of C = 64 tokens counted from the
// segment's own start; the last chunk may be shorter. With the in-chunk cumulative decay
// gamma_i = sum_{j<=i} g_j (i, j local to the chunk) and Γ_ij = exp(gamma_i - gamma_j), Prep computes
//
//	A = (I + strict_lower(diag(beta) K Kᵀ ⊙ Γ))⁻¹       (forward substitution)
//	W = A diag(beta ⊙ exp(gamma)) K                    U = A diag(beta) V
//	Kt = diag(exp(gamma_last - gamma)) K                Qg = diag(exp(gamma)) Q
//
// and, for the state H at a chunk's start,
//
//	V' = U - W H
//	H+ = exp(gamma_last) H + Ktᵀ V'  = M_c H + B_c,   M_c = exp(gamma_last) I - Ktᵀ W,  B_c = Ktᵀ U
//	O  = scale * (Qg H + (Q Kᵀ ⊙ Γ ⊙ causal) V')      (causal includes the diagonal)
//
// The backward runs with the adjoint D = dL/dH+ of the state at a chunk's end:
//
//	dV' = dV'_local + Kt D,              dV'_local = scale (Q Kᵀ ⊙ Γ ⊙ causal)ᵀ dO
//	D  <- exp(gamma_last) D + scale Qgᵀ dO - Wᵀ dV'   (= dL/dH, the adjoint at the chunk's start)
//
// # Context parallelism (DESIGN.md §3)
//
// The walks are separate functions so that an orchestrator can run them per segment:
//
//   - SummaryWalk: from a zero state, H_end = P H_start + Q (Q: value columns with U; P: key columns with
//     U = 0 from I).
//   - ComposeForward: S_start(j+1) = P_j S_start(j) + Q_j, in chain order.
//   - StateWalk: from the true start state; keeps H per chunk and V'; returns the final state. Output.
//   - OffsetWalk: from a zero terminal adjoint, D_start = Pᵀ D_end + R.
//   - ComposeBackward: D_end(j) = P_{j+1}ᵀ D_end(j+1) + R_{j+1}, from the chain's end.
//   - TapeWalk: from the true terminal adjoint, in reverse chunk order; keeps D per chunk and dV'.
//   - ChunkGrads: the chunk-parallel gradients dq, dk, dv, dg, dbeta and the start-state gradient.
//
// Every walk has a Tile form that touches only a column range of the state ([v0, v1) of the value
// columns, or of the key columns for the P walks). Inside a walk no value is ever reduced across state
// columns, and each column goes through the same arithmetic in the same order whatever the tile, so tiles of
// 64 and 128 columns give bitwise-identical results. The products run through package gemm with the tiled
// matrix always as the untransposed right operand (C = alpha op(A) B + beta C; a product with a transposed
// right operand copies it transposed first): gemm accumulates every element of C over the inner index in
// order, the same way on its AVX2 and Go paths (the sequence of gonum's Dgemm for these forms), so an
// element's value does not depend on how many columns are computed beside it, nor on the thread count or
// the CPU.
//
// # The conv module
//
// Conv1dForward and Conv1dBackward are the depthwise causal conv1d of width 4 followed by SiLU that runs in
// front of the GDN over the q|k|v channels, with a 3-token halo for a segment that does not start its
// document.
//
// Shapes are checked and reported as errors. Matrices are *mat.Dense, row-major, one row per token (or one
// row per key index for states). Functions never keep or modify their inputs unless documented.
package gdnref
