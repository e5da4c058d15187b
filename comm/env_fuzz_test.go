package comm

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseEnv feeds ParseEnv arbitrary launcher variables. It must never
// panic, and what it accepts must keep its documented ranges: ranks inside
// the world and the node, and an NCCL_COMM_ID (read or derived) that is
// host:port with the port in 1..65535, where NCCL can listen.
func FuzzParseEnv(f *testing.F) {
	f.Add("0", "2", "0", "2", "127.0.0.1", "29500", "")
	f.Add("1", "2", "1", "2", "", "", "10.0.0.1:6000")
	f.Add("0", "1", "0", "1", "", "", "")
	f.Add("0", "2", "0", "1", "::1", "65535", "")
	f.Add("3", "2", "0", "2", "h", "0", "")
	f.Add("0", "2", "0", "2", "", "", "[fe80::1]:70000")
	f.Add("-1", "x", "", "0", "a b", "99999999999999999999", ":")
	f.Fuzz(func(t *testing.T, rank, world, lrank, lworld, addr, port, commID string) {
		vars := map[string]string{EnvRank: rank, EnvWorldSize: world, EnvLocalRank: lrank, EnvLocalWorldSize: lworld}
		if addr != "" {
			vars[EnvMasterAddr] = addr
		}
		if port != "" {
			vars[EnvMasterPort] = port
		}
		if commID != "" {
			vars[EnvNCCLCommID] = commID
		}
		e, err := ParseEnv(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
		if err != nil {
			return
		}
		require.True(t, e.WorldSize >= 1 && e.Rank >= 0 && e.Rank < e.WorldSize, "%+v", e)
		require.True(t, e.LocalWorldSize >= 1 && e.LocalWorldSize <= e.WorldSize && e.LocalRank >= 0 && e.LocalRank < e.LocalWorldSize, "%+v", e)
		if e.NCCLCommID == "" {
			require.Equal(t, 1, e.WorldSize, "only a one-rank run has nowhere to meet")
			return
		}
		host, p, err := net.SplitHostPort(e.NCCLCommID)
		require.NoError(t, err, "NCCL_COMM_ID %q", e.NCCLCommID)
		require.NotEmpty(t, host, "NCCL_COMM_ID %q", e.NCCLCommID)
		n, err := strconv.Atoi(p)
		require.NoError(t, err, "NCCL_COMM_ID %q", e.NCCLCommID)
		require.True(t, n >= 1 && n <= 65535, "NCCL_COMM_ID %q: port %d", e.NCCLCommID, n)
	})
}
