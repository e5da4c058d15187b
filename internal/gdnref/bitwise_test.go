package gdnref

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/mat"
)

// walkResults are all walk outputs of one segment at one tile width.
type walkResults struct {
	sum *Summary
	st  *States
	off *Offset
	tp  *Tape
	o   *mat.Dense
	g   *Grads
}

func runWalks(t *testing.T, s *Segment, h0, dO, dEnd *mat.Dense, vh int) walkResults {
	t.Helper()
	var r walkResults
	var err error
	r.sum, err = SummaryWalk(s, vh)
	require.NoError(t, err)
	r.st, err = StateWalk(s, h0, vh)
	require.NoError(t, err)
	r.o, err = Output(s, r.st)
	require.NoError(t, err)
	dvl, err := DVLocal(s, dO)
	require.NoError(t, err)
	r.off, err = OffsetWalk(s, dvl, dO, vh)
	require.NoError(t, err)
	r.tp, err = TapeWalk(s, dvl, dO, dEnd, vh)
	require.NoError(t, err)
	r.g, err = ChunkGrads(s, r.st, r.tp, dO)
	require.NoError(t, err)
	return r
}

func requireSameWalks(t *testing.T, a, b walkResults) {
	t.Helper()
	requireBitwise(t, "summary P", a.sum.P, b.sum.P)
	requireBitwise(t, "summary Q", a.sum.Q, b.sum.Q)
	for i := range a.st.H {
		requireBitwise(t, fmt.Sprintf("state H[%d]", i), a.st.H[i], b.st.H[i])
		requireBitwise(t, fmt.Sprintf("tape D[%d]", i), a.tp.D[i], b.tp.D[i])
	}
	requireBitwise(t, "state V'", a.st.VNew, b.st.VNew)
	requireBitwise(t, "final state", a.st.Final, b.st.Final)
	requireBitwise(t, "output", a.o, b.o)
	requireBitwise(t, "offset PT", a.off.PT, b.off.PT)
	requireBitwise(t, "offset R", a.off.R, b.off.R)
	requireBitwise(t, "tape dV'", a.tp.DVNew, b.tp.DVNew)
	requireBitwise(t, "tape start adjoint", a.tp.DStart, b.tp.DStart)
	requireBitwiseGrads(t, a.g, b.g)
}

// TestWalkTilesBitwise: every walk gives the same bits whatever its column tiling (vh 64 vs 128 at
// K = V = 128; 8 vs 16, and ragged tiles of 5, at K = V = 16), and two runs give the same bits.
func TestWalkTilesBitwise(t *testing.T) {
	for _, tc := range []struct {
		t, d int
		vhs  []int
	}{
		{t: 200, d: 16, vhs: []int{16, 8, 5, 1}},
		{t: 130, d: 128, vhs: []int{128, 64}},
	} {
		t.Run(fmt.Sprintf("K=V=%d", tc.d), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.d), 4))
			h := randHead(rng, tc.t, tc.d, tc.d)
			h0 := randDense(rng, tc.d, tc.d, 1)
			dO := randDense(rng, tc.t, tc.d, 1)
			dEnd := randDense(rng, tc.d, tc.d, 1)
			s, err := Prep(h, Options{})
			require.NoError(t, err)
			ref := runWalks(t, s, h0, dO, dEnd, tc.vhs[0])
			for _, vh := range tc.vhs[1:] {
				requireSameWalks(t, ref, runWalks(t, s, h0, dO, dEnd, vh))
			}
			// A second run from scratch (Prep included), on one thread: gonum's BLAS parallelises over blocks of
			// C only, so the bits do not depend on the thread count either.
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			s2, err := Prep(h, Options{})
			require.NoError(t, err)
			requireSameWalks(t, ref, runWalks(t, s2, h0, dO, dEnd, tc.vhs[0]))
		})
	}
}

// TestTileWritesOnlyItsColumns: a tile call leaves the other columns of its outputs alone.
func TestTileWritesOnlyItsColumns(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	h := randHead(rng, 100, 16, 16)
	s, err := Prep(h, Options{})
	require.NoError(t, err)
	st := NewStates(s)
	st.Final.Apply(func(_, _ int, _ float64) float64 { return 7 }, st.Final)
	require.NoError(t, StateWalkTile(s, nil, st, 4, 8))
	for i := 0; i < 16; i++ {
		for j := 0; j < 16; j++ {
			if j < 4 || j >= 8 {
				require.Equal(t, 7.0, st.Final.At(i, j))
				require.Equal(t, 0.0, st.H[1].At(i, j))
			}
		}
	}
}
