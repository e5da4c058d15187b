// Package dlib opens a shared library at run time and binds its functions on
// first use, through purego (no cgo, no headers): the part the CUDA driver
// bindings (loader) and the NCCL bindings (comm) share. Each package keeps
// its own errors: a Library is told what a failed open wraps and how to
// describe a missing symbol.
package dlib

import (
	"fmt"
	"strings"
	"sync"

	"github.com/ebitengine/purego"
)

// Library is a shared library opened on first use from the first of its
// names that dlopen accepts (RTLD_NOW | RTLD_GLOBAL). It is safe for
// concurrent use.
type Library struct {
	names    []string
	notFound error
	missing  func(symbol, library string, err error) error
	prefix   string

	once   sync.Once
	handle uintptr
	name   string
	err    error
}

// New describes a library tried under names, in order. A failed open returns
// an error wrapping notFound that names every name tried and what dlopen
// said; a missing symbol, missing(symbol, the library opened, dlsym's error);
// a function purego cannot bind, an error starting with prefix.
func New(names []string, notFound error, missing func(symbol, library string, err error) error, prefix string) *Library {
	return &Library{names: names, notFound: notFound, missing: missing, prefix: prefix}
}

// Open returns the library's handle, opening it on the first call.
func (l *Library) Open() (uintptr, error) {
	l.once.Do(func() {
		var msgs []string
		for _, n := range l.names {
			h, err := purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_GLOBAL)
			if err == nil {
				l.handle, l.name = h, n
				return
			}
			msgs = append(msgs, err.Error())
		}
		l.err = fmt.Errorf("%w (tried %s): %s", l.notFound, strings.Join(l.names, ", "), strings.Join(msgs, "; "))
	})
	return l.handle, l.err
}

// Name returns the name the library was opened under ("" before a
// successful Open).
func (l *Library) Name() string {
	if _, err := l.Open(); err != nil {
		return ""
	}
	return l.name
}

// Bind resolves symbol in the library (opening it if need be) and binds it to
// *fptr, a Go func variable of the C function's signature.
func (l *Library) Bind(fptr any, symbol string) error {
	h, err := l.Open()
	if err != nil {
		return err
	}
	addr, err := purego.Dlsym(h, symbol)
	if err != nil {
		return l.missing(symbol, l.name, err)
	}
	return register(fptr, addr, l.prefix, symbol)
}

// register wraps purego.RegisterFunc, turning its panics (an unsupported
// signature, a nil address) into errors.
func register(fptr any, addr uintptr, prefix, symbol string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s %s: %v", prefix, symbol, r)
		}
	}()
	purego.RegisterFunc(fptr, addr)
	return nil
}

// Proc is one function of a Library, resolved and bound on its first Get and
// then cached (its error too). F is the Go signature purego calls it with.
type Proc[F any] struct {
	Name string // the C symbol

	once sync.Once
	fn   F
	err  error
}

// Get returns the function, binding it from l on the first call, or why it
// cannot: the library's open error, its missing-symbol error, or a binding
// error.
func (p *Proc[F]) Get(l *Library) (F, error) {
	p.once.Do(func() { p.err = l.Bind(&p.fn, p.Name) })
	return p.fn, p.err
}
