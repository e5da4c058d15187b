package convref

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
)

func bfs(v ...float32) []bf16.BF16 { return bf16.FromFloat32s(v) }

func silu32(a float64) float32 { return bf16.Round(float32(SiLU(a))) }

func TestHandComputed(t *testing.T) {
	// C = 2 channels; one segment of 4 tokens; halo rows h0 (oldest), h1, h2.
	x := bfs(1, 10, 2, 20, 3, 30, 4, 40)
	halo := bfs(-1, -10, -2, -20, -3, -30)
	st, ln, ts, err := SegmentTables([]int{4})
	require.NoError(t, err)
	tests := []struct {
		name string
		w    []bf16.BF16 // [2, 4]
		want []float64   // pre-activation sums, [4, 2]
	}{
		{"identity tap", bfs(0, 0, 0, 1, 0, 0, 0, 1), []float64{1, 10, 2, 20, 3, 30, 4, 40}},
		{"oldest tap reads halo oldest first", bfs(1, 0, 0, 0, 1, 0, 0, 0), []float64{-1, -10, -2, -20, -3, -30, 1, 10}},
		{"middle tap", bfs(0, 0, 1, 0, 0, 0, 1, 0), []float64{-3, -30, 1, 10, 2, 20, 3, 30}},
		{"all taps per channel", bfs(1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5),
			[]float64{-1 - 2 - 3 + 1, 0.5 * (-10 - 20 - 30 + 10), -2 - 3 + 1 + 2, 0.5 * (-20 - 30 + 10 + 20), -3 + 1 + 2 + 3, 0.5 * (-30 + 10 + 20 + 30), 1 + 2 + 3 + 4, 0.5 * (10 + 20 + 30 + 40)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Conv1dSiLU(x, tc.w, halo, st, ln, ts, 4, 2, 1)
			require.NoError(t, err)
			for i, a := range tc.want {
				assert.InDeltaf(t, SiLU(a), r.Exact[i], 1e-12, "output %d", i)
				assert.Equalf(t, silu32(a), r.Y[i].Float32(), "output %d", i)
			}
			require.NoError(t, r.Compare(r.Y))
		})
	}
}

// randBF16 returns n values in about [-scale, scale], rounded to bf16.
func randBF16(rng *rand.Rand, n int, scale float64) []bf16.BF16 {
	out := make([]bf16.BF16, n)
	for i := range out {
		out[i] = bf16.Float32ToBF16(float32((rng.Float64()*2 - 1) * scale))
	}
	return out
}

// TestPiecesEqualWholeDocuments cuts documents into pieces, places them in a
// rank buffer in a scrambled order with the right halos, and checks that every
// token gets the same output as in a conv over its whole document.
func TestPiecesEqualWholeDocuments(t *testing.T) {
	tests := []struct {
		name   string
		docs   []int   // document lengths
		cuts   [][]int // per document: piece lengths, summing to the document length
		order  [][2]int
		c      int
		startH bool // the first piece of each document gets a zero halo
	}{
		{"one document, one piece", []int{7}, [][]int{{7}}, [][2]int{{0, 0}}, 3, true},
		{"zigzag pieces", []int{10, 5}, [][]int{{2, 3, 3, 2}, {1, 1, 2, 1}}, [][2]int{{0, 0}, {0, 3}, {1, 1}, {1, 2}, {0, 2}, {1, 0}, {1, 3}, {0, 1}}, 9, true},
		{"pieces shorter than the halo", []int{6}, [][]int{{1, 1, 1, 2, 1}}, [][2]int{{0, 4}, {0, 2}, {0, 0}, {0, 3}, {0, 1}}, 16, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			C := tc.c
			w := randBF16(rng, C*Width, 1)
			docs := make([][]bf16.BF16, len(tc.docs))
			want := make([][]float64, len(tc.docs))
			for d, L := range tc.docs {
				docs[d] = randBF16(rng, L*C, 3)
				// Whole-document conv: zeros before the document.
				for tk := 0; tk < L; tk++ {
					for c := 0; c < C; c++ {
						acc := 0.0
						for i := 0; i < Width; i++ {
							if q := tk - Halo + i; q >= 0 {
								acc += float64(w[c*Width+i].Float32()) * float64(docs[d][q*C+c].Float32())
							}
						}
						want[d] = append(want[d], SiLU(acc))
					}
				}
			}
			// Build the rank buffer from the pieces in the given order.
			var x, halo []bf16.BF16
			var lens []int
			type origin struct{ doc, tok int }
			var where []origin
			for _, pc := range tc.order {
				d, p := pc[0], pc[1]
				start := 0
				for _, l := range tc.cuts[d][:p] {
					start += l
				}
				l := tc.cuts[d][p]
				lens = append(lens, l)
				x = append(x, docs[d][start*C:(start+l)*C]...)
				for r := 0; r < Halo; r++ {
					tok := start - Halo + r
					for c := 0; c < C; c++ {
						if tok < 0 {
							halo = append(halo, 0)
						} else {
							halo = append(halo, docs[d][tok*C+c])
						}
					}
				}
				for i := 0; i < l; i++ {
					where = append(where, origin{d, start + i})
				}
			}
			st, ln, ts, err := SegmentTables(lens)
			require.NoError(t, err)
			T := len(where)
			r, err := Conv1dSiLU(x, w, halo, st, ln, ts, T, C, len(lens))
			require.NoError(t, err)
			for tok, o := range where {
				for c := 0; c < C; c++ {
					require.InDeltaf(t, want[o.doc][o.tok*C+c], r.Exact[tok*C+c], 1e-12, "token %d (doc %d tok %d) channel %d", tok, o.doc, o.tok, c)
				}
			}
		})
	}
}

// kernelLike computes the outputs the way the CUDA kernel does: fp32 fused
// multiply-adds in tap order, fp32 SiLU, rounded to bf16.
func kernelLike(x, w, halo []bf16.BF16, st, ts []int32, T, C int) []bf16.BF16 {
	y := make([]bf16.BF16, T*C)
	for t := 0; t < T; t++ {
		s := int(ts[t])
		j := t - int(st[s])
		for c := 0; c < C; c++ {
			var acc float32
			for i := 0; i < Width; i++ {
				var xv bf16.BF16
				if q := j - Halo + i; q >= 0 {
					xv = x[(int(st[s])+q)*C+c]
				} else {
					xv = halo[(s*Halo+q+Halo)*C+c]
				}
				acc = float32(math.FMA(float64(w[c*Width+i].Float32()), float64(xv.Float32()), float64(acc)))
			}
			e := float32(math.Exp(float64(-acc)))
			y[t*C+c] = bf16.Float32ToBF16(acc / (1 + e))
		}
	}
	return y
}

func TestCompareAcceptsFP32Kernel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	st, ln, ts, err := SegmentTables([]int{5, 1, 0, 64, 3})
	require.NoError(t, err)
	T, C, nseg := 73, 40, 5
	x := randBF16(rng, T*C, 4)
	w := randBF16(rng, C*Width, 1)
	halo := randBF16(rng, nseg*Halo*C, 4)
	r, err := Conv1dSiLU(x, w, halo, st, ln, ts, T, C, nseg)
	require.NoError(t, err)
	got := kernelLike(x, w, halo, st, ts, T, C)
	require.NoError(t, r.Compare(got))
	diff := 0
	for i := range got {
		d := bf16.ULPDistance(got[i], r.Y[i])
		require.LessOrEqual(t, d, 1, "output %d", i)
		diff += d
	}
	t.Logf("%d of %d fp32 outputs differ from the rounded float64 reference by one bf16 ulp", diff, len(got))
}

func TestCompareRejects(t *testing.T) {
	st, ln, ts, err := SegmentTables([]int{3})
	require.NoError(t, err)
	x := bfs(1, 2, 3, 4, 5, 6)
	w := bfs(0.25, 0.5, 0.75, 1, 1, -1, 1, -1)
	r, err := Conv1dSiLU(x, w, make([]bf16.BF16, 6), st, ln, ts, 3, 2, 1)
	require.NoError(t, err)
	tests := []struct {
		name   string
		mutate func(y []bf16.BF16) []bf16.BF16
		msg    string
	}{
		{"two ulps off", func(y []bf16.BF16) []bf16.BF16 { y[3] += 2; return y }, "1 of 6 outputs differ; first at token 1 channel 1"},
		{"nan", func(y []bf16.BF16) []bf16.BF16 { y[0] = bf16.NaN; return y }, "first at token 0 channel 0"},
		{"poison left", func(y []bf16.BF16) []bf16.BF16 { y[4], y[5] = 0xFFFF, 0xFFFF; return y }, "2 of 6 outputs differ; first at token 2 channel 0"},
		{"short", func(y []bf16.BF16) []bf16.BF16 { return y[:5] }, "got 5 outputs, want 6"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.mutate(append([]bf16.BF16(nil), r.Y...))
			assert.ErrorContains(t, r.Compare(got), tc.msg)
		})
	}
}

func TestValidate(t *testing.T) {
	good := func() (x, w, halo []bf16.BF16, st, ln, ts []int32) {
		st, ln, ts, _ = SegmentTables([]int{2, 2})
		return make([]bf16.BF16, 8), make([]bf16.BF16, 8), make([]bf16.BF16, 12), st, ln, ts
	}
	tests := []struct {
		name   string
		mutate func(x, w, halo *[]bf16.BF16, st, ln, ts *[]int32)
		msg    string
	}{
		{"ok", func(x, w, halo *[]bf16.BF16, st, ln, ts *[]int32) {}, ""},
		{"short x", func(x, w, halo *[]bf16.BF16, st, ln, ts *[]int32) { *x = (*x)[:7] }, "x has 7 elements, want 8"},
		{"short w", func(x, w, halo *[]bf16.BF16, st, ln, ts *[]int32) { *w = (*w)[:4] }, "w has 4 elements, want 8"},
		{"short halo", func(x, w, halo *[]bf16.BF16, st, ln, ts *[]int32) { *halo = (*halo)[:6] }, "halo has 6 elements, want 12"},
		{"segment past the end", func(x, w, halo *[]bf16.BF16, st, ln, ts *[]int32) { (*ln)[1] = 3 }, "segment 1 [2, 2+3) is outside"},
		{"token in wrong segment", func(x, w, halo *[]bf16.BF16, st, ln, ts *[]int32) { (*ts)[1] = 1 }, "token 1 lies in segment 0 but tok_seg says 1"},
		{"token outside every segment", func(x, w, halo *[]bf16.BF16, st, ln, ts *[]int32) { (*ln)[1] = 1 }, "token 3 is outside its segment 1"},
		{"bad segment index", func(x, w, halo *[]bf16.BF16, st, ln, ts *[]int32) { (*ln)[1] = 1; (*ts)[3] = 9 }, "tok_seg[3] = 9"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x, w, halo, st, ln, ts := good()
			tc.mutate(&x, &w, &halo, &st, &ln, &ts)
			err := Validate(x, w, halo, st, ln, ts, 4, 2, 2)
			if tc.msg == "" {
				require.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.msg)
			_, err = Conv1dSiLU(x, w, halo, st, ln, ts, 4, 2, 2)
			assert.ErrorContains(t, err, tc.msg)
		})
	}
}

func TestSegmentTables(t *testing.T) {
	st, ln, ts, err := SegmentTables([]int{2, 0, 3})
	require.NoError(t, err)
	assert.Equal(t, []int32{0, 2, 2}, st)
	assert.Equal(t, []int32{2, 0, 3}, ln)
	assert.Equal(t, []int32{0, 0, 2, 2, 2}, ts)
	_, _, _, err = SegmentTables([]int{1, -1})
	assert.ErrorContains(t, err, "segment 1 has negative length -1")
}

func TestTolerance(t *testing.T) {
	// Half a bf16 ulp at 1.0 is 2^-8; the fp32 part is tiny next to it.
	assert.InDelta(t, math.Ldexp(1, -8), Tolerance(1, 0), math.Ldexp(1, -19))
	assert.Greater(t, Tolerance(0, 1000), Tolerance(0, 0))
	assert.Greater(t, Tolerance(0, 0), 0.0)
}
