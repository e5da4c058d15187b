package loader

import "unsafe"

func anyPtr[T any](p *T) unsafe.Pointer { return unsafe.Pointer(p) }
