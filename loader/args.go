package loader

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ParamSpec is one kernel parameter as laid out in the parameter buffer:
// its size and alignment in bytes and its offset from the buffer's start.
type ParamSpec struct {
	Name   string
	Size   int
	Align  int
	Offset int
}

// maxParamAlign bounds Bytes alignments (CUtensorMap needs 64).
const maxParamAlign = 256

func validAlign(a int) bool { return a > 0 && a <= maxParamAlign && a&(a-1) == 0 }

// Args builds a kernel's arguments in the layout of its parameter buffer:
// each value at the next offset aligned to its natural alignment (Bytes: the
// alignment given), little-endian. The builder names each argument by its
// kind ("ptr", "u32", ...). The first invalid argument is remembered and
// returned by Err and Launch.
type Args struct {
	buf   []byte
	specs []ParamSpec
	err   error
}

// NewArgs returns an empty argument list.
func NewArgs() *Args { return &Args{} }

// Clone returns an independent copy of a: arguments appended to either later
// do not show in the other (a kernel that takes another's arguments and a
// few more).
func (a *Args) Clone() *Args {
	return &Args{buf: append([]byte(nil), a.buf...), specs: append([]ParamSpec(nil), a.specs...), err: a.err}
}

func (a *Args) add(kind string, align int, val []byte) *Args {
	off := (len(a.buf) + align - 1) &^ (align - 1)
	for len(a.buf) < off {
		a.buf = append(a.buf, 0)
	}
	a.buf = append(a.buf, val...)
	a.specs = append(a.specs, ParamSpec{Name: kind, Size: len(val), Align: align, Offset: off})
	return a
}

func (a *Args) fail(err error) *Args {
	if a.err == nil {
		a.err = fmt.Errorf("loader: argument %d: %w", len(a.specs), err)
	}
	// Keep the position so later arguments are numbered as the caller wrote them.
	a.specs = append(a.specs, ParamSpec{Name: "invalid"})
	return a
}

// Ptr appends a device buffer's address (8 bytes, align 8).
func (a *Args) Ptr(b *Buffer) *Args {
	if err := b.alive(); err != nil {
		return a.fail(err)
	}
	return a.add("ptr", 8, binary.LittleEndian.AppendUint64(nil, uint64(b.ptr)))
}

// DevicePtr appends a raw device address (8 bytes, align 8).
func (a *Args) DevicePtr(p uintptr) *Args {
	return a.add("ptr", 8, binary.LittleEndian.AppendUint64(nil, uint64(p)))
}

// I32 appends an int (4 bytes, align 4).
func (a *Args) I32(v int32) *Args {
	return a.add("i32", 4, binary.LittleEndian.AppendUint32(nil, uint32(v)))
}

// U32 appends an unsigned int (4 bytes, align 4).
func (a *Args) U32(v uint32) *Args {
	return a.add("u32", 4, binary.LittleEndian.AppendUint32(nil, v))
}

// I64 appends a long long (8 bytes, align 8).
func (a *Args) I64(v int64) *Args {
	return a.add("i64", 8, binary.LittleEndian.AppendUint64(nil, uint64(v)))
}

// U64 appends an unsigned long long (8 bytes, align 8).
func (a *Args) U64(v uint64) *Args {
	return a.add("u64", 8, binary.LittleEndian.AppendUint64(nil, v))
}

// F32 appends a float (4 bytes, align 4).
func (a *Args) F32(v float32) *Args {
	return a.add("f32", 4, binary.LittleEndian.AppendUint32(nil, math.Float32bits(v)))
}

// F64 appends a double (8 bytes, align 8).
func (a *Args) F64(v float64) *Args {
	return a.add("f64", 8, binary.LittleEndian.AppendUint64(nil, math.Float64bits(v)))
}

// Bytes appends a by-value struct: b's bytes at the next offset aligned to
// align, which must be a power of two no larger than 256. The caller lays
// the struct out (padding included) as the kernel declares it.
func (a *Args) Bytes(align int, b []byte) *Args {
	if !validAlign(align) {
		return a.fail(fmt.Errorf("Bytes alignment %d is not a power of two in [1, %d]", align, maxParamAlign))
	}
	if len(b) == 0 {
		return a.fail(errors.New("Bytes of length 0"))
	}
	return a.add("bytes", align, append([]byte(nil), b...))
}

// Err returns the first invalid argument's error, or nil.
func (a *Args) Err() error { return a.err }

// Len returns the number of arguments.
func (a *Args) Len() int { return len(a.specs) }

// Size returns the parameter buffer's length in bytes (without tail padding).
func (a *Args) Size() int { return len(a.buf) }

// Layout returns each argument's kind, size, alignment and offset.
func (a *Args) Layout() []ParamSpec { return append([]ParamSpec(nil), a.specs...) }

// Data returns a copy of the parameter buffer as laid out.
func (a *Args) Data() []byte { return append([]byte(nil), a.buf...) }

// checkSignature compares an argument layout with a kernel's signature and
// names the first parameter that differs.
func checkSignature(kernel string, sig, got []ParamSpec) error {
	for i := range min(len(sig), len(got)) {
		p, g := sig[i], got[i]
		if p.Size != g.Size || p.Align != g.Align || p.Offset != g.Offset {
			return fmt.Errorf("loader: launch %s: parameter %d %q is size %d align %d at offset %d, but argument %d (%s) is size %d align %d at offset %d",
				kernel, i, p.Name, p.Size, p.Align, p.Offset, i, g.Name, g.Size, g.Align, g.Offset)
		}
	}
	switch {
	case len(got) < len(sig):
		p := sig[len(got)]
		return fmt.Errorf("loader: launch %s: kernel takes %d parameters, got %d arguments; parameter %d %q (size %d align %d at offset %d) is missing",
			kernel, len(sig), len(got), len(got), p.Name, p.Size, p.Align, p.Offset)
	case len(got) > len(sig):
		g := got[len(sig)]
		return fmt.Errorf("loader: launch %s: kernel takes %d parameters, got %d arguments; argument %d (%s, size %d at offset %d) is extra",
			kernel, len(sig), len(got), len(sig), g.Name, g.Size, g.Offset)
	}
	return nil
}
