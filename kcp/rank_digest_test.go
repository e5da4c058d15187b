package kcp

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// rankOnly copies out and g keeping only rank's token rows (dconv_w whole),
// as a process that ran that rank alone holds them.
func rankOnly(p *Plan, rank int, out *Output, g *Grads) (*Output, *Grads) {
	cfg := p.Config
	keep := func(src []float64, width int) []float64 {
		dst := make([]float64, len(src))
		for _, seg := range p.Ranks[rank].Segments {
			copy(dst[seg.Start*width:seg.End()*width], src[seg.Start*width:seg.End()*width])
		}
		return dst
	}
	nq, nv := cfg.HQK*cfg.DK, cfg.HV*cfg.DV
	o := &Output{O: keep(out.O, nv)}
	if g == nil {
		return o, nil
	}
	return o, &Grads{DQ: keep(g.DQ, nq), DK: keep(g.DK, nq), DV: keep(g.DV, nv), DG: keep(g.DG, cfg.HV),
		DBeta: keep(g.DBeta, cfg.HV), DConvW: slices.Clone(g.DConvW)}
}

// RankDigest hashes a rank's own rows only (a process holding that rank
// alone gives the same digest), output then the gradients in Tensors order,
// dconv_w whole; any change of those float64 bits changes it; bad arguments
// are errors.
func TestRankDigest(t *testing.T) {
	ctx := context.Background()
	for _, layout := range Layouts() {
		t.Run(string(layout), func(t *testing.T) {
			p := smallPlan(t, []int{5, 70, 1, 33}, 3, layout, 16)
			in, dout := RandomInputs(p, StageModule, 7)
			be, err := NewCPU(p, Options{Stage: StageModule})
			require.NoError(t, err)
			act, err := be.Forward(ctx, in)
			require.NoError(t, err)
			g, err := act.Backward(ctx, dout)
			require.NoError(t, err)
			seen := map[string]int{}
			for r := range p.Ranks {
				full, err := RankDigest(p, r, act.Out, g)
				require.NoError(t, err)
				require.Len(t, full, 64)
				o1, g1 := rankOnly(p, r, act.Out, g)
				own, err := RankDigest(p, r, o1, g1)
				require.NoError(t, err)
				require.Equal(t, full, own, "rank %d: the other ranks' rows must not count", r)
				outOnly, err := RankDigest(p, r, act.Out, nil)
				require.NoError(t, err)
				require.NotEqual(t, full, outOnly, "rank %d: with and without gradients", r)
				if prev, ok := seen[full]; ok {
					t.Fatalf("ranks %d and %d have the same digest", prev, r)
				}
				seen[full] = r

				// One bit of the rank's own rows, in any tensor, changes it.
				seg := p.Ranks[r].Segments[len(p.Ranks[r].Segments)-1]
				for _, x := range [][]float64{o1.O, g1.DQ, g1.DV, g1.DBeta, g1.DConvW} {
					i := len(x) - 1
					if &x[0] != &g1.DConvW[0] {
						i = seg.End()*len(x)/p.Tokens - 1
					}
					old := x[i]
					x[i] = math.Float64frombits(math.Float64bits(old) ^ 1)
					d, err := RankDigest(p, r, o1, g1)
					require.NoError(t, err)
					require.NotEqual(t, full, d, "rank %d: a flipped bit", r)
					x[i] = old
				}
			}
		})
	}
}

// The digest of a rank's output alone, written out: its segments sorted by
// start, each cut into blocks of at most 1024 tokens; a block's sha256 over
// its rows as little-endian float64 bits; the part's sha256 over the block
// digests; the digest, sha256 over the one part digest.
func TestRankDigestBytes(t *testing.T) {
	p := smallPlan(t, []int{5000, 700}, 2, LayoutZ, 16) // rank 0 holds parts 0 and 3 of 4
	nv := p.Config.HV * p.Config.DV
	out := &Output{O: make([]float64, p.Tokens*nv)}
	for i := range out.O {
		out.O[i] = float64(i) * 0.5
	}
	segs := slices.Clone(p.Ranks[0].Segments)
	require.Greater(t, len(segs), 1, "the rank's tokens are not one run")
	slices.SortFunc(segs, func(a, b Segment) int { return a.Start - b.Start })
	part := sha256.New()
	blocks := 0
	for _, seg := range segs {
		for i0 := 0; i0 < seg.Len; i0 += 1024 {
			var b []byte
			for tok := seg.Start + i0; tok < seg.Start+min(i0+1024, seg.Len); tok++ {
				for _, v := range out.O[tok*nv : (tok+1)*nv] {
					b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
				}
			}
			s := sha256.Sum256(b)
			part.Write(s[:])
			blocks++
		}
	}
	require.Greater(t, blocks, len(segs), "no segment spans several blocks")
	sum := sha256.Sum256(part.Sum(nil))
	got, err := RankDigest(p, 0, out, nil)
	require.NoError(t, err)
	require.Equal(t, hex.EncodeToString(sum[:]), got)
}

func TestRankDigestErrors(t *testing.T) {
	p := smallPlan(t, []int{7}, 2, LayoutC, 16)
	out := &Output{O: make([]float64, p.OutputShape().Size())}
	g := newGrads(p, StageCore)
	for _, tc := range []struct {
		name string
		fn   func() error
		want string
	}{
		{"nil plan", func() error { _, err := RankDigest(nil, 0, out, g); return err }, "plan is nil"},
		{"rank", func() error { _, err := RankDigest(p, 2, out, g); return err }, "rank 2 outside the plan's 2 ranks"},
		{"negative rank", func() error { _, err := RankDigest(p, -1, out, g); return err }, "rank -1 outside"},
		{"nil output", func() error { _, err := RankDigest(p, 0, nil, g); return err }, "output is nil"},
		{"short output", func() error { _, err := RankDigest(p, 0, &Output{O: out.O[1:]}, nil); return err }, "o has"},
		{"short dg", func() error {
			g2 := *g
			g2.DG = g2.DG[:3]
			_, err := RankDigest(p, 0, out, &g2)
			return err
		}, "dg has 3 values"},
		{"dconv_w", func() error {
			g2 := *g
			g2.DConvW = make([]float64, 5)
			_, err := RankDigest(p, 0, out, &g2)
			return err
		}, "dconv_w has 5 values"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorContains(t, tc.fn(), tc.want)
		})
	}
}
