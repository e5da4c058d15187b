package loader

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
)

// FuncAttribute is a CUfunction_attribute.
type FuncAttribute int32

// Function attributes. Values are the driver's.
const (
	FuncMaxThreadsPerBlock            FuncAttribute = 0
	FuncSharedSizeBytes               FuncAttribute = 1 // static shared memory
	FuncConstSizeBytes                FuncAttribute = 2
	FuncLocalSizeBytes                FuncAttribute = 3
	FuncNumRegs                       FuncAttribute = 4
	FuncPTXVersion                    FuncAttribute = 5 // e.g. 80 for PTX ISA 8.0
	FuncBinaryVersion                 FuncAttribute = 6 // e.g. 90 for sm_90
	FuncCacheModeCA                   FuncAttribute = 7
	FuncMaxDynamicSharedBytes         FuncAttribute = 8
	FuncPreferredSharedMemoryCarveout FuncAttribute = 9
)

// FuncAttributes is what the driver reports about a compiled kernel.
type FuncAttributes struct {
	Registers          int // per thread
	SharedStaticBytes  int
	ConstBytes         int
	LocalBytes         int // per thread (spills, stack)
	MaxThreadsPerBlock int
	PTXVersion         int // major*10+minor
	BinaryVersion      int // major*10+minor of the SASS
	MaxDynamicShared   int // current dynamic shared memory limit, bytes
}

// Function is a kernel entry of a loaded module. It may carry the signature
// its parameters must match (SetSignature); Launch checks it.
type Function struct {
	mod    *Module
	handle uintptr
	name   string
	sig    atomic.Pointer[[]ParamSpec]
}

// errNilFunction is what the methods of a nil *Function return.
var errNilFunction = errors.New("loader: nil function")

// Name returns the entry's name ("" for a nil function).
func (f *Function) Name() string {
	if f == nil {
		return ""
	}
	return f.name
}

// Module returns the module the function lives in.
func (f *Function) Module() *Module {
	if f == nil {
		return nil
	}
	return f.mod
}

// Attribute returns one function attribute (cuFuncGetAttribute).
func (f *Function) Attribute(attr FuncAttribute) (int, error) {
	if f == nil {
		return 0, errNilFunction
	}
	if err := f.mod.alive(); err != nil {
		return 0, err
	}
	var v int
	err := f.mod.ctx.Do(func() error {
		var e error
		v, e = f.mod.ctx.d.funcGetAttribute(f.handle, attr)
		return e
	})
	if err != nil {
		return 0, fmt.Errorf("loader: kernel %s attribute %d: %w", f.name, attr, err)
	}
	return v, nil
}

// Attributes returns the attributes gdnkcp reports and checks.
func (f *Function) Attributes() (FuncAttributes, error) {
	var a FuncAttributes
	fields := []struct {
		attr FuncAttribute
		dst  *int
	}{
		{FuncNumRegs, &a.Registers},
		{FuncSharedSizeBytes, &a.SharedStaticBytes},
		{FuncConstSizeBytes, &a.ConstBytes},
		{FuncLocalSizeBytes, &a.LocalBytes},
		{FuncMaxThreadsPerBlock, &a.MaxThreadsPerBlock},
		{FuncPTXVersion, &a.PTXVersion},
		{FuncBinaryVersion, &a.BinaryVersion},
		{FuncMaxDynamicSharedBytes, &a.MaxDynamicShared},
	}
	for _, fl := range fields {
		v, err := f.Attribute(fl.attr)
		if err != nil {
			return FuncAttributes{}, err
		}
		*fl.dst = v
	}
	return a, nil
}

// SetMaxDynamicSharedMemory allows launches with up to bytes of dynamic
// shared memory (cuFuncSetAttribute, attribute 8); needed above 48 KiB, up
// to the device's opt-in limit minus the static shared memory.
func (f *Function) SetMaxDynamicSharedMemory(bytes int) error {
	if f == nil {
		return errNilFunction
	}
	if err := f.mod.alive(); err != nil {
		return err
	}
	if bytes < 0 {
		return fmt.Errorf("loader: kernel %s: negative dynamic shared memory %d", f.name, bytes)
	}
	err := f.mod.ctx.Do(func() error {
		return f.mod.ctx.d.funcSetAttribute(f.handle, FuncMaxDynamicSharedBytes, bytes)
	})
	if err != nil {
		return fmt.Errorf("loader: kernel %s: allow %d bytes of dynamic shared memory: %w", f.name, bytes, err)
	}
	return nil
}

// SetSignature records the parameter layout launches must match (from the
// blob manifest). It checks the layout itself first: positive sizes,
// power-of-two alignments, aligned, non-overlapping, increasing offsets.
// A nil signature removes the check.
func (f *Function) SetSignature(sig []ParamSpec) error {
	if f == nil {
		return errNilFunction
	}
	if sig == nil {
		f.sig.Store(nil)
		return nil
	}
	end := 0
	for i, p := range sig {
		switch {
		case p.Size <= 0:
			return fmt.Errorf("loader: kernel %s signature: parameter %d %q has size %d", f.name, i, p.Name, p.Size)
		case !validAlign(p.Align):
			return fmt.Errorf("loader: kernel %s signature: parameter %d %q has alignment %d, not a power of two", f.name, i, p.Name, p.Align)
		case p.Offset%p.Align != 0:
			return fmt.Errorf("loader: kernel %s signature: parameter %d %q at offset %d is not %d-aligned", f.name, i, p.Name, p.Offset, p.Align)
		case p.Offset < end:
			return fmt.Errorf("loader: kernel %s signature: parameter %d %q at offset %d overlaps the previous one (ends at %d)", f.name, i, p.Name, p.Offset, end)
		}
		end = p.Offset + p.Size
	}
	s := slices.Clone(sig)
	f.sig.Store(&s)
	return nil
}

// Signature returns the recorded parameter layout, or nil.
func (f *Function) Signature() []ParamSpec {
	if f == nil {
		return nil
	}
	if p := f.sig.Load(); p != nil {
		return slices.Clone(*p)
	}
	return nil
}
