package cpuemu

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/internal/convref"
)

const cases = 6 // the cases of testdata/harness.cpp (conv forward)

// reader decodes the case files little-endian.
type reader struct {
	raw []byte
	off int
}

func (r *reader) i32() int32 {
	v := int32(binary.LittleEndian.Uint32(r.raw[r.off:]))
	r.off += 4
	return v
}

func (r *reader) i32s(n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = r.i32()
	}
	return out
}

func (r *reader) bf16s(n int) []bf16.BF16 {
	out := make([]bf16.BF16, n)
	for i := range out {
		out[i] = bf16.BF16(binary.LittleEndian.Uint16(r.raw[r.off:]))
		r.off += 2
	}
	return out
}

func TestConvKernelOnCPU(t *testing.T) {
	bin := built(t, "harness")
	dir := t.TempDir()
	out, err := exec.Command(bin, dir).CombinedOutput()
	require.NoError(t, err, "running the harness:\n%s", out)
	t.Logf("harness:\n%s", out)

	for ci := 0; ci < cases; ci++ {
		t.Run(fmt.Sprintf("case%d", ci), func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("case%d.bin", ci)))
			require.NoError(t, err)
			r := &reader{raw: raw}
			T, C, nseg, bad := int(r.i32()), int(r.i32()), int(r.i32()), int(r.i32())
			x, w, halo := r.bf16s(T*C), r.bf16s(C*4), r.bf16s(nseg*3*C)
			ss, sl, ts := r.i32s(nseg), r.i32s(nseg), r.i32s(T)
			y := r.bf16s(T * C)
			require.Equal(t, len(raw), r.off, "case file size")
			if bad >= 0 {
				// The kernel skips the token with a bad segment index: its
				// outputs keep the poison. The reference needs valid tables,
				// so give the token back its segment and its outputs.
				for c := 0; c < C; c++ {
					assert.Equal(t, bf16.BF16(0xFFFF), y[bad*C+c], "skipped token %d channel %d was written", bad, c)
				}
				ts[bad] = ts[bad-1]
			}
			ref, err := convref.Conv1dSiLU(x, w, halo, ss, sl, ts, T, C, nseg)
			require.NoError(t, err)
			if bad >= 0 {
				copy(y[bad*C:(bad+1)*C], ref.Y[bad*C:(bad+1)*C])
			}
			require.NoError(t, ref.Compare(y))
			for i := range y {
				require.LessOrEqual(t, bf16.ULPDistance(y[i], ref.Y[i]), 1, "output %d", i)
			}
		})
	}
}
