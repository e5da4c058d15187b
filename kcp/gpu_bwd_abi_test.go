package kcp

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// The backward's Go constants agree with ptx/src/gdn_bwd.cu: the entry names
// are exactly the source's extern "C" kernels, the source is part of the
// translation unit that ptxgen builds, and the dynamic shared memory sizes
// equal the source's constexprs (which the source pins with static_asserts,
// so the compiler checks the numbers read here against the expressions).
func TestGPUBackwardABI(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "ptx", "src", "gdn_bwd.cu"))
	if errors.Is(err, os.ErrNotExist) {
		t.Skipf("needs ptx/src/gdn_bwd.cu (run from the package directory of a full checkout): %v", err)
	}
	require.NoError(t, err)
	src := string(raw)

	var got []string
	for _, m := range regexp.MustCompile(`extern "C" __global__ void __launch_bounds__\([^)]*\)\s+(\w+)\(`).FindAllStringSubmatch(src, -1) {
		got = append(got, m[1])
	}
	want := []string{entryDVLocal, entryOffset, entryTape, entryChunkGrads, entryQKBwd, entryConvBwd, entryDWReduce,
		entryAddRows, entryF32ToBF16}
	sort.Strings(got)
	sort.Strings(want)
	require.Equal(t, want, got, "extern \"C\" entries of gdn_bwd.cu")

	tu, err := os.ReadFile(filepath.Join("..", "ptx", "src", "gdnkcp.cu"))
	require.NoError(t, err)
	require.Regexp(t, `(?m)^#include "gdn_bwd.cu"$`, string(tu), "gdnkcp.cu must include gdn_bwd.cu")

	num := func(pattern string) int {
		m := regexp.MustCompile(pattern).FindStringSubmatch(src)
		require.NotNil(t, m, pattern)
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		return n
	}
	require.Equal(t, num(`static_assert\(kDvlSmem == (\d+)`), dvlocalSmem)
	require.Equal(t, num(`static_assert\(kGradSmem == (\d+)`), chunkGradSmem)
	require.Equal(t, num(`static_assert\(bwd_walk_smem\(64\) == (\d+)`), bwdWalkSmem(64))
	require.Equal(t, num(`bwd_walk_smem\(128\) == (\d+)`), bwdWalkSmem(128))
	// The header comment repeats them.
	require.Equal(t, num(`kDvlSmem\s*=\s*(\d+)\s*\n`), dvlocalSmem)
	require.Equal(t, num(`kGradSmem\s*=\s*(\d+)\s*\n`), chunkGradSmem)
	require.Equal(t, num(`= (\d+) \(vh 64\)`), bwdWalkSmem(64))
	require.Equal(t, num(`or (\d+) \(vh 128\)`), bwdWalkSmem(128))
}

// The backward's shared memory sizes, pinned: each within the H200's opt-in
// maximum per block (232448 bytes), and a vh 64 walk small enough for two
// CTAs an SM (233472 bytes an SM, 1 KiB reserved per block).
func TestGPUBackwardSharedMemorySizes(t *testing.T) {
	require.Equal(t, []int{82688, 186368, 98816, 164352},
		[]int{dvlocalSmem, chunkGradSmem, bwdWalkSmem(64), bwdWalkSmem(128)})
	for _, s := range []int{dvlocalSmem, chunkGradSmem, bwdWalkSmem(64), bwdWalkSmem(128)} {
		require.LessOrEqual(t, s, 232448)
	}
	require.LessOrEqual(t, 2*(bwdWalkSmem(64)+1024), 233472)
}
