package blobcheck

import (
	"fmt"
	"strconv"
	"strings"
)

// Arch is a parsed architecture name such as sm_90a, sm_100f or compute_80.
type Arch struct {
	Virtual bool // compute_XY (PTX) rather than sm_XY (SASS)
	Number  int  // 80, 90, 100, 103, ...
	Suffix  byte // 0, 'a' (arch-specific) or 'f' (family-specific)
}

// ParseArch parses sm_NN, sm_NNa, sm_NNf and the compute_ forms.
func ParseArch(s string) (Arch, error) {
	var a Arch
	rest, ok := strings.CutPrefix(s, "sm_")
	if !ok {
		rest, ok = strings.CutPrefix(s, "compute_")
		if !ok {
			return a, fmt.Errorf("architecture %q: want sm_NN[a|f] or compute_NN[a|f]", s)
		}
		a.Virtual = true
	}
	if n := len(rest); n > 0 && (rest[n-1] == 'a' || rest[n-1] == 'f') {
		a.Suffix = rest[n-1]
		rest = rest[:n-1]
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 10 || n > 999 || rest[0] == '0' || rest[0] == '+' {
		return Arch{}, fmt.Errorf("architecture %q: want sm_NN[a|f] or compute_NN[a|f]", s)
	}
	a.Number = n
	return a, nil
}

// String is the canonical name.
func (a Arch) String() string {
	p := "sm_"
	if a.Virtual {
		p = "compute_"
	}
	s := p + strconv.Itoa(a.Number)
	if a.Suffix != 0 {
		s += string(a.Suffix)
	}
	return s
}

// Major is the compute capability major: 9 for sm_90, 10 for sm_103.
func (a Arch) Major() int { return a.Number / 10 }

// Minor is the compute capability minor: 0 for sm_90, 3 for sm_103.
func (a Arch) Minor() int { return a.Number % 10 }

// PTXTarget is what nvcc writes in a PTX file's .target for this
// architecture: compute_80 is written .target sm_80.
func (a Arch) PTXTarget() string {
	b := a
	b.Virtual = false
	return b.String()
}

// Version is a PTX ISA version such as 9.0.
type Version struct{ Major, Minor int }

// String formats the version as X.Y.
func (v Version) String() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// Less reports whether v is an older ISA than w.
func (v Version) Less(w Version) bool {
	return v.Major < w.Major || (v.Major == w.Major && v.Minor < w.Minor)
}

// ParseVersion parses X.Y.
func ParseVersion(s string) (Version, error) {
	maj, min, ok := strings.Cut(s, ".")
	if !ok {
		return Version{}, fmt.Errorf("PTX version %q: want X.Y", s)
	}
	a, err1 := strconv.Atoi(maj)
	b, err2 := strconv.Atoi(min)
	if err1 != nil || err2 != nil || a < 0 || b < 0 {
		return Version{}, fmt.Errorf("PTX version %q: want X.Y", s)
	}
	return Version{a, b}, nil
}

// MaxPTXVersion is the newest PTX ISA the deploy driver (r580, CUDA 13.0)
// compiles; a newer .version fails to load with CUDA_ERROR_UNSUPPORTED_PTX_VERSION.
var MaxPTXVersion = Version{9, 0}

// MaxParamBytes is the parameter buffer limit the checker enforces. PTX 8.1
// and Volta or newer allow 32764 bytes, but every gdnkcp kernel stays within
// the classic 4 KiB so that any driver accepts it.
const MaxParamBytes = 4096

// minPTXVersion is the oldest PTX ISA that knows each .target this project
// accepts (blob_formats.md §1).
var minPTXVersion = map[string]Version{
	"sm_80": {7, 0}, "sm_86": {7, 1}, "sm_87": {7, 4}, "sm_88": {9, 0}, "sm_89": {7, 8},
	"sm_90": {7, 8}, "sm_90a": {8, 0},
	"sm_100": {8, 6}, "sm_100a": {8, 6}, "sm_100f": {8, 8},
	"sm_103": {8, 8}, "sm_103a": {8, 8}, "sm_103f": {8, 8},
	"sm_110": {9, 0}, "sm_120": {8, 7}, "sm_121": {8, 8},
}

// MinPTXVersion is the oldest .version that may declare the given .target,
// and whether the target is one a gdnkcp PTX blob may have: sm_80 and the
// newer plain targets, sm_90a, sm_100a/f and sm_103a/f.
func MinPTXVersion(target string) (Version, bool) {
	v, ok := minPTXVersion[target]
	return v, ok
}

// SlotAccepts reports whether a blob built as builtAs may fill the manifest
// slot: the same architecture, or a family build (sm_XYf) of the slot's major
// version and a minor no newer than the slot's. The sm_107a slot is filled by
// an sm_100f build while the toolkit has no sm_107a.
func SlotAccepts(slot, builtAs string) error {
	s, err := ParseArch(slot)
	if err != nil {
		return fmt.Errorf("target: %v", err)
	}
	b, err := ParseArch(builtAs)
	if err != nil {
		return fmt.Errorf("built_as: %v", err)
	}
	if s == b {
		return nil
	}
	if !b.Virtual && !s.Virtual && b.Suffix == 'f' && b.Major() == s.Major() && b.Minor() <= s.Minor() {
		return nil
	}
	return fmt.Errorf("target %s cannot be filled by a %s build (want %s, or an sm_%df family build)", slot, builtAs, slot, s.Major()*10)
}

// Runs reports whether a device of compute capability major.minor can load a
// blob built as builtAs, and why. SASS: sm_XYa needs exactly XY; sm_XYf and
// plain sm_XY need the same major and a minor at least Y. PTX: compute_XY
// JITs on XY and newer; compute_XYa only on XY; compute_XYf within its family.
func Runs(builtAs string, major, minor int) (bool, string) {
	a, err := ParseArch(builtAs)
	if err != nil {
		return false, err.Error()
	}
	cc := major*10 + minor
	dev := fmt.Sprintf("compute capability %d.%d", major, minor)
	switch {
	case a.Suffix == 'a':
		if cc == a.Number {
			return true, fmt.Sprintf("%s is built for exactly %s", builtAs, dev)
		}
		return false, fmt.Sprintf("%s runs only on compute capability %d.%d, not %s", builtAs, a.Major(), a.Minor(), dev)
	case a.Suffix == 'f' || !a.Virtual:
		if major == a.Major() && minor >= a.Minor() {
			return true, fmt.Sprintf("%s runs on the %d.x family from %d.%d: %s", builtAs, a.Major(), a.Major(), a.Minor(), dev)
		}
		return false, fmt.Sprintf("%s runs on %d.%d..%d.9 only, not %s", builtAs, a.Major(), a.Minor(), a.Major(), dev)
	default: // plain PTX
		if cc >= a.Number {
			return true, fmt.Sprintf("%s PTX is JIT-compiled for %s", builtAs, dev)
		}
		return false, fmt.Sprintf("%s PTX needs compute capability %d.%d or newer, not %s", builtAs, a.Major(), a.Minor(), dev)
	}
}
