package loader

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGPUMemoryRoundTrip(t *testing.T) {
	ctx := gpuContext(t)
	r := rand.New(rand.NewPCG(1, 2))
	s, err := ctx.NewStream(StreamNonBlocking)
	require.NoError(t, err)
	defer func() { assert.NoError(t, s.Close()) }()

	for _, size := range []int{1, 7, 4096, 1<<20 + 3} {
		t.Run("", func(t *testing.T) {
			src := make([]byte, size)
			for i := range src {
				src[i] = byte(r.Uint32())
			}
			a, err := ctx.Alloc(size)
			require.NoError(t, err)
			b, err := ctx.Alloc(size)
			require.NoError(t, err)

			require.NoError(t, a.CopyHtoD(src))
			got := make([]byte, size)
			require.NoError(t, a.CopyDtoH(got))
			assert.Equal(t, src, got, "sync HtoD/DtoH")

			require.NoError(t, b.CopyDtoD(a))
			clear(got)
			require.NoError(t, b.CopyDtoH(got))
			assert.Equal(t, src, got, "DtoD")

			require.NoError(t, b.Memset8(0x5a))
			require.NoError(t, b.CopyDtoH(got))
			assert.Equal(t, byteRepeat(0x5a, size), got, "Memset8")

			// Async through pinned host memory on a stream.
			host, err := ctx.AllocHost(size)
			require.NoError(t, err)
			copy(host.Bytes(), src)
			require.NoError(t, b.Memset8Async(0, s))
			require.NoError(t, b.CopyHtoDAsync(host.Bytes(), s))
			require.NoError(t, s.Synchronize()) // the DMA reads host memory until then
			clear(host.Bytes())
			require.NoError(t, b.CopyDtoHAsync(host.Bytes(), s))
			require.NoError(t, s.Synchronize())
			assert.Equal(t, src, host.Bytes(), "async through pinned memory")
			require.NoError(t, b.CopyDtoDAsync(a, s))
			require.NoError(t, s.Synchronize())

			if size%4 == 0 {
				require.NoError(t, b.Memset32Async(0x01020304, s))
				require.NoError(t, s.Synchronize())
				words := make([]uint32, size/4)
				require.NoError(t, CopyFromDevice(b, words))
				for i, w := range words {
					require.Equal(t, uint32(0x01020304), w, "word %d", i)
				}
				require.NoError(t, b.Memset32(7))
				require.NoError(t, CopyFromDeviceAsync(b, words, s))
				assert.Equal(t, uint32(7), words[len(words)-1])
			} else {
				assert.ErrorContains(t, b.Memset32(1), "multiples of 4")
			}

			// A view addresses the middle of a buffer.
			if size > 2 {
				v, err := a.View(1, size-2)
				require.NoError(t, err)
				mid := make([]byte, size-2)
				require.NoError(t, v.CopyDtoH(mid))
				assert.Equal(t, src[1:size-1], mid, "view")
				require.NoError(t, v.Free())
				assert.ErrorIs(t, v.CopyDtoH(mid), ErrClosed)
				require.NoError(t, a.CopyDtoH(got), "freeing a view keeps its owner")
			}

			assert.ErrorContains(t, a.CopyHtoD(make([]byte, size+1)), "do not fit")
			require.NoError(t, host.Free())
			require.NoError(t, host.Free(), "Free is idempotent")
			assert.Nil(t, host.Bytes())
			require.NoError(t, a.Free())
			require.NoError(t, a.Free(), "Free is idempotent")
			assert.ErrorIs(t, a.CopyHtoD(src), ErrClosed)
			require.NoError(t, b.Free())
		})
	}
}

func TestGPUTypedCopies(t *testing.T) {
	ctx := gpuContext(t)
	r := rand.New(rand.NewPCG(3, 4))
	src := randFloats(r, 1000)
	buf, err := AllocFor[float32](ctx, len(src))
	require.NoError(t, err)
	defer buf.Free()
	assert.Equal(t, 4000, buf.Size())
	require.NoError(t, CopyToDevice(buf, src))
	got := make([]float32, len(src))
	require.NoError(t, CopyFromDevice(buf, got))
	assert.Equal(t, src, got)
	assert.ErrorContains(t, CopyToDevice(buf, src[:999]), "999 elements of 4 bytes are 3996 bytes, the buffer has 4000")
	assert.ErrorContains(t, CopyFromDevice(buf, make([]float64, 1000)), "8000 bytes")
	pairs := make([]pair, 500)
	require.NoError(t, CopyFromDevice(buf, pairs), "a struct of two 4-byte fields views the same bytes")
	assert.Equal(t, got[1], pairs[0].B)
}

// TestGPUCleanupSafetyNet: a buffer dropped without Free is released by the
// garbage collector's cleanup.
func TestGPUCleanupSafetyNet(t *testing.T) {
	ctx := gpuContext(t)
	require.NoError(t, TakeCleanupError())
	const size = 1 << 30
	before, _, err := ctx.MemGetInfo()
	require.NoError(t, err)
	func() {
		b, err := ctx.Alloc(size)
		require.NoError(t, err)
		during, _, err := ctx.MemGetInfo()
		require.NoError(t, err)
		require.Less(t, during, before-size/2, "the allocation shows in MemGetInfo")
		_ = b
	}()
	deadline := time.Now().Add(10 * time.Second)
	var after uint64
	for time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
		after, _, err = ctx.MemGetInfo()
		require.NoError(t, err)
		if after > before-size/2 {
			break
		}
	}
	assert.Greater(t, after, before-size/2, "the dropped buffer was freed")
	assert.NoError(t, TakeCleanupError())
}
