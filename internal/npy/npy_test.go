package npy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// npyFile builds an .npy file as numpy lays it out: magic, version, little-endian header length (u16 for
// 1.0, u32 otherwise), the dict, spaces up to a multiple of 64 bytes and a newline, then the data.
func npyFile(major byte, dict string, data []byte) []byte {
	lenSize := 2
	if major > 1 {
		lenSize = 4
	}
	hlen := len(dict) + 1
	hlen += 64 - (6+2+lenSize+hlen)%64
	b := append([]byte("\x93NUMPY"), major, 0)
	if lenSize == 2 {
		b = binary.LittleEndian.AppendUint16(b, uint16(hlen))
	} else {
		b = binary.LittleEndian.AppendUint32(b, uint32(hlen))
	}
	b = append(b, dict...)
	b = append(b, strings.Repeat(" ", hlen-len(dict)-1)...)
	b = append(b, '\n')
	return append(b, data...)
}

// rawFile builds a file with a given header text and no padding.
func rawFile(major byte, header string, data []byte) []byte {
	b := append([]byte("\x93NUMPY"), major, 0)
	if major == 1 {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(header)))
	} else {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(header)))
	}
	return append(append(b, header...), data...)
}

func f4Bytes(vals ...float32) []byte {
	var b []byte
	for _, v := range vals {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

func dict(descr, fortran, shape string) string {
	return "{'descr': " + descr + ", 'fortran_order': " + fortran + ", 'shape': " + shape + ", }"
}

var testShapes = [][]int{
	{},           // rank 0: a scalar
	{5},          // rank 1
	{3, 4},       // rank 2
	{2, 3, 4},    // rank 3
	{2, 1, 3, 2}, // rank 4
	{0},          // empty
	{4, 0, 3},    // empty, rank 3
	{1, 1, 1, 1}, // all ones
}

func product(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// randomData returns n random values of the Go type matching dtype, with the edge values first.
func randomData(rng *rand.Rand, dtype string, n int) any {
	switch dtype {
	case DtypeFloat32:
		edge := []float32{0, float32(math.Copysign(0, -1)), 1.5, -2.25, math.MaxFloat32, math.SmallestNonzeroFloat32,
			float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
		d := make([]float32, n)
		for i := range d {
			if i < len(edge) {
				d[i] = edge[i]
			} else {
				d[i] = float32(rng.NormFloat64())
			}
		}
		return d
	case DtypeFloat64:
		edge := []float64{0, math.Copysign(0, -1), 1.5, -2.25, math.MaxFloat64, math.SmallestNonzeroFloat64,
			math.Inf(1), math.Inf(-1), math.NaN()}
		d := make([]float64, n)
		for i := range d {
			if i < len(edge) {
				d[i] = edge[i]
			} else {
				d[i] = rng.NormFloat64()
			}
		}
		return d
	case DtypeInt32:
		edge := []int32{0, -1, math.MaxInt32, math.MinInt32}
		d := make([]int32, n)
		for i := range d {
			if i < len(edge) {
				d[i] = edge[i]
			} else {
				d[i] = rng.Int32() - math.MaxInt32/2
			}
		}
		return d
	case DtypeInt64:
		edge := []int64{0, -1, math.MaxInt64, math.MinInt64}
		d := make([]int64, n)
		for i := range d {
			if i < len(edge) {
				d[i] = edge[i]
			} else {
				d[i] = int64(rng.Uint64())
			}
		}
		return d
	case DtypeUint16:
		edge := []uint16{0, 0xffff, 0x7fc0, 0x3f80} // bf16 NaN and 1.0 among them
		d := make([]uint16, n)
		for i := range d {
			if i < len(edge) {
				d[i] = edge[i]
			} else {
				d[i] = uint16(rng.Uint32())
			}
		}
		return d
	}
	panic(dtype)
}

// readBack returns the data of a through the accessor of its own dtype.
func readBack(t *testing.T, a *Array) any {
	t.Helper()
	var v any
	var err error
	switch a.Dtype {
	case DtypeFloat32:
		v, err = a.Float32()
	case DtypeFloat64:
		v, err = a.Float64()
	case DtypeInt32:
		v, err = a.Int32()
	case DtypeInt64:
		v, err = a.Int64()
	case DtypeUint16:
		v, err = a.Uint16()
	}
	require.NoError(t, err)
	return v
}

// bitsOf makes float data comparable bit for bit (NaN included).
func bitsOf(v any) any {
	switch d := v.(type) {
	case []float32:
		out := make([]uint32, len(d))
		for i, x := range d {
			out[i] = math.Float32bits(x)
		}
		return out
	case []float64:
		out := make([]uint64, len(d))
		for i, x := range d {
			out[i] = math.Float64bits(x)
		}
		return out
	}
	return v
}

func TestRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	dir := t.TempDir()
	for _, dtype := range supportedDtypes {
		for _, shape := range testShapes {
			t.Run(fmt.Sprintf("%s%s", dtype, formatShape(shape)), func(t *testing.T) {
				data := randomData(rng, dtype, product(shape))
				var buf bytes.Buffer
				require.NoError(t, Write(&buf, shape, data))

				// The header is numpy's: version 1.0, data aligned to 64 bytes, ending in a newline.
				b := buf.Bytes()
				assert.Equal(t, "\x93NUMPY\x01\x00", string(b[:8]))
				hlen := int(binary.LittleEndian.Uint16(b[8:]))
				assert.Zero(t, (10+hlen)%64, "data offset %d is not a multiple of 64", 10+hlen)
				assert.Equal(t, byte('\n'), b[10+hlen-1])
				assert.Len(t, b, 10+hlen+product(shape)*itemSize(dtype))

				a, err := Read(bytes.NewReader(b))
				require.NoError(t, err)
				assert.Equal(t, shape, a.Shape)
				assert.NotNil(t, a.Shape)
				assert.Equal(t, dtype, a.Dtype)
				assert.Equal(t, product(shape), a.Len())
				assert.Equal(t, bitsOf(data), bitsOf(readBack(t, a)))

				path := filepath.Join(dir, strings.NewReplacer("<", "", "(", "", ")", "", ", ", "x", ",", "").Replace(dtype+formatShape(shape))+".npy")
				require.NoError(t, WriteFile(path, shape, data))
				onDisk, err := os.ReadFile(path)
				require.NoError(t, err)
				assert.Equal(t, b, onDisk)
				a, err = ReadFile(path)
				require.NoError(t, err)
				assert.Equal(t, path, a.Name)
				assert.Equal(t, shape, a.Shape)
				assert.Equal(t, bitsOf(data), bitsOf(readBack(t, a)))
			})
		}
	}
}

func TestWriteNilShapeIsScalar(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, nil, []float64{2.5}))
	a, err := Read(&buf)
	require.NoError(t, err)
	assert.Equal(t, []int{}, a.Shape)
	v, err := a.Float64()
	require.NoError(t, err)
	assert.Equal(t, []float64{2.5}, v)
}

// TestGoldenHeader checks Write against bytes laid out as numpy writes them, spelled out by hand.
func TestGoldenHeader(t *testing.T) {
	tests := []struct {
		name  string
		shape []int
		data  any
		want  string
	}{{
		// numpy.save(f, numpy.arange(12, dtype='<f4').reshape(3, 4)): header length 0x76 = 118.
		name:  "f4 (3, 4)",
		shape: []int{3, 4},
		data:  []float32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11},
		want: "\x93NUMPY\x01\x00\x76\x00" +
			"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }" + strings.Repeat(" ", 58) + "\n" +
			string(f4Bytes(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)),
	}, {
		// numpy.save(f, numpy.float64(1)): a scalar, no room for growth.
		name:  "f8 scalar",
		shape: []int{},
		data:  []float64{1},
		want: "\x93NUMPY\x01\x00\x76\x00" +
			"{'descr': '<f8', 'fortran_order': False, 'shape': (), }" + strings.Repeat(" ", 62) + "\n" +
			"\x00\x00\x00\x00\x00\x00\xf0\x3f",
	}, {
		// numpy.save(f, numpy.array([1, -1], dtype='<i8')).
		name:  "i8 (2,)",
		shape: []int{2},
		data:  []int64{1, -1},
		want: "\x93NUMPY\x01\x00\x76\x00" +
			"{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }" + strings.Repeat(" ", 60) + "\n" +
			"\x01\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff",
	}, {
		// numpy.save(f, numpy.zeros((1, 2, 1, 2) + (1,)*11, dtype='<u2')): a dict of 98 bytes; numpy 1.24+
		// adds 21-len("1") = 20 spare spaces, 10+98+20+1 = 129 > 128, so the header takes 182 bytes and
		// the data starts at 192 (numpy before 1.24 stopped at 118 and 128).
		name:  "u2 rank 15, growth room crosses 128",
		shape: []int{1, 2, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
		data:  make([]uint16, 4),
		want: "\x93NUMPY\x01\x00\xb6\x00" +
			"{'descr': '<u2', 'fortran_order': False, 'shape': (1, 2, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1), }" +
			strings.Repeat(" ", 182-98-1) + "\n" + strings.Repeat("\x00", 8),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			require.NoError(t, Write(&buf, tc.shape, tc.data))
			assert.Equal(t, tc.want, buf.String())
			a, err := Read(strings.NewReader(tc.want))
			require.NoError(t, err)
			assert.Equal(t, tc.shape, a.Shape)
		})
	}
}

// TestWriteVersion2 checks that a header too long for 1.0's 16-bit length is written as 2.0 and read back.
func TestWriteVersion2(t *testing.T) {
	shape := make([]int, 22000) // "1, " per dimension: over 65,535 bytes
	for i := range shape {
		shape[i] = 1
	}
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, shape, []int32{-7}))
	b := buf.Bytes()
	assert.Equal(t, "\x93NUMPY\x02\x00", string(b[:8]))
	hlen := int(binary.LittleEndian.Uint32(b[8:]))
	assert.Greater(t, hlen, math.MaxUint16)
	assert.Zero(t, (12+hlen)%64)
	a, err := Read(&buf)
	require.NoError(t, err)
	assert.Equal(t, shape, a.Shape)
	v, err := a.Int32()
	require.NoError(t, err)
	assert.Equal(t, []int32{-7}, v)
}

// TestReadVariants checks headers that numpy (of various ages) or other writers produce.
func TestReadVariants(t *testing.T) {
	data := f4Bytes(1, 2, 3, 4, 5, 6)
	tests := []struct {
		name string
		file []byte
	}{
		{"numpy 1.0", npyFile(1, dict("'<f4'", "False", "(2, 3)"), data)},
		{"version 2.0", npyFile(2, dict("'<f4'", "False", "(2, 3)"), data)},
		{"version 3.0", npyFile(3, dict("'<f4'", "False", "(2, 3)"), data)},
		{"compact, no trailing comma", npyFile(1, "{'descr':'<f4','fortran_order':False,'shape':(2,3)}", data)},
		{"keys in another order", npyFile(1, "{'shape': (2, 3), 'descr': '<f4', 'fortran_order': False}", data)},
		{"double quotes", npyFile(1, `{"descr": "<f4", "fortran_order": False, "shape": (2, 3), }`, data)},
		{"python 2 longs", npyFile(1, dict("'<f4'", "False", "(2L, 3L)"), data)},
		{"unicode prefix", npyFile(1, dict("u'<f4'", "False", "(2, 3)"), data)},
		{"old 16-byte alignment", rawFile(1, dict("'<f4'", "False", "(2, 3)")+"    \n", data)},
		{"no padding, no newline", rawFile(1, dict("'<f4'", "False", "(2, 3)"), data)},
		{"tabs and newlines", rawFile(1, "{\n\t'descr' : '<f4' ,\n\t'fortran_order' : False ,\n\t'shape' : ( 2 , 3 , ) ,\n}\n", data)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := Read(bytes.NewReader(tc.file))
			require.NoError(t, err)
			assert.Equal(t, []int{2, 3}, a.Shape)
			assert.Equal(t, DtypeFloat32, a.Dtype)
			v, err := a.Float32()
			require.NoError(t, err)
			assert.Equal(t, []float32{1, 2, 3, 4, 5, 6}, v)
		})
	}
}

func TestMalformed(t *testing.T) {
	f4x2 := f4Bytes(1, 2)
	good := func(shape string) []byte { return npyFile(1, dict("'<f4'", "False", shape), nil) }
	tests := []struct {
		name string
		file []byte
		kind error
		msg  string // the message after "npy: " or "FILE: "
	}{
		{"empty", nil, ErrTruncated,
			"file ends after 0 bytes, inside the preamble (magic, version, header length: at least 10 bytes)"},
		{"short magic", []byte("\x93NUM"), ErrTruncated, "file ends after 4 bytes, inside the preamble"},
		{"bad magic", []byte("\x93NUMPZ\x01\x00\x00\x00"), ErrMagic, `bad magic "\x93NUMPZ", want "\x93NUMPY" (not an npy file)`},
		{"zip (an .npz)", []byte("PK\x03\x04\x14\x00\x00\x00"), ErrMagic, `bad magic "PK\x03\x04\x14\x00", want "\x93NUMPY"`},
		{"text", []byte("hello"), ErrMagic, `bad magic "hello", want "\x93NUMPY" (not an npy file)`},
		{"version 4.0", []byte("\x93NUMPY\x04\x00\x00\x00"), ErrVersion, "format version 4.0, want 1.0, 2.0 or 3.0"},
		{"version 1.1", []byte("\x93NUMPY\x01\x01\x00\x00"), ErrVersion, "format version 1.1, want 1.0, 2.0 or 3.0"},
		{"version 0.0", []byte("\x93NUMPY\x00\x00\x00\x00"), ErrVersion, "format version 0.0"},
		{"truncated length", []byte("\x93NUMPY\x02\x00\x10\x00"), ErrTruncated,
			"file ends after 10 bytes, inside the 4-byte header length of format 2.0"},
		{"truncated header", []byte("\x93NUMPY\x01\x00\x76\x00{'descr'"), ErrTruncated, "file ends 8 bytes into a 118-byte header"},
		{"huge header length", []byte("\x93NUMPY\x02\x00\xff\xff\xff\xff"), ErrHeader, "header length 4294967295 bytes, want at most 1048576"},
		{"not a dict", npyFile(1, "[1, 2]", nil), ErrHeader, `header "[1, 2]" is not a dict, want {'descr': ..., 'fortran_order': ..., 'shape': ...}`},
		{"empty header", rawFile(1, "", nil), ErrHeader, `malformed header dict "": at byte 0: want a value, found end of header`},
		{"missing shape", npyFile(1, "{'descr': '<f4', 'fortran_order': False}", nil), ErrHeader,
			"header has no key 'shape', want exactly 'descr', 'fortran_order' and 'shape'"},
		{"extra key", npyFile(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", f4x2), ErrHeader,
			"header has unexpected key 'x', want exactly 'descr', 'fortran_order' and 'shape'"},
		{"duplicate key", npyFile(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", f4x2), ErrHeader,
			"duplicate key 'descr'"},
		{"unterminated string", npyFile(1, "{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", f4x2), ErrHeader,
			"malformed header dict"},
		{"missing colon", npyFile(1, "{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}", f4x2), ErrHeader,
			`at byte 9: want ':' after key 'descr', found "'<f4', 'fo"`},
		{"missing comma", npyFile(1, "{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", f4x2), ErrHeader,
			`want ',' or '}', found`},
		{"garbage after dict", npyFile(1, dict("'<f4'", "False", "(2,)")+" x", f4x2), ErrHeader, `unexpected "x" after the dict`},
		{"unknown name", npyFile(1, dict("'<f4'", "false", "(2,)"), f4x2), ErrHeader, `want a value, found "false, 'sh"`},
		{"non-string key", npyFile(1, "{1: 2}", nil), ErrHeader, "dict key is the integer 1, want a string"},
		{"deep nesting", npyFile(1, "{'descr': "+strings.Repeat("(", 100)+strings.Repeat(")", 100)+"}", nil), ErrHeader,
			"literals nested deeper than 16"},
		{"descr not a string", npyFile(1, dict("4", "False", "(2,)"), f4x2), ErrHeader,
			"'descr' is the integer 4, want a dtype string such as '<f4'"},
		{"big-endian f4", npyFile(1, dict("'>f4'", "False", "(2,)"), f4x2), ErrDtype,
			"unsupported dtype '>f4' (big-endian; save with dtype '<f4'), want one of '<f4', '<f8', '<i4', '<i8', '<u2'"},
		{"big-endian c8", npyFile(1, dict("'>c8'", "False", "(2,)"), f4x2), ErrDtype,
			"unsupported dtype '>c8' (big-endian), want one of"},
		{"object", npyFile(1, dict("'|O'", "False", "(2,)"), f4x2), ErrDtype,
			"unsupported dtype '|O' (object arrays need pickle), want one of"},
		{"complex", npyFile(1, dict("'<c16'", "False", "(2,)"), f4x2), ErrDtype, "unsupported dtype '<c16', want one of"},
		{"float16", npyFile(1, dict("'<f2'", "False", "(2,)"), f4x2), ErrDtype, "unsupported dtype '<f2', want one of"},
		{"native order", npyFile(1, dict("'=f4'", "False", "(2,)"), f4x2), ErrDtype, "unsupported dtype '=f4'"},
		{"structured", npyFile(1, dict("[('a', '<f4')]", "False", "(2,)"), f4x2), ErrDtype,
			"structured dtype (descr is a list of fields), want one of"},
		{"fortran order", npyFile(1, dict("'<f4'", "True", "(2,)"), f4x2), ErrFortranOrder,
			"fortran_order is True, want False (C order)"},
		{"fortran_order not a bool", npyFile(1, dict("'<f4'", "0", "(2,)"), f4x2), ErrHeader,
			"'fortran_order' is the integer 0, want True or False"},
		{"shape a list", npyFile(1, dict("'<f4'", "False", "[2]"), f4x2), ErrHeader,
			"'shape' is a list, want a tuple of integers such as (3, 4)"},
		{"shape an int", npyFile(1, dict("'<f4'", "False", "(2)"), f4x2), ErrHeader,
			"'shape' is the integer 2, want a tuple of integers"},
		{"shape of strings", npyFile(1, dict("'<f4'", "False", "(2, 'a')"), f4x2), ErrHeader,
			"'shape' entry 1 is the string 'a', want an integer"},
		{"shape float", npyFile(1, dict("'<f4'", "False", "(2.0,)"), f4x2), ErrHeader, `want an integer, found "2.0,), }"`},
		{"negative dim", npyFile(1, dict("'<f4'", "False", "(2, -1)"), f4x2), ErrShape, "shape entry 1 = -1 is negative, want >= 0"},
		{"dim overflows int", npyFile(1, dict("'<f4'", "False", "(99999999999999999999,)"), nil), ErrShape,
			"shape entry 0 = 99999999999999999999 overflows int"},
		{"element count overflows", npyFile(1, dict("'<f4'", "False", "(4294967296, 4294967296)"), nil), ErrShape,
			"shape (4294967296, 4294967296) with dtype '<f4': element count overflows int"},
		{"byte count overflows", npyFile(1, dict("'<f8'", "False", "(4611686018427387904,)"), nil), ErrShape,
			"shape (4611686018427387904,) with dtype '<f8': 4611686018427387904 elements of 8 bytes overflow int"},
		{"truncated data", append(good("(3, 4)"), f4Bytes(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)...), ErrTruncated,
			"truncated file: 40 data bytes, want 48 for shape (3, 4) of '<f4'"},
		{"no data", good("(3, 4)"), ErrTruncated, "truncated file: 0 data bytes, want 48 for shape (3, 4) of '<f4'"},
		{"huge claimed shape", good("(1000000000000,)"), ErrTruncated, "truncated file: 0 data bytes, want 4000000000000 for shape (1000000000000,) of '<f4'"},
		{"trailing bytes", append(good("(2,)"), f4Bytes(1, 2, 3)...), ErrTrailingData,
			"4 trailing bytes after the data (shape (2,) of '<f4' needs 8 bytes)"},
		{"scalar with two values", append(good("()"), f4Bytes(1, 2)...), ErrTrailingData,
			"4 trailing bytes after the data (shape () of '<f4' needs 4 bytes)"},
		{"empty array with data", append(good("(0, 3)"), 0), ErrTrailingData,
			"1 trailing bytes after the data (shape (0, 3) of '<f4' needs 0 bytes)"},
	}
	dir := t.TempDir()
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(bytes.NewReader(tc.file))
			require.Error(t, err)
			t.Log(err)
			assert.ErrorIs(t, err, tc.kind)
			var e *Error
			require.ErrorAs(t, err, &e)
			assert.Empty(t, e.File)
			assert.True(t, strings.HasPrefix(err.Error(), "npy: "), err.Error())
			assert.Contains(t, err.Error(), tc.msg)

			// ReadFile knows the file's size up front; the message is the same, prefixed by the path.
			path := filepath.Join(dir, fmt.Sprintf("case%d.npy", i))
			require.NoError(t, os.WriteFile(path, tc.file, 0o644))
			_, err = ReadFile(path)
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.kind)
			assert.True(t, strings.HasPrefix(err.Error(), path+": "), err.Error())
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}

func TestReadFileMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.npy")
	_, err := ReadFile(path)
	require.Error(t, err)
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.ErrorIs(t, err, ErrIO)
	assert.Equal(t, path+": cannot open: no such file or directory", err.Error())
}

// failingReader returns data and then an I/O error.
type failingReader struct {
	data []byte
	err  error
}

func (r *failingReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestReadIOError(t *testing.T) {
	boom := errors.New("disk on fire")
	file := npyFile(1, dict("'<f4'", "False", "(3,)"), f4Bytes(1, 2, 3))
	for _, cut := range []int{0, 5, 9, 20, len(file) - 2, len(file)} {
		t.Run(fmt.Sprint(cut), func(t *testing.T) {
			_, err := Read(&failingReader{data: file[:cut], err: boom})
			require.Error(t, err)
			assert.ErrorIs(t, err, boom)
			assert.ErrorIs(t, err, ErrIO)
		})
	}
}

func TestAccessors(t *testing.T) {
	read := func(t *testing.T, data any) *Array {
		var buf bytes.Buffer
		n := 0
		switch d := data.(type) {
		case []float32:
			n = len(d)
		case []float64:
			n = len(d)
		case []int32:
			n = len(d)
		case []int64:
			n = len(d)
		case []uint16:
			n = len(d)
		}
		require.NoError(t, Write(&buf, []int{n}, data))
		a, err := Read(&buf)
		require.NoError(t, err)
		a.Name = "x.npy"
		return a
	}

	t.Run("f8 to float32 rounds", func(t *testing.T) {
		v, err := read(t, []float64{0.1, 1e300, -1e-50}).Float32()
		require.NoError(t, err)
		assert.Equal(t, []float32{0.1, float32(math.Inf(1)), float32(math.Copysign(0, -1))}, v)
	})
	t.Run("f4 to float64 widens exactly", func(t *testing.T) {
		v, err := read(t, []float32{0.1, -3}).Float64()
		require.NoError(t, err)
		assert.Equal(t, []float64{float64(float32(0.1)), -3}, v)
	})
	t.Run("i8 to int32 in range", func(t *testing.T) {
		v, err := read(t, []int64{math.MinInt32, math.MaxInt32}).Int32()
		require.NoError(t, err)
		assert.Equal(t, []int32{math.MinInt32, math.MaxInt32}, v)
	})
	t.Run("i4 to int64", func(t *testing.T) {
		v, err := read(t, []int32{-5, 7}).Int64()
		require.NoError(t, err)
		assert.Equal(t, []int64{-5, 7}, v)
	})

	errCases := []struct {
		name string
		data any
		get  func(*Array) error
		msg  string
	}{
		{"i8 out of int32 range", []int64{1, math.MaxInt32 + 1}, func(a *Array) error { _, err := a.Int32(); return err },
			"x.npy: element 1 = 2147483648 does not fit in int32 ('<i8' data read as int32)"},
		{"float32 of ints", []int32{1}, func(a *Array) error { _, err := a.Float32(); return err },
			"x.npy: dtype '<i4', want '<f4' or '<f8' for float32 data"},
		{"float64 of u2", []uint16{1}, func(a *Array) error { _, err := a.Float64(); return err },
			"x.npy: dtype '<u2', want '<f4' or '<f8' for float64 data"},
		{"int32 of floats", []float32{1}, func(a *Array) error { _, err := a.Int32(); return err },
			"x.npy: dtype '<f4', want '<i4' or '<i8' for int32 data"},
		{"int64 of floats", []float64{1}, func(a *Array) error { _, err := a.Int64(); return err },
			"x.npy: dtype '<f8', want '<i4' or '<i8' for int64 data"},
		{"uint16 of floats", []float32{1}, func(a *Array) error { _, err := a.Uint16(); return err },
			"x.npy: dtype '<f4', want '<u2' for uint16 data"},
	}
	for _, tc := range errCases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.get(read(t, tc.data))
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrDtype)
			assert.Equal(t, tc.msg, err.Error())
		})
	}
}

func TestWriteErrors(t *testing.T) {
	tests := []struct {
		name  string
		shape []int
		data  any
		kind  error
		msg   string
	}{
		{"length mismatch", []int{3, 4}, make([]float32, 10), ErrShape, "npy: shape (3, 4) holds 12 elements, data has 10"},
		{"scalar needs one value", nil, []float64{}, ErrShape, "npy: shape () holds 1 elements, data has 0"},
		{"negative dim", []int{2, -3}, make([]int32, 6), ErrShape, "npy: shape (2, -3): dimension -3 is negative"},
		{"overflow", []int{1 << 40, 1 << 40}, []int64{}, ErrShape, "npy: shape (1099511627776, 1099511627776): element count overflows int"},
		{"unsupported type", []int{2}, []int8{1, 2}, ErrDtype,
			"npy: cannot write data of type []int8, want []float32, []float64, []int32, []int64 or []uint16"},
		{"not a slice", []int{}, 1.5, ErrDtype, "npy: cannot write data of type float64"},
	}
	dir := t.TempDir()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := Write(&buf, tc.shape, tc.data)
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.kind)
			assert.Contains(t, err.Error(), tc.msg)
			assert.Zero(t, buf.Len(), "nothing is written on error")

			path := filepath.Join(dir, "out.npy")
			err = WriteFile(path, tc.shape, tc.data)
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.kind)
			assert.True(t, strings.HasPrefix(err.Error(), path+": "), err.Error())
			assert.NoFileExists(t, path)
		})
	}
}

// failingWriter fails after n bytes.
type failingWriter struct{ n int }

func (w *failingWriter) Write(p []byte) (int, error) {
	if len(p) > w.n {
		k := w.n
		w.n = 0
		return k, errors.New("disk full")
	}
	w.n -= len(p)
	return len(p), nil
}

func TestWriteIOError(t *testing.T) {
	for _, n := range []int{0, 100, 200} {
		err := Write(&failingWriter{n: n}, []int{100}, make([]float64, 100))
		require.Error(t, err)
		assert.ErrorIs(t, err, ErrIO)
		assert.Contains(t, err.Error(), "disk full")
	}
	// A file that cannot be created.
	err := WriteFile(filepath.Join(t.TempDir(), "no", "such", "dir.npy"), []int{1}, []float32{1})
	require.Error(t, err)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestExpectShape(t *testing.T) {
	a := &Array{Shape: []int{10, 16, 32}, Dtype: DtypeFloat32, Name: "/data/q.npy"}
	tests := []struct {
		name string
		arr  *Array
		as   string
		want []int
		dims []string
		msg  string // "" for no error
	}{
		{"match", a, "q.npy", []int{10, 16, 32}, nil, ""},
		{"wildcard", a, "q.npy", []int{10, -1, -1}, []string{"T, H_qk, K"}, ""},
		{"mismatch with dims", a, "q.npy", []int{12, 16, 32}, []string{"T, H_qk, K"},
			"q.npy: shape (10, 16, 32), want (12, 16, 32) [T, H_qk, K]"},
		{"dims one by one", a, "q.npy", []int{12, 16, 32}, []string{"T", "H_qk", "K"},
			"q.npy: shape (10, 16, 32), want (12, 16, 32) [T, H_qk, K]"},
		{"no dims", a, "q.npy", []int{12, 16, 32}, nil, "q.npy: shape (10, 16, 32), want (12, 16, 32)"},
		{"rank mismatch", a, "q.npy", []int{10, 512}, []string{"T, H_qk*K"}, "q.npy: shape (10, 16, 32), want (10, 512) [T, H_qk*K]"},
		{"wildcard mismatch", a, "q.npy", []int{-1, 48, -1}, []string{"T, HV, V"}, "q.npy: shape (10, 16, 32), want (*, 48, *) [T, HV, V]"},
		{"name from the array", a, "", []int{5}, nil, "/data/q.npy: shape (10, 16, 32), want (5,)"},
		{"scalar", &Array{Shape: []int{}, Dtype: DtypeFloat64}, "s.npy", []int{1}, nil, "s.npy: shape (), want (1,)"},
		{"scalar ok", &Array{Shape: []int{}, Dtype: DtypeFloat64}, "s.npy", []int{}, nil, ""},
		{"nil array", nil, "g.npy", []int{10, 48}, []string{"T, HV"}, "g.npy: no array, want shape (10, 48) [T, HV]"},
		{"no name at all", &Array{Shape: []int{2}}, "", []int{3}, nil, "npy: shape (2,), want (3,)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ExpectShape(tc.arr, tc.as, tc.want, tc.dims...)
			if tc.msg == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrShape)
			assert.Equal(t, tc.msg, err.Error())
		})
	}
}

func TestAccessorsOnHandBuiltArray(t *testing.T) {
	for _, a := range []*Array{
		{Shape: []int{3}, Dtype: DtypeFloat32},
		{Shape: []int{-3}, Dtype: DtypeFloat64},
		{Dtype: DtypeInt32},
		{Shape: []int{2}, Dtype: DtypeUint16, data: []byte{1, 2}},
	} {
		for _, get := range []func() error{
			func() error { _, err := a.Float32(); return err },
			func() error { _, err := a.Float64(); return err },
			func() error { _, err := a.Int32(); return err },
			func() error { _, err := a.Int64(); return err },
			func() error { _, err := a.Uint16(); return err },
		} {
			err := get()
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrShape)
			assert.Contains(t, err.Error(), "data bytes (not read by this package?)")
		}
	}
	// An unknown dtype is reported as such, without touching the data.
	_, err := (&Array{Shape: []int{1}, Dtype: ">f4"}).Float32()
	assert.ErrorIs(t, err, ErrDtype)
}
