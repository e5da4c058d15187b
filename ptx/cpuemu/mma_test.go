package cpuemu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
)

// The tensor-core wrappers of ptx/src/mma.cuh on the emulator, through the
// test kernels of testdata/mma_kernels.cpp.

const (
	mmaM, mmaN, mmaK = 64, 64, 128 // the test kernels' product
	mmaBatches       = 2           // blocks: ascending and descending thread order
	layoutWords      = 32          // emu_mma_layout's words per thread
	cpAsyncDeferred  = "EMU_CP_ASYNC=deferred"
)

// Tolerances (normwise relative error against float64 from the same
// inputs). GEMM: products of bf16 values are exact in fp32 and 128 of them
// are added in fp32, about 1e-7; a wrong fragment element gives O(1).
// Split: hi + lo carries about 16 bits of each fp32 element of A (the lo
// rounding leaves ~2^-17 relative), ~1e-6; plain bf16 keeps 8 bits, ~1e-3.
const (
	gemmTol      = 1e-5
	splitTol     = 2e-5
	plainBF16Min = 3e-4 // plain bf16 must be at least this far off (else the split test proves nothing)
)

// TestTensorCoreOnCPU checks the emulated mma.sync, ldmatrix and cp.async
// (and the bf16 helpers) against the fragment layouts of the PTX ISA and
// against float64 products, and the errors the emulator must report.
func TestTensorCoreOnCPU(t *testing.T) {
	bin := built(t, "runner_mma")

	t.Run("fragment_layout", func(t *testing.T) {
		t.Parallel()
		const block = 64
		j := newJob(t)
		j.out("out", 4*layoutWords*mmaBatches*block)
		j.launch("layout", "emu_mma_layout", grid1(mmaBatches), block, "1024", buf("out"))
		raw := j.run(bin).raw["out"]
		for th := 0; th < mmaBatches*block; th++ {
			want := layoutWant(th % 32)
			for w := 0; w < layoutWords; w++ {
				got := binary.LittleEndian.Uint32(raw[4*(th*layoutWords+w):])
				require.Equalf(t, want[w], got, "thread %d (lane %d): %s is %#08x, the layout says %#08x",
					th, th%32, layoutWordName(w), got, want[w])
			}
		}
	})

	a, b, want := gemmInputs()
	for _, mode := range []struct {
		name string
		env  []string
	}{{"immediate", nil}, {"deferred", []string{cpAsyncDeferred}}} {
		t.Run("gemm_cp_async_"+mode.name, func(t *testing.T) {
			t.Parallel()
			c := runGemm(t, bin, a, b, 0, mode.env)
			et := &errTable{}
			requireRel(t, et, "gemm "+mode.name, widen(c), want, gemmTol)
			et.log(t)
		})
	}

	t.Run("read_before_wait", func(t *testing.T) {
		t.Parallel()
		// The deferred mode sees it: the stage read before its group landed is NaN.
		c := runGemm(t, bin, a, b, 1, []string{cpAsyncDeferred})
		nan := 0
		for _, v := range c {
			if math.IsNaN(float64(v)) {
				nan++
			}
		}
		require.Equal(t, len(c), nan, "deferred cp.async: every output should be NaN when each stage is read before its wait")
		// The default mode cannot: the copies happened at issue.
		c = runGemm(t, bin, a, b, 1, nil)
		require.Less(t, relErr(widen(c), want), gemmTol, "immediate cp.async should not see the missing wait")
	})

	t.Run("stage_refilled_while_read", func(t *testing.T) {
		t.Parallel()
		// A warp runs ahead to its next __syncthreads: without the one after
		// a stage's compute, it refills the stage while the others read it.
		for _, env := range [][]string{nil, {cpAsyncDeferred}} {
			c := runGemm(t, bin, a, b, 2, env)
			e := relErr(widen(c), want)
			require.False(t, e < 1e-2, "%v: the missing __syncthreads went unseen (relative error %.3g)", env, e)
		}
	})

	t.Run("split_hi_lo", func(t *testing.T) {
		t.Parallel()
		rng := rand.New(rand.NewPCG(7, 8))
		af := make([]float32, mmaM*mmaK)
		for i := range af {
			af[i] = float32(rng.NormFloat64())
		}
		bb := randBF16(rng, mmaK*mmaN)
		want := matmul(widen(af), bf16Widen(bb), mmaM, mmaK, mmaN)
		j := newJob(t)
		j.f32("A", af)
		j.bf16("B", bb)
		j.out("split", 4*mmaM*mmaN)
		j.out("plain", 4*mmaM*mmaN)
		j.launch("split", "emu_mma_split", grid1(1), 256, "0", buf("A"), buf("B"), buf("split"), buf("plain"))
		r := j.run(bin)
		et := &errTable{}
		requireRel(t, et, "fp32 A (hi+lo) B", widen(r.f32s("split")), want, splitTol)
		plain := relErr(widen(r.f32s("plain")), want)
		et.note("bf16 A B", plain)
		et.log(t)
		require.Greater(t, plain, plainBF16Min, "plain bf16 A B should be far less accurate than the split")
	})

	for _, c := range []struct {
		name, kernel, want string
		block              int
		args               []string
	}{
		{"lanes_at_different_instructions", "emu_mma_divergent", "all lanes must execute the same", 32,
			[]string{buf("p")}},
		{"partial_warp", "emu_mma_layout", "a warp of fewer than 32 threads", 48, []string{buf("p")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			j := newJob(t)
			j.alloc("p", 4*layoutWords*64)
			j.launch(c.name, c.kernel, grid1(1), c.block, "1024", c.args...)
			require.Contains(t, j.runFail(bin), c.want)
		})
	}

	t.Run("cp_async_zfill", func(t *testing.T) {
		t.Parallel()
		const units, n = 64, 37
		rng := rand.New(rand.NewPCG(9, 10))
		src := make([]float32, 4*units)
		for i := range src {
			src[i] = float32(rng.NormFloat64())
		}
		for _, c := range []struct {
			name string
			env  []string
			bug  int
		}{{"immediate", nil, 0}, {"deferred", []string{cpAsyncDeferred}, 0}, {"deferred_read_before_wait", []string{cpAsyncDeferred}, 1}} {
			j := newJob(t)
			j.env = c.env
			j.f32("src", src)
			j.out("out", 4*4*units)
			j.launch("zfill", "emu_cp_zfill", grid1(1), units, "1024", buf("src"), buf("out"), i32a(n), i32a(c.bug))
			r := j.run(bin)
			out := make([]float32, 4*units)
			if c.bug == 1 { // NaN expected: read the raw bytes (f32s rejects NaN)
				for i := range out {
					out[i] = f32Of(r.raw["out"], i)
				}
			} else {
				out = r.f32s("out")
			}
			for i, v := range out {
				switch {
				case c.bug == 1:
					require.Truef(t, math.IsNaN(float64(v)), "%s: element %d read before its wait is %v, not the in-flight NaN", c.name, i, v)
				case i < 4*n:
					require.Equalf(t, src[i], v, "%s: element %d of a full unit", c.name, i)
				default:
					require.Equalf(t, float32(0), v, "%s: element %d of a unit from n on should be zero", c.name, i)
				}
			}
		}
	})

	t.Run("cp_async_misaligned", func(t *testing.T) {
		t.Parallel()
		j := newJob(t)
		j.bf16("A", a[:mmaM*mmaK])
		j.bf16("B", b[:mmaK*mmaN])
		j.alloc("C", 4*mmaM*mmaN)
		j.launch("gemm", "emu_mma_gemm", grid1(1), 256, "kGemmSmem", buf("A"), bufAt("B", 2), buf("C"), i32a(0))
		require.Contains(t, j.runFail(bin), "16-byte aligned")
	})
}

// gemmInputs: mmaBatches pairs of random bf16 A [64][128], B [128][64] (both
// row-major) and their float64 products.
func gemmInputs() (a, b []bf16.BF16, want []float64) {
	rng := rand.New(rand.NewPCG(5, 6))
	a, b = randBF16(rng, mmaBatches*mmaM*mmaK), randBF16(rng, mmaBatches*mmaK*mmaN)
	for i := 0; i < mmaBatches; i++ {
		want = append(want, matmul(bf16Widen(a[i*mmaM*mmaK:(i+1)*mmaM*mmaK]),
			bf16Widen(b[i*mmaK*mmaN:(i+1)*mmaK*mmaN]), mmaM, mmaK, mmaN)...)
	}
	return a, b, want
}

// runGemm runs emu_mma_gemm on every batch and returns C (NaN allowed).
func runGemm(t *testing.T, bin string, a, b []bf16.BF16, bug int, env []string) []float32 {
	j := newJob(t)
	j.env = env
	j.bf16("A", a)
	j.bf16("B", b)
	j.out("C", 4*mmaBatches*mmaM*mmaN)
	j.launch("gemm", "emu_mma_gemm", grid1(mmaBatches), 256, "kGemmSmem", buf("A"), buf("B"), buf("C"), i32a(bug))
	raw := j.run(bin).raw["C"]
	c := make([]float32, len(raw)/4)
	for i := range c {
		c[i] = f32Of(raw, i)
	}
	return c
}

func randBF16(rng *rand.Rand, n int) []bf16.BF16 {
	out := make([]bf16.BF16, n)
	for i := range out {
		out[i] = bf16.Float32ToBF16(float32(rng.NormFloat64()))
	}
	return out
}

// matmul is the float64 product of row-major a [m][k] and b [k][n].
func matmul(a, b []float64, m, k, n int) []float64 {
	c := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for p := 0; p < k; p++ {
			for j := 0; j < n; j++ {
				c[i*n+j] += a[i*k+p] * b[p*n+j]
			}
		}
	}
	return c
}

// ---- the fragment layouts, as the PTX ISA writes them ----------------------------------------

// mmaA, mmaB, mmaC: row and column of element i of a lane's A (a0..a7), B
// (b0..b3) and C/D (c0..c3) fragment of mma.m16n8k16 with .bf16 inputs (PTX
// ISA, "Matrix Fragments for mma.m16n8k16 with floating point type").
func mmaA(lane, i int) (row, col int) {
	g, t := lane>>2, lane%4
	row = g + 8
	if i < 2 || (4 <= i && i < 6) {
		row = g
	}
	col = t*2 + i&1
	if i >= 4 {
		col += 8
	}
	return row, col
}

func mmaB(lane, i int) (row, col int) {
	g, t := lane>>2, lane%4
	row = t*2 + i&1
	if i >= 2 {
		row += 8
	}
	return row, g
}

func mmaC(lane, i int) (row, col int) {
	g, t := lane>>2, lane%4
	row = g
	if i >= 2 {
		row = g + 8
	}
	return row, t*2 + i&1
}

// ldm: the element (row, col) of each 8x8 matrix that lane receives in the
// low (half 0) and high (half 1) 16 bits of its register (PTX ISA, "ldmatrix
// fragment layout for one 8x8 matrix"; .trans swaps row and column).
func ldm(lane, half int, trans bool) (row, col int) {
	row, col = lane/4, 2*(lane%4)+half
	if trans {
		return col, row
	}
	return row, col
}

func bfBits(f float32) uint32 { return uint32(bf16.Float32ToBF16(f)) }

func pair(lo, hi float32) uint32 { return bfBits(lo) | bfBits(hi)<<16 }

// layoutWant is what lane's thread of emu_mma_layout must write (see
// testdata/mma_kernels.cpp for the values).
func layoutWant(lane int) []uint32 {
	M := func(r, c int) float32 { return float32(8*r + c) }
	rowOf := func(l int) int { return (13*l + 5) % 32 } // the row lane l points ldmatrix at
	av := func(r, k int) float32 { return float32(16*r + k + 1) }
	bv := func(k, n int) float32 { return float32(8*k + n + 1) }
	cv := func(r, n int) float32 { return float32(512 * (8*r + n + 1)) }
	var w []uint32
	for _, trans := range []bool{false, true} {
		for m := 0; m < 4; m++ {
			var h [2]float32
			for half := 0; half < 2; half++ {
				r, c := ldm(lane, half, trans)
				h[half] = M(rowOf(8*m+r), c) // row r of matrix m is lane 8m+r's address
			}
			w = append(w, pair(h[0], h[1]))
		}
	}
	for reg := 0; reg < 4; reg++ {
		r0, c0 := mmaA(lane, 2*reg)
		r1, c1 := mmaA(lane, 2*reg+1)
		w = append(w, pair(av(r0, c0), av(r1, c1)))
	}
	for reg := 0; reg < 2; reg++ {
		k0, n0 := mmaB(lane, 2*reg)
		k1, n1 := mmaB(lane, 2*reg+1)
		w = append(w, pair(bv(k0, n0), bv(k1, n1)))
	}
	for _, d := range []func(r, n int) float32{
		cv,
		func(r, n int) float32 { return cv(r, n) + av(r, n) },   // D1 = Av S0 + Cv
		func(r, n int) float32 { return cv(r, n) + av(r, n+8) }, // D2 = Av S1 + Cv
		bv, // D3 = I Bv
	} {
		for i := 0; i < 4; i++ {
			w = append(w, math.Float32bits(d(mmaC(lane, i))))
		}
	}
	x := float32(lane+1)/3 + float32(float32(1e-3)*float32(lane))
	hi := bf16.Float32ToBF16(x)
	lo := bf16.Float32ToBF16(x - hi.Float32())
	w = append(w, uint32(hi)|uint32(lo)<<16)
	w = append(w, pair(float32(lane)+0.5, -float32(lane)-float32(1)/3))
	return w
}

func layoutWordName(w int) string {
	switch {
	case w < 4:
		return fmt.Sprintf("ldmatrix_x4 r[%d]", w)
	case w < 8:
		return fmt.Sprintf("ldmatrix_x4_trans r[%d]", w-4)
	case w < 12:
		return fmt.Sprintf("A fragment a[%d]", w-8)
	case w < 14:
		return fmt.Sprintf("B fragment b[%d]", w-12)
	case w < 18:
		return fmt.Sprintf("C fragment c[%d]", w-14)
	case w < 30:
		return fmt.Sprintf("mma D%d d[%d]", (w-18)/4+1, (w-18)%4)
	case w == 30:
		return "split_bf16 hi | lo<<16"
	default:
		return "pack_bf16x2"
	}
}
