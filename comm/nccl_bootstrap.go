package comm

import (
	"errors"
	"fmt"

	"github.com/gdnkcp/gdnkcp/loader"
)

// NewNCCLCommFromEnv makes this process's rank of a multi-process NCCL communicator from a launcher's
// environment ([EnvFromOS]), with NCCL's own bootstrap instead of a home-made rendezvous: it puts
// e.NCCLCommID into the process environment as NCCL_COMM_ID ([Env.Export]), so that ncclGetUniqueId
// on every rank encodes that address and NCCL's rank 0 creates the bootstrap root there during init;
// then it makes rank e.Rank of e.WorldSize on ctx (usually loader.Primary(e.LocalRank)). A single rank
// needs no NCCL_COMM_ID. NCCL supports one such id per process at a time. Run with NCCL 2.28.3 on four
// H200s, one process a rank under kcp launch (docs/cp-runs.md, 2026-11-29).
func NewNCCLCommFromEnv(ctx *loader.Context, e Env, opts NCCLOptions) (*NCCLComm, error) {
	if e.NCCLCommID == "" && e.WorldSize > 1 {
		return nil, fmt.Errorf("comm: NCCL rank %d of %d: no %s to meet at (set it, or %s and %s)",
			e.Rank, e.WorldSize, EnvNCCLCommID, EnvMasterAddr, EnvMasterPort)
	}
	if err := e.Export(); err != nil {
		return nil, err
	}
	id, err := NewUniqueID()
	if err != nil {
		return nil, err
	}
	c, err := NewNCCLCommWith(ctx, id, e.WorldSize, e.Rank, opts)
	if err != nil && e.NCCLCommID != "" && !errors.Is(err, ErrNoNCCL) {
		err = fmt.Errorf("%w (bootstrap root %s=%s, created by rank 0)", err, EnvNCCLCommID, e.NCCLCommID)
	}
	return c, err
}
