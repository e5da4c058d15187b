package npy

import (
	"bytes"
	"testing"
)

// FuzzRead checks that Read never panics, and that whatever it accepts writes back to a file that reads
// back the same. Run with: go test -run '^$' -fuzz FuzzRead ./internal/npy/
func FuzzRead(f *testing.F) {
	for _, shape := range [][]int{{}, {3}, {2, 3}, {2, 1, 2}} {
		for _, data := range []any{
			make([]float32, product(shape)), make([]float64, product(shape)), make([]int32, product(shape)),
			make([]int64, product(shape)), make([]uint16, product(shape)),
		} {
			var buf bytes.Buffer
			if err := Write(&buf, shape, data); err != nil {
				f.Fatal(err)
			}
			f.Add(buf.Bytes())
		}
	}
	f4 := f4Bytes(1, 2)
	for _, seed := range [][]byte{
		nil,
		[]byte("\x93NUMPY"),
		[]byte("\x93NUMPY\x02\x00\xff\xff\xff\x7f"),
		npyFile(2, dict("'<f4'", "False", "(2,)"), f4),
		npyFile(3, dict("'<f4'", "False", "(2,)"), f4),
		npyFile(1, dict("'>f4'", "False", "(2,)"), f4),
		npyFile(1, dict("'<f4'", "True", "(2,)"), f4),
		npyFile(1, dict("'<f4'", "False", "(-2,)"), f4),
		npyFile(1, dict("'<f4'", "False", "(1000000000000000,)"), f4),
		npyFile(1, dict("[('a', '<f4')]", "False", "(2,)"), f4),
		npyFile(1, "{'descr': ((((((((((((((((((((((((()))))))))))))))))))))))))}", nil),
		npyFile(1, `{"descr": u'<f4', "fortran_order": False, "shape": (2L,)}`, f4),
		rawFile(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f4),
		append(npyFile(1, dict("'<f4'", "False", "(2,)"), f4), 0),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		a, err := Read(bytes.NewReader(in))
		if err != nil {
			if a != nil {
				t.Fatalf("array and error: %v", err)
			}
			if _, ok := err.(*Error); !ok {
				t.Fatalf("error %v is a %T, want *Error", err, err)
			}
			return
		}
		if a.Len()*itemSize(a.Dtype) != len(a.data) {
			t.Fatalf("shape %v of %s with %d data bytes", a.Shape, a.Dtype, len(a.data))
		}
		var data any
		switch a.Dtype {
		case DtypeFloat32:
			data, err = a.Float32()
		case DtypeFloat64:
			data, err = a.Float64()
		case DtypeInt32:
			data, err = a.Int32()
		case DtypeInt64:
			data, err = a.Int64()
		case DtypeUint16:
			data, err = a.Uint16()
		}
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := Write(&buf, a.Shape, data); err != nil {
			t.Fatal(err)
		}
		b, err := Read(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if !equalInts(a.Shape, b.Shape) || a.Dtype != b.Dtype || !bytes.Equal(a.data, b.data) {
			t.Fatalf("round trip changed the array: %v %s -> %v %s", a.Shape, a.Dtype, b.Shape, b.Dtype)
		}
	})
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
