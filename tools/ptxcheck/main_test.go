package main

import (
	"bytes"
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
			for _, want := range tc.contains {
				found := false
				for _, l := range lines {
					found = found || strings.HasPrefix(l, want)
				}
				assert.Truef(t, found, "no line starting %q in\n%s", want, strings.Join(lines, "\n"))
			}
			if tc.last != "" {
				assert.Equal(t, tc.last, lines[len(lines)-1])
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
