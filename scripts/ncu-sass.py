#!/usr/bin/env python3
"""Summarises an ncu source page (--page source --csv --print-source sass): the stall samples of every
SASS instruction, totalled by opcode and by stall reason, and the hottest instructions with their
neighbours' opcodes. Usage: ncu-sass.py FILE.csv [TOP]."""
import signal
import sys
from collections import Counter

from ncusource import num, read

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly


head, body, col = read(sys.argv[1], "ncu-sass")
top_n = int(sys.argv[2]) if len(sys.argv) > 2 else 25
src = col["Source"]
samp = next((col[h] for h in head if h.startswith("Warp Stall Sampling (All")), None)
stall_cols = [h for h in head if h.startswith("stall_") or (h.startswith("Stall") and "Sampl" not in h)]
print(f"{len(body)} instructions; sample column: {head[samp] if samp is not None else 'none'}")
print("columns:", ", ".join(h for h in head if h not in ("Source",))[:600])
if samp is None:
    sys.exit(0)
total = sum(num(r[samp]) for r in body) or 1.0
by_op = Counter()
for r in body:
    op = r[src].strip().split()[0] if r[src].strip() else "?"
    if op.startswith("@"):
        op = r[src].strip().split()[1]
    by_op[op.split(".")[0]] += num(r[samp])
print("stall samples by opcode:", ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_op.most_common(14)))
reasons = Counter()
for h in stall_cols:
    reasons[h] = sum(num(r[col[h]]) for r in body)
if reasons:
    print("by reason:", ", ".join(f"{k} {v:.0f}" for k, v in reasons.most_common(10) if v > 0))
    own = {k: v for k, v in reasons.items() if "Not Issued" not in k}
    tot = sum(own.values()) or 1.0
    print("by reason, share:", ", ".join(f"{k[6:] if k.startswith('stall_') else k} {100 * v / tot:.1f}%"
                                         for k, v in sorted(own.items(), key=lambda x: -x[1])[:10] if v > 0))
ex = col.get("Instructions Executed")
if ex is not None:
    mix = Counter()
    for r in body:
        words = r[src].strip().split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if words:
            mix[words[0].split(".")[0]] += num(r[ex])
    n_ex = sum(mix.values()) or 1.0
    print(f"executed warp instructions {n_ex:.3g}:", ", ".join(f"{k} {100 * v / n_ex:.1f}%" for k, v in mix.most_common(12)))
order = sorted(range(len(body)), key=lambda i: -num(body[i][samp]))[:top_n]
for i in order:
    r = body[i]
    why = sorted(((num(r[col[h]]), h) for h in stall_cols), reverse=True)[:3]
    ctx = " | ".join(body[j][src].strip()[:34] for j in range(max(0, i - 2), i))
    print(f"{100 * num(r[samp]) / total:5.1f}% #{i:5d} {r[src].strip()[:60]:60s} {', '.join(f'{h} {v:.0f}' for v, h in why if v > 0)}  <- {ctx}")
