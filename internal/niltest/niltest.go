// Package niltest checks, for tests, that the methods of nil pointers answer
// with zero values or errors instead of panicking.
package niltest

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// Panics calls every exported method of each of values (typed nil pointers,
// e.g. (*loader.Buffer)(nil)) with zero-valued arguments and returns
// "Type.Method: panic value" for each that panics; an error where a value is
// not a typed nil pointer.
func Panics(values ...any) ([]string, error) {
	var bad []string
	for _, v := range values {
		rv := reflect.ValueOf(v)
		if rv.Kind() != reflect.Pointer || !rv.IsNil() {
			return nil, fmt.Errorf("niltest: %T is not a typed nil pointer", v)
		}
		for i := range rv.NumMethod() {
			mt := rv.Method(i).Type()
			args := make([]reflect.Value, mt.NumIn())
			for j := range args {
				args[j] = reflect.Zero(mt.In(j))
			}
			func() {
				defer func() {
					if p := recover(); p != nil {
						bad = append(bad, fmt.Sprintf("%T.%s: %v", v, rv.Type().Method(i).Name, p))
					}
				}()
				rv.Method(i).Call(args)
			}()
		}
	}
	return bad, nil
}

// NoPanics fails t where Panics finds a method that panics, naming each.
func NoPanics(t testing.TB, values ...any) {
	t.Helper()
	bad, err := Panics(values...)
	require.NoError(t, err)
	require.Empty(t, bad, "methods of nil pointers that panic")
}
