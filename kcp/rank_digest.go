package kcp

import (
	"encoding/hex"
	"errors"
	"fmt"
)

// RankDigest returns a hex sha256 over rank's own token rows of out and of
// every gradient of g, for bitwise comparisons across processes: the
// per-rank digests of N processes (each running one rank with
// GPUOptions.Communicator) equal those of a one-process run of the same
// plan, and GPUForward.RankDigest and GPUGrads.RankDigest give the same
// value from the GPU's own rows without making the float64 tensors.
//
// The values are hashed as little-endian float64 bits, in parts: out's rows
// (HV*DV values a token), then each tensor of g in Grads.Tensors() order
// (dq, dk: HQK*DK a token; dv: HV*DV; dg, dbeta: HV; dconv_w, which every
// rank holds whole, as one block). A part's rows are the rank's tokens in
// global order, cut into blocks: its segments sorted by start, each in runs
// of at most 1024 tokens from its first. The digest is the sha256 of the
// concatenated part digests, a part's the sha256 of its concatenated block
// digests, a block's the sha256 of its bytes (so the blocks hash in
// parallel). g nil hashes the output only. Tensors whose lengths do not fit
// the plan are an error.
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
	blocks := globalBlocks(p, rank)
	parts := make([]digestPart, 0, len(ts))
	for _, t := range ts {
		if len(t.data) != t.size {
			return "", fmt.Errorf("kcp: rank digest: %s has %d values, the plan wants %d", t.name, len(t.data), t.size)
		}
		if t.width == 0 {
			parts = append(parts, wholePart(func(d *digestWriter) {
				for _, v := range t.data {
					d.f64(v)
				}
			}))
			continue
		}
		parts = append(parts, f64Part(blocks, t.data, t.width))
	}
	d := rankDigest(parts)
	return hex.EncodeToString(d[:]), nil
}

// RankDigest is the RankDigest of rank's output alone (no gradients), made
// from the GPU's rows: RankDigest(plan, rank, f.Output(), nil). The rank
// must have run in this process (Ranks).
func (f *GPUForward) RankDigest(rank int) (string, error) {
	if f == nil {
		return "", errors.New("kcp: rank digest: empty result")
	}
	return outRowsDigest(f.plan, f.out, rank)
}

// RankDigest is the RankDigest of rank's output alone, from the GPU's rows:
// RankDigest(plan, rank, ck.Output(), nil).
func (ck *GPUCheckpoint) RankDigest(rank int) (string, error) {
	if ck == nil || ck.g == nil {
		return "", errors.New("kcp: rank digest: the checkpoint is empty")
	}
	return outRowsDigest(ck.g.plan, ck.out, rank)
}

func outRowsDigest(p *Plan, o *gpuOutRows, rank int) (string, error) {
	if p == nil || o == nil {
		return "", errors.New("kcp: rank digest: empty result")
	}
	if rank < 0 || rank >= len(p.Ranks) {
		return "", fmt.Errorf("kcp: rank digest: rank %d outside the plan's %d ranks", rank, len(p.Ranks))
	}
	parts, err := o.digestParts(rank)
	if err != nil {
		return "", err
	}
	d := rankDigest(parts)
	return hex.EncodeToString(d[:]), nil
}

// RankDigest is the RankDigest of rank's output and gradients, made from
// the GPU's rows: RankDigest(plan, rank, out, g.Gradients()) with out the
// output of the forward this backward ran from (for a checkpoint, the
// recompute's, which is the checkpoint's bit for bit). The rank must have
// run in this process (Ranks).
func (g *GPUGrads) RankDigest(rank int) (string, error) {
	if g == nil || g.rows == nil {
		return "", errors.New("kcp: rank digest: empty gradients")
	}
	p := g.rows.plan
	if rank < 0 || rank >= len(p.Ranks) {
		return "", fmt.Errorf("kcp: rank digest: rank %d outside the plan's %d ranks", rank, len(p.Ranks))
	}
	parts, err := g.rows.digestParts(rank)
	if err != nil {
		return "", err
	}
	d := rankDigest(parts)
	return hex.EncodeToString(d[:]), nil
}
