package npy

import (
	"testing"

	"github.com/gdnkcp/gdnkcp/internal/niltest"
)

// TestNilNoPanic: every exported method of a nil pointer of the package's
// types answers with zero values or an error, never a panic.
func TestNilNoPanic(t *testing.T) {
	niltest.NoPanics(t, (*Array)(nil))
}
