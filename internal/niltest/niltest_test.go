package niltest

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

type safe struct{ n int }

func (s *safe) N() int {
	if s == nil {
		return 0
	}
	return s.n
}

func (s *safe) Err(int) error {
	if s == nil {
		return errors.New("nil")
	}
	return nil
}

type unsafe struct{ n int }

func (u *unsafe) N() int { return u.n }

func TestPanics(t *testing.T) {
	bad, err := Panics((*safe)(nil))
	require.NoError(t, err)
	require.Empty(t, bad, "nil-safe methods")
	bad, err = Panics((*safe)(nil), (*unsafe)(nil))
	require.NoError(t, err)
	require.Len(t, bad, 1)
	require.Contains(t, bad[0], "*niltest.unsafe.N: runtime error: invalid memory address or nil pointer dereference")
	for _, v := range []any{safe{}, &safe{}, nil} {
		_, err = Panics(v)
		require.ErrorContains(t, err, "is not a typed nil pointer")
	}
	NoPanics(t, (*safe)(nil))
}
