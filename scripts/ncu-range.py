#!/usr/bin/env python3
"""Splits an ncu source page (--page source --csv --print-source sass, as scripts/ncu-source.sh writes it) at
the SASS line indices given and prints, per range, its share of the stall samples and of the executed warp
instructions and its most executed opcodes as counts per PER executions (e.g. PER = CTAs x warps x chunks of
a walk's loop: 96 x 4 x 512 = 196608 at 32K, so that a count reads as instructions a warp and chunk). With
--list, every executed line of the ranges too: index, executions, share of samples, instruction, top two
stall reasons. How the twenty-fourth session found the state walk's guarded U^T loads on its chain
(docs/perf-notes.md): list the loop (executions >= PER), find the wgmma issue and wait, sum the ranges.
With --branches (no indices needed), every executed branch instead: its line, executions and target line,
which is how a warp-specialised kernel's roles are found (the twenty-fifth session's tape walk: the copiers
jump over the state warps' lines at one branch, the state warps over the copiers' at another; the ranges
between them, given back as cuts, split the samples by role).
Usage: ncu-range.py FILE.csv [--per PER] [--list] I0 I1 [I2 ...] | ncu-range.py FILE.csv --branches"""
import argparse
import re
import signal

from ncusource import num, opcode, read

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("cuts", type=int, nargs="*", help="SASS line indices: the ranges [I0, I1), [I1, I2), ...")
    ap.add_argument("--per", type=float, default=196608.0, help="executions that make one (default 196608)")
    ap.add_argument("--list", action="store_true", help="also list every executed line of the ranges")
    ap.add_argument("--branches", action="store_true", help="list every executed branch and its target line")
    a = ap.parse_intermixed_args()
    head, body, col = read(a.csv, "ncu-range")
    src, ex = col["Source"], col["Instructions Executed"]
    if a.branches:
        if "Address" not in col:
            ap.error("the csv has no Address column, which --branches needs")
        line = {int(r[col["Address"]], 16): i for i, r in enumerate(body)}
        for i, r in enumerate(body):
            m = re.search(r"\bBRA\b.*?(0x[0-9a-fA-F]+)", r[src])
            if m and num(r[ex]) > 0:
                to = line.get(int(m.group(1), 16))
                print(f"{i:6d} {int(num(r[ex])):9d} {r[src].strip()[:48]:48s} -> {to if to is not None else '?'}")
        return
    samp = next(col[h] for h in head if h.startswith("Warp Stall Sampling (All"))
    stalls = [h for h in head if h.startswith("stall_") and "Not Issued" not in h]
    tot = sum(num(r[samp]) for r in body) or 1.0
    if len(a.cuts) < 2:
        ap.error("give at least two indices")
    for lo, hi in zip(a.cuts[:-1], a.cuts[1:]):
        rows = body[lo:hi]
        smp, ins, ops = 0.0, 0.0, {}
        for i, r in enumerate(rows, lo):
            e, s = num(r[ex]), num(r[samp])
            smp, ins = smp + s, ins + e
            ops[opcode(r[src])] = ops.get(opcode(r[src]), 0.0) + e
            if a.list and (e > 0 or s > 0):
                top = sorted(((num(r[col[h]]), h[6:]) for h in stalls), reverse=True)[:2]
                why = " ".join(f"{h}:{int(v)}" for v, h in top if v > 0)
                print(f"{i:6d} {int(e):9d} {100 * s / tot:6.2f}% {r[src].strip()[:72]:72s} {why}")
        top = ", ".join(f"{k} {v / a.per:.0f}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:6])
        print(f"[{lo}, {hi}): samples {100 * smp / tot:5.1f}%, {ins / a.per:.0f} instructions per {a.per:.0f}: {top}")


if __name__ == "__main__":
    main()
