// Package npy reads and writes NumPy .npy files: the format numpy.save writes and numpy.load reads.
//
// Supported: format versions 1.0, 2.0 and 3.0 on read (1.0 on write, or 2.0 when the header does not fit
// in 1.0's 16-bit length); C order only (fortran_order True is an error); any number of dimensions,
// including 0 (a scalar, shape ()); the little-endian dtypes
//
//	'<f4' float32   '<f8' float64   '<i4' int32   '<i8' int64   '<u2' uint16 (raw bits, e.g. bf16)
//
// Reading is strict: a file must start with the magic "\x93NUMPY", carry a header dict with exactly the keys
// 'descr', 'fortran_order' and 'shape', and hold exactly as many data bytes as its shape and dtype need
// (a truncated file and trailing bytes are both errors). Every error is an [*Error] that names the file
// where it is known, says what is wrong and what was expected, and matches one of the Err* sentinels with
// [errors.Is].
//
// Writing produces the same bytes numpy (1.24 and later) writes: the header dict
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } followed by spaces (numpy's spare room for
// growing the first axis, then alignment) and a newline, so that the data starts at a multiple of 64 bytes.
package npy

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Dtype strings (numpy's array-protocol type strings) this package reads and writes.
const (
	DtypeFloat32 = "<f4" // little-endian IEEE 754 binary32
	DtypeFloat64 = "<f8" // little-endian IEEE 754 binary64
	DtypeInt32   = "<i4" // little-endian two's-complement 32-bit integer
	DtypeInt64   = "<i8" // little-endian two's-complement 64-bit integer
	DtypeUint16  = "<u2" // little-endian 16-bit unsigned integer; also raw bf16 or fp16 bits
)

// supportedDtypes lists the dtypes in the order error messages name them.
var supportedDtypes = []string{DtypeFloat32, DtypeFloat64, DtypeInt32, DtypeInt64, DtypeUint16}

// itemSize returns the size in bytes of one element of a supported dtype, or 0.
func itemSize(dtype string) int {
	switch dtype {
	case DtypeFloat32, DtypeInt32:
		return 4
	case DtypeFloat64, DtypeInt64:
		return 8
	case DtypeUint16:
		return 2
	}
	return 0
}

// Sentinel errors: every error this package returns is an [*Error] whose Kind is one of these, so
// errors.Is(err, npy.ErrDtype) and the like tell the cases apart.
var (
	ErrMagic        = errors.New("npy: not an npy file")
	ErrVersion      = errors.New("npy: unsupported format version")
	ErrHeader       = errors.New("npy: malformed header")
	ErrDtype        = errors.New("npy: unsupported dtype")
	ErrFortranOrder = errors.New("npy: fortran order")
	ErrShape        = errors.New("npy: bad shape")
	ErrTruncated    = errors.New("npy: truncated")
	ErrTrailingData = errors.New("npy: trailing data")
	ErrIO           = errors.New("npy: i/o error")
)

// Error is the error type of this package.
type Error struct {
	// File is the file the error is about ("" when unknown, e.g. for Read from a stream).
	File string
	// Kind is one of the Err* sentinels.
	Kind error
	// Msg says what is wrong and what was expected.
	Msg string
	// Err is the underlying cause, if any (e.g. an I/O error).
	Err error
}

// Error returns "FILE: MSG" when the file is known and "npy: MSG" when it is not.
func (e *Error) Error() string {
	msg := e.Msg
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	if e.File != "" {
		return e.File + ": " + msg
	}
	return "npy: " + msg
}

// Unwrap returns the Kind sentinel and the underlying cause, for errors.Is and errors.As.
func (e *Error) Unwrap() []error {
	errs := make([]error, 0, 2)
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

func newError(file string, kind error, format string, args ...any) *Error {
	return &Error{File: file, Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// Array is an array read from an .npy file: its shape, dtype and data (little-endian, C order). Use the
// typed accessors to get the data.
type Array struct {
	// Shape is the array's shape; empty (not nil) for a scalar.
	Shape []int
	// Dtype is one of the Dtype* constants: "<f4", "<f8", "<i4", "<i8" or "<u2".
	Dtype string
	// Name names the array in error messages: ReadFile sets it to the file's path; Read leaves it empty.
	Name string

	data []byte // len = Len() * item size
}

// Len returns the number of elements: the product of Shape (1 for a scalar).
func (a *Array) Len() int {
	if a == nil {
		return 0
	}
	n := 1
	for _, d := range a.Shape {
		n *= d
	}
	return n
}

// check returns an error if a's data does not match its shape and dtype, as for an Array built by hand
// rather than read by this package.
func (a *Array) check() error {
	if a == nil {
		return errors.New("npy: nil array")
	}
	size := itemSize(a.Dtype)
	nelem, nbytes, msg := sizeOf(a.Shape, size)
	if size != 0 && (msg != "" || nbytes != len(a.data) || nelem != a.Len()) {
		return newError(a.Name, ErrShape, "array of shape %s and dtype %s holds %d data bytes (not read by this package?)",
			formatShape(a.Shape), quote(a.Dtype), len(a.data))
	}
	return nil
}

func (a *Array) dtypeError(want string) error {
	return newError(a.Name, ErrDtype, "dtype %s, want %s", quote(a.Dtype), want)
}

// Float32 returns the data as float32: a copy for '<f4', rounded to nearest for '<f8'. Other dtypes are
// an error.
func (a *Array) Float32() ([]float32, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	switch a.Dtype {
	case DtypeFloat32:
		out := make([]float32, a.Len())
		for i := range out {
			out[i] = math.Float32frombits(le.Uint32(a.data[4*i:]))
		}
		return out, nil
	case DtypeFloat64:
		out := make([]float32, a.Len())
		for i := range out {
			out[i] = float32(math.Float64frombits(le.Uint64(a.data[8*i:])))
		}
		return out, nil
	}
	return nil, a.dtypeError("'<f4' or '<f8' for float32 data")
}

// Float64 returns the data as float64: a copy for '<f8', exactly widened for '<f4'. Other dtypes are an
// error.
func (a *Array) Float64() ([]float64, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	switch a.Dtype {
	case DtypeFloat32:
		out := make([]float64, a.Len())
		for i := range out {
			out[i] = float64(math.Float32frombits(le.Uint32(a.data[4*i:])))
		}
		return out, nil
	case DtypeFloat64:
		out := make([]float64, a.Len())
		for i := range out {
			out[i] = math.Float64frombits(le.Uint64(a.data[8*i:]))
		}
		return out, nil
	}
	return nil, a.dtypeError("'<f4' or '<f8' for float64 data")
}

// Int32 returns the data as int32: a copy for '<i4'; for '<i8' (numpy's default integer) every value must
// fit in int32, else it is an error. Other dtypes are an error.
func (a *Array) Int32() ([]int32, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	switch a.Dtype {
	case DtypeInt32:
		out := make([]int32, a.Len())
		for i := range out {
			out[i] = int32(le.Uint32(a.data[4*i:]))
		}
		return out, nil
	case DtypeInt64:
		out := make([]int32, a.Len())
		for i := range out {
			v := int64(le.Uint64(a.data[8*i:]))
			if v < math.MinInt32 || v > math.MaxInt32 {
				return nil, newError(a.Name, ErrDtype, "element %d = %d does not fit in int32 ('<i8' data read as int32)", i, v)
			}
			out[i] = int32(v)
		}
		return out, nil
	}
	return nil, a.dtypeError("'<i4' or '<i8' for int32 data")
}

// Int64 returns the data as int64, from '<i8' or (widened) '<i4'. Other dtypes are an error.
func (a *Array) Int64() ([]int64, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	switch a.Dtype {
	case DtypeInt32:
		out := make([]int64, a.Len())
		for i := range out {
			out[i] = int64(int32(le.Uint32(a.data[4*i:])))
		}
		return out, nil
	case DtypeInt64:
		out := make([]int64, a.Len())
		for i := range out {
			out[i] = int64(le.Uint64(a.data[8*i:]))
		}
		return out, nil
	}
	return nil, a.dtypeError("'<i4' or '<i8' for int64 data")
}

// Uint16 returns the raw 16-bit values of a '<u2' array (e.g. bf16 bit patterns). Other dtypes are an
// error.
func (a *Array) Uint16() ([]uint16, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	if a.Dtype != DtypeUint16 {
		return nil, a.dtypeError("'<u2' for uint16 data")
	}
	out := make([]uint16, a.Len())
	for i := range out {
		out[i] = le.Uint16(a.data[2*i:])
	}
	return out, nil
}

// ExpectShape checks that a has exactly the shape want. A negative entry in want matches any size (use it
// for a dimension that the caller learns from this array). name names the array in the error ("" uses
// a.Name); dims, if given, describe the dimensions and are joined with ", ", so both
// ExpectShape(a, "q.npy", s, "T", "H_qk", "K") and ExpectShape(a, "q.npy", s, "T, H_qk, K") give
//
//	q.npy: shape (10, 16, 32), want (12, 16, 32) [T, H_qk, K]
//
// The error is an [*Error] of kind ErrShape; a nil a is an error too.
func ExpectShape(a *Array, name string, want []int, dims ...string) error {
	if name == "" && a != nil {
		name = a.Name
	}
	wantStr := formatWant(want)
	if len(dims) > 0 {
		wantStr += " [" + strings.Join(dims, ", ") + "]"
	}
	if a == nil {
		return newError(name, ErrShape, "no array, want shape %s", wantStr)
	}
	ok := len(a.Shape) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = want[i] < 0 || want[i] == a.Shape[i]
	}
	if ok {
		return nil
	}
	return newError(name, ErrShape, "shape %s, want %s", formatShape(a.Shape), wantStr)
}

// formatShape writes a shape as Python writes a tuple: (), (5,), (3, 4).
func formatShape(shape []int) string {
	var b strings.Builder
	b.WriteByte('(')
	for i, d := range shape {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(d))
	}
	if len(shape) == 1 {
		b.WriteByte(',')
	}
	b.WriteByte(')')
	return b.String()
}

// formatWant is formatShape with negative entries written as "*".
func formatWant(shape []int) string {
	parts := make([]string, len(shape))
	for i, d := range shape {
		if d < 0 {
			parts[i] = "*"
		} else {
			parts[i] = strconv.Itoa(d)
		}
	}
	s := "(" + strings.Join(parts, ", ")
	if len(shape) == 1 {
		s += ","
	}
	return s + ")"
}

// quote writes s in single quotes as Python's repr does for plain ASCII, escaping anything else.
func quote(s string) string {
	q := strconv.QuoteToASCII(s)
	q = q[1 : len(q)-1]
	q = strings.ReplaceAll(q, `\"`, `"`)
	q = strings.ReplaceAll(q, `'`, `\'`)
	return "'" + q + "'"
}

// supportedList is the list of supported dtypes for error messages.
func supportedList() string {
	parts := make([]string, len(supportedDtypes))
	for i, d := range supportedDtypes {
		parts[i] = quote(d)
	}
	return strings.Join(parts, ", ")
}
