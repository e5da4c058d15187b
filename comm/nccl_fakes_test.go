package comm

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/fakecuda"
	"github.com/gdnkcp/gdnkcp/internal/fakenccl"
)

// TestNCCLOnFakes runs the NCCL GPU tests (nccl_gpu_test.go: one rank,
// two ranks' all-gathers against the loopback's, the abort on a timeout, the
// init timeout, a duplicate device, two processes a rank each through NCCL_COMM_ID) in a child process on two fake devices
// (internal/fakecuda) and a fake NCCL whose all-gathers really gather
// (internal/fakenccl): the binding's calls, non-blocking waits and aborts
// without a GPU.
func TestNCCLOnFakes(t *testing.T) {
	require.Equal(t, EnvNCCLLibrary, fakenccl.EnvLibrary, "fakenccl's copy of the variable's name")
	so, err := fakenccl.Build(t.TempDir())
	if errors.Is(err, fakenccl.ErrUnsupported) {
		t.Skipf("the fake NCCL: %v", err)
	}
	require.NoError(t, err)
	out := fakecuda.RunChild(t, "TestNCCLGPU[A-Z].*", "FAKECUDA_DEVICES=2", fakenccl.EnvLibrary+"="+so, "FAKENCCL_DIR="+t.TempDir())
	for _, name := range []string{"TestNCCLGPUOneRank", "TestNCCLGPUTwoRanksMatchLoopback", "TestNCCLGPUAbortOnTimeout",
		"TestNCCLGPUInitTimeout", "TestNCCLGPUDuplicateDevice", "TestNCCLGPUProcessPerRank"} {
		require.Contains(t, out, "--- PASS: "+name+" ", out)
	}
	require.NotContains(t, out, "--- SKIP", out)
}
