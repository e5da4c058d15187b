// Package fakenccl builds a stand-in NCCL library for host-side tests on
// machines without a GPU (csrc/fakenccl.c): the NCCL functions package comm
// binds, for ranks on fake devices whose memory is host memory
// (internal/fakecuda), in one process or, where NCCL_COMM_ID is set (as a
// launcher sets it) and so names the group, in several: such a group lives
// in files of the folder FAKENCCL_DIR (default /dev/shm, else /tmp). Its
// all-gathers really gather, in rank order, so a run over it gives the
// loopback's bits; every call returns at once and ncclCommGetAsyncError
// reports ncclInProgress until a communicator's group is complete and its
// last all-gather has every rank, as a non-blocking communicator does.
// Tests point package comm at it through comm.EnvNCCLLibrary, in a child
// process (comm reads the variable once).
package fakenccl

import (
	_ "embed"
	"errors"
	"fmt"

	"github.com/gdnkcp/gdnkcp/internal/cshared"
)

//go:embed csrc/fakenccl.c
var source string

// EnvLibrary is comm.EnvNCCLLibrary (package comm's tests check the copy):
// the NCCL library package comm opens in place of libnccl.so.2.
const EnvLibrary = "GDNKCP_NCCL_LIBRARY"

// ErrUnsupported is returned by Build where the fake cannot be built: no C
// compiler (cc), or another platform than linux/amd64 and linux/arm64.
var ErrUnsupported = errors.New("fakenccl: cannot build the fake NCCL library here")

// Build compiles the fake NCCL into dir and returns the library's path.
func Build(dir string) (string, error) {
	so, err := cshared.Build(dir, "fakenccl", source)
	if errors.Is(err, cshared.ErrUnsupported) {
		return "", fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	if err != nil {
		return "", fmt.Errorf("fakenccl: %w", err)
	}
	return so, nil
}
