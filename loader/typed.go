package loader

import (
	"fmt"
	"reflect"
	"unsafe"
)

// elemSize returns the size of T when T is a fixed-size, pointer-free type
// (sized integers, floats, complex, bool, and arrays and structs of them).
// int, uint and uintptr are refused: their size is the platform's.
func elemSize[T any]() (int, error) {
	t := reflect.TypeFor[T]()
	if !fixedSize(t) {
		return 0, fmt.Errorf("loader: element type %s is not a fixed-size plain type", t)
	}
	if t.Size() == 0 {
		return 0, fmt.Errorf("loader: element type %s has size 0", t)
	}
	return int(t.Size()), nil
}

func fixedSize(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Bool, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		return true
	case reflect.Array:
		return fixedSize(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if !fixedSize(t.Field(i).Type) {
				return false
			}
		}
		return true
	}
	return false
}

// sliceBytes views s as bytes after checking that len(s) elements of T
// fill exactly want bytes.
func sliceBytes[T any](op string, s []T, want int) ([]byte, error) {
	size, err := elemSize[T]()
	if err != nil {
		return nil, err
	}
	if len(s)*size != want {
		return nil, fmt.Errorf("loader: %s: %d elements of %d bytes are %d bytes, the buffer has %d",
			op, len(s), size, len(s)*size, want)
	}
	if len(s) == 0 {
		return nil, nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), want), nil
}

// AllocFor allocates device memory for n elements of T.
func AllocFor[T any](ctx *Context, n int) (*Buffer, error) {
	size, err := elemSize[T]()
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("loader: AllocFor(%d): count must be positive", n)
	}
	return ctx.Alloc(n * size)
}

// CopyToDevice copies src into buf, whose size must equal src's in bytes.
func CopyToDevice[T any](buf *Buffer, src []T) error {
	if err := buf.alive(); err != nil {
		return err
	}
	b, err := sliceBytes("CopyToDevice", src, buf.size)
	if err != nil {
		return err
	}
	return buf.CopyHtoD(b)
}

// CopyToDeviceAsync is CopyToDevice in the order of stream s.
func CopyToDeviceAsync[T any](buf *Buffer, src []T, s *Stream) error {
	if err := buf.alive(); err != nil {
		return err
	}
	b, err := sliceBytes("CopyToDeviceAsync", src, buf.size)
	if err != nil {
		return err
	}
	return buf.CopyHtoDAsync(b, s)
}

// CopyFromDevice copies buf into dst, whose size must equal buf's in bytes.
func CopyFromDevice[T any](buf *Buffer, dst []T) error {
	if err := buf.alive(); err != nil {
		return err
	}
	b, err := sliceBytes("CopyFromDevice", dst, buf.size)
	if err != nil {
		return err
	}
	return buf.CopyDtoH(b)
}

// CopyFromDeviceAsync is CopyFromDevice in the order of stream s; into Go
// memory the driver returns when the copy is complete.
func CopyFromDeviceAsync[T any](buf *Buffer, dst []T, s *Stream) error {
	if err := buf.alive(); err != nil {
		return err
	}
	b, err := sliceBytes("CopyFromDeviceAsync", dst, buf.size)
	if err != nil {
		return err
	}
	return buf.CopyDtoHAsync(b, s)
}
