package cpuemu

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// launchRE matches a kernel launch's configuration, k<<<grid, block, smem>>>(args): syntaxCopy rewrites the
// launch as the call k(args), which the host compiler parses and type-checks against the kernel's parameters.
var launchRE = regexp.MustCompile(`<<<[^;]*?>>>`)

// syntaxCopy copies the files of src whose names end in one of exts into dst, launches rewritten as calls; it
// returns how many launches it rewrote.
func syntaxCopy(t *testing.T, src, dst string, exts ...string) int {
	t.Helper()
	require.NoError(t, os.MkdirAll(dst, 0o755))
	ents, err := os.ReadDir(src)
	require.NoError(t, err)
	n := 0
	for _, e := range ents {
		keep := false
		for _, x := range exts {
			keep = keep || strings.HasSuffix(e.Name(), x)
		}
		if e.IsDir() || !keep {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		n += len(launchRE.FindAll(b, -1))
		require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), launchRE.ReplaceAll(b, nil), 0o644))
	}
	return n
}

// sm90a is the macros of nvcc's device pass for sm_90a: __CUDA_ARCH__ 900 with the sm_90a feature macro, so
// wgmma.cuh's inline-PTX branch.
var sm90a = []string{"-D__CUDA_ARCH__=900", "-D__CUDA_ARCH_FEAT_SM90_ALL"}

// syntaxCheck runs the host compiler over one source as the GPU machine's nvcc would see it in the device pass
// that the macros arch name, with the stand-in headers of testdata/syntax, parsing and type-checking only.
func syntaxCheck(cxx, inc, path string, arch []string) ([]byte, error) {
	args := append([]string{"-std=c++17", "-fsyntax-only", "-x", "c++", "-I", "testdata/syntax", "-I", inc}, arch...)
	cmd := exec.Command(cxx, append(args, path)...)
	return cmd.CombinedOutput()
}

// TestDevtestSyntax parses and type-checks every program of ptx/devtest (the timing skeletons and device checks
// that scripts/*.sh build with nvcc on the GPU machine) with the host C++ compiler: a session without a GPU
// machine would otherwise learn only on its next device call that a program it edited does not compile. The
// kernel sources of ptx/src (or CPUEMU_SRC) are the ones the programs include. What it cannot see: nvcc's own
// rules (host / device annotations, inline-PTX constraints), ptxas (registers, spills) and anything at run time.
func TestDevtestSyntax(t *testing.T) {
	cxx := compiler(t)
	files, err := filepath.Glob("../devtest/*.cu")
	require.NoError(t, err)
	require.NotEmpty(t, files, "no programs in ptx/devtest")
	root := t.TempDir()
	syntaxCopy(t, srcDir(), filepath.Join(root, "src"), ".cu", ".cuh")
	launches := syntaxCopy(t, "../devtest", filepath.Join(root, "devtest"), ".cu", ".cuh")
	require.Positive(t, launches, "no kernel launch found to rewrite in ptx/devtest")
	inc := filepath.Join(root, "src")

	t.Run("a broken program fails", func(t *testing.T) {
		src := []byte(`#include "devtest.cuh"
#include "../src/wgmma.cuh"
__global__ void k(float* x) { float a[32]; unsigned f[4][4]; gdnkcp::wg::mma_m64n64k16_rs(a, f, 0ull); x[0] = a[0]; }
int main() { k<<<1, 128>>>(nullptr); return 0; }
`)
		require.Len(t, launchRE.FindAll(src, -1), 1)
		bad := filepath.Join(root, "devtest", "broken_probe.cu")
		require.NoError(t, os.WriteFile(bad, launchRE.ReplaceAll(src, nil), 0o644))
		out, err := syntaxCheck(cxx, inc, bad, sm90a)
		require.Error(t, err, "a fragment of the wrong shape passed: %s", out)
		require.Contains(t, string(out), "mma_m64n64k16_rs")
	})
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(strings.TrimSuffix(name, ".cu"), func(t *testing.T) {
			t.Parallel()
			out, err := syntaxCheck(cxx, inc, filepath.Join(root, "devtest", name), sm90a)
			require.NoError(t, err, "ptx/devtest/%s does not compile as C++:\n%s", name, out)
		})
	}
}

// TestKernelSyntax parses and type-checks the blobs' one translation unit (ptx/src/gdnkcp.cu, or CPUEMU_SRC's)
// with the host compiler for each kind of target tools/ptxgen builds, as nvcc's device pass for it sees the
// sources: the emulator tests compile the kernels on their CPU path only, so the inline PTX of the sm_90a
// branches (wgmma, stmatrix, setmaxnreg) and of the portable one (mma.sync, ldmatrix, cp.async) would otherwise
// meet a compiler first on the GPU machine, at a blob rebuild. nvcc's own rules and ptxas stay the GPU's.
func TestKernelSyntax(t *testing.T) {
	cxx := compiler(t)
	tu := filepath.Join(srcDir(), "gdnkcp.cu")
	require.FileExists(t, tu)
	for _, tc := range []struct {
		name string
		arch []string
	}{
		{"sm_90a", sm90a},
		{"sm_100a", []string{"-D__CUDA_ARCH__=1000", "-D__CUDA_ARCH_FEAT_SM100_ALL"}},
		{"compute_80", []string{"-D__CUDA_ARCH__=800"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := syntaxCheck(cxx, srcDir(), tu, tc.arch)
			require.NoError(t, err, "%s does not compile as C++ for %s:\n%s", tu, tc.name, out)
		})
	}
}
