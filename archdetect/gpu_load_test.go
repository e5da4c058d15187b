package archdetect

import (
	"testing"

	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGPULoadAndLaunch(t *testing.T) {
	ctx := gpu(t)
	t.Setenv(EnvBlob, "")
	store, m := writeStore(t, ptxBlob())
	p, err := Detect(0, Options{Manifest: m})
	require.NoError(t, err)
	require.Equal(t, SlotCompute80, p.Target, "only the PTX blob is there")
	assert.Contains(t, p.Reason, "PTX fallback")

	k, err := Load(ctx, store, p)
	require.NoError(t, err)
	defer func() { assert.NoError(t, k.Close()) }()
	assert.Equal(t, loader.ImagePTX, k.Module().Kind())
	assert.Same(t, p, k.Profile())

	fn, err := k.Function("scale")
	require.NoError(t, err)
	assert.Equal(t, ParamSpecs(scaleParams), fn.Signature(), "the signature comes from the manifest")
	again, err := k.Function("scale")
	require.NoError(t, err)
	assert.Same(t, fn, again)

	const n = 1000
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i) * 0.25
	}
	dx, err := loader.AllocFor[float32](ctx, n)
	require.NoError(t, err)
	defer dx.Free()
	dy, err := loader.AllocFor[float32](ctx, n)
	require.NoError(t, err)
	defer dy.Free()
	require.NoError(t, loader.CopyToDevice(dx, x))
	require.NoError(t, dy.Memset8(0))

	// The manifest's layout is enforced: n as a u64 is refused before launch.
	err = loader.Launch(nil, fn, [3]uint32{4, 1, 1}, [3]uint32{256, 1, 1}, 0, loader.NewArgs().Ptr(dx).Ptr(dy).F32(3).U64(n))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `launch scale: parameter 3 "n"`)

	require.NoError(t, loader.Launch(nil, fn, [3]uint32{4, 1, 1}, [3]uint32{256, 1, 1}, 0, loader.NewArgs().Ptr(dx).Ptr(dy).F32(3).U32(n)))
	got := make([]float32, n)
	require.NoError(t, loader.CopyFromDevice(dy, got))
	for i := range got {
		require.Equal(t, 3*x[i], got[i], "y[%d]", i)
	}

	_, err = k.Function("conv1d_fwd")
	assert.ErrorContains(t, err, `kernel "conv1d_fwd" is not in blob compute_80 (entries: scale)`)
}

func TestGPULoadErrors(t *testing.T) {
	ctx := gpu(t)
	major, minor, err := ctx.Device().ComputeCapability()
	require.NoError(t, err)
	cc := CC{major, minor}

	// A blob whose bytes do not match the manifest's sha256.
	bad := ptxBlob()
	bad.SHA256 = "00"
	store, m := writeStore(t, bad)
	p, err := ProfileFor(cc, 1, "gpu", m, "")
	require.NoError(t, err)
	_, err = Load(ctx, store, p)
	assert.ErrorContains(t, err, "sha256")

	// The manifest calls it a cubin that runs here, the file is PTX: the
	// module is loaded, found wrong, and unloaded.
	liar := ptx.Blob{Target: SlotCompute80, Kind: ptx.KindCubin, File: "liar.cubin", BuiltAs: "compute_80"}
	store, m = writeStore(t, liar)
	p, err = ProfileFor(cc, 1, "gpu", m, "")
	require.NoError(t, err)
	_, err = Load(ctx, store, p)
	assert.ErrorContains(t, err, "the manifest says cubin, the file is ptx")

	// A profile made for another device.
	store, m = writeStore(t, ptxBlob())
	p, err = ProfileFor(cc, 1, "gpu", m, "")
	require.NoError(t, err)
	p.Ordinal = 7
	_, err = Load(ctx, store, p)
	assert.ErrorContains(t, err, "profile is for device 7, context is device 0")

	// A profile whose blob the device cannot run.
	other := CC{10, 0}
	slot := SlotSM100a
	if cc == other {
		other, slot = CC{9, 0}, SlotSM90a
	}
	p, err = ProfileFor(other, 1, "gpu", fakeManifest(slot), "")
	require.NoError(t, err)
	_, err = Load(ctx, store, p)
	assert.ErrorContains(t, err, "blob "+slot+" cannot run on device 0 (compute capability "+cc.String()+")")
}

// TestGPUEmbeddedBlobs loads every embedded blob the device can run and
// resolves each entry with its manifest signature.
func TestGPUEmbeddedBlobs(t *testing.T) {
	ctx := gpu(t)
	store := ptx.Embedded()
	m, err := store.Manifest()
	require.NoError(t, err)
	if len(m.Blobs) == 0 {
		t.Skip("needs built blobs in ptx/blobs: the embedded manifest lists none")
	}
	major, minor, err := ctx.Device().ComputeCapability()
	require.NoError(t, err)
	cc := CC{major, minor}
	loaded := 0
	for _, b := range m.Blobs {
		t.Run(b.Target, func(t *testing.T) {
			p, err := ProfileFor(cc, 1, "device 0", m, b.Target)
			if err != nil {
				t.Skipf("blob %s does not run here: %v", b.Target, err)
			}
			k, err := Load(ctx, store, p)
			require.NoError(t, err)
			defer func() { assert.NoError(t, k.Close()) }()
			for _, e := range b.Entries {
				fn, err := k.Function(e.Name)
				require.NoError(t, err)
				assert.Len(t, fn.Signature(), len(e.Params), "entry %s", e.Name)
			}
			loaded++
		})
	}
	assert.Positive(t, loaded, "at least one embedded blob (the compute_80 PTX) runs on device 0")
}
