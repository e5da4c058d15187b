#!/usr/bin/env python3
"""Splits an ncu source page (--page source --csv --print-source sass, as scripts/ncu-source.sh writes it) at
the kernel's block barriers (BAR.SYNC / EXIT) and prints, per segment, its share of the executed warp
instructions and of the stall samples, its HMMA count and its most executed opcodes. A barrier's waits are
sampled on the first instructions after it, so a segment's samples include the wait at the barrier that
opens it. For kernels built of phases between __syncthreads (the prep, the chunk gradients): which phase
holds the time. Usage: ncu-phases.py FILE.csv"""
import signal
import sys

from ncusource import num, opcode, read

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly


def main(path):
    head, body, col = read(path, "ncu-phases")
    src, ex = col["Source"], col["Instructions Executed"]
    samp = next(col[h] for h in head if h.startswith("Warp Stall Sampling (All"))
    tot_i = sum(num(r[ex]) for r in body) or 1.0
    tot_s = sum(num(r[samp]) for r in body) or 1.0
    print(f"{tot_i:.4e} warp instructions, {int(tot_s)} stall samples, {len(body)} SASS lines")
    seg = dict(start=0, ins=0.0, smp=0.0, hmma=0.0, ops={})
    k = 0
    for i, r in enumerate(body):
        if not r[src].strip():
            continue
        op = opcode(r[src])
        seg["ins"] += num(r[ex])
        seg["smp"] += num(r[samp])
        seg["ops"][op] = seg["ops"].get(op, 0.0) + num(r[ex])
        if op == "HMMA":
            seg["hmma"] += num(r[ex])
        if op in ("BAR", "EXIT") or i == len(body) - 1:
            if seg["ins"] or seg["smp"]:
                top = sorted(seg["ops"].items(), key=lambda x: -x[1])[:5]
                ops = " ".join(f"{o}:{100 * v / max(seg['ins'], 1):.0f}%" for o, v in top)
                print(f"{k:2d} lines {seg['start']:5d}-{i:5d}  instructions {100 * seg['ins'] / tot_i:5.1f}%  "
                      f"samples {100 * seg['smp'] / tot_s:5.1f}%  hmma {seg['hmma']:.2e}  {ops}")
                k += 1
            seg = dict(start=i + 1, ins=0.0, smp=0.0, hmma=0.0, ops={})


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
