package loader

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestArgsLayout(t *testing.T) {
	struct32 := make([]byte, 32)
	tests := []struct {
		name  string
		build func(*Args) *Args
		want  []ParamSpec
		size  int
	}{
		{"empty", func(a *Args) *Args { return a }, nil, 0},
		{"axpy u64 u64 f32 u32", func(a *Args) *Args { return a.DevicePtr(0x1000).DevicePtr(0x2000).F32(2).U32(7) },
			[]ParamSpec{{"ptr", 8, 8, 0}, {"ptr", 8, 8, 8}, {"f32", 4, 4, 16}, {"u32", 4, 4, 20}}, 24},
		{"u32 then u64 pads to 8", func(a *Args) *Args { return a.U32(1).U64(2) },
			[]ParamSpec{{"u32", 4, 4, 0}, {"u64", 8, 8, 8}}, 16},
		{"i32 bytes16 u32", func(a *Args) *Args { return a.I32(-1).Bytes(16, struct32).U32(3) },
			[]ParamSpec{{"i32", 4, 4, 0}, {"bytes", 32, 16, 16}, {"u32", 4, 4, 48}}, 52},
		{"odd bytes then i64", func(a *Args) *Args { return a.Bytes(1, []byte{1, 2, 3}).I64(-5) },
			[]ParamSpec{{"bytes", 3, 1, 0}, {"i64", 8, 8, 8}}, 16},
		{"f32 f64 i32", func(a *Args) *Args { return a.F32(1).F64(2).I32(3) },
			[]ParamSpec{{"f32", 4, 4, 0}, {"f64", 8, 8, 8}, {"i32", 4, 4, 16}}, 20},
		{"bytes align 64", func(a *Args) *Args { return a.U32(9).Bytes(64, make([]byte, 128)) },
			[]ParamSpec{{"u32", 4, 4, 0}, {"bytes", 128, 64, 64}}, 192},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.build(NewArgs())
			require.NoError(t, a.Err())
			assert.Equal(t, tc.want, a.Layout())
			assert.Equal(t, tc.size, a.Size())
			assert.Equal(t, len(tc.want), a.Len())
		})
	}
}

func TestArgsValues(t *testing.T) {
	a := NewArgs().U32(0xdeadbeef).DevicePtr(0x1122334455667788).F32(1.5).I32(-2).Bytes(2, []byte{0xaa, 0xbb, 0xcc})
	require.NoError(t, a.Err())
	d := a.Data()
	assert.Equal(t, uint32(0xdeadbeef), binary.LittleEndian.Uint32(d[0:]))
	assert.Equal(t, []byte{0, 0, 0, 0}, d[4:8], "padding is zero")
	assert.Equal(t, uint64(0x1122334455667788), binary.LittleEndian.Uint64(d[8:]))
	assert.Equal(t, float32(1.5), math.Float32frombits(binary.LittleEndian.Uint32(d[16:])))
	assert.Equal(t, int32(-2), int32(binary.LittleEndian.Uint32(d[20:])))
	assert.Equal(t, []byte{0xaa, 0xbb, 0xcc}, d[24:27])
}

func TestArgsClone(t *testing.T) {
	freed := &Buffer{ptr: 0x1000, size: 16}
	freed.root = freed
	freed.freed.Store(true)
	for _, tc := range []struct {
		name string
		base *Args
	}{
		{"empty", NewArgs()},
		{"values", NewArgs().U32(7).DevicePtr(0x1000).F32(2.5)},
		{"invalid", NewArgs().I32(1).Ptr(freed)},
		// Room to grow in place: a clone sharing the arrays would see the original's later appends.
		{"spare capacity", (&Args{buf: make([]byte, 0, 256), specs: make([]ParamSpec, 0, 16)}).U32(7)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			layout, data := tc.base.Layout(), append([]byte(nil), tc.base.Data()...)
			c := tc.base.Clone()
			assert.Equal(t, layout, c.Layout())
			assert.Equal(t, data, c.Data())
			assert.Equal(t, tc.base.Err(), c.Err())
			c.DevicePtr(0x2000).I32(-1)
			assert.Equal(t, layout, tc.base.Layout(), "the original's layout after appending to the clone")
			assert.Equal(t, data, tc.base.Data(), "the original's bytes after appending to the clone")
			assert.Equal(t, len(layout)+2, c.Len())
			cdata := append([]byte(nil), c.Data()...)
			tc.base.U64(9)
			assert.Equal(t, len(layout)+2, c.Len(), "the clone after appending to the original")
			assert.Equal(t, cdata, c.Data(), "the clone's bytes after appending to the original")
		})
	}
}

func TestArgsInvalid(t *testing.T) {
	freed := &Buffer{ptr: 0x1000, size: 16}
	freed.root = freed
	freed.freed.Store(true)
	tests := []struct {
		name  string
		build func(*Args) *Args
		want  string
	}{
		{"align 3", func(a *Args) *Args { return a.Bytes(3, []byte{1}) }, "alignment 3"},
		{"align 0", func(a *Args) *Args { return a.Bytes(0, []byte{1}) }, "alignment 0"},
		{"align 512", func(a *Args) *Args { return a.Bytes(512, []byte{1}) }, "alignment 512"},
		{"empty bytes", func(a *Args) *Args { return a.U32(1).Bytes(4, nil) }, "argument 1: Bytes of length 0"},
		{"nil buffer", func(a *Args) *Args { return a.Ptr(nil) }, "nil buffer"},
		{"freed buffer", func(a *Args) *Args { return a.U64(1).Ptr(freed) }, "already closed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.build(NewArgs()).U32(5)
			require.Error(t, a.Err())
			assert.Contains(t, a.Err().Error(), tc.want)
			// Launch refuses the builder before touching the driver.
			err := Launch(nil, &Function{name: "k"}, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0, a)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "launch k")
		})
	}
}

var axpySig = []ParamSpec{{"x", 8, 8, 0}, {"y", 8, 8, 8}, {"a", 4, 4, 16}, {"n", 4, 4, 20}}

func TestCheckSignature(t *testing.T) {
	tests := []struct {
		name string
		args *Args
		want []string // substrings; none means no error
	}{
		{"match", NewArgs().DevicePtr(1).DevicePtr(2).F32(1).U32(4), nil},
		{"size", NewArgs().DevicePtr(1).DevicePtr(2).F64(1).U32(4),
			[]string{"launch axpy", `parameter 2 "a" is size 4 align 4 at offset 16`, "argument 2 (f64) is size 8 align 8 at offset 16"}},
		{"offset", NewArgs().DevicePtr(1).U32(2).F32(1).U32(4),
			[]string{`parameter 1 "y" is size 8`, "argument 1 (u32) is size 4"}},
		{"align", NewArgs().DevicePtr(1).DevicePtr(2).Bytes(8, []byte{1, 2, 3, 4}).U32(4),
			[]string{`parameter 2 "a"`, "argument 2 (bytes) is size 4 align 8"}},
		{"missing", NewArgs().DevicePtr(1).DevicePtr(2).F32(1),
			[]string{"takes 4 parameters, got 3 arguments", `parameter 3 "n"`, "missing"}},
		{"extra", NewArgs().DevicePtr(1).DevicePtr(2).F32(1).U32(4).U32(5),
			[]string{"takes 4 parameters, got 5 arguments", "argument 4 (u32, size 4 at offset 24) is extra"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkSignature("axpy", axpySig, tc.args.Layout())
			if tc.want == nil {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}

			// The same check runs inside Launch, before anything reaches the driver:
			// this Function has no module, so reaching the driver would fail differently.
			fn := &Function{name: "axpy"}
			require.NoError(t, fn.SetSignature(axpySig))
			lerr := Launch(nil, fn, [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, tc.args)
			require.Error(t, lerr)
			assert.Equal(t, err.Error(), lerr.Error())
		})
	}
}

func TestLaunchWithoutModuleFailsCleanly(t *testing.T) {
	fn := &Function{name: "axpy"}
	require.NoError(t, fn.SetSignature(axpySig))
	err := Launch(nil, fn, [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, NewArgs().DevicePtr(1).DevicePtr(2).F32(1).U32(4))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "nil module")
	assert.Contains(t, Launch(nil, nil, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0, nil).Error(), "nil function")
}

func TestSetSignatureValidates(t *testing.T) {
	tests := []struct {
		name string
		sig  []ParamSpec
		want string
	}{
		{"zero size", []ParamSpec{{"x", 0, 8, 0}}, "size 0"},
		{"align 6", []ParamSpec{{"x", 8, 6, 0}}, "alignment 6"},
		{"misaligned", []ParamSpec{{"x", 4, 4, 0}, {"y", 8, 8, 4}}, "offset 4 is not 8-aligned"},
		{"overlap", []ParamSpec{{"x", 8, 8, 0}, {"y", 4, 4, 4}}, "overlaps"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fn := &Function{name: "k"}
			err := fn.SetSignature(tc.sig)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Nil(t, fn.Signature(), "a rejected signature is not recorded")
		})
	}
	fn := &Function{name: "k"}
	sig := append([]ParamSpec(nil), axpySig...)
	require.NoError(t, fn.SetSignature(sig))
	sig[0].Size = 99 // the function keeps its own copy
	assert.Equal(t, axpySig, fn.Signature())
	require.NoError(t, fn.SetSignature(nil))
	assert.Nil(t, fn.Signature())
}

func TestValidateDims(t *testing.T) {
	tests := []struct {
		name        string
		grid, block [3]uint32
		want        string
	}{
		{"ok", [3]uint32{132, 2, 1}, [3]uint32{256, 1, 1}, ""},
		{"ok 1024", [3]uint32{1, 1, 1}, [3]uint32{32, 32, 1}, ""},
		{"grid x zero", [3]uint32{0, 1, 1}, [3]uint32{1, 1, 1}, "grid dimension x is 0"},
		{"grid z zero", [3]uint32{1, 1, 0}, [3]uint32{1, 1, 1}, "grid dimension z is 0"},
		{"block y zero", [3]uint32{1, 1, 1}, [3]uint32{1, 0, 1}, "block dimension y is 0"},
		{"1025 threads", [3]uint32{1, 1, 1}, [3]uint32{1025, 1, 1}, "1025 threads"},
		{"overflowing product", [3]uint32{1, 1, 1}, [3]uint32{1 << 20, 1 << 20, 1 << 20}, "threads, more than 1024"},
		{"block z", [3]uint32{1, 1, 1}, [3]uint32{1, 1, 128}, "block z 128 is more than 64"},
		{"grid y", [3]uint32{1, 70000, 1}, [3]uint32{1, 1, 1}, "larger than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := validateDims(tc.grid, tc.block)
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			lerr := Launch(nil, &Function{name: "k"}, tc.grid, tc.block, 0, nil)
			require.Error(t, lerr)
			assert.True(t, strings.HasPrefix(lerr.Error(), "loader: launch k: "), lerr.Error())
		})
	}
}

func TestBuildParams(t *testing.T) {
	a := NewArgs().U32(7).DevicePtr(0xabc).Bytes(64, []byte{9, 8, 7}).F32(2.5)
	arena, params := buildParams(a)
	require.NotNil(t, params)
	require.Len(t, arena, len(arena))
	ptrs := unsafe.Slice((*uintptr)(params), a.Len())
	data := a.Data()
	for i, p := range a.Layout() {
		addr := ptrs[i]
		assert.Zero(t, addr%uintptr(p.Align), "argument %d is aligned in host memory", i)
		got := unsafe.Slice((*byte)(unsafe.Add(params, addr-uintptr(params))), p.Size)
		assert.Equal(t, data[p.Offset:p.Offset+p.Size], got, "argument %d", i)
		// Every pointer stays inside the arena.
		assert.GreaterOrEqual(t, addr, uintptr(params))
		assert.LessOrEqual(t, addr+uintptr(p.Size), uintptr(params)+uintptr(len(arena)*8))
	}
	arena, params = buildParams(NewArgs())
	assert.Nil(t, arena)
	assert.Nil(t, params)
}
