// Package cshared compiles one C source file into a shared library with the
// system's cc, for the stand-in libraries the tests load with dlopen
// (internal/fakecuda, internal/fakenccl).
package cshared

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// ErrUnsupported is returned by Build where no library can be built: no C
// compiler (cc), or another platform than linux/amd64 and linux/arm64.
var ErrUnsupported = errors.New("cshared: cannot build a C shared library here")

// Build writes source to dir/name.c, compiles it (-O1, -pthread) into
// dir/libname.so and returns that path.
func Build(dir, name, source string) (string, error) {
	if runtime.GOOS != "linux" || (runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64") {
		return "", fmt.Errorf("%w: %s/%s", ErrUnsupported, runtime.GOOS, runtime.GOARCH)
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	src := filepath.Join(dir, name+".c")
	so := filepath.Join(dir, "lib"+name+".so")
	if err := os.WriteFile(src, []byte(source), 0o644); err != nil {
		return "", fmt.Errorf("cshared: %w", err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-pthread", "-o", so, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("cshared: build %s: %v\n%s", src, err, out)
	}
	return so, nil
}
