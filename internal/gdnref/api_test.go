package gdnref

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/mat"
)

func TestQKHead(t *testing.T) {
	for _, tc := range []struct{ vh, hv, hqk, want int }{
		{0, 48, 16, 0}, {2, 48, 16, 0}, {3, 48, 16, 1}, {47, 48, 16, 15}, {5, 8, 8, 5}, {7, 8, 1, 0},
	} {
		got, err := QKHead(tc.vh, tc.hv, tc.hqk)
		require.NoError(t, err)
		require.Equal(t, tc.want, got, "vh %d of %d/%d", tc.vh, tc.hv, tc.hqk)
	}
	for _, tc := range []struct{ vh, hv, hqk int }{{0, 48, 10}, {48, 48, 16}, {-1, 48, 16}, {0, 0, 0}} {
		_, err := QKHead(tc.vh, tc.hv, tc.hqk)
		require.Error(t, err)
	}
}

func TestSumOverValueHeads(t *testing.T) {
	per := make([]*mat.Dense, 6)
	for i := range per {
		per[i] = mat.NewDense(2, 2, []float64{float64(i), 1, 0, float64(10 * i)})
	}
	out, err := SumOverValueHeads(per, 2) // heads 0,1,2 -> QK 0; 3,4,5 -> QK 1
	require.NoError(t, err)
	require.Len(t, out, 2)
	require.Equal(t, []float64{3, 3, 0, 30}, out[0].RawMatrix().Data)
	require.Equal(t, []float64{12, 3, 0, 120}, out[1].RawMatrix().Data)
	_, err = SumOverValueHeads(per, 4)
	require.Error(t, err)
	per[4] = mat.NewDense(3, 2, nil)
	_, err = SumOverValueHeads(per, 2)
	require.ErrorContains(t, err, "value head 4")
}

// TestBadShapes: mismatched shapes are errors that name what is wrong, never panics.
func TestBadShapes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	good := randHead(rng, 10, 4, 6)
	s, err := Prep(good, Options{})
	require.NoError(t, err)
	dO := randDense(rng, 10, 6, 1)
	dvl, err := DVLocal(s, dO)
	require.NoError(t, err)
	st := NewStates(s)

	bad := good
	bad.K = mat.NewDense(10, 5, nil)
	_, _, err = Forward(bad, nil, Options{})
	require.ErrorContains(t, err, "K is 10x5")
	bad = good
	bad.G = bad.G[:9]
	_, err = Prep(bad, Options{})
	require.ErrorContains(t, err, "G has 9")
	bad = good
	bad.V = mat.NewDense(9, 6, nil)
	_, err = Backward(bad, nil, dO, nil, Options{})
	require.ErrorContains(t, err, "V has 9 rows")

	for name, err := range map[string]error{
		"initial state": func() error { _, _, err := Forward(good, mat.NewDense(4, 5, nil), Options{}); return err }(),
		"dO":            func() error { _, err := Backward(good, nil, mat.NewDense(10, 5, nil), nil, Options{}); return err }(),
		"dSFinal":       func() error { _, err := Backward(good, nil, dO, mat.NewDense(6, 4, nil), Options{}); return err }(),
		"column range":  StateWalkTile(s, nil, st, 4, 7),
		"summary Q":     SummaryWalkQTile(s, nil, 0, 6),
		"summary P":     SummaryWalkPTile(s, mat.NewDense(4, 6, nil), 0, 4),
		"states":        StateWalkTile(s, nil, &States{}, 0, 6),
		"start state":   StateWalkTile(s, mat.NewDense(6, 4, nil), st, 0, 6),
		"tape":          TapeWalkTile(s, dvl, dO, nil, &Tape{}, 0, 6),
		"tile width":    func() error { _, err := StateWalk(s, nil, 0); return err }(),
		"dV'_local":     OffsetWalkRTile(s, mat.NewDense(3, 6, nil), dO, mat.NewDense(4, 6, nil), 0, 6),
		"empty": func() error {
			_, err := Prep(Head{Q: &mat.Dense{}, K: &mat.Dense{}, V: &mat.Dense{}}, Options{})
			return err
		}(),
		"summary 0 P": func() error {
			_, err := ComposeForward(nil, []*Summary{{P: mat.NewDense(4, 5, nil), Q: mat.NewDense(4, 6, nil)}}, 4, 6)
			return err
		}(),
		"offset 1 R": func() error {
			_, err := ComposeBackward(nil, []*Offset{{PT: mat.NewDense(4, 4, nil), R: mat.NewDense(4, 5, nil)}}, 4, 6)
			return err
		}(),
		"w is": func() error {
			_, err := Conv1dForward(mat.NewDense(5, 3, nil), mat.NewDense(3, 3, nil), nil)
			return err
		}(),
		"conv halo": func() error {
			_, err := Conv1dForward(mat.NewDense(5, 3, nil), mat.NewDense(3, 4, nil), mat.NewDense(2, 3, nil))
			return err
		}(),
		"conv dy": func() error {
			_, _, _, err := Conv1dBackward(mat.NewDense(5, 3, nil), mat.NewDense(3, 4, nil), nil, mat.NewDense(4, 3, nil))
			return err
		}(),
	} {
		require.ErrorContains(t, err, name, name)
	}
}

// Example runs a document of 150 tokens cut into two segments through the CP algebra and compares the
// outputs and the final state with the token-by-token recurrence.
func Example() {
	rng := rand.New(rand.NewPCG(1, 2))
	const dk, dv = 16, 16
	doc := randHead(rng, 150, dk, dv)
	first, _ := Prep(sliceHead(doc, 0, 90), Options{})
	second, _ := Prep(sliceHead(doc, 90, 150), Options{})

	sum, _ := SummaryWalk(first, 8) // only the first segment has a successor
	starts, _ := ComposeForward(nil, []*Summary{sum}, dk, dv)
	st1, _ := StateWalk(first, starts[0], 8)
	st2, _ := StateWalk(second, starts[1], 8)
	o1, _ := Output(first, st1)
	o2, _ := Output(second, st2)

	o, sFinal, _ := Forward(doc, nil, Options{})
	fmt.Println(relErr(o1, rowsOf(o, 0, 90)) < 1e-12, relErr(o2, rowsOf(o, 90, 150)) < 1e-12,
		relErr(st2.Final, sFinal) < 1e-12)
	// Output: true true true
}
