package archdetect

import (
	"testing"

	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeManifest holds one blob per slot given, built as the slot's default
// unless written "slot=builtAs".
func fakeManifest(slots ...string) *ptx.Manifest {
	m := &ptx.Manifest{Generator: "test"}
	for _, s := range slots {
		target, as := s, ""
		for i := range len(s) {
			if s[i] == '=' {
				target, as = s[:i], s[i+1:]
			}
		}
		if as == "" {
			as = slotBuiltAs[target]
		}
		kind := ptx.KindCubin
		if target == SlotCompute80 {
			kind = ptx.KindPTX
		}
		m.Blobs = append(m.Blobs, ptx.Blob{Target: target, Kind: kind, File: "k." + target, BuiltAs: as})
	}
	return m
}

var allSlots = []string{SlotSM90a, SlotSM100a, SlotSM103a, SlotSM107a, SlotCompute80}

func TestProfileForAllBlobs(t *testing.T) {
	m := fakeManifest(allSlots...)
	tests := []struct {
		cc      CC
		target  string
		variant string
		reason  string // substring of Reason, or of the error when target is ""
	}{
		{CC{7, 5}, "", "", "no blob can run on GPU (compute capability 7.5): gdnkcp needs compute capability 8.0 or newer"},
		{CC{8, 0}, SlotCompute80, VariantGeneric, "PTX fallback compute_80 (JIT-compiled at load) for compute capability 8.0: no cubin is built for it"},
		{CC{8, 9}, SlotCompute80, VariantGeneric, "PTX fallback compute_80"},
		{CC{9, 0}, SlotSM90a, VariantSM90a, "exact cubin sm_90a for compute capability 9.0"},
		{CC{10, 0}, SlotSM100a, VariantSM100a, "exact cubin sm_100a for compute capability 10.0"},
		{CC{10, 3}, SlotSM103a, VariantSM103a, "exact cubin sm_103a for compute capability 10.3"},
		{CC{10, 7}, SlotSM107a, VariantSM107a, "family cubin sm_107a (built as sm_100f) for compute capability 10.7"},
		{CC{11, 0}, SlotCompute80, VariantGeneric, "for compute capability 11.0: no cubin is built for it"},
		{CC{12, 0}, SlotCompute80, VariantGeneric, "PTX fallback compute_80"},
		{CC{12, 1}, SlotCompute80, VariantGeneric, "PTX fallback compute_80"},
		{CC{10, 1}, SlotSM107a, VariantGeneric, "family cubin sm_107a"}, // off the table
		{CC{9, 1}, SlotCompute80, VariantGeneric, "PTX fallback"},       // off the table
	}
	for _, tc := range tests {
		t.Run(tc.cc.String(), func(t *testing.T) {
			p, err := ProfileFor(tc.cc, 132, "GPU", m, "")
			if tc.target == "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.reason)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.target, p.Target)
			require.NotNil(t, p.Blob)
			assert.Equal(t, tc.target, p.Blob.Target)
			assert.Equal(t, tc.variant, p.Variant)
			assert.Contains(t, p.Reason, tc.reason)
			assert.False(t, p.Forced)
			assert.Equal(t, 132, p.SMs)
			assert.Equal(t, tc.cc, p.CC())
		})
	}
}

func TestProfileForMissingBlobs(t *testing.T) {
	tests := []struct {
		name    string
		cc      CC
		slots   []string
		target  string
		variant string
		want    string // substring of Reason, or of the error when target is ""
	}{
		{"9.0 without sm_90a", CC{9, 0}, []string{SlotSM100a, SlotCompute80}, SlotCompute80, VariantSM90a,
			"PTX fallback compute_80 (JIT-compiled at load) for compute capability 9.0: the manifest lacks the exact cubin sm_90a"},
		{"10.0 without sm_100a", CC{10, 0}, []string{SlotSM107a, SlotCompute80}, SlotSM107a, VariantSM100a,
			"family cubin sm_107a (built as sm_100f) for compute capability 10.0; the manifest lacks the exact cubin sm_100a"},
		{"10.3 without cubins", CC{10, 3}, []string{SlotSM100a, SlotCompute80}, SlotCompute80, VariantSM103a,
			"the manifest lacks the exact cubin sm_103a and the family cubin sm_107a"},
		{"10.7 without sm_107a", CC{10, 7}, []string{SlotSM100a, SlotSM103a, SlotCompute80}, SlotCompute80, VariantSM107a,
			"the manifest lacks the family cubin sm_107a"},
		{"10.0 with a true sm_107a build", CC{10, 0}, []string{SlotSM107a + "=sm_107a", SlotCompute80}, SlotCompute80, VariantSM100a,
			"PTX fallback"},
		{"10.7 with a true sm_107a build", CC{10, 7}, []string{SlotSM107a + "=sm_107a"}, SlotSM107a, VariantSM107a,
			"family cubin sm_107a (built as sm_107a)"},
		{"9.0 empty manifest", CC{9, 0}, nil, "", "",
			"no blob for NVIDIA H200 (compute capability 9.0): the manifest lacks the exact cubin sm_90a, the PTX fallback compute_80 (it has: no blobs)"},
		{"12.0 cubins only", CC{12, 0}, []string{SlotSM90a, SlotSM100a}, "", "",
			"compute capability 12.0): the manifest lacks the PTX fallback compute_80 (it has: sm_90a, sm_100a)"},
		{"10.3 nothing it can load", CC{10, 3}, []string{SlotSM90a, SlotSM100a}, "", "",
			"lacks the exact cubin sm_103a, the family cubin sm_107a, the PTX fallback compute_80"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ProfileFor(tc.cc, 132, "NVIDIA H200", fakeManifest(tc.slots...), "")
			if tc.target == "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.want)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.target, p.Target)
			assert.Equal(t, tc.variant, p.Variant, "the variant follows the device, not the blob")
			assert.Contains(t, p.Reason, tc.want)
		})
	}
	_, err := ProfileFor(CC{9, 0}, 132, "x", nil, "")
	assert.ErrorContains(t, err, "no manifest")
}

func TestProfileForOverride(t *testing.T) {
	m := fakeManifest(allSlots...)
	tests := []struct {
		name     string
		cc       CC
		manifest *ptx.Manifest
		override string
		target   string
		want     []string // substrings of Reason, or of the error when target is ""
	}{
		{"PTX on an H200", CC{9, 0}, m, SlotCompute80, SlotCompute80,
			[]string{"forced by override: compute_80 PTX built as compute_80 for compute capability 9.0"}},
		{"family on 10.3", CC{10, 3}, m, SlotSM107a, SlotSM107a, []string{"forced by override", "sm_100f"}},
		{"exact on its device", CC{10, 0}, m, SlotSM100a, SlotSM100a, []string{"forced"}},
		{"sm_100a on 9.0", CC{9, 0}, m, SlotSM100a, "",
			[]string{"blob sm_100a forced by override cannot run on NVIDIA H200 (compute capability 9.0): an sm_100a cubin runs only on compute capability 10.0"}},
		{"sm_107a on 9.0", CC{9, 0}, m, SlotSM107a, "",
			[]string{"sm_107a", "compute capability 9.0", "an sm_100f family cubin runs on compute capability 10.x"}},
		{"sm_90a on 10.0", CC{10, 0}, m, SlotSM90a, "", []string{"runs only on compute capability 9.0"}},
		{"PTX on 7.5", CC{7, 5}, m, SlotCompute80, "", []string{"compute_80 PTX runs on compute capability 8.0 and newer"}},
		{"unknown name", CC{9, 0}, m, "sm_80", "",
			[]string{`unknown blob "sm_80"`, "valid blobs: sm_90a, sm_100a, sm_103a, sm_107a, compute_80"}},
		{"not in manifest", CC{9, 0}, fakeManifest(SlotCompute80), SlotSM90a, "",
			[]string{"blob sm_90a forced by override is not in the manifest (it has: compute_80)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ProfileFor(tc.cc, 132, "NVIDIA H200", tc.manifest, tc.override)
			if tc.target == "" {
				require.Error(t, err)
				for _, w := range tc.want {
					assert.Contains(t, err.Error(), w)
				}
				return
			}
			require.NoError(t, err)
			assert.True(t, p.Forced)
			assert.Equal(t, tc.target, p.Target)
			for _, w := range tc.want {
				assert.Contains(t, p.Reason, w)
			}
		})
	}
}

func TestOptionsOverride(t *testing.T) {
	tests := []struct {
		name         string
		env          string
		opts         Options
		slot, source string
	}{
		{"nothing", "", Options{}, "", ""},
		{"env", "compute_80", Options{}, "compute_80", "GDNKCP_BLOB=compute_80"},
		{"option wins", "compute_80", Options{Blob: "sm_90a"}, "sm_90a", "option"},
		{"env ignored", "compute_80", Options{IgnoreEnv: true}, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvBlob, tc.env)
			slot, source := tc.opts.override()
			assert.Equal(t, tc.slot, slot)
			assert.Equal(t, tc.source, source)
		})
	}
	// The source is named in the reason and in errors.
	p, err := profileFor(CC{9, 0}, 132, "NVIDIA H200", fakeManifest(allSlots...), "compute_80", "GDNKCP_BLOB=compute_80")
	require.NoError(t, err)
	assert.Contains(t, p.Reason, "forced by GDNKCP_BLOB=compute_80")
	_, err = profileFor(CC{9, 0}, 132, "NVIDIA H200", fakeManifest(allSlots...), "sm_100a", "GDNKCP_BLOB=sm_100a")
	assert.ErrorContains(t, err, "blob sm_100a forced by GDNKCP_BLOB=sm_100a cannot run on NVIDIA H200 (compute capability 9.0)")
}

func TestProfileString(t *testing.T) {
	p, err := ProfileFor(CC{9, 0}, 132, "NVIDIA H200", fakeManifest(allSlots...), "")
	require.NoError(t, err)
	assert.Equal(t, "GPU 0: NVIDIA H200 (CC 9.0, Hopper, 132 SMs): blob sm_90a, variant sm_90a — exact cubin sm_90a for compute capability 9.0", p.String())
}
