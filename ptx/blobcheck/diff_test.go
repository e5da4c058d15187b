package blobcheck

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/ptx"
)

func TestChangedUnits(t *testing.T) {
	abc := strings.Split("a b c d e f", " ")
	tests := []struct {
		name string
		x, y []string
		want int
	}{
		{"equal", abc, abc, 0},
		{"both empty", nil, nil, 0},
		{"one empty", nil, abc, 6},
		{"one replaced", abc, strings.Split("a b X d e f", " "), 1},
		{"one inserted: the rest is not shifted", abc, strings.Split("a X b c d e f", " "), 1},
		{"one removed", abc, strings.Split("a b d e f", " "), 1},
		{"all different", abc, strings.Split("u v w x y z", " "), 6},
		{"longer side counts", strings.Split("a b", " "), strings.Split("x y z", " "), 3},
		{"swapped pair", abc, strings.Split("b a c d e f", " "), 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, changedUnits(tc.x, tc.y))
			assert.Equal(t, tc.want, changedUnits(tc.y, tc.x), "symmetric")
		})
	}
}

func TestPTXBodies(t *testing.T) {
	src := `//
.version 8.0
.target sm_80

.func (.param .b32 func_retval0) helper(
	.param .b32 helper_param_0
)
{
	ret;
}

.visible .entry k1(
	.param .u64 k1_param_0
)
{
	ret;
}

.extern .func ext_decl(.param .b32 a);
.entry k2()
{
	ret;
}
`
	b := PTXBodies([]byte(src))
	require.ElementsMatch(t, []string{"helper", "k1", "ext_decl", "k2"}, keys(b))
	assert.Equal(t, ".visible .entry k1(", b["k1"][0])
	assert.Equal(t, "}", b["k1"][len(b["k1"])-1], "trailing blank lines dropped")
	assert.Equal(t, []string{".extern .func ext_decl(.param .b32 a);"}, b["ext_decl"])
	assert.Len(t, b["k2"], 4)
}

func keys(m map[string][]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// writeProbeStore writes the probe blobs, after edit (which may change any
// file's bytes), and their manifest to a new directory.
func writeProbeStore(t *testing.T, edit func(files map[string][]byte)) string {
	t.Helper()
	m, files := probeFixture(t)
	if edit != nil {
		edit(files)
	}
	dir := t.TempDir()
	for i := range m.Blobs {
		b := &m.Blobs[i]
		data := files[b.File]
		b.SHA256, b.Size = ptx.SHA256(data), len(data)
		require.NoError(t, os.WriteFile(filepath.Join(dir, b.File), data, 0o644))
	}
	raw, err := json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ptx.ManifestName), raw, 0o644))
	return dir
}

func TestDiff(t *testing.T) {
	base := ptx.Dir(writeProbeStore(t, nil))
	// The 5th instruction of probe_mixed in the sm_90a cubin, one bit of it.
	flipInstr := func(files map[string][]byte) {
		d := clone(files["probe.sm_90a.cubin"])
		off, size := sectionRange(t, d, ".text.probe_mixed")
		require.Greater(t, size, 5*16)
		d[off+4*16+3] ^= 0x10
		files["probe.sm_90a.cubin"] = d
	}
	// One line added to probe_axpy's body in the compute_80 PTX.
	addLine := func(files map[string][]byte) {
		files["probe.compute_80.ptx"] = replaceOnce(t, files["probe.compute_80.ptx"], "\tfma.rn.f32 \t%f4,", "\tmembar.gl;\n\tfma.rn.f32 \t%f4,")
	}
	tests := []struct {
		name  string
		edit  func(map[string][]byte)
		diffs []string // "target name changed" of every function that differs
	}{
		{"same blobs", nil, nil},
		{"one instruction word", flipInstr, []string{"sm_90a probe_mixed 1"}},
		{"one PTX line", addLine, []string{"compute_80 probe_axpy 1"}},
		{"both", func(f map[string][]byte) { flipInstr(f); addLine(f) }, []string{"sm_90a probe_mixed 1", "compute_80 probe_axpy 1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Diff(base, ptx.Dir(writeProbeStore(t, tc.edit)))
			require.NoError(t, err)
			var differ []string
			functions := 0
			for _, d := range got {
				functions++
				if d.Code != CodeSame {
					assert.Equal(t, CodeDiffers, d.Code)
					differ = append(differ, d.Target+" "+d.Name+" "+strconv.Itoa(d.Changed))
				} else {
					assert.Zero(t, d.Changed)
					assert.Equal(t, d.LenA, d.LenB)
				}
			}
			assert.Equal(t, tc.diffs, differ)
			assert.GreaterOrEqual(t, functions, 6*2, "every slot's two entries compared")
		})
	}
}

func TestDiffMissingSlotAndResources(t *testing.T) {
	dirA := writeProbeStore(t, nil)
	dirB := writeProbeStore(t, nil)
	m, err := ptx.Dir(dirB).Manifest()
	require.NoError(t, err)
	m.Blobs = m.Blobs[:len(m.Blobs)-1] // compute_90a gone
	m.Blobs[0].Entries[0].Resources = &ptx.Resources{Registers: 99}
	raw, err := json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dirB, ptx.ManifestName), raw, 0o644))

	got, err := Diff(ptx.Dir(dirA), ptx.Dir(dirB))
	require.NoError(t, err)
	var only []EntryDiff
	for _, d := range got {
		if d.Code == CodeOnlyA {
			only = append(only, d)
		}
		if d.Target == "sm_90a" && d.Name == "probe_axpy" {
			require.NotNil(t, d.ResA)
			require.NotNil(t, d.ResB)
			assert.Equal(t, 10, d.ResA.Registers)
			assert.Equal(t, 99, d.ResB.Registers)
		}
	}
	require.Len(t, only, 1)
	assert.Equal(t, EntryDiff{Target: "compute_90a", Name: "*", Code: CodeOnlyA, LenA: -1, LenB: -1}, only[0])

	// A blob whose bytes do not match its manifest is an error, not a difference.
	require.NoError(t, os.WriteFile(filepath.Join(dirB, "probe.sm_90a.cubin"), []byte("not a cubin"), 0o644))
	_, err = Diff(ptx.Dir(dirA), ptx.Dir(dirB))
	require.ErrorContains(t, err, "sha256")
}
