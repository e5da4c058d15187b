package archdetect

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gdnkcp/gdnkcp/ptx"
)

// Profile is one device and what gdnkcp loads on it.
type Profile struct {
	Ordinal     int    // CUDA device ordinal (0 from ProfileFor)
	Name        string // e.g. "NVIDIA H200"
	Arch        string // e.g. "Hopper"; "unknown" off the table
	Major       int
	Minor       int
	SMs         int
	MemBytes    uint64 // device memory (Detect only)
	SharedOptin int    // opt-in shared memory per block, bytes (Detect only)

	Blob    *ptx.Blob // the manifest entry chosen
	Target  string    // Blob.Target, e.g. "sm_90a" or "compute_80"
	Reason  string    // why this blob, in words
	Variant string    // width-rule variant: sm_90a, sm_100a, sm_103a, sm_107a, generic
	Forced  bool      // the blob was forced by an override
}

// CC returns the profile's compute capability.
func (p *Profile) CC() CC {
	if p == nil {
		return CC{}
	}
	return CC{p.Major, p.Minor}
}

// String summarises the profile on one line.
func (p *Profile) String() string {
	if p == nil {
		return "no GPU profile"
	}
	return fmt.Sprintf("GPU %d: %s (CC %d.%d, %s, %d SMs): blob %s, variant %s — %s",
		p.Ordinal, p.Name, p.Major, p.Minor, p.Arch, p.SMs, p.Target, p.Variant, p.Reason)
}

// ProfileFor decides, without a GPU, what to load on a device of the given
// compute capability, SM count and name from manifest m. A non-empty
// override forces that blob slot; it must be a known slot, in the manifest,
// and loadable on the device.
func ProfileFor(cc CC, sms int, name string, m *ptx.Manifest, override string) (*Profile, error) {
	return profileFor(cc, sms, name, m, override, "override")
}

// profileFor is ProfileFor with the override's source named in the reason.
func profileFor(cc CC, sms int, name string, m *ptx.Manifest, override, source string) (*Profile, error) {
	if m == nil {
		return nil, errors.New("archdetect: no manifest")
	}
	row := rowFor(cc)
	p := &Profile{Name: name, Arch: row.Arch, Major: cc.Major, Minor: cc.Minor, SMs: sms, Variant: row.Variant}
	device := fmt.Sprintf("%s (compute capability %s)", name, cc)

	choose := func(b *ptx.Blob, reason string) (*Profile, error) {
		p.Blob, p.Target, p.Reason = b, b.Target, reason
		return p, nil
	}

	if override != "" {
		if !validSlot(override) {
			return nil, fmt.Errorf("archdetect: unknown blob %q forced by %s; valid blobs: %s", override, source, strings.Join(Slots, ", "))
		}
		b, ok := m.Blob(override)
		if !ok {
			return nil, fmt.Errorf("archdetect: blob %s forced by %s is not in the manifest (it has: %s)", override, source, manifestTargets(m))
		}
		bb, err := blobBuild(b)
		if err != nil {
			return nil, err
		}
		if !bb.runs(cc) {
			return nil, fmt.Errorf("archdetect: blob %s forced by %s cannot run on %s: %s", override, source, device, bb.rule())
		}
		p.Forced = true
		return choose(b, fmt.Sprintf("forced by %s: %s built as %s for compute capability %s", source, describe(b), bb.name, cc))
	}

	if cc.Less(MinCC) {
		return nil, fmt.Errorf("archdetect: no blob can run on %s: gdnkcp needs compute capability %s or newer", device, MinCC)
	}
	var missing []string
	if row.Exact != "" {
		if b, ok := runnable(m, row.Exact, cc); ok {
			return choose(b, fmt.Sprintf("exact cubin %s for compute capability %s", b.Target, cc))
		}
		missing = append(missing, "exact cubin "+row.Exact)
	}
	if row.Family != "" {
		if b, ok := runnable(m, row.Family, cc); ok {
			bb, _ := blobBuild(b)
			r := fmt.Sprintf("family cubin %s (built as %s) for compute capability %s", b.Target, bb.name, cc)
			if len(missing) > 0 {
				r += "; the manifest lacks the " + strings.Join(missing, ", ")
			}
			return choose(b, r)
		}
		missing = append(missing, "family cubin "+row.Family)
	}
	if b, ok := runnable(m, SlotCompute80, cc); ok {
		r := fmt.Sprintf("PTX fallback %s (JIT-compiled at load) for compute capability %s", b.Target, cc)
		if len(missing) > 0 {
			r += ": the manifest lacks the " + strings.Join(missing, " and the ")
		} else {
			r += ": no cubin is built for it"
		}
		return choose(b, r)
	}
	missing = append(missing, "PTX fallback "+SlotCompute80)
	return nil, fmt.Errorf("archdetect: no blob for %s: the manifest lacks the %s (it has: %s)",
		device, strings.Join(missing, ", the "), manifestTargets(m))
}

// runnable returns the manifest's blob for slot when the device can load it.
func runnable(m *ptx.Manifest, slot string, cc CC) (*ptx.Blob, bool) {
	b, ok := m.Blob(slot)
	if !ok {
		return nil, false
	}
	bb, err := blobBuild(b)
	if err != nil || !bb.runs(cc) {
		return nil, false
	}
	return b, true
}

func describe(b *ptx.Blob) string {
	if b.Kind == ptx.KindPTX {
		return b.Target + " PTX"
	}
	return b.Target + " " + b.Kind
}

func manifestTargets(m *ptx.Manifest) string {
	if len(m.Blobs) == 0 {
		return "no blobs"
	}
	t := make([]string, len(m.Blobs))
	for i, b := range m.Blobs {
		t[i] = b.Target
	}
	return strings.Join(t, ", ")
}
