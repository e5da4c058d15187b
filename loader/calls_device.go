package loader

// Result layer for devices and contexts: each method resolves its driver
// function, calls it and turns the CUresult into an error. None of them
// binds a context; the safe layer does that.

func (d *driver) deviceCount() (int, error) {
	f, err := d.cuDeviceGetCount.Get(d.lib.Library)
	if err != nil {
		return 0, err
	}
	var n int32
	return int(n), d.check(d.cuDeviceGetCount.Name, f(&n))
}

func (d *driver) deviceGet(ordinal int) (int32, error) {
	f, err := d.cuDeviceGet.Get(d.lib.Library)
	if err != nil {
		return 0, err
	}
	var dev int32
	return dev, d.check(d.cuDeviceGet.Name, f(&dev, int32(ordinal)))
}

func (d *driver) deviceName(dev int32) (string, error) {
	f, err := d.cuDeviceGetName.Get(d.lib.Library)
	if err != nil {
		return "", err
	}
	buf := make([]byte, 256)
	if err := d.check(d.cuDeviceGetName.Name, f(&buf[0], int32(len(buf)), dev)); err != nil {
		return "", err
	}
	for i, c := range buf {
		if c == 0 {
			return string(buf[:i]), nil
		}
	}
	return string(buf), nil
}

func (d *driver) deviceAttribute(attr DeviceAttribute, dev int32) (int, error) {
	f, err := d.cuDeviceGetAttribute.Get(d.lib.Library)
	if err != nil {
		return 0, err
	}
	var v int32
	return int(v), d.check(d.cuDeviceGetAttribute.Name, f(&v, int32(attr), dev))
}

func (d *driver) deviceTotalMem(dev int32) (uint64, error) {
	f, err := d.cuDeviceTotalMem.Get(d.lib.Library)
	if err != nil {
		return 0, err
	}
	var n uintptr
	return uint64(n), d.check(d.cuDeviceTotalMem.Name, f(&n, dev))
}

func (d *driver) deviceCanAccessPeer(dev, peer int32) (bool, error) {
	f, err := d.cuDeviceCanAccessPeer.Get(d.lib.Library)
	if err != nil {
		return false, err
	}
	var can int32
	return can != 0, d.check(d.cuDeviceCanAccessPeer.Name, f(&can, dev, peer))
}

func (d *driver) primaryCtxRetain(dev int32) (uintptr, error) {
	f, err := d.cuDevicePrimaryCtxRetain.Get(d.lib.Library)
	if err != nil {
		return 0, err
	}
	var ctx uintptr
	return ctx, d.check(d.cuDevicePrimaryCtxRetain.Name, f(&ctx, dev))
}

func (d *driver) primaryCtxRelease(dev int32) error {
	f, err := d.cuDevicePrimaryCtxRelease.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuDevicePrimaryCtxRelease.Name, f(dev))
}

func (d *driver) ctxGetCurrent() (uintptr, error) {
	f, err := d.cuCtxGetCurrent.Get(d.lib.Library)
	if err != nil {
		return 0, err
	}
	var ctx uintptr
	return ctx, d.check(d.cuCtxGetCurrent.Name, f(&ctx))
}

func (d *driver) ctxSetCurrent(ctx uintptr) error {
	f, err := d.cuCtxSetCurrent.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuCtxSetCurrent.Name, f(ctx))
}

func (d *driver) ctxSynchronize() error {
	f, err := d.cuCtxSynchronize.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuCtxSynchronize.Name, f())
}

func (d *driver) ctxEnablePeerAccess(peer uintptr) error {
	f, err := d.cuCtxEnablePeerAccess.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuCtxEnablePeerAccess.Name, f(peer, 0))
}
