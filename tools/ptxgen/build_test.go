package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/gdnkcp/gdnkcp/ptx/blobcheck"
)

// fakeNVCC stands in for nvcc: it hands out the probe blobs that a real
// nvcc 13.0 built from testdata/probe/probe.cu, and prints ptxas -v lines.
// FAKE_NVCC_MODE breaks it on purpose.
const fakeNVCC = `#!/usr/bin/env bash
probe=PROBE
mode=${FAKE_NVCC_MODE:-}
case "$1" in
--version) cat "$probe/nvcc_version.txt"; exit 0 ;;
--list-gpu-code) echo "sm_75 sm_80 sm_86 sm_87 sm_88 sm_89 sm_90 sm_100 sm_110 sm_103 sm_120 sm_121"; exit 0 ;;
esac
out= kind= arch=
while [ $# -gt 0 ]; do
	case "$1" in
	-o) out=$2; shift ;;
	-cubin) kind=cubin ;;
	-ptx) kind=ptx ;;
	-gencode=*) arch=${1##*code=} ;;
	-arch=*) arch=${1#-arch=} ;;
	*fast_math*) echo "nvcc: fast math was asked for" >&2; exit 9 ;;
	esac
	shift
done
if [ "$mode" = fail ] && [ "$arch" = sm_103a ]; then echo "gdnkcp.cu(3): error: identifier \"oops\" is undefined" >&2; exit 2; fi
if [ "$kind" = ptx ]; then
	if [ "$mode" = ptxparam ]; then
		sed 's/\.param \.u32 probe_axpy_param_3/.param .u64 probe_axpy_param_3/' "$probe/probe.$arch.ptx" >"$out"
	else
		cp "$probe/probe.$arch.ptx" "$out"
	fi
	exit 0
fi
src=$arch
[ "$mode" = wrongsm ] && [ "$arch" = sm_100a ] && src=sm_90a
cp "$probe/probe.$src.cubin" "$out"
{
	echo "ptxas info    : 0 bytes gmem"
	echo "ptxas info    : Compiling entry function 'probe_mixed' for '$arch'"
	echo "ptxas info    : Function properties for probe_mixed"
	echo "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"
	echo "ptxas info    : Used 18 registers, used 1 barriers, 1024 bytes smem"
	[ "$mode" = noaxpy ] && exit 0
	echo "ptxas info    : Compiling entry function 'probe_axpy' for '$arch'"
	echo "ptxas info    : Function properties for probe_axpy"
	echo "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"
	echo "ptxas info    : Used 10 registers, used 0 barriers"
} >&2
`

// setup writes the fake nvcc and a source tree whose translation unit
// includes probe.cu, and returns the config for run.
func setup(t *testing.T) config {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("the fake nvcc needs bash")
	}
	probe, err := filepath.Abs("../../testdata/probe")
	require.NoError(t, err)
	dir := t.TempDir()
	nvcc := filepath.Join(dir, "nvcc")
	require.NoError(t, os.WriteFile(nvcc, []byte(strings.ReplaceAll(fakeNVCC, "PROBE", probe)), 0o755))
	src := filepath.Join(dir, "src")
	require.NoError(t, os.Mkdir(src, 0o755))
	cu, err := os.ReadFile(filepath.Join(probe, "probe.cu"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(src, "probe.cu"), cu, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, "gdnkcp.cu"), []byte("#include \"probe.cu\"\n"), 0o644))
	return config{Src: src, Out: filepath.Join(dir, "out"), NVCC: nvcc, Main: "gdnkcp.cu", SM107: "auto", Timeout: time.Minute, Log: t.Logf}
}

func TestRunWithFakeNVCC(t *testing.T) {
	cfg := setup(t)
	m, err := run(context.Background(), cfg)
	require.NoError(t, err)

	disk, err := ptx.Dir(cfg.Out).Manifest()
	require.NoError(t, err)
	assert.Equal(t, m, disk)
	rep := blobcheck.Check(ptx.Dir(cfg.Out))
	require.True(t, rep.OK(), "%v", rep.Failures)

	var slots []string
	for _, b := range m.Blobs {
		slots = append(slots, b.Target+"="+b.BuiltAs+":"+b.File)
		assert.Equal(t, "Cuda compilation tools, release 13.0, V13.0.88", b.NVCC)
		assert.Contains(t, b.Flags, "-O3")
		assert.Contains(t, b.Flags, "-std=c++17")
		for _, f := range b.Flags {
			assert.NotContains(t, f, "fast_math")
		}
		require.Len(t, b.Entries, 2)
		assert.Equal(t, "probe_axpy", b.Entries[0].Name)
		assert.Equal(t, 24, b.Entries[0].ParamBytes())
		assert.Equal(t, 56, b.Entries[1].ParamBytes())
		if b.Kind == ptx.KindCubin {
			assert.Contains(t, b.Flags, "-v")
			require.NotNil(t, b.Entries[1].Resources)
			assert.Equal(t, ptx.Resources{Registers: 18, SharedStatic: 1024}, *b.Entries[1].Resources)
		} else {
			assert.Nil(t, b.Entries[0].Resources)
		}
	}
	assert.Equal(t, []string{
		"sm_90a=sm_90a:gdnkcp.sm_90a.cubin",
		"sm_100a=sm_100a:gdnkcp.sm_100a.cubin",
		"sm_103a=sm_103a:gdnkcp.sm_103a.cubin",
		"sm_107a=sm_100f:gdnkcp.sm_100f.cubin",
		"compute_80=compute_80:gdnkcp.compute_80.ptx",
	}, slots)
	b107, _ := m.Blob("sm_107a")
	assert.Equal(t, sm107Note, b107.Note)
	assert.Equal(t, []string{"-cubin", "-gencode=arch=compute_100f,code=sm_100f", "-O3", "-std=c++17", "-Xptxas", "-v"}, b107.Flags)
	assert.Contains(t, m.Sources, "probe.cu")
	assert.Contains(t, m.Sources, "gdnkcp.cu")
	assert.True(t, strings.HasPrefix(m.Generator, "gdnkcp tools/ptxgen"))
}

func TestRunTargets(t *testing.T) {
	cfg := setup(t)
	cfg.Targets = "sm_90a"
	m, err := run(context.Background(), cfg)
	require.NoError(t, err)
	var slots []string
	for _, b := range m.Blobs {
		slots = append(slots, b.Target)
		require.Len(t, b.Entries, 2, b.Target)
	}
	assert.Equal(t, []string{"sm_90a", "compute_80"}, slots, "the slot named and the PTX, in manifest order")
	files, err := filepath.Glob(filepath.Join(cfg.Out, "gdnkcp.*"))
	require.NoError(t, err)
	assert.Len(t, files, 2, "no other blob built: %v", files)
	disk, err := ptx.Dir(cfg.Out).Manifest()
	require.NoError(t, err)
	assert.Len(t, disk.Blobs, 2)
}

func TestPickTargets(t *testing.T) {
	all := targets(false)
	tests := []struct {
		list, want, err string
	}{
		{list: "", want: "sm_90a sm_100a sm_103a sm_107a compute_80"},
		{list: "sm_90a", want: "sm_90a compute_80"},
		{list: " sm_103a , sm_90a", want: "sm_90a sm_103a compute_80"},
		{list: "compute_80", want: "compute_80"},
		{list: "compute_80,sm_100a", want: "sm_100a compute_80"},
		{list: "sm_89", err: `-targets: unknown slot "sm_89" (slots: sm_90a, sm_100a, sm_103a, sm_107a, compute_80)`},
		{list: "sm_90a,", err: `unknown slot ""`},
		{list: "sm_90a,sm_90a", err: "slot sm_90a named twice"},
	}
	for _, tc := range tests {
		t.Run(tc.list, func(t *testing.T) {
			got, err := pick(all, tc.list)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			var slots []string
			for _, g := range got {
				slots = append(slots, g.Slot)
			}
			assert.Equal(t, tc.want, strings.Join(slots, " "))
		})
	}
}

func TestRunFailures(t *testing.T) {
	tests := []struct {
		name  string
		mode  string
		prep  func(t *testing.T, cfg *config)
		want  string
		noMan bool
	}{
		{name: "cubin of the wrong SM", mode: "wrongsm", want: "gdnkcp.sm_100a.cubin: elf-sm: e_flags 0x6005a04 (ABI version 8) give SM 90"},
		{name: "PTX layout differs from KPARAM_INFO", mode: "ptxparam", want: "gdnkcp.sm_90a.cubin: kparam: entry probe_axpy: parameter 3 (probe_axpy_param_3): KPARAM_INFO offset 20 size 4, manifest offset 24 size 8"},
		{name: "nvcc fails", mode: "fail", want: "sm_103a: nvcc -cubin -gencode=arch=compute_103a,code=sm_103a"},
		{name: "ptxas reports no entry", mode: "noaxpy", want: "sm_90a: ptxas -v reported nothing for entry probe_axpy"},
		{name: "a .cu file left out", prep: func(t *testing.T, cfg *config) {
			require.NoError(t, os.WriteFile(filepath.Join(cfg.Src, "extra.cu"), []byte("// kernels\n"), 0o644))
		}, want: "gdnkcp.cu does not #include extra.cu"},
		{name: "no translation unit", prep: func(t *testing.T, cfg *config) { cfg.Main = "missing.cu" }, want: "the translation unit: open"},
		{name: "bad -sm107", prep: func(t *testing.T, cfg *config) { cfg.SM107 = "maybe" }, want: "-sm107 \"maybe\""},
		{name: "bad -targets", prep: func(t *testing.T, cfg *config) { cfg.Targets = "sm_70" }, want: `-targets: unknown slot "sm_70"`},
		{name: "no nvcc", prep: func(t *testing.T, cfg *config) { cfg.NVCC = filepath.Join(t.TempDir(), "nvcc") }, want: "nvcc \""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := setup(t)
			t.Setenv("FAKE_NVCC_MODE", tc.mode)
			if tc.prep != nil {
				tc.prep(t, &cfg)
			}
			_, err := run(context.Background(), cfg)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			_, statErr := os.Stat(filepath.Join(cfg.Out, ptx.ManifestName))
			assert.ErrorIs(t, statErr, os.ErrNotExist, "a failed run must leave no manifest.json")
		})
	}
}

func TestTargetsFamilyAndNative(t *testing.T) {
	fam := targets(false)
	nat := targets(true)
	require.Len(t, fam, 5)
	require.Len(t, nat, 5)
	assert.Equal(t, "sm_100f", fam[3].BuiltAs)
	assert.Equal(t, "sm_107a", nat[3].BuiltAs)
	assert.Empty(t, nat[3].Note)
	for _, ts := range [][]target{fam, nat} {
		for _, tg := range ts {
			require.NoError(t, blobcheck.SlotAccepts(tg.Slot, tg.BuiltAs), tg.Slot)
			for _, f := range tg.flags() {
				assert.NotContains(t, f, "fast_math")
			}
		}
	}
	assert.Equal(t, "gdnkcp.compute_80.ptx", fam[4].fileName("gdnkcp"))
	assert.Equal(t, []string{"-ptx", "-arch=compute_80", "-O3", "-std=c++17"}, fam[4].flags())
}

// TestRealSources checks the shipped translation unit includes every .cu.
func TestRealSources(t *testing.T) {
	h, err := sources("../../ptx/src", "gdnkcp.cu")
	require.NoError(t, err)
	assert.Contains(t, h, "conv1d.cu")
	assert.Contains(t, h, "util.cu")
}
