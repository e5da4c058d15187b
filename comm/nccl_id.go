package comm

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
)

// UniqueIDBytes is the size of an NCCL unique id (NCCL_UNIQUE_ID_BYTES).
const UniqueIDBytes = 128

// UniqueID is an ncclUniqueId: the 128 bytes that name one NCCL communicator and its bootstrap root.
// One rank makes it ([NewUniqueID]), the others receive it out of band (as text: [UniqueID.String],
// [UniqueID.Base64], [ParseUniqueID]), and every rank passes it to [NewNCCLComm]. Its layout is the C
// struct's (char internal[128]), so purego passes it to ncclCommInitRank by value.
//
// With NCCL_COMM_ID=host:port in the environment every rank can make the id itself: NCCL then encodes
// that address, and rank 0 creates the bootstrap root there during init ([NewNCCLCommFromEnv]).
type UniqueID struct {
	internal [UniqueIDBytes]byte
}

// NewUniqueID calls ncclGetUniqueId. Without NCCL_COMM_ID in the environment the id holds the address
// of a bootstrap root this process has just started listening on, so the process that makes it must
// take part (as any rank) in the communicator.
func NewUniqueID() (UniqueID, error) {
	id, err := ncclLib.uniqueID()
	if err != nil {
		return UniqueID{}, fmt.Errorf("comm: new NCCL unique id: %w", err)
	}
	return id, nil
}

// UniqueIDFromBytes rebuilds an id from its 128 bytes, as received out of band.
func UniqueIDFromBytes(b []byte) (UniqueID, error) {
	var id UniqueID
	if len(b) != UniqueIDBytes {
		return id, fmt.Errorf("comm: NCCL unique id of %d bytes, want %d", len(b), UniqueIDBytes)
	}
	copy(id.internal[:], b)
	return id, nil
}

// Bytes returns a copy of the id's 128 bytes.
func (id UniqueID) Bytes() []byte {
	return append([]byte(nil), id.internal[:]...)
}

// IsZero reports whether every byte is zero (an id that was never set).
func (id UniqueID) IsZero() bool {
	return id == UniqueID{}
}

// String returns the id as 256 lowercase hex digits, the form [ParseUniqueID] reads first.
func (id UniqueID) String() string {
	return hex.EncodeToString(id.internal[:])
}

// Base64 returns the id in standard base64 with padding (172 characters).
func (id UniqueID) Base64() string {
	return base64.StdEncoding.EncodeToString(id.internal[:])
}

// MarshalText encodes the id as hex, so it travels in JSON and flags as text.
func (id UniqueID) MarshalText() ([]byte, error) {
	return []byte(id.String()), nil
}

// UnmarshalText decodes what [ParseUniqueID] accepts.
func (id *UniqueID) UnmarshalText(b []byte) error {
	v, err := ParseUniqueID(string(b))
	if err != nil {
		return err
	}
	*id = v
	return nil
}

// ParseUniqueID decodes an id written by [UniqueID.String] (256 hex digits, either case) or
// [UniqueID.Base64] (standard or URL alphabet, padded or not). Surrounding space is ignored. Any
// other length or a bad character is an error that says which form was expected.
func ParseUniqueID(s string) (UniqueID, error) {
	s = strings.TrimSpace(s)
	var id UniqueID
	switch len(s) {
	case 2 * UniqueIDBytes:
		b, err := hex.DecodeString(s)
		if err != nil {
			return id, fmt.Errorf("comm: NCCL unique id: 256 characters but not hex: %w", err)
		}
		return UniqueIDFromBytes(b)
	case base64.StdEncoding.EncodedLen(UniqueIDBytes), base64.RawStdEncoding.EncodedLen(UniqueIDBytes):
		enc := base64.RawStdEncoding
		if strings.ContainsAny(s, "-_") {
			enc = base64.RawURLEncoding
		}
		b, err := enc.DecodeString(strings.TrimRight(s, "="))
		if err != nil {
			return id, fmt.Errorf("comm: NCCL unique id: %d characters but not base64: %w", len(s), err)
		}
		return UniqueIDFromBytes(b)
	}
	return id, fmt.Errorf("comm: NCCL unique id of %d characters: want 256 hex digits or 172 base64 characters (171 unpadded)", len(s))
}
