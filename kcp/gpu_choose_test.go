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
			set2, why2 := KernelsFor(p)
			assert.Equal(t, [2]string{set, why}, [2]string{set2, why2}, "KernelsFor is chooseKernels")
		})
	}
	set, why := KernelsFor(nil)
	assert.Equal(t, [2]string{"fp32", "auto: fp32 (no blob detected)"}, [2]string{set, why})
	set, _ = KernelsFor(&archdetect.Profile{Name: "no blob"})
	assert.Equal(t, "fp32", set)
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

// TestKernelChoice covers how GPUOptions choose a kernel set: nothing chosen
// is KernelsAuto, a name alone or with its own switches is that set,
// switches alone are their set or KernelsCustom, and a name that is no set
// or disagrees with the switches is an error.
func TestKernelChoice(t *testing.T) {
	named := func(name string, split bool) GPUOptions {
		var o GPUOptions
		require.NoError(t, o.SetKernels(name))
		o.SplitGrads = split
		return o
	}
	for _, c := range []struct {
		name string
		o    GPUOptions
		want string
		err  string
	}{
		{"zero", GPUOptions{}, KernelsAuto, ""},
		{"auto by name", GPUOptions{Kernels: KernelsAuto}, KernelsAuto, ""},
		{"auto by SetKernels", named(KernelsAuto, false), KernelsAuto, ""},
		{"split grads alone", GPUOptions{SplitGrads: true}, KernelsAuto, ""},
		{"fp32 by name", GPUOptions{Kernels: "fp32"}, "fp32", ""},
		{"v5 by name", GPUOptions{Kernels: "v5"}, "v5", ""},
		{"v5 by SetKernels", named("v5", true), "v5", ""},
		{"tc by SetKernels", named("tc", false), "tc", ""},
		{"mma switches", GPUOptions{MMAWalks: true, MMAChunk: true, MMABackwardWalks: true, MMABackwardChunk: true}, "mma", ""},
		{"custom switches", GPUOptions{MMAWalks: true}, KernelsCustom, ""},
		{"unknown name", GPUOptions{Kernels: "v6"}, "", `GPUOptions.Kernels: kcp: kernel set "v6": want one of fp32, tc, mma, v5 or auto`},
		{"custom is no name", GPUOptions{Kernels: KernelsCustom, MMAWalks: true}, "", `kernel set "custom"`},
		{"name and other switches", GPUOptions{Kernels: "v5", TensorCoreWalks: true}, "",
			`GPUOptions.Kernels "v5" and the kernel switches set (those of custom) disagree`},
		{"fp32 with mma switches", func() GPUOptions { o := named("mma", false); o.Kernels = "fp32"; return o }(), "",
			`GPUOptions.Kernels "fp32" and the kernel switches set (those of mma) disagree`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.o.kernelChoice()
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
	// SetKernels and switchesName agree on every set, and SetKernels keeps
	// SplitGrads.
	for _, name := range KernelSets {
		o := named(name, true)
		require.Equal(t, name, o.switchesName())
		require.Equal(t, name, o.Kernels)
		require.True(t, o.SplitGrads, name)
	}
	o := named("v5", false)
	require.NoError(t, o.SetKernels("fp32"))
	require.Equal(t, [8]bool{}, o.kernelSwitches(), "SetKernels clears the other sets' switches")
}
