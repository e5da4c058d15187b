package loader

import "errors"

// Result layer for streams and events.

func (d *driver) streamCreate(flags uint32) (uintptr, error) {
	f, err := d.cuStreamCreate.Get(d.lib.Library)
	if err != nil {
		return 0, err
	}
	var s uintptr
	return s, d.check(d.cuStreamCreate.Name, f(&s, flags))
}

func (d *driver) streamCreateWithPriority(flags uint32, priority int32) (uintptr, error) {
	f, err := d.cuStreamCreatePrio.Get(d.lib.Library)
	if err != nil {
		return 0, err
	}
	var s uintptr
	return s, d.check(d.cuStreamCreatePrio.Name, f(&s, flags, priority))
}

// streamPriorities returns the current context's stream priority range.
func (d *driver) streamPriorities() (least, greatest int32, err error) {
	f, err := d.cuCtxStreamPrios.Get(d.lib.Library)
	if err != nil {
		return 0, 0, err
	}
	return least, greatest, d.check(d.cuCtxStreamPrios.Name, f(&least, &greatest))
}

func (d *driver) streamDestroy(s uintptr) error {
	f, err := d.cuStreamDestroy.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuStreamDestroy.Name, f(s))
}

func (d *driver) streamSynchronize(s uintptr) error {
	f, err := d.cuStreamSynchronize.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuStreamSynchronize.Name, f(s))
}

// streamQuery reports whether all work on s has completed.
func (d *driver) streamQuery(s uintptr) (bool, error) {
	f, err := d.cuStreamQuery.Get(d.lib.Library)
	if err != nil {
		return false, err
	}
	switch rc := f(s); rc {
	case Success:
		return true, nil
	case ErrorNotReady:
		return false, nil
	default:
		return false, d.newError(d.cuStreamQuery.Name, rc)
	}
}

func (d *driver) streamWaitEvent(s, ev uintptr) error {
	f, err := d.cuStreamWaitEvent.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuStreamWaitEvent.Name, f(s, ev, 0))
}

func (d *driver) eventCreate(flags uint32) (uintptr, error) {
	f, err := d.cuEventCreate.Get(d.lib.Library)
	if err != nil {
		return 0, err
	}
	var ev uintptr
	return ev, d.check(d.cuEventCreate.Name, f(&ev, flags))
}

func (d *driver) eventRecord(ev, s uintptr) error {
	f, err := d.cuEventRecord.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuEventRecord.Name, f(ev, s))
}

func (d *driver) eventSynchronize(ev uintptr) error {
	f, err := d.cuEventSynchronize.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuEventSynchronize.Name, f(ev))
}

// eventQuery reports whether the work captured by ev has completed.
func (d *driver) eventQuery(ev uintptr) (bool, error) {
	f, err := d.cuEventQuery.Get(d.lib.Library)
	if err != nil {
		return false, err
	}
	switch rc := f(ev); rc {
	case Success:
		return true, nil
	case ErrorNotReady:
		return false, nil
	default:
		return false, d.newError(d.cuEventQuery.Name, rc)
	}
}

func (d *driver) eventDestroy(ev uintptr) error {
	f, err := d.cuEventDestroy.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuEventDestroy.Name, f(ev))
}

// eventElapsed uses cuEventElapsedTime_v2 (CUDA >= 12.8, the only name in
// CUDA 13 headers) and falls back to cuEventElapsedTime on older drivers.
func (d *driver) eventElapsed(start, end uintptr) (float32, error) {
	p := &d.cuEventElapsedTimeV2
	f, err := p.Get(d.lib.Library)
	if errors.Is(err, ErrMissingSymbol) {
		p = &d.cuEventElapsedTimeV1
		f, err = p.Get(d.lib.Library)
	}
	if err != nil {
		return 0, err
	}
	var ms float32
	return ms, d.check(p.Name, f(&ms, start, end))
}
