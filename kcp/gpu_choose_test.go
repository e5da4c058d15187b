package kcp

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/archdetect"
	"github.com/gdnkcp/gdnkcp/ptx"
)

// withoutEntries is a copy of b without the named entries.
func withoutEntries(b *ptx.Blob, drop ...string) *ptx.Blob {
	c := *b
	c.Entries = nil
	for _, e := range b.Entries {
		keep := true
		for _, d := range drop {
			keep = keep && e.Name != d
		}
		if keep {
			c.Entries = append(c.Entries, e)
		}
	}
	return &c
}

func TestChooseKernels(t *testing.T) {
	for _, name := range kernelPreference {
		require.NoError(t, new(GPUOptions).SetKernels(name), "kernelPreference name %q", name)
	}
	m, err := ptx.Default().Manifest()
	require.NoError(t, err)
	hopper, ok := m.Blob("sm_90a")
	require.True(t, ok, "the embedded manifest has an sm_90a blob")
	portable, ok := m.Blob("compute_80")
	require.True(t, ok, "the embedded manifest has a compute_80 blob")
	const h200Optin, a100Optin = 232448, 166912
	cases := []struct {
		name   string
		blob   *ptx.Blob
		optin  int
		want   string
		reason string // a piece of why
	}{
		{"H200, embedded sm_90a", hopper, h200Optin, "v5", "the fastest set"},
		{"H200, compute_80 forced", portable, h200Optin, "v5", "the fastest set"},
		{"optin unknown", hopper, 0, "v5", "the fastest set"},
		{"A100: the mma walks do not fit", portable, a100Optin, "fp32", "needs 231424 bytes of shared memory"},
		{"blob without the v5 walks", withoutEntries(hopper, entryStatePlanes), h200Optin, "mma", "v5: blob sm_90a lacks gdn_state_walk_planes"},
		{"blob without any tensor-core kernel", withoutEntries(hopper, entryStatePlanes, entryStateMMA, entryStateTC), h200Optin, "fp32", "tc: blob sm_90a lacks gdn_state_walk_tc"},
		{"blob without the fp32 walk either", withoutEntries(hopper, entryStatePlanes, entryStateMMA, entryStateTC, entryState), h200Optin, "fp32", "no kernel set fits"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := &archdetect.Profile{Name: "Test GPU", Blob: c.blob, Target: c.blob.Target, SharedOptin: c.optin}
			set, why := chooseKernels(p)
			assert.Equal(t, c.want, set, why)
			assert.Contains(t, why, c.reason)
			assert.Contains(t, why, "auto: "+c.want)
		})
	}
}

// TestGPUChooseKernels resolves auto on the GPU present: on a device that
// allows the walks' ~230 KB of shared memory (Hopper, data-centre
// Blackwell) with the embedded blobs it is v5, and NewGPU opens it.
func TestGPUChooseKernels(t *testing.T) {
	prof, err := archdetect.Detect(0, archdetect.Options{})
	if err != nil {
		t.Skipf("needs libcuda.so.1 and a CUDA GPU: %v", err)
	}
	set, why, err := ChooseKernels(0, "")
	require.NoError(t, err)
	t.Logf("%s: %s", prof, why)
	if prof.SharedOptin >= walkMMASmem(64) {
		require.Equal(t, "v5", set, why)
	}
	var opts GPUOptions
	require.NoError(t, opts.SetKernels(set))
	g, err := NewGPU(bwdPlan(t, []int{100, 200}, 2, LayoutC, 1, 2), opts)
	require.NoError(t, err, "NewGPU with the chosen set %s", set)
	require.NoError(t, g.Close())
}
