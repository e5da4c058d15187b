package archdetect

import (
	"testing"

	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/stretchr/testify/assert"
)

func TestParamSpecs(t *testing.T) {
	in := []ptx.Param{
		{Name: "x", Type: "u64", Size: 8, Align: 8, Offset: 0},
		{Name: "n", Type: "u32", Size: 4, Align: 4, Offset: 8},
		{Name: "cfg", Type: "b8", Size: 24, Align: 8, Offset: 16},
	}
	assert.Equal(t, []loader.ParamSpec{
		{Name: "x", Size: 8, Align: 8, Offset: 0},
		{Name: "n", Size: 4, Align: 4, Offset: 8},
		{Name: "cfg", Size: 24, Align: 8, Offset: 16},
	}, ParamSpecs(in))
	assert.Empty(t, ParamSpecs(nil))
}

func TestLoadArgumentErrors(t *testing.T) {
	p := &Profile{}
	_, err := Load(nil, ptx.Embedded(), p)
	assert.ErrorContains(t, err, "nil context")
	_, err = Load(&loader.Context{}, nil, p)
	assert.ErrorContains(t, err, "nil blob store")
	_, err = Load(&loader.Context{}, ptx.Embedded(), p)
	assert.ErrorContains(t, err, "profile has no blob")
}

func TestEmbeddedManifestReadable(t *testing.T) {
	m, err := ptx.Embedded().Manifest()
	if assert.NoError(t, err) {
		for _, b := range m.Blobs {
			assert.True(t, validSlot(b.Target), "embedded blob %s is a known slot", b.Target)
			_, err := blobBuild(&b)
			assert.NoError(t, err, "embedded blob %s says what it was built as", b.Target)
		}
	}
}
