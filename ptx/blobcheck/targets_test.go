package blobcheck

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseArch(t *testing.T) {
	tests := []struct {
		in      string
		want    Arch
		ptx     string
		wantErr bool
	}{
		{in: "sm_90a", want: Arch{Number: 90, Suffix: 'a'}, ptx: "sm_90a"},
		{in: "sm_100f", want: Arch{Number: 100, Suffix: 'f'}, ptx: "sm_100f"},
		{in: "sm_103a", want: Arch{Number: 103, Suffix: 'a'}, ptx: "sm_103a"},
		{in: "compute_80", want: Arch{Virtual: true, Number: 80}, ptx: "sm_80"},
		{in: "compute_90a", want: Arch{Virtual: true, Number: 90, Suffix: 'a'}, ptx: "sm_90a"},
		{in: "sm_", wantErr: true},
		{in: "sm_9x", wantErr: true},
		{in: "gfx90a", wantErr: true},
		{in: "sm_090", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			a, err := ParseArch(tc.in)
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, a)
			assert.Equal(t, tc.in, a.String())
			assert.Equal(t, tc.ptx, a.PTXTarget())
		})
	}
}

func TestSlotAccepts(t *testing.T) {
	tests := []struct {
		slot, builtAs string
		ok            bool
	}{
		{"sm_90a", "sm_90a", true},
		{"sm_100a", "sm_100a", true},
		{"sm_107a", "sm_100f", true},
		{"sm_107a", "sm_107a", true},
		{"sm_107a", "sm_103f", true},
		{"sm_107a", "sm_100a", false},
		{"sm_103a", "sm_100f", true},
		{"sm_100a", "sm_103f", false},
		{"sm_90a", "sm_100f", false},
		{"compute_80", "compute_80", true},
		{"compute_80", "sm_80", false},
		{"sm_107a", "compute_100f", false},
		{"bogus", "sm_90a", false},
	}
	for _, tc := range tests {
		t.Run(tc.slot+"/"+tc.builtAs, func(t *testing.T) {
			err := SlotAccepts(tc.slot, tc.builtAs)
			if tc.ok {
				assert.NoError(t, err)
			} else {
				assert.Error(t, err)
			}
		})
	}
}

func TestRuns(t *testing.T) {
	tests := []struct {
		builtAs      string
		major, minor int
		ok           bool
	}{
		{"sm_90a", 9, 0, true},
		{"sm_90a", 10, 0, false},
		{"sm_100a", 10, 0, true},
		{"sm_100a", 10, 3, false},
		{"sm_103a", 10, 3, true},
		{"sm_100f", 10, 0, true},
		{"sm_100f", 10, 3, true},
		{"sm_100f", 10, 7, true},
		{"sm_100f", 11, 0, false},
		{"sm_100f", 9, 0, false},
		{"compute_80", 8, 0, true},
		{"compute_80", 9, 0, true},
		{"compute_80", 12, 1, true},
		{"compute_80", 7, 5, false},
		{"compute_90a", 9, 0, true},
		{"compute_90a", 10, 0, false},
		{"compute_100f", 10, 3, true},
		{"compute_100f", 12, 0, false},
	}
	for _, tc := range tests {
		ok, why := Runs(tc.builtAs, tc.major, tc.minor)
		assert.Equalf(t, tc.ok, ok, "%s on %d.%d: %s", tc.builtAs, tc.major, tc.minor, why)
		assert.NotEmpty(t, why)
	}
}

func TestVersion(t *testing.T) {
	v, err := ParseVersion("9.0")
	require.NoError(t, err)
	assert.Equal(t, Version{9, 0}, v)
	assert.True(t, Version{8, 8}.Less(v))
	assert.False(t, v.Less(Version{8, 8}))
	for _, bad := range []string{"9", "a.b", "9.", "-1.0"} {
		_, err := ParseVersion(bad)
		assert.Error(t, err, bad)
	}
	min, ok := MinPTXVersion("sm_103a")
	assert.True(t, ok)
	assert.Equal(t, Version{8, 8}, min)
	_, ok = MinPTXVersion("sm_75")
	assert.False(t, ok)
}

func TestParseNVInfo(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		n    int
		err  string
	}{
		{"empty", nil, 0, ""},
		{"values", []byte{3, 0x19, 0x38, 0, 2, 0x4c, 1, 0, 1, 0x50, 0, 0}, 3, ""},
		{"payload", []byte{4, 0x37, 4, 0, 0x82, 0, 0, 0}, 1, ""},
		{"short header", []byte{3, 0x19, 0x38}, 0, "3 bytes left, a record header needs 4"},
		{"payload past the end", []byte{4, 0x37, 8, 0, 0x82, 0, 0, 0}, 0, "payload of 8 bytes runs past the section end (4 bytes left)"},
		{"unknown format", []byte{3, 0x19, 0x38, 0, 7, 1, 0, 0}, 1, "record at offset 0x4: unknown format 7"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			recs, err := ParseNVInfo(tc.in)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
			} else {
				require.NoError(t, err)
			}
			assert.Len(t, recs, tc.n)
		})
	}
}

func TestLayoutError(t *testing.T) {
	good := probeParams["probe_mixed"]
	require.NoError(t, LayoutError(good))
	bad := append(good[:0:0], good...)
	bad[4].Type = "u128"
	assert.ErrorContains(t, LayoutError(bad), "unknown type \"u128\"")
	bad = append(good[:0:0], good...)
	bad[2].Align = 3
	assert.ErrorContains(t, LayoutError(bad), "alignment 3")
	bad = append(good[:0:0], good...)
	bad[0].Size = 12
	assert.ErrorContains(t, LayoutError(bad), "size 12 is not a whole number of u64")
}
