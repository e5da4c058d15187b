package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzSweepShow runs `kcp sweep --show FILE` on arbitrary file contents
// (seeded with a real report, fakeReport's, and pieces of one): a saved
// report is printed as the table (exit 0), anything else is refused with a
// reason (exit 1); never a panic, whatever rows, rules or ranks it lists.
func FuzzSweepShow(f *testing.F) {
	var buf bytes.Buffer
	require.NoError(f, writeJSON(&buf, fakeReport(f, nil, "")))
	f.Add(buf.Bytes())
	f.Add([]byte(`{"rows":[{"pack":"P1","rules":[{"rule":"B","digests":["x"],"ranks":[]}]}]}`))
	f.Add([]byte(`{"rows":[{"rules":null}],"summary":null}`))
	f.Add([]byte(`{"rows":[]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "rep.json")
		require.NoError(t, os.WriteFile(path, data, 0o644))
		_, stderr, code := execute("sweep", "--show", path)
		switch code {
		case 0:
		case 1:
			require.NotEmpty(t, stderr, "a refusal says why")
		default:
			t.Fatalf("exit code %d: %s", code, stderr)
		}
	})
}
