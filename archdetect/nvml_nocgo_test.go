//go:build !cgo

package archdetect

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNVMLInfoNeedsCgo(t *testing.T) {
	devs, ver, err := NVMLInfo()
	assert.ErrorIs(t, err, ErrNVMLNeedsCgo)
	assert.Contains(t, err.Error(), "cgo")
	assert.Nil(t, devs)
	assert.Empty(t, ver)
}
