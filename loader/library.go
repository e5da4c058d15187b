package loader

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/ebitengine/purego"
)

// ErrNoDriver is returned (wrapped) by every call when the CUDA driver
// library cannot be opened. Test for it with errors.Is.
var ErrNoDriver = errors.New("loader: CUDA driver library not found")

// ErrMissingSymbol is matched by errors.Is for a *SymbolError.
var ErrMissingSymbol = errors.New("loader: driver symbol not found")

// defaultLibraryNames are the names tried, in order, to open the driver.
var defaultLibraryNames = []string{"libcuda.so.1", "libcuda.so"}

// SymbolError says that the opened driver library lacks a function,
// typically because the driver is older than the function.
type SymbolError struct {
	Name          string // the driver function, e.g. "cuEventElapsedTime_v2"
	Library       string // the library searched
	DriverVersion int    // cuDriverGetVersion, e.g. 13000; 0 when unknown
	Err           error  // what dlsym said
}

// Error names the function, the library and the driver version.
func (e *SymbolError) Error() string {
	return fmt.Sprintf("loader: symbol %s not found in %s (driver version %s): %v",
		e.Name, e.Library, versionString(e.DriverVersion), e.Err)
}

// Is makes errors.Is(err, ErrMissingSymbol) true.
func (e *SymbolError) Is(target error) bool { return target == ErrMissingSymbol }

// Unwrap returns dlsym's error.
func (e *SymbolError) Unwrap() error { return e.Err }

// versionString renders a cuDriverGetVersion value: 13000 -> "13000 (CUDA 13.0)".
func versionString(v int) string {
	if v <= 0 {
		return "unknown"
	}
	return fmt.Sprintf("%d (CUDA %d.%d)", v, v/1000, v%1000/10)
}

// library is the dlopen'ed driver. It opens once, on first use.
type library struct {
	names []string

	openOnce sync.Once
	handle   uintptr
	name     string
	openErr  error

	versionOnce sync.Once
	version     int
	versionErr  error
}

func newLibrary(names []string) *library {
	return &library{names: names}
}

// open returns the library handle, opening it on the first call.
func (l *library) open() (uintptr, error) {
	l.openOnce.Do(func() {
		var msgs []string
		for _, n := range l.names {
			h, err := purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_GLOBAL)
			if err == nil {
				l.handle, l.name = h, n
				return
			}
			msgs = append(msgs, err.Error())
		}
		l.openErr = fmt.Errorf("%w (tried %s): %s", ErrNoDriver, strings.Join(l.names, ", "), strings.Join(msgs, "; "))
	})
	return l.handle, l.openErr
}

// driverVersion calls cuDriverGetVersion, which needs no cuInit. It resolves
// the symbol itself so that a SymbolError for any other function can carry it.
func (l *library) driverVersion() (int, error) {
	l.versionOnce.Do(func() {
		h, err := l.open()
		if err != nil {
			l.versionErr = err
			return
		}
		addr, err := purego.Dlsym(h, "cuDriverGetVersion")
		if err != nil {
			l.versionErr = &SymbolError{Name: "cuDriverGetVersion", Library: l.name, Err: err}
			return
		}
		var fn func(*int32) ErrorCode
		if err := register(&fn, addr); err != nil {
			l.versionErr = err
			return
		}
		var v int32
		if rc := fn(&v); rc != Success {
			l.versionErr = &Error{Call: "cuDriverGetVersion", Code: rc, Name: rc.fallbackName()}
			return
		}
		l.version = int(v)
	})
	return l.version, l.versionErr
}

// register wraps purego.RegisterFunc, turning its panics (an unsupported
// signature, a nil address) into errors.
func register(fptr any, addr uintptr) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("loader: cannot bind driver function: %v", r)
		}
	}()
	purego.RegisterFunc(fptr, addr)
	return nil
}

// proc is one driver function, resolved on first use and then cached. F is
// the Go signature purego calls it with.
type proc[F any] struct {
	name string
	once sync.Once
	fn   F
	err  error
}

// get resolves the function in l (once) and returns it, or the reason it is
// not there: ErrNoDriver when the library cannot be opened, a *SymbolError
// when the symbol is missing.
func (p *proc[F]) get(l *library) (F, error) {
	p.once.Do(func() {
		h, err := l.open()
		if err != nil {
			p.err = err
			return
		}
		addr, err := purego.Dlsym(h, p.name)
		if err != nil {
			v, _ := l.driverVersion()
			p.err = &SymbolError{Name: p.name, Library: l.name, DriverVersion: v, Err: err}
			return
		}
		if err := register(&p.fn, addr); err != nil {
			p.err = fmt.Errorf("%s: %w", p.name, err)
		}
	})
	return p.fn, p.err
}
