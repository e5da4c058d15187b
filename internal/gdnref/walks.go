package gdnref

import (
	"fmt"

	"gonum.org/v1/gonum/mat"
)

// forwardChunk advances state columns h (K x w, in place) through chunk c:
//
//	V' = U - W H,     H <- exp(gamma_last) H + Ktᵀ V'
//
// u is the chunk's U restricted to the same columns (Len x w), or nil for U = 0 (the P walk); V' is
// written to vnew (Len x w). Every column is computed from that column alone.
func forwardChunk(c *Chunk, u, h, vnew *mat.Dense) {
	if u != nil {
		vnew.Copy(u)
	} else {
		vnew.Zero()
	}
	gemmNN(-1, c.W, h, 1, vnew)       // V' = U - W H
	gemmTN(1, c.Kt, vnew, c.Decay, h) // H = exp(gamma_last) H + Ktᵀ V'
}

// backwardChunk moves adjoint columns d (K x w, in place) from the chunk's end to its start:
//
//	dV' = dV'_local + Kt D,     D <- exp(gamma_last) D + scale Qgᵀ dO - Wᵀ dV'
//
// dvLocal and dO are restricted to the same columns (Len x w), or both nil (the Pᵀ walk); dV' is written to
// dvnew (Len x w). Every column is computed from that column alone.
func backwardChunk(c *Chunk, scale float64, dvLocal, dO, d, dvnew *mat.Dense) {
	if dvLocal != nil {
		dvnew.Copy(dvLocal)
	} else {
		dvnew.Zero()
	}
	gemmNN(1, c.Kt, d, 1, dvnew) // dV' = dV'_local + Kt D
	if dO != nil {
		gemmTN(scale, c.Qg, dO, c.Decay, d) // D = exp(gamma_last) D + scale Qgᵀ dO
		gemmTN(-1, c.W, dvnew, 1, d)        //     - Wᵀ dV'
	} else {
		gemmTN(-1, c.W, dvnew, c.Decay, d) // D = exp(gamma_last) D - Wᵀ dV'
	}
}

// tileScratch returns a ChunkSize x w scratch and the view of its first n rows.
func tileScratch(w int) func(n int) *mat.Dense {
	buf := mat.NewDense(ChunkSize, w, nil)
	return func(n int) *mat.Dense { return rowsOf(buf, 0, n) }
}

// chunkCols returns rows [c.Start, c.Start+c.Len) and columns [c0, c1) of the T x n matrix m.
func chunkCols(m *mat.Dense, c *Chunk, c0, c1 int) *mat.Dense {
	return m.Slice(c.Start, c.Start+c.Len, c0, c1).(*mat.Dense)
}

// tiles calls f on [0, n) cut into column ranges of width vh (the last one possibly narrower).
func tiles(what string, n, vh int, f func(c0, c1 int) error) error {
	if vh <= 0 {
		return fmt.Errorf("gdnref: %s: tile width %d must be positive", what, vh)
	}
	for c0 := 0; c0 < n; c0 += vh {
		if err := f(c0, min(c0+vh, n)); err != nil {
			return err
		}
	}
	return nil
}

// ---- Summary walk ----------------------------------------------------------------------------------------

// Summary is a segment's affine map from its start state to its end state: H_end = P H_start + Q,
// with P = M_N ... M_1 (K x K) and Q the end state reached from a zero start (K x V).
type Summary struct {
	P *mat.Dense // K x K
	Q *mat.Dense // K x V
}

// NewSummary allocates a zero Summary for s, for the tile functions to fill.
func NewSummary(s *Segment) *Summary {
	return &Summary{P: mat.NewDense(s.Dk, s.Dk, nil), Q: mat.NewDense(s.Dk, s.Dv, nil)}
}

// SummaryWalkQTile computes columns [v0, v1) of Q, the walk over the value columns from a zero state:
// per chunk V' = U - W H, H <- exp(gamma_last) H + Ktᵀ V'. It writes only those columns of q (K x V).
func SummaryWalkQTile(s *Segment, q *mat.Dense, v0, v1 int) error {
	if err := checkOut("summary Q", q, s.Dk, s.Dv); err != nil {
		return err
	}
	if err := checkTile("SummaryWalkQTile", v0, v1, s.Dv); err != nil {
		return err
	}
	h := colsOf(q, v0, v1)
	h.Zero()
	scratch := tileScratch(v1 - v0)
	for ci := range s.Chunks {
		c := &s.Chunks[ci]
		forwardChunk(c, colsOf(c.U, v0, v1), h, scratch(c.Len))
	}
	return nil
}

// SummaryWalkPTile computes columns [c0, c1) of P, the walk over the key columns with U = 0 from the
// identity: per chunk H <- M_c H = exp(gamma_last) H - Ktᵀ (W H). It writes only those columns of p (K x K).
func SummaryWalkPTile(s *Segment, p *mat.Dense, c0, c1 int) error {
	if err := checkOut("summary P", p, s.Dk, s.Dk); err != nil {
		return err
	}
	if err := checkTile("SummaryWalkPTile", c0, c1, s.Dk); err != nil {
		return err
	}
	h := colsOf(p, c0, c1)
	h.Copy(colsOf(identity(s.Dk), c0, c1))
	scratch := tileScratch(c1 - c0)
	for ci := range s.Chunks {
		c := &s.Chunks[ci]
		forwardChunk(c, nil, h, scratch(c.Len))
	}
	return nil
}

// SummaryWalk computes the segment's Summary with tiles of vh columns (value columns for Q, key columns for
// P). The result does not depend on vh, bit for bit.
func SummaryWalk(s *Segment, vh int) (*Summary, error) {
	sum := NewSummary(s)
	if err := tiles("SummaryWalk", s.Dv, vh, func(v0, v1 int) error { return SummaryWalkQTile(s, sum.Q, v0, v1) }); err != nil {
		return nil, err
	}
	if err := tiles("SummaryWalk", s.Dk, vh, func(c0, c1 int) error { return SummaryWalkPTile(s, sum.P, c0, c1) }); err != nil {
		return nil, err
	}
	return sum, nil
}

// ---- State walk ------------------------------------------------------------------------------------------

// States is what the state walk keeps for the output and the backward.
type States struct {
	H     []*mat.Dense // per chunk, K x V: the state at the chunk's start
	VNew  *mat.Dense   // T x V: V' = U - W H, chunk by chunk
	Final *mat.Dense   // K x V: the state at the segment's end
}

// NewStates allocates zero States for s, for StateWalkTile to fill.
func NewStates(s *Segment) *States {
	st := &States{VNew: mat.NewDense(s.T, s.Dv, nil), Final: mat.NewDense(s.Dk, s.Dv, nil)}
	for range s.Chunks {
		st.H = append(st.H, mat.NewDense(s.Dk, s.Dv, nil))
	}
	return st
}

func (s *Segment) checkStates(what string, st *States) error {
	if st == nil || len(st.H) != len(s.Chunks) || st.VNew == nil || st.Final == nil {
		return fmt.Errorf("gdnref: %s: states must come from NewStates for this segment", what)
	}
	if err := s.tokenMatrix(what+": V'", st.VNew, s.Dv); err != nil {
		return err
	}
	return checkState(what+": final state", st.Final, s.Dk, s.Dv)
}

// StateWalkTile runs columns [v0, v1) of the state walk from the true start state h0 (K x V; nil means
// zero): per chunk it stores H (the state at the chunk's start), then V' = U - W H and
// H <- exp(gamma_last) H + Ktᵀ V'. It writes only those columns of st.H, st.VNew and st.Final (the running
// state lives there, so h0 must not share storage with st).
func StateWalkTile(s *Segment, h0 *mat.Dense, st *States, v0, v1 int) error {
	if err := checkState("StateWalkTile: start state", h0, s.Dk, s.Dv); err != nil {
		return err
	}
	if err := s.checkStates("StateWalkTile", st); err != nil {
		return err
	}
	if err := checkTile("StateWalkTile", v0, v1, s.Dv); err != nil {
		return err
	}
	h := colsOf(st.Final, v0, v1) // the running state lives in the final state's columns
	if h0 != nil {
		h.Copy(colsOf(h0, v0, v1))
	} else {
		h.Zero()
	}
	for ci := range s.Chunks {
		c := &s.Chunks[ci]
		colsOf(st.H[ci], v0, v1).Copy(h)
		forwardChunk(c, colsOf(c.U, v0, v1), h, chunkCols(st.VNew, c, v0, v1))
	}
	return nil
}

// StateWalk runs the state walk over all value columns in tiles of vh. The result does not depend on vh,
// bit for bit.
func StateWalk(s *Segment, h0 *mat.Dense, vh int) (*States, error) {
	st := NewStates(s)
	if err := tiles("StateWalk", s.Dv, vh, func(v0, v1 int) error { return StateWalkTile(s, h0, st, v0, v1) }); err != nil {
		return nil, err
	}
	return st, nil
}

// Output computes the outputs of the segment (T x V), chunk-parallel:
//
//	O = scale (Qg H + (Q Kᵀ ⊙ Γ ⊙ causal) V')
func Output(s *Segment, st *States) (*mat.Dense, error) {
	if err := s.checkStates("Output", st); err != nil {
		return nil, err
	}
	o := mat.NewDense(s.T, s.Dv, nil)
	ws := getScratch()
	defer putScratch(ws)
	for ci := range s.Chunks {
		c := &s.Chunks[ci]
		ws.reset()
		oc := rowsOf(o, c.Start, c.Start+c.Len)
		intra := ws.dense(c.Len, s.Dv)
		mulNN(intra, c.attention(ws), rowsOf(st.VNew, c.Start, c.Start+c.Len))
		mulNN(oc, c.Qg, st.H[ci])
		addTo(oc, intra)
		scaleTo(oc, s.Scale, oc)
	}
	return o, nil
}

// ---- Backward: local dV', offset walk, tape walk ------------------------------------------------------------

// DVLocal returns dV'_local (T x V), the gradient of V' through the in-chunk output term alone:
//
//	dV'_local = scale (Q Kᵀ ⊙ Γ ⊙ causal)ᵀ dO      (per chunk)
func DVLocal(s *Segment, dO *mat.Dense) (*mat.Dense, error) {
	if err := s.tokenMatrix("DVLocal: dO", dO, s.Dv); err != nil {
		return nil, err
	}
	dv := mat.NewDense(s.T, s.Dv, nil)
	ws := getScratch()
	defer putScratch(ws)
	for ci := range s.Chunks {
		c := &s.Chunks[ci]
		ws.reset()
		dvc := rowsOf(dv, c.Start, c.Start+c.Len)
		mulTN(dvc, c.attention(ws), rowsOf(dO, c.Start, c.Start+c.Len))
		scaleTo(dvc, s.Scale, dvc)
	}
	return dv, nil
}

// Offset is a segment's affine map from its terminal adjoint to its start adjoint: D_start = PT D_end + R.
type Offset struct {
	PT *mat.Dense // K x K: M_1ᵀ ... M_Nᵀ, the transpose of the summary's P
	R  *mat.Dense // K x V: the start adjoint reached from a zero terminal adjoint with the segment's dO
}

// NewOffset allocates a zero Offset for s, for the tile functions to fill.
func NewOffset(s *Segment) *Offset {
	return &Offset{PT: mat.NewDense(s.Dk, s.Dk, nil), R: mat.NewDense(s.Dk, s.Dv, nil)}
}

func (s *Segment) checkDO(what string, dvLocal, dO *mat.Dense) error {
	if err := s.tokenMatrix(what+": dV'_local", dvLocal, s.Dv); err != nil {
		return err
	}
	return s.tokenMatrix(what+": dO", dO, s.Dv)
}

// OffsetWalkRTile computes columns [v0, v1) of R: from D = 0 at the segment's end, in reverse chunk order,
// dV' = dV'_local + Kt D, D <- exp(gamma_last) D + scale Qgᵀ dO - Wᵀ dV'. It writes only those columns of r.
func OffsetWalkRTile(s *Segment, dvLocal, dO, r *mat.Dense, v0, v1 int) error {
	if err := s.checkDO("OffsetWalkRTile", dvLocal, dO); err != nil {
		return err
	}
	if err := checkOut("offset R", r, s.Dk, s.Dv); err != nil {
		return err
	}
	if err := checkTile("OffsetWalkRTile", v0, v1, s.Dv); err != nil {
		return err
	}
	d := colsOf(r, v0, v1)
	d.Zero()
	scratch := tileScratch(v1 - v0)
	for ci := len(s.Chunks) - 1; ci >= 0; ci-- {
		c := &s.Chunks[ci]
		backwardChunk(c, s.Scale, chunkCols(dvLocal, c, v0, v1), chunkCols(dO, c, v0, v1), d, scratch(c.Len))
	}
	return nil
}

// OffsetWalkPTTile computes columns [c0, c1) of Pᵀ: from D = I at the segment's end, in reverse chunk
// order, D <- M_cᵀ D = exp(gamma_last) D - Wᵀ (Kt D). It writes only those columns of pt (K x K).
func OffsetWalkPTTile(s *Segment, pt *mat.Dense, c0, c1 int) error {
	if err := checkOut("offset PT", pt, s.Dk, s.Dk); err != nil {
		return err
	}
	if err := checkTile("OffsetWalkPTTile", c0, c1, s.Dk); err != nil {
		return err
	}
	d := colsOf(pt, c0, c1)
	d.Copy(colsOf(identity(s.Dk), c0, c1))
	scratch := tileScratch(c1 - c0)
	for ci := len(s.Chunks) - 1; ci >= 0; ci-- {
		c := &s.Chunks[ci]
		backwardChunk(c, s.Scale, nil, nil, d, scratch(c.Len))
	}
	return nil
}

// OffsetWalk computes the segment's Offset with tiles of vh columns. The result does not depend on vh.
func OffsetWalk(s *Segment, dvLocal, dO *mat.Dense, vh int) (*Offset, error) {
	off := NewOffset(s)
	if err := tiles("OffsetWalk", s.Dv, vh, func(v0, v1 int) error { return OffsetWalkRTile(s, dvLocal, dO, off.R, v0, v1) }); err != nil {
		return nil, err
	}
	if err := tiles("OffsetWalk", s.Dk, vh, func(c0, c1 int) error { return OffsetWalkPTTile(s, off.PT, c0, c1) }); err != nil {
		return nil, err
	}
	return off, nil
}

// Tape is what the tape walk keeps for the chunk-parallel gradients.
type Tape struct {
	D      []*mat.Dense // per chunk, K x V: the adjoint of the state at the chunk's end
	DVNew  *mat.Dense   // T x V: dV' = dV'_local + Kt D, chunk by chunk
	DStart *mat.Dense   // K x V: the adjoint of the segment's start state (its gradient)
}

// NewTape allocates a zero Tape for s, for TapeWalkTile to fill.
func NewTape(s *Segment) *Tape {
	tp := &Tape{DVNew: mat.NewDense(s.T, s.Dv, nil), DStart: mat.NewDense(s.Dk, s.Dv, nil)}
	for range s.Chunks {
		tp.D = append(tp.D, mat.NewDense(s.Dk, s.Dv, nil))
	}
	return tp
}

func (s *Segment) checkTape(what string, tp *Tape) error {
	if tp == nil || len(tp.D) != len(s.Chunks) || tp.DVNew == nil || tp.DStart == nil {
		return fmt.Errorf("gdnref: %s: tape must come from NewTape for this segment", what)
	}
	if err := s.tokenMatrix(what+": dV'", tp.DVNew, s.Dv); err != nil {
		return err
	}
	return checkState(what+": start adjoint", tp.DStart, s.Dk, s.Dv)
}

// TapeWalkTile runs columns [v0, v1) of the tape walk from the true terminal adjoint dEnd (K x V; nil means
// zero), in reverse chunk order: it stores D (the adjoint at the chunk's end), then
// dV' = dV'_local + Kt D and D <- exp(gamma_last) D + scale Qgᵀ dO - Wᵀ dV'. It writes only those columns of
// tp.D, tp.DVNew and tp.DStart (the gradient of the segment's start state; the running adjoint lives
// there, so dEnd must not share storage with tp).
func TapeWalkTile(s *Segment, dvLocal, dO, dEnd *mat.Dense, tp *Tape, v0, v1 int) error {
	if err := s.checkDO("TapeWalkTile", dvLocal, dO); err != nil {
		return err
	}
	if err := checkState("TapeWalkTile: terminal adjoint", dEnd, s.Dk, s.Dv); err != nil {
		return err
	}
	if err := s.checkTape("TapeWalkTile", tp); err != nil {
		return err
	}
	if err := checkTile("TapeWalkTile", v0, v1, s.Dv); err != nil {
		return err
	}
	d := colsOf(tp.DStart, v0, v1) // the running adjoint lives in the start adjoint's columns
	if dEnd != nil {
		d.Copy(colsOf(dEnd, v0, v1))
	} else {
		d.Zero()
	}
	for ci := len(s.Chunks) - 1; ci >= 0; ci-- {
		c := &s.Chunks[ci]
		colsOf(tp.D[ci], v0, v1).Copy(d)
		backwardChunk(c, s.Scale, chunkCols(dvLocal, c, v0, v1), chunkCols(dO, c, v0, v1), d, chunkCols(tp.DVNew, c, v0, v1))
	}
	return nil
}

// TapeWalk runs the tape walk over all value columns in tiles of vh. The result does not depend on vh.
func TapeWalk(s *Segment, dvLocal, dO, dEnd *mat.Dense, vh int) (*Tape, error) {
	tp := NewTape(s)
	if err := tiles("TapeWalk", s.Dv, vh, func(v0, v1 int) error { return TapeWalkTile(s, dvLocal, dO, dEnd, tp, v0, v1) }); err != nil {
		return nil, err
	}
	return tp, nil
}

// FoldedOutput returns the output's operands folded ahead of the state walk, for chunk ci of s:
//
//	Qeff   = Qg - P W      (Len x K)
//	Ointra = P U           (Len x V),    P = Q Kᵀ ⊙ Γ ⊙ causal
//
// Since V' = U - W H, the output O = scale (Qg H + P V') is scale (Qeff H + Ointra): one product with the
// chunk's start state H, where Output needs H, V' and P. Both depend only on the chunk's inputs, so a
// chunk-parallel kernel (the prep) can form them before the walk, and the walk can finish O itself from
// the H it holds (docs/perf-notes.md, "The output folded into the prep and the walk").
func FoldedOutput(s *Segment, ci int) (qeff, ointra *mat.Dense, err error) {
	if ci < 0 || ci >= len(s.Chunks) {
		return nil, nil, fmt.Errorf("gdnref: FoldedOutput: chunk %d not within [0, %d)", ci, len(s.Chunks))
	}
	c := &s.Chunks[ci]
	ws := getScratch()
	defer putScratch(ws)
	p := c.attention(ws)
	qeff = mat.NewDense(c.Len, s.Dk, nil)
	mulNN(qeff, p, c.W)
	qeff.Sub(c.Qg, qeff)
	ointra = mat.NewDense(c.Len, s.Dv, nil)
	mulNN(ointra, p, c.U)
	return qeff, ointra, nil
}

// OutputFolded computes the outputs of the segment (T x V) from FoldedOutput's operands and the chunks'
// start states: O = scale (Qeff H + Ointra). It equals Output up to rounding.
func OutputFolded(s *Segment, st *States) (*mat.Dense, error) {
	if err := s.checkStates("OutputFolded", st); err != nil {
		return nil, err
	}
	o := mat.NewDense(s.T, s.Dv, nil)
	for ci := range s.Chunks {
		c := &s.Chunks[ci]
		qeff, ointra, err := FoldedOutput(s, ci)
		if err != nil {
			return nil, err
		}
		oc := rowsOf(o, c.Start, c.Start+c.Len)
		mulNN(oc, qeff, st.H[ci])
		addTo(oc, ointra)
		scaleTo(oc, s.Scale, oc)
	}
	return o, nil
}
