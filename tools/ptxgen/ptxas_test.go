package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/ptx"
)

func TestParsePtxasProbe(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/probe/ptxas.txt")
	require.NoError(t, err)
	res, err := parsePtxas(string(raw))
	require.NoError(t, err)
	require.Len(t, res, 4)
	for _, arch := range []string{"sm_90a", "sm_100a", "sm_103a", "sm_100f"} {
		require.Contains(t, res, arch)
		assert.Equal(t, &ptx.Resources{Registers: 10}, res[arch]["probe_axpy"], arch)
		assert.Equal(t, &ptx.Resources{Registers: 18, SharedStatic: 1024}, res[arch]["probe_mixed"], arch)
	}
}

func TestParsePtxasSpillsAndHelpers(t *testing.T) {
	out := `ptxas info    : 0 bytes gmem
ptxas info    : Function properties for helper
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : Function properties for k
    48 bytes stack frame, 40 bytes spill stores, 36 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 48 bytes cumulative stack size, 16384 bytes smem
ptxas info    : Function properties for helper2
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'k' for 'sm_100a'
ptxas info    : Used 32 registers, 384 bytes cmem[0]
`
	res, err := parsePtxas(out)
	require.NoError(t, err)
	assert.Equal(t, &ptx.Resources{Registers: 255, SpillStores: 40, SpillLoads: 36, StackFrame: 48, SharedStatic: 16384}, res["sm_90a"]["k"])
	assert.Equal(t, &ptx.Resources{Registers: 32}, res["sm_100a"]["k"])

	_, err = parsePtxas("ptxas info : Compiling entry function 'k' for 'sm_90a'\nptxas info : Compiling entry function 'k' for 'sm_90a'\n")
	assert.ErrorContains(t, err, "entry k compiled twice for sm_90a")
}
