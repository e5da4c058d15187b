package cpuemu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
)

// The sm_90a body of gdn_state_walk_mma16 (ptx/src/gdn_walk_wgmma.cu: the
// state as the register A operand of wgmma, W and Kt^T split into
// 128-byte-swizzled stages) on the emulator's wgmma (emu.h), in
// runner_mma16_wg: kernels_mma16.cpp built with GDNKCP_EMU_WGMMA.

// wgmmaDeferred holds every wgmma's result back until its wait and checks
// that the shared memory it reads does not change before then (emu.h).
const wgmmaDeferred = "EMU_WGMMA=deferred"

// wgmmaWalkTol bounds the wgmma body's H, V' and final states against the
// mma.sync gdn_state_walk_mma's (and P, Q against gdn_summary_walk_mma's) on the same inputs, normwise. Both are
// ~4e-6 from float64 on the H200 (scripts/walk-check.sh); U^T joins (1)'s
// product at its end instead of at its start, so they differ in the last
// bits. Measured here: see the test log.
const wgmmaWalkTol = 2e-5

// TestWGMMAStateWalkOnCPU runs the wgmma body of gdn_state_walk_mma16 on
// mma16Cases beside gdn_state_walk_mma on the prep's Kt: "core" with copies
// and wgmma results at issue (vh 128 with every output, vh 64 with h_out and
// vnew null), "gva" with EMU_CP_ASYNC=deferred and EMU_WGMMA=deferred (vh 64
// with every output, vh 128 with h16 and vnew16 null). It requires the
// runner's log to show wgmma (so that the wgmma body ran, not the mma.sync
// one); every output poisoned first and fully written, a null output
// untouched; h_out, vnew and the final states within wgmmaWalkTol of the
// mma.sync walk's; h16 and vnew16 bitwise the bf16 tiles of the walk's own
// fp32 H and V' (transposed, 0 past a chunk's end); and the outputs that
// both widths write bitwise equal. Where the sources have the summary walk's
// wgmma body, gdn_summary_walk_mma16 at vh 64 and 128 too: P and Q within
// wgmmaWalkTol of gdn_summary_walk_mma's, the widths bitwise equal.
func TestWGMMAStateWalkOnCPU(t *testing.T) {
	if !haveEmuWGMMA() {
		t.Skipf("%s/wgmma.cuh does not route wgmma to the emulator (no GDNKCP_EMU_WGMMA)", srcDir())
	}
	bin := built(t, "runner_mma16_wg")
	for _, rn := range []struct {
		name  string
		c     *gdnCase
		env   []string
		walks []mma16Walk
	}{
		{"core/immediate", &mma16Cases[0], nil, []mma16Walk{{128, 0}, {64, 1 | 2}}},
		{"gva/deferred", &mma16Cases[1], []string{cpAsyncDeferred, wgmmaDeferred}, []mma16Walk{{64, 0}, {128, 4 | 8}}},
	} {
		t.Run(rn.name, func(t *testing.T) {
			t.Parallel()
			d := newData(t, rn.c)
			start := randomStates(d.l.NS*rn.c.hv, 17)
			j := newJob(t)
			j.env = rn.env
			sums := mma16Sums{ref: 128}
			if haveWGMMASummary() {
				sums.vhs = []int{64, 128}
			}
			addWalks16(j, d, start, rn.walks, sums)
			r := j.run(bin)
			t.Logf("walks:\n%s", r.log)
			labels := walkNames(rn.walks)
			for _, vh := range sums.vhs {
				labels = append(labels, sum16Name(vh)+"summary")
			}
			for _, l := range labels {
				require.Contains(t, logLine(r.log, l), "wgmma (warp)", "%s ran no wgmma: the mma.sync body was built", l)
			}
			et := &errTable{}
			checkWGMMAWalks(t, et, d, r, rn.walks)
			checkWGMMASums(t, et, r, sums.vhs)
			et.log(t)
		})
	}
}

// haveWGMMASummary reports whether the sources' gdn_summary_walk_mma16 has a wgmma body.
func haveWGMMASummary() bool {
	b, err := os.ReadFile(filepath.Join(srcDir(), "gdn_walk_wgmma.cu"))
	return err == nil && strings.Contains(string(b), "summary_walk(")
}

// checkWGMMASums checks the wgmma summary walks at vhs: P and Q fully written, within wgmmaWalkTol of
// gdn_summary_walk_mma's on the prep's Kt, and the widths bitwise equal.
func checkWGMMASums(t *testing.T, et *errTable, r *result, vhs []int) {
	for i, vh := range vhs {
		for _, n := range []string{"out_p", "out_q"} {
			p := sum16Name(vh) + n
			requireRel(t, et, "summary "+n, widen(r.f32s(p)), widen(r.f32s("ref_"+n)), wgmmaWalkTol)
			if i > 0 {
				require.Equal(t, r.raw[sum16Name(vhs[0])+n], r.raw[p], "summary %s: vh %d and vh %d differ", n, vhs[0], vh)
			}
		}
	}
}

// logLine returns the runner's log line of launch label.
func logLine(log, label string) string {
	for _, l := range strings.Split(log, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == label {
			return l
		}
	}
	return ""
}

// checkWGMMAWalks checks the walks of TestWGMMAStateWalkOnCPU; walks[0]
// writes every output.
func checkWGMMAWalks(t *testing.T, et *errTable, d *gdnData, r *result, walks []mma16Walk) {
	require.Zero(t, walks[0].drop, "the first walk must write every output")
	outs := []string{"h", "vnew", "h16", "vnew16"}
	for _, w := range walks {
		p := w.name()
		for bit, n := range outs {
			switch {
			case w.drop&(1<<bit) != 0:
				requireAllPoison(t, r.raw[p+n], p+n)
			case bit < 2:
				requireRel(t, et, n, widen(r.f32s(p+n)), widen(r.f32s("ref_"+n)), wgmmaWalkTol)
			default:
				r.bf16s(p + n) // fully written, no NaN or Inf
			}
		}
		requireRel(t, et, "final", widen(r.f32s(p+"final")), widen(r.f32s("ref_final")), wgmmaWalkTol)
	}
	p0 := walks[0].name()
	want16 := bf16Tiles(d.l, d.c.hv, r.f32s(p0+"h"), r.f32s(p0+"vnew"))
	for _, n := range []string{"h16", "vnew16"} {
		requireSameBF16(t, want16[n], r.raw[p0+n], p0+n)
	}
	for _, w := range walks[1:] {
		for bit, n := range append(outs, "final") {
			if bit < len(outs) && (w.drop|walks[0].drop)&(1<<bit) != 0 {
				continue
			}
			require.Equal(t, r.raw[p0+n], r.raw[w.name()+n], "%s: vh %d and vh %d differ", n, walks[0].vh, w.vh)
		}
	}
}

// TestWGMMAOnCPU checks the emulator's wgmma model itself (emu.h), through
// emu_wgmma_gemm of testdata/mma_kernels.cpp, which calls it directly (not
// through ptx/src/wgmma.cuh): D = A B and D = C + A B for N 64 and 128
// against float64, with B K-major (emu::wgmma_rs) and MN-major
// (emu::wgmma_rs_t, imm-trans-b 1), with the results at issue and deferred to the wait; and
// the errors it must report: a descriptor of another swizzle mode, lanes that
// disagree, a thread that exits with a wgmma pending and shared memory
// rewritten under an in-flight wgmma (deferred), and D read before the wait
// (NaN, deferred). Commit groups: with a second, newer group in flight,
// wait_group 1 retires D's group (D = A B, both modes) and wait_group 2 does
// not (D NaN, deferred).
func TestWGMMAOnCPU(t *testing.T) {
	bin := built(t, "runner_mma")
	rng := rand.New(rand.NewPCG(11, 12))
	a := randBF16(rng, mmaM*mmaK)
	run := func(t *testing.T, n, mode, bug int, env []string, c []float32) (*job, []bf16.BF16) {
		b := randBF16(rng, mmaK*n)
		j := newJob(t)
		j.env = env
		j.bf16("A", a)
		j.bf16("B", b)
		j.f32("C", c)
		j.out("D", 4*mmaM*n)
		j.launch("wgmma", "emu_wgmma_gemm", grid1(1), 128, "kWgmmaSmem", buf("A"), buf("B"), buf("C"), buf("D"),
			i32a(n), i32a(mode), i32a(bug))
		return j, b
	}
	for _, n := range []int{64, 128} {
		for _, mode := range []int{0, 1, 2, 3} { // 2, 3: B MN-major (emu::wgmma_rs_t)
			for _, env := range [][]string{nil, {wgmmaDeferred}} {
				t.Run(fmt.Sprintf("n%d_mode%d_%d", n, mode, len(env)), func(t *testing.T) {
					t.Parallel()
					c := make([]float32, mmaM*n)
					for i := range c {
						c[i] = float32(i%7) - 3
					}
					j, b := run(t, n, mode, 0, env, c)
					r := j.run(bin)
					want := matmul(bf16Widen(a), bf16Widen(b), mmaM, mmaK, n)
					if mode%2 == 1 {
						for i := range want {
							want[i] += float64(c[i])
						}
					}
					require.Contains(t, r.log, "wgmma (warp)")
					et := &errTable{}
					requireRel(t, et, "wgmma gemm", widen(r.f32s("D")), want, gemmTol)
					et.log(t)
				})
			}
		}
	}
	c := make([]float32, mmaM*mmaN)
	for _, bc := range []struct {
		name string
		bug  int
		env  []string
		want string
	}{
		{"swizzle_mode_0", 4, nil, "only the 128-byte swizzle"},
		{"lanes_disagree", 5, nil, "different descriptors"},
		{"exit_pending", 3, []string{wgmmaDeferred}, "not waited for"},
		{"b_rewritten_in_flight", 2, []string{wgmmaDeferred}, "changed before its wait"},
	} {
		for _, mode := range []int{0, 2} {
			t.Run(fmt.Sprintf("%s_mode%d", bc.name, mode), func(t *testing.T) {
				t.Parallel()
				j, _ := run(t, mmaN, mode, bc.bug, bc.env, c)
				require.Contains(t, j.runFail(bin), bc.want)
			})
		}
	}
	for _, env := range [][]string{nil, {wgmmaDeferred}} {
		t.Run(fmt.Sprintf("wait_group1_%d", len(env)), func(t *testing.T) {
			t.Parallel()
			j, b := run(t, mmaN, 0, 6, env, c)
			requireRel(t, &errTable{}, "wgmma gemm, a newer group in flight", widen(j.run(bin).f32s("D")),
				matmul(bf16Widen(a), bf16Widen(b), mmaM, mmaK, mmaN), gemmTol)
		})
	}
	// pending: D's first 128 elements, read while its wgmma is in flight
	// (deferred), must all be NaN.
	for _, pc := range []struct {
		name      string
		mode, bug int
		when      string
	}{
		{"wait_group2_pending", 2, 7, "under wait_group 2"},
		{"read_before_wait", 0, 1, "before the wait"},
	} {
		t.Run(pc.name, func(t *testing.T) {
			t.Parallel()
			j, _ := run(t, mmaN, pc.mode, pc.bug, []string{wgmmaDeferred}, c)
			raw := j.run(bin).raw["D"]
			for i := 0; i < 128; i++ {
				require.True(t, math.IsNaN(float64(f32Of(raw, i))), "D[%d] read %s should be NaN", i, pc.when)
			}
		})
	}
}

// TestWGTransBOnCPU checks ptx/src/wgmma.cuh's products with a transposed B
// (mma_m64nNk16_rs_t on desc_sw128_mn: B MN-major, 64-column blocks a
// leading byte offset apart) through test_wg_trans_b of
// testdata/kernels_mma16.cpp, for N 64 and 128, in runner_mma16_wg (the
// emulated wgmma, emu::wgmma_rs_t) and runner_mma16 (the portable products on
// mma.sync and ldmatrix.trans): in each runner the MN-major product writes the
// K-major one's bits, both runners write the same bits, and the result is
// A B within fp32 summation of float64. The device check of the same layout
// is ptx/devtest/wgmma_t_check.cu.
func TestWGTransBOnCPU(t *testing.T) {
	if !haveEmuWGMMA() {
		t.Skipf("%s/wgmma.cuh does not route wgmma to the emulator (no GDNKCP_EMU_WGMMA)", srcDir())
	}
	wgBin, ptBin := built(t, "runner_mma16_wg"), built(t, "runner_mma16")
	rng := rand.New(rand.NewPCG(13, 14))
	for _, n := range []int{64, 128} {
		t.Run(fmt.Sprintf("n%d", n), func(t *testing.T) {
			a, b := randBF16(rng, mmaM*mmaK), randBF16(rng, mmaK*n)
			run := func(bin string) *result {
				j := newJob(t)
				j.bf16("A", a)
				j.bf16("B", b)
				for _, o := range []string{"dk", "dt"} {
					j.out(o, 4*mmaM*n)
					j.poison(o, poisonF32)
				}
				j.launch("trans_b", "test_wg_trans_b", grid1(1), 128, "wgTransBSmem", buf("A"), buf("B"), buf("dk"), buf("dt"),
					i32a(n))
				return j.run(bin)
			}
			rw, rp := run(wgBin), run(ptBin)
			require.Contains(t, logLine(rw.log, "trans_b"), "wgmma (warp)", "test_wg_trans_b ran no wgmma in runner_mma16_wg")
			require.NotContains(t, logLine(rp.log, "trans_b"), "wgmma", "test_wg_trans_b ran wgmma in runner_mma16")
			for _, r := range []*result{rw, rp} {
				require.Equal(t, r.raw["dk"], r.raw["dt"], "the MN-major product differs from the K-major one")
			}
			require.Equal(t, rw.raw["dt"], rp.raw["dt"], "the portable MN-major product differs from wgmma's")
			et := &errTable{}
			requireRel(t, et, "trans-B gemm", widen(rw.f32s("dt")), matmul(bf16Widen(a), bf16Widen(b), mmaM, mmaK, n), gemmTol)
			et.log(t)
		})
	}
}
