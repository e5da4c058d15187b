package comm

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// envMap is a launcher environment for ParseEnv.
type envMap map[string]string

func (m envMap) lookup(k string) (string, bool) {
	v, ok := m[k]
	return v, ok
}

// with returns a copy with changes: key, value pairs; the value "-" deletes the key.
func (m envMap) with(kv ...string) envMap {
	out := envMap{}
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "-" {
			delete(out, kv[i])
		} else {
			out[kv[i]] = kv[i+1]
		}
	}
	return out
}

func TestParseEnv(t *testing.T) {
	base := envMap{"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
		"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500"}
	tests := []struct {
		name    string
		env     envMap
		want    Env
		wantErr []string // every one must appear in the error
	}{
		{
			name: "torchrun, NCCL_COMM_ID derived",
			env:  base,
			want: Env{Rank: 1, WorldSize: 4, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "10.0.0.5", MasterPort: 29500,
				NCCLCommID: "10.0.0.5:29501", NCCLCommIDDerived: true},
		},
		{
			name: "NCCL_COMM_ID given wins",
			env:  base.with("NCCL_COMM_ID", "10.0.0.9:4000"),
			want: Env{Rank: 1, WorldSize: 4, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "10.0.0.5", MasterPort: 29500,
				NCCLCommID: "10.0.0.9:4000"},
		},
		{
			name: "NCCL_COMM_ID without MASTER_*",
			env:  base.with("MASTER_ADDR", "-", "MASTER_PORT", "-", "NCCL_COMM_ID", "node0:1234"),
			want: Env{Rank: 1, WorldSize: 4, LocalRank: 1, LocalWorldSize: 2, NCCLCommID: "node0:1234"},
		},
		{
			name: "IPv6 master",
			env:  base.with("MASTER_ADDR", "fe80::1"),
			want: Env{Rank: 1, WorldSize: 4, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "fe80::1", MasterPort: 29500,
				NCCLCommID: "[fe80::1]:29501", NCCLCommIDDerived: true},
		},
		{
			name: "one rank needs no rendezvous",
			env:  envMap{"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"},
			want: Env{WorldSize: 1, LocalWorldSize: 1},
		},
		{
			name: "spaces around numbers",
			env:  base.with("RANK", " 3 ", "MASTER_PORT", "29500\n"),
			want: Env{Rank: 3, WorldSize: 4, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "10.0.0.5", MasterPort: 29500,
				NCCLCommID: "10.0.0.5:29501", NCCLCommIDDerived: true},
		},
		{name: "nothing set", env: envMap{},
			wantErr: []string{"comm: launcher environment: RANK is not set", "WORLD_SIZE is not set", "LOCAL_RANK is not set", "LOCAL_WORLD_SIZE is not set"}},
		{name: "RANK missing", env: base.with("RANK", "-"), wantErr: []string{"RANK is not set"}},
		{name: "RANK not an integer", env: base.with("RANK", "one"), wantErr: []string{`RANK="one" is not an integer`}},
		{name: "WORLD_SIZE not an integer", env: base.with("WORLD_SIZE", "4.0"), wantErr: []string{`WORLD_SIZE="4.0" is not an integer`}},
		{name: "WORLD_SIZE zero", env: base.with("WORLD_SIZE", "0"), wantErr: []string{"WORLD_SIZE=0: want at least 1"}},
		{name: "RANK too large", env: base.with("RANK", "4"), wantErr: []string{"RANK=4 is outside [0, WORLD_SIZE=4)"}},
		{name: "RANK negative", env: base.with("RANK", "-1"), wantErr: []string{"RANK=-1 is outside [0, WORLD_SIZE=4)"}},
		{name: "LOCAL_RANK too large", env: base.with("LOCAL_RANK", "2"), wantErr: []string{"LOCAL_RANK=2 is outside [0, LOCAL_WORLD_SIZE=2)"}},
		{name: "LOCAL_RANK not an integer", env: base.with("LOCAL_RANK", "gpu1"), wantErr: []string{`LOCAL_RANK="gpu1" is not an integer`}},
		{name: "LOCAL_WORLD_SIZE above WORLD_SIZE", env: base.with("LOCAL_WORLD_SIZE", "8"),
			wantErr: []string{"LOCAL_WORLD_SIZE=8 is outside [1, WORLD_SIZE=4]"}},
		{name: "LOCAL_WORLD_SIZE bad, LOCAL_RANK negative", env: base.with("LOCAL_WORLD_SIZE", "0", "LOCAL_RANK", "-2"),
			wantErr: []string{"LOCAL_WORLD_SIZE=0 is outside [1, WORLD_SIZE=4]", "LOCAL_RANK=-2 is negative"}},
		{name: "MASTER_PORT without MASTER_ADDR", env: base.with("MASTER_ADDR", "-"),
			wantErr: []string{`MASTER_PORT="29500" is set but MASTER_ADDR is not`}},
		{name: "MASTER_ADDR without MASTER_PORT", env: base.with("MASTER_PORT", "-"),
			wantErr: []string{`MASTER_ADDR="10.0.0.5" is set but MASTER_PORT is not`}},
		{name: "MASTER_ADDR empty", env: base.with("MASTER_ADDR", " "), wantErr: []string{"MASTER_ADDR is set but empty"}},
		{name: "MASTER_PORT not an integer", env: base.with("MASTER_PORT", "http"), wantErr: []string{`MASTER_PORT="http" is not an integer`}},
		{name: "MASTER_PORT out of range", env: base.with("MASTER_PORT", "70000"), wantErr: []string{"MASTER_PORT=70000 is outside [1, 65535]"}},
		{name: "MASTER_PORT leaves no port for NCCL", env: base.with("MASTER_PORT", "65535"),
			wantErr: []string{"deriving NCCL_COMM_ID as MASTER_ADDR:(MASTER_PORT+1): MASTER_PORT=65535 leaves no port above it"}},
		{name: "NCCL_COMM_ID without a port", env: base.with("NCCL_COMM_ID", "10.0.0.9"),
			wantErr: []string{`NCCL_COMM_ID="10.0.0.9": want host:port`}},
		{name: "NCCL_COMM_ID with a bad port", env: base.with("NCCL_COMM_ID", "10.0.0.9:0"),
			wantErr: []string{`NCCL_COMM_ID="10.0.0.9:0": want host:port: port "0" is not in [1, 65535]`}},
		{name: "NCCL_COMM_ID without a host", env: base.with("NCCL_COMM_ID", ":4000"),
			wantErr: []string{`NCCL_COMM_ID=":4000": want host:port: the host is empty`}},
		{name: "several ranks and nowhere to meet", env: base.with("MASTER_ADDR", "-", "MASTER_PORT", "-"),
			wantErr: []string{"WORLD_SIZE=4 but neither NCCL_COMM_ID nor MASTER_ADDR and MASTER_PORT are set: the ranks have nowhere to meet"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseEnv(tc.env.lookup)
			if len(tc.wantErr) > 0 {
				require.Error(t, err)
				for _, w := range tc.wantErr {
					assert.Contains(t, err.Error(), w)
				}
				assert.Equal(t, Env{}, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestEnvCheckDevices(t *testing.T) {
	tests := []struct {
		localRank, visible int
		wantErr            string
	}{
		{0, 1, ""},
		{1, 2, ""},
		{7, 8, ""},
		{0, 0, "comm: LOCAL_RANK=0 but no GPU is visible (LOCAL_RANK picks the GPU this process drives)"},
		{1, 1, "comm: LOCAL_RANK=1 but only 1 GPU is visible (LOCAL_RANK picks the GPU this process drives)"},
		{3, 2, "comm: LOCAL_RANK=3 but only 2 GPUs are visible (LOCAL_RANK picks the GPU this process drives)"},
	}
	for _, tc := range tests {
		err := Env{LocalRank: tc.localRank}.CheckDevices(tc.visible)
		if tc.wantErr == "" {
			assert.NoError(t, err)
		} else {
			assert.EqualError(t, err, tc.wantErr)
		}
	}
}

func TestNCCLCommIDFor(t *testing.T) {
	tests := []struct {
		addr    string
		port    int
		want    string
		wantErr string
	}{
		{"127.0.0.1", 29500, "127.0.0.1:29501", ""},
		{"node-a", 1, "node-a:2", ""},
		{"::1", 8000, "[::1]:8001", ""},
		{"", 8000, "", "comm: deriving NCCL_COMM_ID: MASTER_ADDR is empty"},
		{"h", 65535, "", "MASTER_PORT=65535 leaves no port above it in [1, 65535]"},
		{"h", 0, "", "MASTER_PORT=0 leaves no port above it"},
	}
	for _, tc := range tests {
		got, err := NCCLCommIDFor(tc.addr, tc.port)
		if tc.wantErr != "" {
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, tc.want, got)
	}
}

func TestEnvFromOSAndExport(t *testing.T) {
	for k, v := range map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"} {
		t.Setenv(k, v)
	}
	t.Setenv(EnvNCCLCommID, "placeholder")
	require.NoError(t, os.Unsetenv(EnvNCCLCommID))
	assert.True(t, EnvPresent())

	e, err := EnvFromOS()
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:29501", e.NCCLCommID)
	assert.True(t, e.NCCLCommIDDerived)

	require.NoError(t, e.Export())
	assert.Equal(t, "127.0.0.1:29501", os.Getenv(EnvNCCLCommID))
	if cv, ok := cGetenv(t, EnvNCCLCommID); ok {
		assert.Equal(t, "127.0.0.1:29501", cv, "NCCL reads the C environment")
	}
	require.NoError(t, e.Export(), "the same value again")

	require.NoError(t, os.Setenv(EnvNCCLCommID, "10.1.1.1:5"))
	assert.EqualError(t, e.Export(), `comm: NCCL_COMM_ID="10.1.1.1:5" is set, but this rank's environment says "127.0.0.1:29501"`)
	assert.NoError(t, Env{}.Export(), "nothing to export")

	e.NCCLCommID, e.WorldSize, e.Rank = "", 2, 1
	_, err = NewNCCLCommFromEnv(nil, e, NCCLOptions{})
	assert.EqualError(t, err, "comm: NCCL rank 1 of 2: no NCCL_COMM_ID to meet at (set it, or MASTER_ADDR and MASTER_PORT)")

	t.Setenv(EnvWorldSize, "x")
	require.NoError(t, os.Unsetenv(EnvWorldSize))
	assert.False(t, EnvPresent())
}
