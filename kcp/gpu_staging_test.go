package kcp

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/loader"
)

// TestGPUStagedUpload copies through a pooled stager what spans several
// chunks (both chunks reused, a short last span) and reads it back: the
// bytes of a plain upload, of dO gathered and converted into the chunks,
// and of a small upload that bypasses the stager. A second run takes the
// same stager from the pool, dropStager gives it back mid-run; reserve tops
// the pool up; a failed stager is closed; everything is freed at the end.
func TestGPUStagedUpload(t *testing.T) {
	if _, err := loader.DeviceCount(); err != nil {
		t.Skipf("needs libcuda.so.1 and a CUDA GPU: %v", err)
	}
	ctx, err := loader.Primary(0)
	require.NoError(t, err)
	defer func() { require.NoError(t, ctx.Close()) }()
	live := devMemLive.Load()
	pool := &stagerPool{ctx: ctx}
	rng := rand.New(rand.NewPCG(1, 2))

	big := make([]uint32, (5*stageChunkBytes+12345)/4) // 5.0007 chunks
	for i := range big {
		big[i] = rng.Uint32()
	}
	small := []float32{1, 2, 3}
	p, err := NewPlan(PlanConfig{Docs: []int{1500, 70, 1900}, Ranks: 2, Layout: LayoutZ, HQK: 16, HV: 48, DK: 128, DV: 128})
	require.NoError(t, err)
	_, dout := RandomInputs(p, StageCore, 9)

	var first *stager
	for run := 0; run < 2; run++ {
		m := newDevMem(ctx, pool)
		s, err := m.stream()
		require.NoError(t, err)
		b, err := upload(m, s, "big", big, 4)
		require.NoError(t, err)
		bs, err := upload(m, s, "small", small, 4)
		require.NoError(t, err)
		if run == 0 {
			first = m.st
		} else {
			require.Same(t, first, m.st, "the second run takes the pooled stager")
		}
		require.NoError(t, m.dropStager())
		require.Nil(t, m.st)
		require.Len(t, pool.idle, 1, "run %d: dropStager gives the stager back mid-run", run)
		var douts []*loader.Buffer
		for r := range p.Ranks {
			d, err := uploadDOut(m, s, p, r, dout)
			require.NoError(t, err)
			douts = append(douts, d)
		}
		require.Same(t, first, m.st, "uploadDOut took the pooled stager again")
		gotBig := make([]uint32, len(big))
		require.NoError(t, download(b, s, "big", gotBig, 4))
		require.Equal(t, big, gotBig, "run %d: staged upload", run)
		gotSmall := make([]float32, len(small))
		require.NoError(t, download(bs, s, "small", gotSmall, 4))
		require.Equal(t, small, gotSmall)
		for r, d := range douts {
			want := gatherDOut(p, r, dout)
			require.Greater(t, 2*len(want), stageChunkBytes, "rank %d's dO spans chunks", r)
			got := make([]bf16.BF16, len(want))
			require.NoError(t, download(d, s, "dout", got, 2))
			require.Equal(t, want, got, "run %d rank %d: dO gathered into the chunks", run, r)
		}
		require.NoError(t, m.free())
	}
	require.Len(t, pool.idle, 1, "one stager, back in the pool")
	require.NoError(t, pool.reserve(1))
	require.Len(t, pool.idle, 1, "reserve(1) with one made makes none")
	require.NoError(t, pool.reserve(3))
	require.Len(t, pool.idle, 3, "reserve(3) makes two more")
	// A stager whose copy failed is closed, not pooled, and no longer counts.
	bad, err := pool.get()
	require.NoError(t, err)
	bad.failed = true
	require.NoError(t, pool.put(bad))
	require.Len(t, pool.idle, 2)
	require.Equal(t, 2, pool.made)
	require.NoError(t, pool.close())
	require.Equal(t, live, devMemLive.Load(), "device memory held after the runs")
}
