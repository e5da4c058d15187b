package loader

import "unsafe"

// Result layer for memory. Host pointers are unsafe.Pointer so that purego
// keeps the Go memory alive for the call.

func (d *driver) memGetInfo() (free, total uint64, err error) {
	f, err := d.cuMemGetInfo.Get(d.lib.Library)
	if err != nil {
		return 0, 0, err
	}
	var fr, tot uintptr
	err = d.check(d.cuMemGetInfo.Name, f(&fr, &tot))
	return uint64(fr), uint64(tot), err
}

func (d *driver) memAlloc(n uintptr) (uintptr, error) {
	f, err := d.cuMemAlloc.Get(d.lib.Library)
	if err != nil {
		return 0, err
	}
	var p uintptr
	return p, d.check(d.cuMemAlloc.Name, f(&p, n))
}

func (d *driver) memFree(p uintptr) error {
	f, err := d.cuMemFree.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuMemFree.Name, f(p))
}

func (d *driver) memcpyHtoD(dst uintptr, src unsafe.Pointer, n uintptr, stream uintptr, async bool) error {
	if async {
		f, err := d.cuMemcpyHtoDAsync.Get(d.lib.Library)
		if err != nil {
			return err
		}
		return d.check(d.cuMemcpyHtoDAsync.Name, f(dst, src, n, stream))
	}
	f, err := d.cuMemcpyHtoD.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuMemcpyHtoD.Name, f(dst, src, n))
}

func (d *driver) memcpyDtoH(dst unsafe.Pointer, src uintptr, n uintptr, stream uintptr, async bool) error {
	if async {
		f, err := d.cuMemcpyDtoHAsync.Get(d.lib.Library)
		if err != nil {
			return err
		}
		return d.check(d.cuMemcpyDtoHAsync.Name, f(dst, src, n, stream))
	}
	f, err := d.cuMemcpyDtoH.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuMemcpyDtoH.Name, f(dst, src, n))
}

func (d *driver) memcpyDtoD(dst, src uintptr, n uintptr, stream uintptr, async bool) error {
	if async {
		f, err := d.cuMemcpyDtoDAsync.Get(d.lib.Library)
		if err != nil {
			return err
		}
		return d.check(d.cuMemcpyDtoDAsync.Name, f(dst, src, n, stream))
	}
	f, err := d.cuMemcpyDtoD.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuMemcpyDtoD.Name, f(dst, src, n))
}

func (d *driver) memcpyPeerAsync(dst, dstCtx, src, srcCtx uintptr, n uintptr, stream uintptr) error {
	f, err := d.cuMemcpyPeerAsync.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuMemcpyPeerAsync.Name, f(dst, dstCtx, src, srcCtx, n, stream))
}

func (d *driver) memsetD8(dst uintptr, v uint8, n uintptr, stream uintptr, async bool) error {
	if async {
		f, err := d.cuMemsetD8Async.Get(d.lib.Library)
		if err != nil {
			return err
		}
		return d.check(d.cuMemsetD8Async.Name, f(dst, v, n, stream))
	}
	f, err := d.cuMemsetD8.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuMemsetD8.Name, f(dst, v, n))
}

func (d *driver) memsetD32(dst uintptr, v uint32, n uintptr, stream uintptr, async bool) error {
	if async {
		f, err := d.cuMemsetD32Async.Get(d.lib.Library)
		if err != nil {
			return err
		}
		return d.check(d.cuMemsetD32Async.Name, f(dst, v, n, stream))
	}
	f, err := d.cuMemsetD32.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuMemsetD32.Name, f(dst, v, n))
}

func (d *driver) memHostAlloc(n uintptr, flags uint32) (unsafe.Pointer, error) {
	f, err := d.cuMemHostAlloc.Get(d.lib.Library)
	if err != nil {
		return nil, err
	}
	var p unsafe.Pointer
	return p, d.check(d.cuMemHostAlloc.Name, f(&p, n, flags))
}

func (d *driver) memFreeHost(p unsafe.Pointer) error {
	f, err := d.cuMemFreeHost.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuMemFreeHost.Name, f(p))
}
