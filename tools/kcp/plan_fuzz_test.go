package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzPlanCLI runs `kcp plan` in-process on arbitrary --docs, --cp, --layout,
// --arch, --sms and head counts, as text and as JSON: every run must end with
// exit code 0 (its output complete: JSON that parses) or 1 with a message on
// stderr; never a panic (run recovers none: a panic fails the fuzz target).
func FuzzPlanCLI(f *testing.F) {
	f.Add("300,40,700", 2, "D", "sm_90a", 0, 16, 48, false)
	f.Add("40000,45000,35908", 1, "C", "sm_100a", 0, 0, 0, true)
	f.Add("1,1,1,64,65", 64, "Z", "generic", 84, 1, 2, false)
	f.Add("0", 2, "D", "sm_90a", 0, 0, 0, false)
	f.Add(",,", 2, "D", "sm_90a", 0, 0, 0, true)
	f.Add("99999999999999999999", 1, "C", "sm_90a", 0, 0, 0, false)
	f.Add("1099511627776,1", 1, "C", "sm_90a", 0, 0, 0, false)
	f.Add("5", 0, "Q", "sm_42", -3, -1, 7, false)
	f.Fuzz(func(t *testing.T, docs string, cp int, layout, arch string, sms, hqk, hv int, asJSON bool) {
		// Keep a run fast: the plan's own work grows with the tokens.
		total := 0
		for _, d := range strings.Split(docs, ",") {
			var n int
			if _, err := fmt.Sscan(strings.TrimSpace(d), &n); err == nil && n > 0 {
				total += n
			}
		}
		if total > 1<<22 || len(docs) > 200 {
			t.Skip("over the fuzz budget")
		}
		args := []string{"plan", "--docs", docs, "--cp", fmt.Sprint(cp), "--layout", layout, "--arch", arch,
			"--hqk", fmt.Sprint(hqk), "--hv", fmt.Sprint(hv)}
		if sms != 0 {
			args = append(args, "--sms", fmt.Sprint(sms))
		}
		if asJSON {
			args = append(args, "--json")
		}
		stdout, stderr, code := execute(args...)
		switch code {
		case 0:
			if asJSON {
				require.True(t, json.Valid([]byte(stdout)), "stdout holds only JSON: %q", stdout)
			} else {
				require.Contains(t, stdout, "rank 0")
			}
		case 1:
			require.NotEmpty(t, stderr, "a failure says why")
		default:
			t.Fatalf("exit code %d: %s", code, stderr)
		}
	})
}
