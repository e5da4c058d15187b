package comm

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sampleID() UniqueID {
	var id UniqueID
	for i := range id.internal {
		id.internal[i] = byte(i*37 + 11) // every byte value class, '-' and '_' producers in base64 included
	}
	return id
}

func TestUniqueIDLayout(t *testing.T) {
	// The C struct is char internal[128]: same size, byte alignment.
	assert.Equal(t, uintptr(128), unsafe.Sizeof(UniqueID{}))
	assert.Equal(t, uintptr(1), unsafe.Alignof(UniqueID{}))
}

func TestUniqueIDRoundTrip(t *testing.T) {
	id := sampleID()
	b64 := id.Base64()
	tests := []struct {
		name string
		text string
	}{
		{"hex", id.String()},
		{"hex upper case", strings.ToUpper(id.String())},
		{"hex with spaces around", "  " + id.String() + "\n"},
		{"base64", b64},
		{"base64 unpadded", strings.TrimRight(b64, "=")},
		{"base64 url", base64.URLEncoding.EncodeToString(id.Bytes())},
		{"base64 url unpadded", base64.RawURLEncoding.EncodeToString(id.Bytes())},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseUniqueID(tc.text)
			require.NoError(t, err)
			assert.Equal(t, id, got)
		})
	}
	assert.Len(t, id.String(), 256)
	assert.Len(t, b64, 172)

	fromBytes, err := UniqueIDFromBytes(id.Bytes())
	require.NoError(t, err)
	assert.Equal(t, id, fromBytes)
	b := id.Bytes()
	b[0] ^= 0xff
	assert.NotEqual(t, b[0], id.internal[0], "Bytes returns a copy")

	// As text in JSON.
	js, err := json.Marshal(map[string]UniqueID{"id": id})
	require.NoError(t, err)
	var back map[string]UniqueID
	require.NoError(t, json.Unmarshal(js, &back))
	assert.Equal(t, id, back["id"])

	assert.True(t, UniqueID{}.IsZero())
	assert.False(t, id.IsZero())
}

func TestUniqueIDBadInput(t *testing.T) {
	id := sampleID()
	hexID := id.String()
	tests := []struct {
		name string
		text string
		want string
	}{
		{"empty", "", "comm: NCCL unique id of 0 characters: want 256 hex digits or 172 base64 characters (171 unpadded)"},
		{"too short hex", hexID[:254], "of 254 characters"},
		{"too long hex", hexID + "00", "of 258 characters"},
		{"not hex", "zz" + hexID[2:], "256 characters but not hex"},
		{"not base64", strings.Repeat("!", 172), "172 characters but not base64"},
		{"base64 of 171 with a bad character", "*" + strings.TrimRight(id.Base64(), "=")[1:], "171 characters but not base64"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseUniqueID(tc.text)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := UniqueIDFromBytes(make([]byte, 127))
	assert.EqualError(t, err, "comm: NCCL unique id of 127 bytes, want 128")
	var u UniqueID
	assert.Error(t, u.UnmarshalText([]byte("nope")))
}
