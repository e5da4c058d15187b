package cshared

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"
)

// A library builds and its function answers; a source that does not
// compile is an error naming the file and what cc said.
func TestBuild(t *testing.T) {
	dir := t.TempDir()
	so, err := Build(dir, "answer", "int answer(int x) { return 2 * x + 1; }\n")
	if errors.Is(err, ErrUnsupported) {
		t.Skipf("%v", err)
	}
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "libanswer.so"), so)
	h, err := purego.Dlopen(so, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	require.NoError(t, err)
	var answer func(int32) int32
	purego.RegisterLibFunc(&answer, h, "answer")
	require.Equal(t, int32(43), answer(21))

	_, err = Build(dir, "broken", "int broken( { return; }\n")
	require.ErrorContains(t, err, "cshared: build "+filepath.Join(dir, "broken.c"))
	_, err = os.Stat(filepath.Join(dir, "libbroken.so"))
	require.True(t, os.IsNotExist(err), "no library from a failed build")
}
