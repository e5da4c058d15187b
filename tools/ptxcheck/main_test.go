package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/gdnkcp/gdnkcp/ptx/blobcheck"
)

const probeDir = "../../testdata/probe"

var probeSlots = []struct{ file, target, kind, builtAs string }{
	{"probe.sm_90a.cubin", "sm_90a", ptx.KindCubin, "sm_90a"},
	{"probe.sm_100a.cubin", "sm_100a", ptx.KindCubin, "sm_100a"},
	{"probe.sm_103a.cubin", "sm_103a", ptx.KindCubin, "sm_103a"},
	{"probe.sm_100f.cubin", "sm_107a", ptx.KindCubin, "sm_100f"},
	{"probe.compute_80.ptx", "compute_80", ptx.KindPTX, "compute_80"},
	{"probe.sm_90a.ptx", "compute_90a", ptx.KindPTX, "compute_90a"},
}

// probeStore copies the probe blobs to a directory with a manifest whose
// parameter layouts come from the probe PTX, and returns the directory.
func probeStore(t *testing.T) string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(probeDir, "probe.compute_80.ptx"))
	require.NoError(t, err)
	mod := blobcheck.ParsePTX(text)
	require.Empty(t, mod.Issues)
	var entries []ptx.Entry
	for _, e := range mod.Exported() {
		entries = append(entries, ptx.Entry{Name: e.Name, Params: e.Params})
	}
	dir := t.TempDir()
	m := ptx.Manifest{Generator: "ptxcheck test", Sources: map[string]string{}}
	for _, s := range probeSlots {
		data, err := os.ReadFile(filepath.Join(probeDir, s.file))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, s.file), data, 0o644))
		m.Blobs = append(m.Blobs, ptx.Blob{Target: s.target, Kind: s.kind, File: s.file, BuiltAs: s.builtAs,
			SHA256: ptx.SHA256(data), Size: len(data), Entries: entries})
	}
	raw, err := json.MarshalIndent(m, "", "  ")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ptx.ManifestName), raw, 0o644))
	return dir
}

func noDriver() (gpuDriver, error) { return nil, errors.New("loader: CUDA driver library not found") }

func runCLI(t *testing.T, driver func() (gpuDriver, error), args ...string) (int, []string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut, driver)
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	return code, lines, errOut.String()
}

// assertLines checks that a line starts with each of contains and, unless
// last is empty, that the last line is last.
func assertLines(t *testing.T, lines, contains []string, last string) {
	t.Helper()
	for _, want := range contains {
		found := false
		for _, l := range lines {
			found = found || strings.HasPrefix(l, want)
		}
		assert.Truef(t, found, "no line starting %q in\n%s", want, strings.Join(lines, "\n"))
	}
	if last != "" {
		assert.Equal(t, last, lines[len(lines)-1])
	}
}

func TestCLI(t *testing.T) {
	dir := probeStore(t)
	flipped := probeStore(t)
	p := filepath.Join(flipped, "probe.sm_90a.cubin")
	d, err := os.ReadFile(p)
	require.NoError(t, err)
	d[len(d)/2] ^= 1
	require.NoError(t, os.WriteFile(p, d, 0o644))

	tests := []struct {
		name     string
		args     []string
		code     int
		contains []string // lines that must appear
		last     string   // prefix of the last line
	}{
		{name: "probe blobs pass", args: []string{dir}, code: 0, last: "ptxcheck: " + dir + ": 6 blobs, 12 entries: all checks passed"},
		{name: "verbose", args: []string{"-v", dir}, code: 0, contains: []string{"blob probe.sm_90a.cubin (cubin sm_90a, 2 entries): ok"}},
		{name: "flipped byte", args: []string{flipped}, code: 1,
			contains: []string{"probe.sm_90a.cubin: sha256: file hashes to "}, last: "ptxcheck: " + flipped + ": 6 blobs (1 failing), 12 entries: 1 failure"},
		{name: "missing directory", args: []string{filepath.Join(dir, "nope")}, code: 1, contains: []string{"manifest.json: manifest: ptx: "}},
		{name: "gpu without a driver", args: []string{dir, "--gpu"}, code: 1,
			contains: []string{"driver: gpu: no CUDA driver: loader: CUDA driver library not found (--gpu needs a machine with a GPU and its driver)"},
			last:     "ptxcheck: " + dir + ": 6 blobs, 12 entries: all checks passed; gpu: no driver"},
		{name: "help", args: []string{"-h"}, code: 0, contains: []string{"usage: ptxcheck [--gpu] [-v] [DIR]"}},
		{name: "unknown flag", args: []string{"--cpu"}, code: 2},
		{name: "two directories", args: []string{dir, dir}, code: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, lines, _ := runCLI(t, noDriver, tc.args...)
			assert.Equal(t, tc.code, code, strings.Join(lines, "\n"))
			assertLines(t, lines, tc.contains, tc.last)
		})
	}
}

// editedProbeStore is probeStore with probe_axpy's PTX for compute_80 one
// line longer (the manifest's sha256 and size follow).
func editedProbeStore(t *testing.T) string {
	t.Helper()
	dir := probeStore(t)
	p := filepath.Join(dir, "probe.compute_80.ptx")
	d, err := os.ReadFile(p)
	require.NoError(t, err)
	d = bytes.Replace(d, []byte("\tfma.rn.f32 \t%f4,"), []byte("\tmembar.gl;\n\tfma.rn.f32 \t%f4,"), 1)
	require.NoError(t, os.WriteFile(p, d, 0o644))
	m, err := ptx.Dir(dir).Manifest()
	require.NoError(t, err)
	b, ok := m.Blob("compute_80")
	require.True(t, ok)
	b.SHA256, b.Size = ptx.SHA256(d), len(d)
	raw, err := json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ptx.ManifestName), raw, 0o644))
	return dir
}

// tarball packs dir's files into a .tar.gz as scripts/knob-sweep.sh returns
// them (paths "./NAME") and returns its path.
func tarball(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "blobs-x.tar.gz")
	f, err := os.Create(path)
	require.NoError(t, err)
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		d, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: "./" + e.Name(), Mode: 0o644, Size: int64(len(d)), Typeflag: tar.TypeReg}))
		_, err = tw.Write(d)
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	require.NoError(t, gz.Close())
	require.NoError(t, f.Close())
	return path
}

func TestCLIDiff(t *testing.T) {
	dir := probeStore(t)
	edited := editedProbeStore(t)
	tgz := tarball(t, edited)
	tests := []struct {
		name     string
		args     []string
		code     int
		contains []string
		last     string
	}{
		{name: "same", args: []string{"--diff", dir, dir}, code: 0,
			last: "ptxcheck: --diff " + dir + " " + dir + ": 0 of 12 functions differ"},
		{name: "same, verbose", args: []string{"--diff", "-v", dir, dir}, code: 0,
			contains: []string{"sm_90a probe_axpy: same (", "compute_80 probe_mixed: same ("}},
		{name: "one PTX line", args: []string{"--diff", dir, edited}, code: 1,
			contains: []string{"compute_80 probe_axpy: differs, 1 of "},
			last:     "ptxcheck: --diff " + dir + " " + edited + ": 1 of 12 functions differ (compute_80 1)"},
		{name: "tarball", args: []string{"--diff", dir, tgz}, code: 1, contains: []string{"compute_80 probe_axpy: differs, 1 of "}},
		{name: "one set", args: []string{"--diff", dir}, code: 2},
		{name: "with --gpu", args: []string{"--diff", "--gpu", dir, dir}, code: 2},
		{name: "missing set", args: []string{"--diff", dir, filepath.Join(dir, "nope")}, code: 2},
		{name: "not a blob set", args: []string{"--diff", dir, filepath.Join(dir, ptx.ManifestName)}, code: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, lines, errOut := runCLI(t, noDriver, tc.args...)
			assert.Equal(t, tc.code, code, strings.Join(lines, "\n")+errOut)
			assertLines(t, lines, tc.contains, tc.last)
			if code == 2 {
				assert.Contains(t, errOut, "ptxcheck: --diff")
			}
		})
	}
}

// TestEmbedded runs ptxcheck on the blobs compiled into the binary.
func TestEmbedded(t *testing.T) {
	code, lines, _ := runCLI(t, noDriver)
	m, err := ptx.Embedded().Manifest()
	require.NoError(t, err)
	if len(m.Blobs) == 0 {
		// A shipped binary without kernels is broken, so the CLI fails...
		assert.Equal(t, 1, code)
		assert.Contains(t, lines[0], "manifest.json: manifest: lists no blobs")
		// ...but the blobs are built on the GPU machine by the lead.
		t.Skipf("the embedded manifest is a placeholder (generator %q): build the blobs with scripts/blobs-*.sh", m.Generator)
	}
	assert.Equal(t, 0, code, strings.Join(lines, "\n"))
	assert.Contains(t, lines[len(lines)-1], "all checks passed")
}

// fakeDriver pretends to be a CUDA driver with the given devices.
type fakeDriver struct {
	devs    []gpuDevice
	loadErr map[string]error // by blob size
	drop    string           // entry never resolved
	regs    int
	loads   []string
}

func (f *fakeDriver) Devices() ([]gpuDevice, error) { return f.devs, nil }
func (f *fakeDriver) Close() error                  { return nil }
func (f *fakeDriver) Load(d gpuDevice, image []byte, entries []ptx.Entry) ([]gpuEntry, error) {
	f.loads = append(f.loads, ptx.SHA256(image))
	for file, err := range f.loadErr {
		data, _ := os.ReadFile(filepath.Join(probeDir, file))
		if bytes.Equal(data, image) {
			return nil, err
		}
	}
	var out []gpuEntry
	for _, e := range entries {
		if e.Name != f.drop {
			out = append(out, gpuEntry{Name: e.Name, Registers: f.regs})
		}
	}
	return out, nil
}

func TestGPU(t *testing.T) {
	dir := probeStore(t)
	h200 := gpuDevice{Ordinal: 0, Name: "NVIDIA H200", Major: 9, Minor: 0}
	tests := []struct {
		name     string
		drv      *fakeDriver
		code     int
		loads    int
		contains []string
		summary  string
	}{
		{name: "H200 loads sm_90a and both PTX", drv: &fakeDriver{devs: []gpuDevice{h200, {Ordinal: 1, Name: "NVIDIA H200", Major: 9}}}, code: 0, loads: 3,
			summary: "gpu: device 0 (NVIDIA H200, 9.0): 3 blobs loaded [probe.sm_90a.cubin probe.compute_80.ptx probe.sm_90a.ptx], 6 entries resolved"},
		{name: "B200", drv: &fakeDriver{devs: []gpuDevice{{Name: "B200", Major: 10}}}, code: 0, loads: 3,
			summary: "[probe.sm_100a.cubin probe.sm_100f.cubin probe.compute_80.ptx]"},
		{name: "10.7 takes the family build", drv: &fakeDriver{devs: []gpuDevice{{Name: "R", Major: 10, Minor: 7}}}, code: 0, loads: 2,
			summary: "[probe.sm_100f.cubin probe.compute_80.ptx]"},
		{name: "nothing runs on 7.5", drv: &fakeDriver{devs: []gpuDevice{{Name: "T4", Major: 7, Minor: 5}}}, code: 1, loads: 0,
			contains: []string{"driver: gpu: device 0 (T4, 7.5): no blob of the manifest runs on compute capability 7.5"}},
		{name: "no devices", drv: &fakeDriver{}, code: 1, contains: []string{"driver: gpu: the driver sees no CUDA device"}},
		{name: "JIT failure", drv: &fakeDriver{devs: []gpuDevice{h200}, loadErr: map[string]error{
			"probe.compute_80.ptx": errors.New("loader: load ptx module (2938 bytes): CUDA_ERROR_INVALID_PTX\nJIT error log:\nptxas fatal"),
		}}, code: 1, loads: 3,
			contains: []string{"probe.compute_80.ptx: gpu: device 0 (NVIDIA H200, 9.0): loader: load ptx module (2938 bytes): CUDA_ERROR_INVALID_PTX | JIT error log: | ptxas fatal"}},
		{name: "entry not resolved", drv: &fakeDriver{devs: []gpuDevice{h200}, drop: "probe_mixed"}, code: 1, loads: 3,
			contains: []string{"probe.sm_90a.cubin: gpu: device 0 (NVIDIA H200, 9.0): entry probe_mixed was not resolved"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, lines, _ := runCLI(t, func() (gpuDriver, error) { return tc.drv, nil }, "--gpu", "-v", dir)
			out := strings.Join(lines, "\n")
			assert.Equal(t, tc.code, code, out)
			assert.Len(t, tc.drv.loads, tc.loads, out)
			for _, want := range tc.contains {
				assert.Contains(t, lines, want, out)
			}
			if tc.summary != "" {
				assert.Contains(t, lines[len(lines)-1], tc.summary)
			}
		})
	}
}

func TestGPURegisters(t *testing.T) {
	dir := probeStore(t)
	// Put ptxas' register counts into the manifest; the fake reports 99.
	raw, err := os.ReadFile(filepath.Join(dir, ptx.ManifestName))
	require.NoError(t, err)
	var m ptx.Manifest
	require.NoError(t, json.Unmarshal(raw, &m))
	for i := range m.Blobs {
		if m.Blobs[i].Kind == ptx.KindCubin {
			m.Blobs[i].Entries = []ptx.Entry{m.Blobs[i].Entries[0], m.Blobs[i].Entries[1]}
			m.Blobs[i].Entries[0].Resources = &ptx.Resources{Registers: 10}
			m.Blobs[i].Entries[1].Resources = &ptx.Resources{Registers: 18, SharedStatic: 1024}
		}
	}
	raw, err = json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ptx.ManifestName), raw, 0o644))
	drv := &fakeDriver{devs: []gpuDevice{{Name: "NVIDIA H200", Major: 9}}, regs: 99}
	code, lines, _ := runCLI(t, func() (gpuDriver, error) { return drv, nil }, "--gpu", dir)
	assert.Equal(t, 1, code)
	assert.Contains(t, lines, "probe.sm_90a.cubin: gpu: device 0 (NVIDIA H200, 9.0): entry probe_axpy: the driver reports 99 registers, manifest says 10")
}
