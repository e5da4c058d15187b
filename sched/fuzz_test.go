package sched

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzDecide feeds Decide, DispatchOrder and MixedWalk arbitrary walk lists
// (up to 16 chains of up to 65,535 chunks, from chains: two bytes each),
// head counts, SM counts, variants, rules and walk kinds. None may panic.
// Where Decide answers, the width is 64 or 128 (0 only for an empty list)
// and its counts are the list's; where DispatchOrder answers, the order is a
// permutation of the launch's CTAs and its makespan at least the longest
// chain and the average load.
func FuzzDecide(f *testing.F) {
	le := func(ns ...int) []byte {
		b := make([]byte, 2*len(ns))
		for i, n := range ns {
			binary.LittleEndian.PutUint16(b[2*i:], uint16(n))
		}
		return b
	}
	f.Add(le(625, 704, 562), 48, 132, uint8(0), uint8(2), uint8(1), false)
	f.Add(le(782, 782, 232, 232), 48, 148, uint8(1), uint8(2), uint8(3), true)
	f.Add(le(0, 5), 1, 1, uint8(4), uint8(1), uint8(0), false)
	f.Add(le(), 48, 132, uint8(0), uint8(2), uint8(2), false)
	f.Add(le(1, 1, 1), 0, -3, uint8(9), uint8(7), uint8(9), false)
	f.Fuzz(func(t *testing.T, raw []byte, hv, sms int, variant, rule, kind uint8, lean bool) {
		if len(raw) > 32 {
			raw = raw[:32]
		}
		var chains []int
		for i := 0; i+1 < len(raw); i += 2 {
			chains = append(chains, int(binary.LittleEndian.Uint16(raw[i:])))
		}
		hv, sms = hv%1024, sms%4096 // keep the launches to a size the fuzzer can run many of
		vs := Variants()
		prof := Profile{Variant: vs[int(variant)%(len(vs)+1)%len(vs)], SMs: sms, LeanForward: lean}
		if int(variant)%(len(vs)+1) == len(vs) {
			prof.Variant = "sm_00"
		}
		d, err := Decide(WalkKind(kind%5), chains, hv, prof, Rule(rule%4))
		if err == nil {
			nonEmpty := len(chains) > 0
			if nonEmpty {
				require.Contains(t, []int{64, 128}, d.VH)
				require.Equal(t, len(chains), d.NWalk)
				longest := 0
				for _, c := range chains {
					longest = max(longest, c)
				}
				require.Equal(t, longest, d.LongestChain)
			} else {
				require.Zero(t, d.VH)
			}
		}
		for _, per := range []int{1, 2} {
			order, span, err := DispatchOrder(chains, hv, per, sms)
			if err != nil || order == nil {
				continue
			}
			n := hv * per * len(chains)
			require.Len(t, order, n)
			seen := make([]bool, n)
			total, longest := 0, 0
			for _, c := range order {
				require.True(t, c >= 0 && int(c) < n && !seen[c], "CTA %d twice or outside 0..%d", c, n-1)
				seen[c] = true
			}
			for _, c := range chains {
				total += c * hv * per
				longest = max(longest, c)
			}
			require.GreaterOrEqual(t, span, max(longest, (total+sms-1)/sms))
		}
		// LPT and ListMakespan on signed lengths: an error on a bad argument, never a
		// panic; otherwise a makespan of at least the longest job and the mean load.
		signed := make([]int, len(chains))
		total, longest := 0, 0
		for i, c := range chains {
			signed[i] = int(int16(c))
			total, longest = total+max(signed[i], 0), max(longest, signed[i])
		}
		if m, err := LPT(signed, sms); err == nil {
			require.GreaterOrEqual(t, m, max(longest, (total+sms-1)/sms), "LPT(%v, %d)", signed, sms)
		} else {
			require.Zero(t, m)
		}
		if m, err := ListMakespan(signed, hv, 1, sms); err == nil && hv > 0 && len(signed) > 0 {
			require.GreaterOrEqual(t, m, max(longest, (hv*total+sms-1)/sms), "ListMakespan(%v, %d, 1, %d)", signed, hv, sms)
		} else if err != nil {
			require.Zero(t, m)
		}
		if hv <= 64 && len(chains) <= 8 {
			_, _ = MixedWalk(chains, hv, 1+int(kind)%2, sms, ChunkCost{Narrow: 1 + int(rule)%5, Wide: 1 + int(variant)%9})
		}
	})
}
