package kcp

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
)

// fakeGPURows makes every rank's output and gradient rows as the GPU backend
// keeps them, random bf16 / fp32 values, and the same as float64 global
// tensors filled token by token (the reference for the parallel passes).
func fakeGPURows(t *testing.T, p *Plan, stage Stage, seed uint64) (*gpuGradRows, *Output, *Grads) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	cfg := p.Config
	nq, nv, C, HV := cfg.HQK*gpuD, cfg.HV*gpuD, p.ConvChannels(), cfg.HV
	b16 := func(n int) []bf16.BF16 {
		x := make([]bf16.BF16, n)
		for i := range x {
			x[i] = bf16.Float32ToBF16(float32(rng.NormFloat64()))
		}
		return x
	}
	f32 := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	out := newGPUOutRows(p)
	gr := &gpuGradRows{plan: p, stage: stage, out: out, rows: make([]*gradRows, len(p.Ranks))}
	wantO := &Output{O: make([]float64, p.OutputShape().Size())}
	wantG := newGrads(p, stage)
	for r, rp := range p.Ranks {
		Tr := rp.Tokens
		o := b16(Tr * nv)
		require.NoError(t, out.set(r, o))
		rows := &gradRows{DG: f32(Tr * HV), DBeta: f32(Tr * HV)}
		if stage == StageModule {
			rows.DX = b16(Tr * C)
		} else {
			rows.DQ, rows.DK, rows.DV = b16(Tr*nq), b16(Tr*nq), b16(Tr*nv)
		}
		require.NoError(t, checkGradRows(p, r, *rows))
		gr.rows[r] = rows
		for _, seg := range rp.Segments {
			for i := 0; i < seg.Len; i++ {
				lt, gt := seg.LocalStart+i, seg.Start+i
				for j := 0; j < nv; j++ {
					wantO.O[gt*nv+j] = float64(o[lt*nv+j].Float32())
				}
				for j := 0; j < nq; j++ {
					if rows.DX != nil {
						wantG.DQ[gt*nq+j] = float64(rows.DX[lt*C+j].Float32())
						wantG.DK[gt*nq+j] = float64(rows.DX[lt*C+nq+j].Float32())
					} else {
						wantG.DQ[gt*nq+j] = float64(rows.DQ[lt*nq+j].Float32())
						wantG.DK[gt*nq+j] = float64(rows.DK[lt*nq+j].Float32())
					}
				}
				for j := 0; j < nv; j++ {
					if rows.DX != nil {
						wantG.DV[gt*nv+j] = float64(rows.DX[lt*C+2*nq+j].Float32())
					} else {
						wantG.DV[gt*nv+j] = float64(rows.DV[lt*nv+j].Float32())
					}
				}
				for h := 0; h < HV; h++ {
					wantG.DG[gt*HV+h] = float64(rows.DG[lt*HV+h])
					wantG.DBeta[gt*HV+h] = float64(rows.DBeta[lt*HV+h])
				}
			}
		}
	}
	if stage == StageModule {
		gr.dconvW = f32(C * ConvWidth)
		for i, v := range gr.dconvW {
			wantG.DConvW[i] = float64(v)
		}
	}
	return gr, wantO, wantG
}

// The GPU backend's host results: the float64 tensors made in parallel
// blocks equal a token-by-token fill, bit for bit; the digests made from the
// GPU's rows equal RankDigest of those tensors (with and without the
// gradients); segments longer than a block and every layout included.
func TestGPUResultRows(t *testing.T) {
	for _, stage := range []Stage{StageCore, StageModule} {
		for _, layout := range Layouts() {
			t.Run(fmt.Sprintf("%s/%s", stage, layout), func(t *testing.T) {
				p, err := NewPlan(PlanConfig{Docs: []int{7000, 3, 900}, Ranks: 3, Layout: layout, HQK: 1, HV: 2, DK: 128, DV: 128})
				require.NoError(t, err)
				gr, wantO, wantG := fakeGPURows(t, p, stage, 11)
				long := false
				for _, rp := range p.Ranks {
					long = long || len(tokenBlocks(rp.Segments)) > len(rp.Segments)
				}
				require.True(t, long, "no segment spans several blocks")
				gotO := gr.out.output()
				requireBitwise(t, "output", gotO.O, wantO.O)
				require.Same(t, gotO, gr.out.output(), "made once")
				gotG := gr.gradients()
				gt, wt := gotG.Tensors(), wantG.Tensors()
				require.Len(t, gt, len(wt))
				for i := range gt {
					requireBitwise(t, gt[i].Name, gt[i].Data, wt[i].Data)
				}
				seen := map[string]bool{}
				for r := range p.Ranks {
					want, wantOut := requireRankDigests(t, p, r, gr, wantO, wantG)
					require.NotEqual(t, want, wantOut)
					require.False(t, seen[want], "rank %d: digest repeated", r)
					seen[want] = true
				}
				// A rank that did not run here has no digest.
				gr.out.rows[1], gr.rows[1] = nil, nil
				_, err = (&GPUGrads{rows: gr}).RankDigest(1)
				require.ErrorContains(t, err, "rank 1 did not run in this process")
				_, err = (&GPUGrads{rows: gr}).RankDigest(3)
				require.ErrorContains(t, err, "rank 3 outside")
			})
		}
	}
}

// The parallel checks name the first bad element in block order (the same
// one whatever the scheduling) and count every one, in any block.
func TestGPUCheckRowsBlocks(t *testing.T) {
	p, err := NewPlan(PlanConfig{Docs: []int{5000}, Ranks: 1, Layout: LayoutC, HQK: 1, HV: 2, DK: 128, DV: 128})
	require.NoError(t, err)
	row := 2 * gpuD
	o := make([]bf16.BF16, p.Tokens*row)
	for _, lt := range []int{4100, 2050, 4999} { // blocks 4, 2 and 4
		o[lt*row+3] = poisonBF16
	}
	o[3000*row+gpuD] = bf16.NaN
	for range 5 {
		err := newGPUOutRows(p).set(0, o)
		require.ErrorContains(t, err, "rank 0: output: 3 elements never written, 1 NaN; first at token 2050 (local 2050, document 0) head 0 column 3")
	}
	dg := make([]float32, p.Tokens*2)
	dg[4500*2+1] = math.Float32frombits(PoisonF32)
	dg[1030*2] = float32(math.NaN())
	err = checkF32Rows(0, "dg", tokenBlocks(p.Ranks[0].Segments), dg, 2, func(h int) string { return fmt.Sprintf("value head %d", h) })
	require.ErrorContains(t, err, "rank 0: dg: 1 elements never written, 1 NaN; first at token 1030 (local 1030, document 0) value head 0: NaN")
}

// A rank holding no tokens that ran here (setEmpty, as the forward, the
// recompute and the backward record it) has the digest RankDigest gives
// from the float64 tensors, in both stages; one left unrecorded has none.
func TestGPURowsEmptyRank(t *testing.T) {
	for _, stage := range []Stage{StageCore, StageModule} {
		t.Run(fmt.Sprint(stage), func(t *testing.T) {
			p, err := NewPlan(PlanConfig{Docs: []int{1, 2}, Ranks: 4, Layout: LayoutC, HQK: 1, HV: 2, DK: 128, DV: 128})
			require.NoError(t, err)
			gr, wantO, wantG := fakeGPURows(t, p, stage, 3)
			var empty []int
			for r, rp := range p.Ranks {
				if rp.Tokens == 0 {
					empty = append(empty, r)
				}
			}
			require.NotEmpty(t, empty, "the plan has no empty rank")
			for _, r := range empty {
				gr.out.rows[r], gr.rows[r] = nil, nil
				_, err := (&GPUGrads{rows: gr}).RankDigest(r)
				require.ErrorContains(t, err, fmt.Sprintf("rank %d did not run in this process", r))
				require.NoError(t, gr.out.setEmpty(r))
				gr.setEmpty(r, stage == StageModule)
				requireRankDigests(t, p, r, gr, wantO, wantG)
			}
		})
	}
}

// requireRankDigests requires rank's digests from the GPU's rows (output
// and gradients, and output alone) equal to RankDigest's from the float64
// tensors, and returns those two.
func requireRankDigests(t *testing.T, p *Plan, r int, gr *gpuGradRows, wantO *Output, wantG *Grads) (string, string) {
	t.Helper()
	want, err := RankDigest(p, r, wantO, wantG)
	require.NoError(t, err)
	got, err := (&GPUGrads{rows: gr}).RankDigest(r)
	require.NoError(t, err)
	require.Equal(t, want, got, "rank %d: output and gradients", r)
	wantOut, err := RankDigest(p, r, wantO, nil)
	require.NoError(t, err)
	gotOut, err := (&GPUForward{plan: p, out: gr.out}).RankDigest(r)
	require.NoError(t, err)
	require.Equal(t, wantOut, gotOut, "rank %d: output", r)
	return want, wantOut
}
