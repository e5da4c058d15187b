package comm

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// The environment variables of torchrun's conventions, which `kcp launch` sets for each child process,
// and NCCL's own.
const (
	EnvRank           = "RANK"             // this process's rank, in [0, WORLD_SIZE)
	EnvWorldSize      = "WORLD_SIZE"       // the number of ranks, >= 1
	EnvLocalRank      = "LOCAL_RANK"       // this process's rank on its host: the GPU it drives
	EnvLocalWorldSize = "LOCAL_WORLD_SIZE" // the number of ranks on this host
	EnvMasterAddr     = "MASTER_ADDR"      // the host of rank 0 (torch's rendezvous store)
	EnvMasterPort     = "MASTER_PORT"      // the port of torch's store on MASTER_ADDR
	EnvNCCLCommID     = "NCCL_COMM_ID"     // host:port of NCCL's bootstrap root, read by NCCL itself
	EnvNCCLNVLSEnable = "NCCL_NVLS_ENABLE" // NVLink multicast; gdnkcp keeps it 0 (see EnsureNVLSOff)
)

// Env is one process's place in a multi-process run, read from the environment a launcher (torchrun,
// `kcp launch`) sets.
type Env struct {
	Rank           int    // RANK
	WorldSize      int    // WORLD_SIZE
	LocalRank      int    // LOCAL_RANK
	LocalWorldSize int    // LOCAL_WORLD_SIZE
	MasterAddr     string // MASTER_ADDR, or "" when unset
	MasterPort     int    // MASTER_PORT, or 0 when unset
	// NCCLCommID is host:port of NCCL's bootstrap root: NCCL_COMM_ID as set, or derived from
	// MASTER_ADDR and MASTER_PORT (see [NCCLCommIDFor]); "" only when WORLD_SIZE is 1 and neither is set.
	NCCLCommID string
	// NCCLCommIDDerived reports that NCCLCommID was derived, not read: [Env.Export] then puts it in the
	// process environment, where NCCL reads it.
	NCCLCommIDDerived bool
}

// EnvPresent reports whether a launcher seems to have set this process's environment (WORLD_SIZE is
// set), so that a program can choose between [EnvFromOS] and running alone.
func EnvPresent() bool {
	_, ok := os.LookupEnv(EnvWorldSize)
	return ok
}

// EnvFromOS reads and checks the environment of this process; see [ParseEnv].
func EnvFromOS() (Env, error) {
	return ParseEnv(os.LookupEnv)
}

// ParseEnv reads torchrun's variables through lookup (os.LookupEnv, or a map in tests) and checks them:
// RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE must be set to integers with WORLD_SIZE >= 1,
// RANK in [0, WORLD_SIZE), LOCAL_WORLD_SIZE in [1, WORLD_SIZE] and LOCAL_RANK in [0,
// LOCAL_WORLD_SIZE); MASTER_ADDR and MASTER_PORT go together, the port in [1, 65535]; NCCL_COMM_ID,
// when set, is host:port. When NCCL_COMM_ID is unset but MASTER_ADDR and MASTER_PORT are set it
// derives NCCL_COMM_ID = MASTER_ADDR:(MASTER_PORT+1) (see [NCCLCommIDFor] for why +1). With more than
// one rank and no way to derive it, that is an error too: the ranks would have nowhere to meet. Every
// error names the variable and its value. Whether LOCAL_RANK names a visible GPU is for
// [Env.CheckDevices], given the device count.
func ParseEnv(lookup func(string) (string, bool)) (Env, error) {
	var e Env
	var errs []error
	integer := func(name string, dst *int) bool {
		v, ok := lookup(name)
		if !ok {
			errs = append(errs, fmt.Errorf("%s is not set", name))
			return false
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q is not an integer", name, v))
			return false
		}
		*dst = n
		return true
	}
	okRank := integer(EnvRank, &e.Rank)
	okWorld := integer(EnvWorldSize, &e.WorldSize)
	okLocal := integer(EnvLocalRank, &e.LocalRank)
	okLocalWorld := integer(EnvLocalWorldSize, &e.LocalWorldSize)
	if okWorld && e.WorldSize < 1 {
		errs = append(errs, fmt.Errorf("%s=%d: want at least 1", EnvWorldSize, e.WorldSize))
		okWorld = false
	}
	if okRank && okWorld && (e.Rank < 0 || e.Rank >= e.WorldSize) {
		errs = append(errs, fmt.Errorf("%s=%d is outside [0, %s=%d)", EnvRank, e.Rank, EnvWorldSize, e.WorldSize))
	}
	if okLocalWorld && (e.LocalWorldSize < 1 || okWorld && e.LocalWorldSize > e.WorldSize) {
		errs = append(errs, fmt.Errorf("%s=%d is outside [1, %s=%d]", EnvLocalWorldSize, e.LocalWorldSize, EnvWorldSize, e.WorldSize))
		okLocalWorld = false
	}
	if okLocal && okLocalWorld && (e.LocalRank < 0 || e.LocalRank >= e.LocalWorldSize) {
		errs = append(errs, fmt.Errorf("%s=%d is outside [0, %s=%d)", EnvLocalRank, e.LocalRank, EnvLocalWorldSize, e.LocalWorldSize))
	} else if okLocal && e.LocalRank < 0 {
		errs = append(errs, fmt.Errorf("%s=%d is negative", EnvLocalRank, e.LocalRank))
	}

	addr, hasAddr := lookup(EnvMasterAddr)
	port, hasPort := lookup(EnvMasterPort)
	addr = strings.TrimSpace(addr)
	switch {
	case hasAddr && !hasPort:
		errs = append(errs, fmt.Errorf("%s=%q is set but %s is not", EnvMasterAddr, addr, EnvMasterPort))
	case hasPort && !hasAddr:
		errs = append(errs, fmt.Errorf("%s=%q is set but %s is not", EnvMasterPort, port, EnvMasterAddr))
	case hasAddr && hasPort:
		if addr == "" {
			errs = append(errs, fmt.Errorf("%s is set but empty", EnvMasterAddr))
		}
		p, err := strconv.Atoi(strings.TrimSpace(port))
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s=%q is not an integer", EnvMasterPort, port))
		case p < 1 || p > 65535:
			errs = append(errs, fmt.Errorf("%s=%d is outside [1, 65535]", EnvMasterPort, p))
		default:
			e.MasterAddr, e.MasterPort = addr, p
		}
	}

	if id, ok := lookup(EnvNCCLCommID); ok {
		id = strings.TrimSpace(id)
		if err := checkHostPort(id); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", EnvNCCLCommID, id, err))
		} else {
			e.NCCLCommID = id
		}
	} else if e.MasterAddr != "" {
		id, err := NCCLCommIDFor(e.MasterAddr, e.MasterPort)
		if err != nil {
			errs = append(errs, err)
		} else {
			e.NCCLCommID, e.NCCLCommIDDerived = id, true
		}
	} else if okWorld && e.WorldSize > 1 && !hasAddr && !hasPort {
		errs = append(errs, fmt.Errorf("%s=%d but neither %s nor %s and %s are set: the ranks have nowhere to meet",
			EnvWorldSize, e.WorldSize, EnvNCCLCommID, EnvMasterAddr, EnvMasterPort))
	}
	if len(errs) > 0 {
		return Env{}, fmt.Errorf("comm: launcher environment: %w", errors.Join(errs...))
	}
	return e, nil
}

// NCCLCommIDFor derives NCCL_COMM_ID from torch's rendezvous: MASTER_ADDR:(MASTER_PORT+1). The +1
// keeps MASTER_PORT itself free for torch's own TCP store, which torchrun (or a torch program in the
// same job) already listens on; NCCL's bootstrap root, created by rank 0 during init, takes the next
// port, which must therefore be free on MASTER_ADDR. An IPv6 address is bracketed.
func NCCLCommIDFor(masterAddr string, masterPort int) (string, error) {
	if masterAddr == "" {
		return "", fmt.Errorf("comm: deriving %s: %s is empty", EnvNCCLCommID, EnvMasterAddr)
	}
	if masterPort < 1 || masterPort >= 65535 {
		return "", fmt.Errorf("comm: deriving %s as %s:(%s+1): %s=%d leaves no port above it in [1, 65535]",
			EnvNCCLCommID, EnvMasterAddr, EnvMasterPort, EnvMasterPort, masterPort)
	}
	return net.JoinHostPort(masterAddr, strconv.Itoa(masterPort+1)), nil
}

// checkHostPort checks an NCCL_COMM_ID value: host:port (an IPv6 host in brackets), port in [1, 65535].
func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("want host:port: %w", err)
	}
	if host == "" {
		return errors.New("want host:port: the host is empty")
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("want host:port: port %q is not in [1, 65535]", port)
	}
	return nil
}

// CheckDevices checks that LOCAL_RANK names one of the visible GPUs (CUDA_VISIBLE_DEVICES already
// applied by the driver): LOCAL_RANK must be below visible.
func (e Env) CheckDevices(visible int) error {
	if e.LocalRank < visible {
		return nil
	}
	seen := fmt.Sprintf("only %d GPUs are visible", visible)
	switch visible {
	case 0:
		seen = "no GPU is visible"
	case 1:
		seen = "only 1 GPU is visible"
	}
	return fmt.Errorf("comm: %s=%d but %s (LOCAL_RANK picks the GPU this process drives)", EnvLocalRank, e.LocalRank, seen)
}

// Export puts a derived NCCLCommID into the process environment as NCCL_COMM_ID, where NCCL's
// ncclGetUniqueId and init read it. It does nothing when NCCL_COMM_ID was read from the environment or
// is empty, and refuses to replace a different NCCL_COMM_ID set since.
func (e Env) Export() error {
	if e.NCCLCommID == "" {
		return nil
	}
	if cur, ok := os.LookupEnv(EnvNCCLCommID); ok {
		if cur != e.NCCLCommID {
			return fmt.Errorf("comm: %s=%q is set, but this rank's environment says %q", EnvNCCLCommID, cur, e.NCCLCommID)
		}
		return nil
	}
	if err := os.Setenv(EnvNCCLCommID, e.NCCLCommID); err != nil {
		return fmt.Errorf("comm: setting %s: %w", EnvNCCLCommID, err)
	}
	return nil
}
