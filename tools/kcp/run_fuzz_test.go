package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzRunCLI runs `kcp run --backend cpu` in-process on arbitrary small
// packs, rank counts, layouts, stages, modes, heads and dims, with the check
// on and JSON out: every run must end with exit code 0 and errors against
// the naive recurrence under 1e-9, or exit 1 with a message; never a panic.
func FuzzRunCLI(f *testing.F) {
	f.Add("300,40,70", 2, "D", "module", "b1", 1, 2, 16, uint64(1))
	f.Add("1,1,1,1", 8, "Z", "core", "b3", 1, 1, 16, uint64(2))
	f.Add("64,65", 3, "C", "module", "b3", 2, 4, 32, uint64(3))
	f.Add("5", 0, "X", "attention", "b2", 3, 4, 17, uint64(4))
	f.Add("", 2, "D", "core", "b1", 1, 2, 16, uint64(5))
	f.Fuzz(func(t *testing.T, docs string, cp int, layout, stage, mode string, hqk, hv, dim int, seed uint64) {
		total := 0
		for _, d := range strings.Split(docs, ",") {
			var n int
			if _, err := fmt.Sscan(strings.TrimSpace(d), &n); err == nil && n > 0 {
				total += n
			}
		}
		if total > 2000 || len(docs) > 100 || hqk > 4 || hv > 8 || dim > 32 {
			t.Skip("over the fuzz budget")
		}
		stdout, stderr, code := execute("run", "--backend", "cpu", "--docs", docs, "--cp", fmt.Sprint(cp), "--layout", layout,
			"--stage", stage, "--mode", mode, "--hqk", fmt.Sprint(hqk), "--hv", fmt.Sprint(hv), "--dk", fmt.Sprint(dim),
			"--dv", fmt.Sprint(dim), "--seed", fmt.Sprint(seed), "--json", "--no-progress")
		switch code {
		case 0:
			var rep struct {
				RelErr map[string]float64 `json:"rel_err"`
			}
			require.NoError(t, json.Unmarshal([]byte(stdout), &rep), "stdout holds one JSON object: %q", stdout)
			require.NotEmpty(t, rep.RelErr, "the check ran")
			for name, e := range rep.RelErr {
				require.Less(t, e, 1e-9, "%s against the naive recurrence", name)
			}
		case 1:
			require.NotEmpty(t, stderr, "a failure says why")
		default:
			t.Fatalf("exit code %d: %s", code, stderr)
		}
	})
}
