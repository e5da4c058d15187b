package gdnref

import (
	"fmt"

	"gonum.org/v1/gonum/mat"
)

// ComposeForward folds a document's chain in order: given the document's initial state s0 (K x V; nil means
// zero) and the summaries of its segments 0..m-2 in chain order (the last segment needs none), it returns the
// true start states of segments 0..m-1:
//
//	S_start(0) = s0,    S_start(j+1) = P_j S_start(j) + Q_j
//
// The fold runs in this fixed order, so the result is deterministic.
func ComposeForward(s0 *mat.Dense, sums []*Summary, dk, dv int) ([]*mat.Dense, error) {
	if err := checkState("ComposeForward: initial state", s0, dk, dv); err != nil {
		return nil, err
	}
	starts := []*mat.Dense{cloneOrZero(s0, dk, dv)}
	for j, sum := range sums {
		if sum == nil {
			return nil, fmt.Errorf("gdnref: ComposeForward: summary %d is nil", j)
		}
		if err := checkState(fmt.Sprintf("ComposeForward: summary %d P", j), sum.P, dk, dk); err != nil {
			return nil, err
		}
		if err := checkState(fmt.Sprintf("ComposeForward: summary %d Q", j), sum.Q, dk, dv); err != nil {
			return nil, err
		}
		next := mat.NewDense(dk, dv, nil)
		mulNN(next, sum.P, starts[j])
		addTo(next, sum.Q)
		starts = append(starts, next)
	}
	return starts, nil
}

// ComposeBackward folds a document's chain in reverse: given the adjoint of the document's final state
// dSFinal (K x V; nil means zero) and the offsets of its segments 1..m-1 in chain order (offs[j] belongs to
// segment j+1; the first segment needs none), it returns the true terminal adjoints of segments 0..m-1:
//
//	D_end(m-1) = dSFinal,    D_end(j) = P_{j+1}ᵀ D_end(j+1) + R_{j+1}
//
// (D_end(j) is the adjoint of segment j+1's start state.) The fold runs from the chain's end, in this fixed
// order.
func ComposeBackward(dSFinal *mat.Dense, offs []*Offset, dk, dv int) ([]*mat.Dense, error) {
	if err := checkState("ComposeBackward: final adjoint", dSFinal, dk, dv); err != nil {
		return nil, err
	}
	m := len(offs) + 1
	ends := make([]*mat.Dense, m)
	ends[m-1] = cloneOrZero(dSFinal, dk, dv)
	for j := m - 2; j >= 0; j-- {
		off := offs[j]
		if off == nil {
			return nil, fmt.Errorf("gdnref: ComposeBackward: offset of segment %d is nil", j+1)
		}
		if err := checkState(fmt.Sprintf("ComposeBackward: offset %d PT", j+1), off.PT, dk, dk); err != nil {
			return nil, err
		}
		if err := checkState(fmt.Sprintf("ComposeBackward: offset %d R", j+1), off.R, dk, dv); err != nil {
			return nil, err
		}
		prev := mat.NewDense(dk, dv, nil)
		mulNN(prev, off.PT, ends[j+1])
		addTo(prev, off.R)
		ends[j] = prev
	}
	return ends, nil
}

// ChunkedForward runs the chunked form on one whole segment (Prep, StateWalk with tiles of vh, Output): the
// same result as Forward up to rounding.
func ChunkedForward(h Head, s0 *mat.Dense, opt Options, vh int) (o, sFinal *mat.Dense, err error) {
	s, err := Prep(h, opt)
	if err != nil {
		return nil, nil, err
	}
	st, err := StateWalk(s, s0, vh)
	if err != nil {
		return nil, nil, err
	}
	o, err = Output(s, st)
	if err != nil {
		return nil, nil, err
	}
	return o, st.Final, nil
}

// ChunkedBackward runs the chunked backward on one whole segment (Prep, StateWalk, DVLocal, TapeWalk from
// dSFinal, ChunkGrads), with tiles of vh: the same result as Backward up to rounding.
func ChunkedBackward(h Head, s0, dO, dSFinal *mat.Dense, opt Options, vh int) (*Grads, error) {
	s, err := Prep(h, opt)
	if err != nil {
		return nil, err
	}
	st, err := StateWalk(s, s0, vh)
	if err != nil {
		return nil, err
	}
	dvl, err := DVLocal(s, dO)
	if err != nil {
		return nil, err
	}
	tp, err := TapeWalk(s, dvl, dO, dSFinal, vh)
	if err != nil {
		return nil, err
	}
	return ChunkGrads(s, st, tp, dO)
}
