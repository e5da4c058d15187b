package kcp

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
)

// RankDigest returns a hex sha256 over rank's own token rows of out and of
// every gradient of g, for bitwise comparisons across processes: the
// per-rank digests of N processes (each running one rank with
// GPUOptions.Communicator) equal those of a one-process run of the same
// plan. It hashes the rank's tokens in global order, as float64 bits
// little-endian: first out's rows (HV*DV values a token), then each tensor
// of g in Grads.Tensors() order (dq, dk: HQK*DK a token; dv: HV*DV; dg,
// dbeta: HV; dconv_w, which every rank holds whole, entirely). g nil hashes
// the output only. Tensors whose lengths do not fit the plan are an error.
func RankDigest(p *Plan, rank int, out *Output, g *Grads) (string, error) {
	if p == nil {
		return "", errors.New("kcp: rank digest: plan is nil")
	}
	if rank < 0 || rank >= len(p.Ranks) {
		return "", fmt.Errorf("kcp: rank digest: rank %d outside the plan's %d ranks", rank, len(p.Ranks))
	}
	if out == nil {
		return "", errors.New("kcp: rank digest: output is nil")
	}
	cfg := p.Config
	type tensor struct {
		name  string
		data  []float64
		width int // values a token; 0: hash whole
		size  int // the length the plan asks for
	}
	nq, nv := cfg.HQK*cfg.DK, cfg.HV*cfg.DV
	ts := []tensor{{"o", out.O, nv, p.Tokens * nv}}
	if g != nil {
		for _, t := range g.Tensors() {
			switch t.Name {
			case "dq", "dk":
				ts = append(ts, tensor{t.Name, t.Data, nq, p.Tokens * nq})
			case "dv":
				ts = append(ts, tensor{t.Name, t.Data, nv, p.Tokens * nv})
			case "dg", "dbeta":
				ts = append(ts, tensor{t.Name, t.Data, cfg.HV, p.Tokens * cfg.HV})
			case "dconv_w":
				ts = append(ts, tensor{t.Name, t.Data, 0, p.ConvChannels() * ConvWidth})
			default:
				return "", fmt.Errorf("kcp: rank digest: unknown gradient %q", t.Name)
			}
		}
	}
	// The rank's tokens in global order.
	segs := slices.Clone(p.Ranks[rank].Segments)
	slices.SortFunc(segs, func(a, b Segment) int { return a.Start - b.Start })
	h := sha256.New()
	var buf []byte
	put := func(vs []float64) {
		buf = buf[:0]
		for _, v := range vs {
			buf = binary.LittleEndian.AppendUint64(buf, math.Float64bits(v))
		}
		h.Write(buf)
	}
	for _, t := range ts {
		if len(t.data) != t.size {
			return "", fmt.Errorf("kcp: rank digest: %s has %d values, the plan wants %d", t.name, len(t.data), t.size)
		}
		if t.width == 0 {
			put(t.data)
			continue
		}
		for _, seg := range segs {
			put(t.data[seg.Start*t.width : seg.End()*t.width])
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
