package blobcheck

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/ptx"
)

// TestParsePTXSyntax feeds the parser constructs nvcc may write around the
// entries: helper functions, initialised globals, prototypes, strings that
// look like comments, directives after the parameter list.
func TestParsePTXSyntax(t *testing.T) {
	const text = `//
// header comment with { braces }
.version 8.8
.target sm_103a, texmode_unified
.address_size 64

.file 1 "/tmp//odd/path.cu"
.global .align 4 .b8 table[8] = {1, 2, 3, 4, 5, 6, 7, 8};
.extern .func (.param .b32 func_retval0) vprintf(.param .b64 a, .param .b64 b);
.visible .entry proto_only(.param .u32 p);
.func (.param .b32 r) helper(.param .b32 a)
{
	{ .reg .b32 t; }
	ret;
}
/* a block comment
   over lines with .visible .entry fake( .param .u8 z ) { } */
.weak .entry hidden(.param .u32 h) { ret; }
.visible .entry k(
	.param .u64 .ptr .global .align 16 k_param_0,
	.param .align 16 .b8 k_param_1[20],
	.param .f16 k_param_2,
	.param .s64 k_param_3
)
.maxntid 256, 1, 1
.reqntid 128
.minnctapersm 2
{
	ret;
}
`
	m := ParsePTX([]byte(text))
	require.Empty(t, m.Issues)
	assert.Equal(t, Version{8, 8}, m.Version)
	assert.Equal(t, "sm_103a", m.Target)
	assert.Equal(t, []string{"texmode_unified"}, m.TargetOptions)
	require.Len(t, m.Entries, 3)
	assert.False(t, m.Entries[0].HasBody)
	assert.False(t, m.Entries[1].Visible)
	ex := m.Exported()
	require.Len(t, ex, 1)
	assert.Equal(t, "k", ex[0].Name)
	assert.Equal(t, []int{256, 1, 1}, ex[0].MaxNTID)
	assert.Equal(t, []int{128}, ex[0].ReqNTID)
	assert.Equal(t, []ptx.Param{
		{Name: "k_param_0", Type: "u64", Size: 8, Align: 8, Offset: 0},
		{Name: "k_param_1", Type: "b8", Size: 20, Align: 16, Offset: 16},
		{Name: "k_param_2", Type: "f16", Size: 2, Align: 2, Offset: 36},
		{Name: "k_param_3", Type: "s64", Size: 8, Align: 8, Offset: 40},
	}, ex[0].Params)
	require.NoError(t, ntidError(ex[0]))
}

func TestParsePTXIssues(t *testing.T) {
	tests := []struct {
		name, text, check, evidence string
	}{
		{"empty", "", CheckPTXHeader, "missing .version, .target, .address_size"},
		{"only comments", "// nothing\n", CheckPTXTruncated, "no PTX text"},
		{"bad version", ".version nine\n.target sm_80\n.address_size 64\n", CheckPTXHeader, `PTX version "nine"`},
		{"param without type", ".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param k_p) { ret; }\n", CheckPTXSyntax, "entry k parameter 0 (line 4): no type"},
		{"array without length", ".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .b8 k_p[]) { ret; }\n", CheckPTXSyntax, "array length"},
		{"odd alignment", ".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .align 3 .b8 k_p[4]) { ret; }\n", CheckPTXSyntax, ".align 3 is not a power of two"},
		{"unclosed parameter list", ".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u32 a\n{ ret; }\n", CheckPTXSyntax, "parameter list is not closed"},
		{"body cut", ".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u32 a)\n{\n\tret;\n", CheckPTXBraces, "1 { never closed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := ParsePTX([]byte(tc.text))
			found := false
			for _, is := range m.Issues {
				found = found || (is.Check == tc.check && strings.Contains(is.Evidence, tc.evidence))
			}
			assert.Truef(t, found, "want %s: %s; got %v", tc.check, tc.evidence, m.Issues)
		})
	}
}
