package archdetect

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scalePTX: y[i] = a * x[i] for i < n; portable sm_80 PTX.
const scalePTX = `.version 8.0
.target sm_80
.address_size 64

.visible .entry scale(
	.param .u64 scale_x,
	.param .u64 scale_y,
	.param .f32 scale_a,
	.param .u32 scale_n
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<6>;
	.reg .f32 %f<4>;
	.reg .b64 %rd<8>;

	ld.param.u64 %rd1, [scale_x];
	ld.param.u64 %rd2, [scale_y];
	ld.param.f32 %f1, [scale_a];
	ld.param.u32 %r1, [scale_n];
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mad.lo.s32 %r5, %r2, %r3, %r4;
	setp.ge.u32 %p1, %r5, %r1;
	@%p1 bra SCALE_DONE;
	cvta.to.global.u64 %rd3, %rd1;
	cvta.to.global.u64 %rd4, %rd2;
	mul.wide.u32 %rd5, %r5, 4;
	add.s64 %rd6, %rd3, %rd5;
	add.s64 %rd7, %rd4, %rd5;
	ld.global.f32 %f2, [%rd6];
	mul.rn.f32 %f3, %f1, %f2;
	st.global.f32 [%rd7], %f3;
SCALE_DONE:
	ret;
}
`

var scaleParams = []ptx.Param{
	{Name: "x", Type: "u64", Size: 8, Align: 8, Offset: 0},
	{Name: "y", Type: "u64", Size: 8, Align: 8, Offset: 8},
	{Name: "a", Type: "f32", Size: 4, Align: 4, Offset: 16},
	{Name: "n", Type: "u32", Size: 4, Align: 4, Offset: 20},
}

// writeStore writes a blob directory holding scalePTX under each given
// blob description and returns it with its manifest.
func writeStore(t *testing.T, blobs ...ptx.Blob) (*ptx.Store, *ptx.Manifest) {
	t.Helper()
	dir := t.TempDir()
	data := []byte(scalePTX)
	m := &ptx.Manifest{Generator: "archdetect test"}
	for _, b := range blobs {
		require.NoError(t, os.WriteFile(filepath.Join(dir, b.File), data, 0o644))
		if b.SHA256 == "" {
			b.SHA256 = ptx.SHA256(data)
		}
		b.Size = len(data)
		b.Entries = []ptx.Entry{{Name: "scale", Params: scaleParams}}
		m.Blobs = append(m.Blobs, b)
	}
	raw, err := json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ptx.ManifestName), raw, 0o644))
	store := ptx.Dir(dir)
	m, err = store.Manifest()
	require.NoError(t, err)
	return store, m
}

func ptxBlob() ptx.Blob {
	return ptx.Blob{Target: SlotCompute80, Kind: ptx.KindPTX, File: "scale.ptx", BuiltAs: "compute_80"}
}

// gpu skips without a driver and a GPU and returns device 0's context.
func gpu(t *testing.T) *loader.Context {
	t.Helper()
	n, err := loader.DeviceCount()
	if err != nil {
		t.Skipf("needs libcuda.so.1 and a CUDA GPU: %v", err)
	}
	if n == 0 {
		t.Skip("needs a CUDA GPU: the driver reports no devices")
	}
	ctx, err := loader.Primary(0)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, ctx.Close()) })
	return ctx
}
