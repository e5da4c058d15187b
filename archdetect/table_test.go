package archdetect

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTableConsistent(t *testing.T) {
	for i, r := range ccTable {
		if i > 0 {
			assert.True(t, ccTable[i-1].CC.Less(r.CC), "rows are sorted and unique at %s", r.CC)
		}
		assert.NotEmpty(t, r.Arch, "%s", r.CC)
		assert.Contains(t, []string{VariantSM90a, VariantSM100a, VariantSM103a, VariantSM107a, VariantGeneric}, r.Variant)
		for _, slot := range []string{r.Exact, r.Family} {
			if slot == "" {
				continue
			}
			require.True(t, validSlot(slot), "%s: slot %s", r.CC, slot)
			b, err := parseBuild(slotBuiltAs[slot])
			require.NoError(t, err)
			assert.True(t, b.runs(r.CC), "%s: slot %s (%s) must run there", r.CC, slot, b.name)
		}
		if r.Exact != "" {
			b, _ := parseBuild(slotBuiltAs[r.Exact])
			assert.Equal(t, buildExact, b.kind, "%s: the exact slot is an sm_XYa build", r.CC)
		}
	}
	for _, s := range Slots {
		_, err := parseBuild(slotBuiltAs[s])
		assert.NoError(t, err, "slot %s", s)
	}
}

func TestSlotRules(t *testing.T) {
	ccs := []CC{{7, 5}, {8, 0}, {8, 9}, {9, 0}, {10, 0}, {10, 3}, {10, 7}, {11, 0}, {12, 0}, {12, 1}}
	runsOn := map[string][]CC{
		SlotSM90a:     {{9, 0}},
		SlotSM100a:    {{10, 0}},
		SlotSM103a:    {{10, 3}},
		SlotSM107a:    {{10, 0}, {10, 3}, {10, 7}},
		SlotCompute80: {{8, 0}, {8, 9}, {9, 0}, {10, 0}, {10, 3}, {10, 7}, {11, 0}, {12, 0}, {12, 1}},
	}
	for _, slot := range Slots {
		b, err := parseBuild(slotBuiltAs[slot])
		require.NoError(t, err)
		for _, cc := range ccs {
			assert.Equal(t, contains(runsOn[slot], cc), b.runs(cc), "slot %s on %s", slot, cc)
		}
	}
}

func contains(s []CC, c CC) bool {
	for _, x := range s {
		if x == c {
			return true
		}
	}
	return false
}

func TestParseBuild(t *testing.T) {
	tests := []struct {
		in   string
		kind int
		cc   CC
		err  bool
	}{
		{"sm_90a", buildExact, CC{9, 0}, false},
		{"sm_100a", buildExact, CC{10, 0}, false},
		{"sm_100f", buildFamily, CC{10, 0}, false},
		{"sm_103f", buildFamily, CC{10, 3}, false},
		{"sm_86", buildSASS, CC{8, 6}, false},
		{"sm_121", buildSASS, CC{12, 1}, false},
		{"compute_80", buildPTX, CC{8, 0}, false},
		{"compute_90a", 0, CC{}, true},
		{"sm90a", 0, CC{}, true},
		{"", 0, CC{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			b, err := parseBuild(tc.in)
			if tc.err {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.kind, b.kind)
			assert.Equal(t, tc.cc, b.cc)
		})
	}
}

func TestRowForUnknown(t *testing.T) {
	r := rowFor(CC{10, 5})
	assert.Equal(t, "unknown", r.Arch)
	assert.Equal(t, SlotSM107a, r.Family, "any 10.x loads the sm_100f family build")
	assert.Empty(t, r.Exact)
	assert.Equal(t, VariantGeneric, r.Variant)
	assert.Empty(t, rowFor(CC{13, 0}).Family)
	assert.Equal(t, "Hopper", rowFor(CC{9, 0}).Arch)
}

func TestCC(t *testing.T) {
	assert.Equal(t, "10.3", CC{10, 3}.String())
	assert.True(t, CC{9, 0}.Less(CC{10, 0}))
	assert.True(t, CC{10, 0}.Less(CC{10, 3}))
	assert.False(t, CC{10, 3}.Less(CC{10, 3}))
	assert.False(t, CC{12, 0}.Less(CC{8, 9}))
}
