package archdetect

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/ptx"
)

// Kernels is a profile's blob loaded into a context.
type Kernels struct {
	profile *Profile
	blob    *ptx.Blob
	mod     *loader.Module

	mu  sync.Mutex
	fns map[string]*loader.Function
}

// Load reads the profile's blob from store (sha256 checked), loads it into
// ctx, and checks that the device is the profile's and can run the blob.
func Load(ctx *loader.Context, store *ptx.Store, p *Profile) (*Kernels, error) {
	switch {
	case ctx == nil:
		return nil, errors.New("archdetect: Load: nil context")
	case store == nil:
		return nil, errors.New("archdetect: Load: nil blob store")
	case p == nil || p.Blob == nil:
		return nil, errors.New("archdetect: Load: profile has no blob")
	}
	b := p.Blob
	dev := ctx.Device()
	if dev.Ordinal != p.Ordinal {
		return nil, fmt.Errorf("archdetect: Load: profile is for device %d, context is device %d", p.Ordinal, dev.Ordinal)
	}
	major, minor, err := dev.ComputeCapability()
	if err != nil {
		return nil, fmt.Errorf("archdetect: Load: %w", err)
	}
	bb, err := blobBuild(b)
	if err != nil {
		return nil, err
	}
	if cc := (CC{major, minor}); !bb.runs(cc) {
		return nil, fmt.Errorf("archdetect: blob %s cannot run on device %d (compute capability %s): %s", b.Target, dev.Ordinal, cc, bb.rule())
	}
	raw, err := store.Load(b)
	if err != nil {
		return nil, fmt.Errorf("archdetect: %w", err)
	}
	mod, err := loader.LoadModule(ctx, raw)
	if err != nil {
		return nil, fmt.Errorf("archdetect: load blob %s (%s) on device %d: %w", b.Target, b.File, dev.Ordinal, err)
	}
	if want := imageKind(b.Kind); mod.Kind() != want {
		err := fmt.Errorf("archdetect: blob %s (%s): the manifest says %s, the file is %s", b.Target, b.File, b.Kind, mod.Kind())
		return nil, errors.Join(err, mod.Close())
	}
	return &Kernels{profile: p, blob: b, mod: mod, fns: map[string]*loader.Function{}}, nil
}

func imageKind(kind string) loader.ImageKind {
	if kind == ptx.KindPTX {
		return loader.ImagePTX
	}
	return loader.ImageCubin
}

// Profile returns the profile the kernels were loaded for.
func (k *Kernels) Profile() *Profile { return k.profile }

// Blob returns the manifest entry of the loaded blob.
func (k *Kernels) Blob() *ptx.Blob { return k.blob }

// Module returns the loaded module.
func (k *Kernels) Module() *loader.Module { return k.mod }

// Function returns the named kernel with its signature set from the
// manifest, so that loader.Launch checks every launch's arguments.
func (k *Kernels) Function(name string) (*loader.Function, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if fn, ok := k.fns[name]; ok {
		return fn, nil
	}
	e, ok := k.blob.Entry(name)
	if !ok {
		names := make([]string, len(k.blob.Entries))
		for i, e := range k.blob.Entries {
			names[i] = e.Name
		}
		return nil, fmt.Errorf("archdetect: kernel %q is not in blob %s (entries: %s)", name, k.blob.Target, strings.Join(names, ", "))
	}
	fn, err := k.mod.Function(name)
	if err != nil {
		return nil, fmt.Errorf("archdetect: blob %s: %w", k.blob.Target, err)
	}
	if err := fn.SetSignature(ParamSpecs(e.Params)); err != nil {
		return nil, fmt.Errorf("archdetect: blob %s: manifest parameters: %w", k.blob.Target, err)
	}
	k.fns[name] = fn
	return fn, nil
}

// Close unloads the module.
func (k *Kernels) Close() error { return k.mod.Close() }

// ParamSpecs converts manifest parameters to loader's signature form.
func ParamSpecs(params []ptx.Param) []loader.ParamSpec {
	out := make([]loader.ParamSpec, len(params))
	for i, p := range params {
		out[i] = loader.ParamSpec{Name: p.Name, Size: p.Size, Align: p.Align, Offset: p.Offset}
	}
	return out
}
