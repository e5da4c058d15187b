package loader

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"
)

// Launch limits that hold on every GPU this project runs on (CC >= 8.0).
const (
	MaxThreadsPerBlock = 1024
	maxBlockZ          = 64
	maxGridX           = 1<<31 - 1
	maxGridYZ          = 65535
)

// validateDims checks a launch shape before the driver sees it.
func validateDims(grid, block [3]uint32) error {
	for i, g := range grid {
		if g == 0 {
			return fmt.Errorf("grid dimension %c is 0 (grid %v)", "xyz"[i], grid)
		}
	}
	for i, b := range block {
		if b == 0 {
			return fmt.Errorf("block dimension %c is 0 (block %v)", "xyz"[i], block)
		}
	}
	if n := uint64(block[0]) * uint64(block[1]) * uint64(block[2]); n > MaxThreadsPerBlock {
		return fmt.Errorf("block %v has %d threads, more than %d", block, n, MaxThreadsPerBlock)
	}
	if block[2] > maxBlockZ {
		return fmt.Errorf("block z %d is more than %d", block[2], maxBlockZ)
	}
	if grid[0] > maxGridX || grid[1] > maxGridYZ || grid[2] > maxGridYZ {
		return fmt.Errorf("grid %v is larger than %d x %d x %d", grid, maxGridX, maxGridYZ, maxGridYZ)
	}
	return nil
}

// Launch runs fn on stream s (nil: the default stream of fn's context) with
// the given grid and block shape, dynamic shared memory and arguments (nil:
// none). Before cuLaunchKernel it checks the shape and, when fn has a
// signature, the arguments' layout against it. The argument pointers and
// values are built in one arena that stays pinned for the call.
func Launch(s *Stream, fn *Function, grid, block [3]uint32, sharedBytes uint32, args *Args) error {
	if fn == nil {
		return errors.New("loader: launch: nil function")
	}
	if args == nil {
		args = NewArgs()
	}
	if args.err != nil {
		return fmt.Errorf("loader: launch %s: %w", fn.name, args.err)
	}
	if err := validateDims(grid, block); err != nil {
		return fmt.Errorf("loader: launch %s: %w", fn.name, err)
	}
	if sig := fn.sig.Load(); sig != nil {
		if err := checkSignature(fn.name, *sig, args.specs); err != nil {
			return err
		}
	}
	if err := fn.mod.alive(); err != nil {
		return fmt.Errorf("loader: launch %s: %w", fn.name, err)
	}
	ctx := fn.mod.ctx
	sh, err := streamOf(s, ctx)
	if err != nil {
		return fmt.Errorf("loader: launch %s: %w", fn.name, err)
	}

	arena, params := buildParams(args)
	var pin runtime.Pinner
	if len(arena) > 0 {
		pin.Pin(&arena[0])
	}
	err = ctx.Do(func() error {
		return ctx.d.launchKernel(fn.handle, grid, block, sharedBytes, sh, params)
	})
	pin.Unpin()
	runtime.KeepAlive(arena)
	if err != nil {
		return fmt.Errorf("loader: launch %s grid %v block %v shared %d: %w", fn.name, grid, block, sharedBytes, err)
	}
	return nil
}

// buildParams lays out cuLaunchKernel's void** in one arena: n pointer
// slots, then the parameter buffer, aligned to its largest alignment; slot i
// points at argument i. It returns the arena and the address of slot 0 (nil
// without arguments).
func buildParams(a *Args) ([]uint64, unsafe.Pointer) {
	n := len(a.specs)
	if n == 0 {
		return nil, nil
	}
	maxAlign := 8
	for _, p := range a.specs {
		maxAlign = max(maxAlign, p.Align)
	}
	words := n + (len(a.buf)+maxAlign+7)/8
	arena := make([]uint64, words)
	base := unsafe.Pointer(&arena[0])
	start := uintptr(n * 8)
	if r := (uintptr(base) + start) % uintptr(maxAlign); r != 0 {
		start += uintptr(maxAlign) - r
	}
	raw := unsafe.Slice((*byte)(base), words*8)
	copy(raw[start:], a.buf)
	for i, p := range a.specs {
		arena[i] = uint64(uintptr(base) + start + uintptr(p.Offset))
	}
	return arena, base
}
