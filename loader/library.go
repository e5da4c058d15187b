package loader

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/gdnkcp/gdnkcp/internal/dlib"
)

// ErrNoDriver is returned (wrapped) by every call when the CUDA driver
// library cannot be opened. Test for it with errors.Is.
var ErrNoDriver = errors.New("loader: CUDA driver library not found")

// ErrMissingSymbol is matched by errors.Is for a *SymbolError.
var ErrMissingSymbol = errors.New("loader: driver symbol not found")

// defaultLibraryNames are the names tried, in order, to open the driver.
var defaultLibraryNames = []string{"libcuda.so.1", "libcuda.so"}

// EnvLibrary names the CUDA driver library to open in place of libcuda.so.1
// and libcuda.so: a path, or a name dlopen resolves. It is read once, when
// the package initialises. The tests point it at a stand-in driver
// (internal/fakecuda) to fail device calls on machines without a GPU.
const EnvLibrary = "GDNKCP_CUDA_LIBRARY"

// libraryNames is what the driver is opened under: EnvLibrary's value where
// it is set, else defaultLibraryNames.
func libraryNames() []string {
	if v := os.Getenv(EnvLibrary); v != "" {
		return []string{v}
	}
	return defaultLibraryNames
}

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

// library is the dlopen'ed driver (internal/dlib): opened once, on first
// use; a missing symbol is a *SymbolError carrying the driver's version.
type library struct {
	*dlib.Library

	versionOnce sync.Once
	version     int
	versionErr  error
}

func newLibrary(names []string) *library {
	l := &library{}
	l.Library = dlib.New(names, ErrNoDriver, func(symbol, name string, err error) error {
		se := &SymbolError{Name: symbol, Library: name, Err: err}
		if symbol != "cuDriverGetVersion" { // its own lookup must not ask for itself
			se.DriverVersion, _ = l.driverVersion()
		}
		return se
	}, "loader: cannot bind driver function")
	return l
}

// driverVersion calls cuDriverGetVersion, which needs no cuInit, so that a
// SymbolError for any other function can carry the version.
func (l *library) driverVersion() (int, error) {
	l.versionOnce.Do(func() {
		var fn func(*int32) ErrorCode
		if err := l.Bind(&fn, "cuDriverGetVersion"); err != nil {
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

// proc is one driver function, resolved on first use and then cached
// (dlib.Proc: Name is the symbol, Get binds it from a library). F is the Go
// signature purego calls it with.
type proc[F any] = dlib.Proc[F]
