package ptx_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/archdetect"
	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/internal/convref"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/ptx"
)

// TestGPUConv1dSiLU runs the embedded conv1d + SiLU kernel from every blob
// the GPU can load (on an H200: the sm_90a cubin and the compute_80 PTX) on
// random inputs over segments of many lengths, and compares it with the CPU
// reference. The output is poisoned first, so an unwritten element fails.
func TestGPUConv1dSiLU(t *testing.T) {
	if _, err := loader.DeviceCount(); err != nil {
		t.Skipf("needs libcuda.so.1 and a CUDA GPU: %v", err)
	}
	m, err := ptx.Embedded().Manifest()
	require.NoError(t, err)
	if len(m.Blobs) == 0 {
		t.Skip("needs built blobs: the embedded manifest lists none (scripts/blobs-remote.sh)")
	}
	ctx, err := loader.Primary(0)
	require.NoError(t, err)
	ran := 0
	for _, b := range m.Blobs {
		prof, err := archdetect.Detect(0, archdetect.Options{Blob: b.Target, IgnoreEnv: true})
		if err != nil {
			t.Logf("%s: not loadable here: %v", b.Target, err)
			continue
		}
		t.Run(b.Target, func(t *testing.T) {
			k, err := archdetect.Load(ctx, ptx.Embedded(), prof)
			require.NoError(t, err)
			defer k.Close()
			conv, err := k.Function("gdn_conv1d_silu_fwd")
			require.NoError(t, err)
			poison, err := k.Function("gdn_poison_u32")
			require.NoError(t, err)
			cases := []struct {
				name string
				lens []int
				C    int
			}{
				{"vector path", []int{1, 2, 3, 50, 130, 7}, 10240 / 16},
				{"scalar tail", []int{5, 33, 2}, 37},
				{"one long", []int{1000}, 64},
			}
			for i, tc := range cases {
				rng := rand.New(rand.NewPCG(uint64(i)+1, 99))
				segStart, segLen, tokSeg, err := convref.SegmentTables(tc.lens)
				require.NoError(t, err)
				T, C, nseg := len(tokSeg), tc.C, len(tc.lens)
				draw := func(n int, s float64) []bf16.BF16 {
					out := make([]bf16.BF16, n)
					for j := range out {
						out[j] = bf16.Float32ToBF16(float32(rng.NormFloat64() * s))
					}
					return out
				}
				x, w, halo := draw(T*C, 1), draw(C*4, 0.5), draw(nseg*3*C, 1)
				for j := 0; j < 3*C; j++ { // the first segment starts its document
					halo[j] = 0
				}
				ref, err := convref.Conv1dSiLU(x, w, halo, segStart, segLen, tokSeg, T, C, nseg)
				require.NoError(t, err)
				bufs := make([]*loader.Buffer, 0, 7)
				alloc := func(n int) *loader.Buffer {
					b, err := ctx.Alloc(max(n, 4))
					require.NoError(t, err)
					bufs = append(bufs, b)
					return b
				}
				defer func() {
					for _, b := range bufs {
						require.NoError(t, b.Free())
					}
				}()
				dx, dw, dh := alloc(2*len(x)), alloc(2*len(w)), alloc(2*len(halo))
				ds, dl, dt, dy := alloc(4*nseg), alloc(4*nseg), alloc(4*T), alloc(2*T*C+2)
				require.NoError(t, loader.CopyToDevice(dx, x))
				require.NoError(t, loader.CopyToDevice(dw, w))
				require.NoError(t, loader.CopyToDevice(dh, halo))
				require.NoError(t, loader.CopyToDevice(ds, segStart))
				require.NoError(t, loader.CopyToDevice(dl, segLen))
				require.NoError(t, loader.CopyToDevice(dt, tokSeg))
				words := (2*T*C + 3) / 4
				require.NoError(t, loader.Launch(nil, poison, [3]uint32{uint32((words + 255) / 256), 1, 1}, [3]uint32{256, 1, 1}, 0,
					loader.NewArgs().Ptr(dy).U64(uint64(words)).U32(0x7fc17fc1)))
				lanes := (C + 7) / 8
				if C%8 != 0 {
					lanes = C
				}
				items := lanes * ((T + 15) / 16)
				args := loader.NewArgs().Ptr(dx).Ptr(dw).Ptr(dh).Ptr(ds).Ptr(dl).Ptr(dt).Ptr(dy).U32(uint32(T)).U32(uint32(C)).U32(uint32(nseg))
				require.NoError(t, loader.Launch(nil, conv, [3]uint32{uint32((items + 255) / 256), 1, 1}, [3]uint32{256, 1, 1}, 0, args))
				require.NoError(t, ctx.Synchronize())
				y := make([]bf16.BF16, T*C)
				yv, err := dy.View(0, 2*T*C)
				require.NoError(t, err)
				require.NoError(t, loader.CopyFromDevice(yv, y))
				require.NoError(t, ref.Compare(y), "%s: %s", b.Target, tc.name)
			}
		})
		ran++
	}
	if ran == 0 {
		require.NoError(t, errors.New("no embedded blob is loadable on this GPU"))
	}
}
