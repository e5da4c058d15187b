package dlib

import (
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var errNotFound = errors.New("test library not found")

// missingError records what the library reports for a missing symbol.
type missingError struct{ symbol, library string }

func (e *missingError) Error() string { return "missing " + e.symbol + " in " + e.library }

func newTest(names ...string) *Library {
	return New(names, errNotFound, func(symbol, library string, err error) error {
		return &missingError{symbol, library}
	}, "test: cannot bind")
}

func TestOpenFails(t *testing.T) {
	l := newTest("libgdnkcp-none-1.so", "libgdnkcp-none-2.so")
	_, err := l.Open()
	require.ErrorIs(t, err, errNotFound)
	assert.Contains(t, err.Error(), "tried libgdnkcp-none-1.so, libgdnkcp-none-2.so")
	assert.Equal(t, "", l.Name())
	var p Proc[func() int32]
	_, perr := p.Get(l)
	require.ErrorIs(t, perr, errNotFound, "a Proc of a library that does not open")
}

// libc stands in for a library: the second name opens, a real function
// binds and runs, a missing one is reported through the library's callback
// (and the error is cached).
func TestBindWithLibc(t *testing.T) {
	l := newTest("libgdnkcp-none.so", "libc.so.6")
	if _, err := l.Open(); err != nil {
		t.Skipf("needs libc.so.6: %v", err)
	}
	assert.Equal(t, "libc.so.6", l.Name())

	getpid := Proc[func() int32]{Name: "getpid"}
	f, err := getpid.Get(l)
	require.NoError(t, err)
	assert.Equal(t, int32(os.Getpid()), f())

	missing := Proc[func() int32]{Name: "gdnkcp_no_such_function"}
	_, err = missing.Get(l)
	var me *missingError
	require.ErrorAs(t, err, &me)
	assert.Equal(t, missingError{"gdnkcp_no_such_function", "libc.so.6"}, *me)
	_, again := missing.Get(l)
	assert.Same(t, err, again, "the error is cached")

	var bad int // not a func: purego panics, Bind returns an error
	err = l.Bind(&bad, "getpid")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "test: cannot bind getpid")
}
