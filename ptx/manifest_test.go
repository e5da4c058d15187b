package ptx

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStore(t *testing.T) {
	dir := t.TempDir()
	blob := []byte("fake cubin")
	manifest := `{"generator": "test", "sources": {}, "blobs": [
	  {"target": "sm_90a", "kind": "cubin", "file": "a.cubin", "built_as": "sm_90a", "sha256": "` + SHA256(blob) + `", "size": 10,
	   "entries": [{"name": "k", "params": [{"name": "p0", "type": "u64", "size": 8, "align": 8, "offset": 0},
	                                         {"name": "p1", "type": "u32", "size": 4, "align": 4, "offset": 8}]}]},
	  {"target": "compute_80", "kind": "ptx", "file": "b.ptx", "built_as": "compute_80", "sha256": "00", "size": 3, "entries": []}]}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, ManifestName), []byte(manifest), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.cubin"), blob, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "b.ptx"), []byte("abc"), 0o644))

	s := Dir(dir)
	assert.Equal(t, filepath.Clean(dir), s.Name())
	m, err := s.Manifest()
	require.NoError(t, err)
	b, ok := m.Blob("sm_90a")
	require.True(t, ok)
	e, ok := b.Entry("k")
	require.True(t, ok)
	assert.Equal(t, 12, e.ParamBytes())
	_, ok = b.Entry("missing")
	assert.False(t, ok)
	_, ok = m.Blob("sm_100a")
	assert.False(t, ok)

	data, err := s.Load(b)
	require.NoError(t, err)
	assert.Equal(t, blob, data)
	pb, _ := m.Blob("compute_80")
	_, err = s.Load(pb)
	assert.ErrorContains(t, err, "sha256 "+SHA256([]byte("abc"))+", manifest says 00")
	_, err = s.ReadFile("nope")
	assert.Error(t, err)

	require.NoError(t, os.WriteFile(filepath.Join(dir, ManifestName), []byte("{"), 0o644))
	_, err = s.Manifest()
	assert.ErrorContains(t, err, "decode manifest.json")
	_, err = Dir(filepath.Join(dir, "none")).Manifest()
	assert.ErrorContains(t, err, "read manifest")
}

func TestEmbeddedManifestDecodes(t *testing.T) {
	s := Embedded()
	assert.Equal(t, "embedded", s.Name())
	_, err := s.Manifest()
	require.NoError(t, err)
}

func TestDefaultStore(t *testing.T) {
	t.Setenv(EnvBlobDir, "")
	require.Equal(t, "embedded", Default().Name())
	dir := t.TempDir()
	t.Setenv(EnvBlobDir, dir)
	require.Equal(t, dir, Default().Name())
	_, err := Default().Manifest()
	require.ErrorContains(t, err, dir)
}

// knownWalkSpills are the walk entries of the committed blobs that break the
// no-spill rule, with why: TestEmbeddedWalksDoNotSpill fails for any other
// spilling walk, and for a listed one that no longer spills (then remove it
// here). None since 2026-12-01: the Blackwell state walks' spills went with
// the vh 128 chain parked in shared memory (docs/mma-kernels.md).
var knownWalkSpills = map[string]string{}

// TestEmbeddedWalksDoNotSpill holds the house rule that walk kernels never
// spill registers: every cubin's walk entries (the name holds "walk") have
// no spill stores or loads and no stack frame, as ptxas reported them when
// the blobs were built (the PTX blob has no such record), except the
// documented knownWalkSpills.
func TestEmbeddedWalksDoNotSpill(t *testing.T) {
	m, err := Embedded().Manifest()
	require.NoError(t, err)
	walks := 0
	for _, b := range m.Blobs {
		for _, e := range b.Entries {
			if !strings.Contains(e.Name, "walk") || e.Resources == nil {
				continue
			}
			walks++
			r := e.Resources
			if why, ok := knownWalkSpills[b.Target+" "+e.Name]; ok {
				assert.NotZero(t, r.SpillStores+r.SpillLoads+r.StackFrame, "%s %s no longer spills: remove it from knownWalkSpills", b.Target, e.Name)
				t.Logf("known: %s %s spills %d/%d bytes, %d bytes of stack: %s", b.Target, e.Name, r.SpillStores, r.SpillLoads, r.StackFrame, why)
				continue
			}
			assert.Zero(t, r.SpillStores+r.SpillLoads, "%s %s: %d spill stores, %d spill loads", b.Target, e.Name, r.SpillStores, r.SpillLoads)
			assert.Zero(t, r.StackFrame, "%s %s: %d bytes of stack", b.Target, e.Name, r.StackFrame)
		}
	}
	require.NotZero(t, walks, "no walk entry with ptxas resources in the embedded manifest")
}

// TestEmbeddedBlobsEverySlot: the embedded manifest holds every slot that
// tools/ptxgen builds (its targets; DESIGN.md §5), each entry in each blob, so
// that a partial set (ptxgen -targets, made for timing) is never installed.
func TestEmbeddedBlobsEverySlot(t *testing.T) {
	m, err := Embedded().Manifest()
	require.NoError(t, err)
	var slots []string
	for _, b := range m.Blobs {
		slots = append(slots, b.Target)
	}
	assert.Equal(t, []string{"sm_90a", "sm_100a", "sm_103a", "sm_107a", "compute_80"}, slots)
	for _, b := range m.Blobs {
		assert.Len(t, b.Entries, len(m.Blobs[0].Entries), "%s: every blob holds every entry", b.Target)
	}
}

// TestEmbeddedBlobsMatchSources holds the rule that the committed blobs are
// built from the committed kernels: every source the embedded manifest
// records has the same sha256 in ptx/src, and every .cu file of ptx/src is
// recorded. A kernel change therefore lands with its blobs (tools/ptxgen
// writes both); changes that wait for a GPU session stay in ptx/staging (as
// new files, or as patches to ptx/src that scripts/land-v4.sh applies), and
// after landing them this test fails until the blobs are rebuilt.
func TestEmbeddedBlobsMatchSources(t *testing.T) {
	ents, err := os.ReadDir("src")
	if os.IsNotExist(err) {
		t.Skipf("needs ptx/src (run from the package directory of a full checkout): %v", err)
	}
	require.NoError(t, err)
	m, err := Embedded().Manifest()
	require.NoError(t, err)
	require.NotEmpty(t, m.Sources, "the embedded manifest records no sources")
	for name, want := range m.Sources {
		data, err := os.ReadFile(filepath.Join("src", name))
		require.NoError(t, err, "the manifest records ptx/src/%s", name)
		assert.Equal(t, want, SHA256(data), "ptx/src/%s differs from what the embedded blobs were built from: rebuild them (tools/ptxgen on the GPU machine)", name)
	}
	for _, e := range ents {
		if filepath.Ext(e.Name()) != ".cu" {
			continue
		}
		_, ok := m.Sources[e.Name()]
		assert.True(t, ok, "ptx/src/%s is in no blob: rebuild the blobs, or keep it in ptx/staging until a GPU session can", e.Name())
	}
}
