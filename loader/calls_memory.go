package loader

import "unsafe"

// Result layer for memory. Host pointers are unsafe.Pointer so that purego
// keeps the Go memory alive for the call.

func (d *driver) memGetInfo() (free, total uint64, err error) {
	f, err := d.cuMemGetInfo.get(d.lib)
	if err != nil {
		return 0, 0, err
	}
	var fr, tot uintptr
	err = d.check(d.cuMemGetInfo.name, f(&fr, &tot))
	return uint64(fr), uint64(tot), err
}

func (d *driver) memAlloc(n uintptr) (uintptr, error) {
	f, err := d.cuMemAlloc.get(d.lib)
	if err != nil {
		return 0, err
	}
	var p uintptr
	return p, d.check(d.cuMemAlloc.name, f(&p, n))
}

func (d *driver) memFree(p uintptr) error {
	f, err := d.cuMemFree.get(d.lib)
	if err != nil {
		return err
	}
	return d.check(d.cuMemFree.name, f(p))
}

func (d *driver) memcpyHtoD(dst uintptr, src unsafe.Pointer, n uintptr, stream uintptr, async bool) error {
	if async {
		f, err := d.cuMemcpyHtoDAsync.get(d.lib)
		if err != nil {
			return err
		}
		return d.check(d.cuMemcpyHtoDAsync.name, f(dst, src, n, stream))
	}
	f, err := d.cuMemcpyHtoD.get(d.lib)
	if err != nil {
		return err
	}
	return d.check(d.cuMemcpyHtoD.name, f(dst, src, n))
}

func (d *driver) memcpyDtoH(dst unsafe.Pointer, src uintptr, n uintptr, stream uintptr, async bool) error {
	if async {
		f, err := d.cuMemcpyDtoHAsync.get(d.lib)
		if err != nil {
			return err
		}
		return d.check(d.cuMemcpyDtoHAsync.name, f(dst, src, n, stream))
	}
	f, err := d.cuMemcpyDtoH.get(d.lib)
	if err != nil {
		return err
	}
	return d.check(d.cuMemcpyDtoH.name, f(dst, src, n))
}

func (d *driver) memcpyDtoD(dst, src uintptr, n uintptr, stream uintptr, async bool) error {
	if async {
		f, err := d.cuMemcpyDtoDAsync.get(d.lib)
		if err != nil {
			return err
		}
		return d.check(d.cuMemcpyDtoDAsync.name, f(dst, src, n, stream))
	}
	f, err := d.cuMemcpyDtoD.get(d.lib)
	if err != nil {
		return err
	}
	return d.check(d.cuMemcpyDtoD.name, f(dst, src, n))
}

func (d *driver) memcpyPeerAsync(dst, dstCtx, src, srcCtx uintptr, n uintptr, stream uintptr) error {
	f, err := d.cuMemcpyPeerAsync.get(d.lib)
	if err != nil {
		return err
	}
	return d.check(d.cuMemcpyPeerAsync.name, f(dst, dstCtx, src, srcCtx, n, stream))
}

func (d *driver) memsetD8(dst uintptr, v uint8, n uintptr, stream uintptr, async bool) error {
	if async {
		f, err := d.cuMemsetD8Async.get(d.lib)
		if err != nil {
			return err
		}
		return d.check(d.cuMemsetD8Async.name, f(dst, v, n, stream))
	}
	f, err := d.cuMemsetD8.get(d.lib)
	if err != nil {
		return err
	}
	return d.check(d.cuMemsetD8.name, f(dst, v, n))
}

func (d *driver) memsetD32(dst uintptr, v uint32, n uintptr, stream uintptr, async bool) error {
	if async {
		f, err := d.cuMemsetD32Async.get(d.lib)
		if err != nil {
			return err
		}
		return d.check(d.cuMemsetD32Async.name, f(dst, v, n, stream))
	}
	f, err := d.cuMemsetD32.get(d.lib)
	if err != nil {
		return err
	}
	return d.check(d.cuMemsetD32.name, f(dst, v, n))
}

func (d *driver) memHostAlloc(n uintptr, flags uint32) (unsafe.Pointer, error) {
	f, err := d.cuMemHostAlloc.get(d.lib)
	if err != nil {
		return nil, err
	}
	var p unsafe.Pointer
	return p, d.check(d.cuMemHostAlloc.name, f(&p, n, flags))
}

func (d *driver) memFreeHost(p unsafe.Pointer) error {
	f, err := d.cuMemFreeHost.get(d.lib)
	if err != nil {
		return err
	}
	return d.check(d.cuMemFreeHost.name, f(p))
}
