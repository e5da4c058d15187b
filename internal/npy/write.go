package npy

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
)

// Write writes data as an .npy array of the given shape (C order; nil or empty shape for a scalar, which
// needs exactly one element). data is a []float32, []float64, []int32, []int64 or []uint16, written as
// '<f4', '<f8', '<i4', '<i8' or '<u2'. The header is format 1.0 (2.0 if it does not fit), laid out
// byte for byte as numpy writes it. Nothing is written when the arguments are invalid.
func Write(w io.Writer, shape []int, data any) error {
	return write(w, "", shape, data)
}

// WriteFile writes data to the file at path (created or truncated) as [Write] does. Errors name the file;
// a file whose write fails is removed.
func WriteFile(path string, shape []int, data any) (err error) {
	if _, _, err := check(path, shape, data); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return ioError(path, "cannot create", err)
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = ioError(path, "closing", cerr)
		}
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<16)
	if err := write(bw, path, shape, data); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return ioError(path, "writing", err)
	}
	return nil
}

// check validates the arguments of Write and returns the dtype and the header bytes.
func check(file string, shape []int, data any) (string, []byte, error) {
	var dtype string
	var n int
	switch d := data.(type) {
	case []float32:
		dtype, n = DtypeFloat32, len(d)
	case []float64:
		dtype, n = DtypeFloat64, len(d)
	case []int32:
		dtype, n = DtypeInt32, len(d)
	case []int64:
		dtype, n = DtypeInt64, len(d)
	case []uint16:
		dtype, n = DtypeUint16, len(d)
	default:
		return "", nil, newError(file, ErrDtype, "cannot write data of type %T, want []float32, []float64, []int32, []int64 or []uint16", data)
	}
	nelem, _, msg := sizeOf(shape, itemSize(dtype))
	if msg != "" {
		return "", nil, newError(file, ErrShape, "shape %s: %s", formatShape(shape), msg)
	}
	if nelem != n {
		return "", nil, newError(file, ErrShape, "shape %s holds %d elements, data has %d", formatShape(shape), nelem, n)
	}
	if shape == nil {
		shape = []int{}
	}
	return dtype, encodeHeader(dtype, shape), nil
}

func write(w io.Writer, file string, shape []int, data any) error {
	_, hdr, err := check(file, shape, data)
	if err != nil {
		return err
	}
	if _, err := w.Write(hdr); err != nil {
		return ioError(file, "writing the header", err)
	}
	switch d := data.(type) {
	case []float32:
		err = encode(w, d, 4, func(b []byte, v float32) { le.PutUint32(b, math.Float32bits(v)) })
	case []float64:
		err = encode(w, d, 8, func(b []byte, v float64) { le.PutUint64(b, math.Float64bits(v)) })
	case []int32:
		err = encode(w, d, 4, func(b []byte, v int32) { le.PutUint32(b, uint32(v)) })
	case []int64:
		err = encode(w, d, 8, func(b []byte, v int64) { le.PutUint64(b, uint64(v)) })
	case []uint16:
		err = encode(w, d, 2, func(b []byte, v uint16) { le.PutUint16(b, v) })
	default:
		panic(fmt.Sprintf("unreachable: %T passed check", data))
	}
	if err != nil {
		return ioError(file, "writing the data", err)
	}
	return nil
}

// encode writes data little-endian through a bounded buffer.
func encode[T any](w io.Writer, data []T, size int, put func([]byte, T)) error {
	const bufElems = 8192
	buf := make([]byte, size*min(len(data), bufElems))
	for len(data) > 0 {
		k := min(len(data), bufElems)
		for i, v := range data[:k] {
			put(buf[i*size:], v)
		}
		if _, err := w.Write(buf[:k*size]); err != nil {
			return err
		}
		data = data[k:]
	}
	return nil
}
