#!/usr/bin/env python3
"""Prints one compact block per kernel launch of an ncu report's raw page (ncu -i REP --page raw --csv):
duration, throughputs (SM, memory, DRAM), tensor-pipe and issue-slot use, shared-memory bank conflicts and
the largest warp-stall reasons (warps stalled per issued instruction). Used by scripts/dev-cycle.sh NCU=1."""
import csv
import sys


def num(s):
    try:
        return float(s.replace(",", ""))
    except (ValueError, AttributeError):
        return None


rows = list(csv.reader(sys.stdin))
if len(rows) < 3:
    sys.exit("ncu-table: no launches in the report")
head, units, data = rows[0], rows[1], rows[2:]
col = {h: i for i, h in enumerate(head)}


def get(r, name):
    i = col.get(name)
    return num(r[i]) if i is not None and i < len(r) else None


def fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


stalls = [h for h in head if h.startswith("smsp__average_warps_issue_stalled_") and h.endswith("_per_issue_active.ratio")]
for r in data:
    name = r[col["Kernel Name"]] if "Kernel Name" in col else "?"
    dur = get(r, "gpu__time_duration.sum")
    unit = units[col["gpu__time_duration.sum"]] if "gpu__time_duration.sum" in col else ""
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}.get(unit)
    us = dur * scale if dur is not None and scale is not None else None
    print(f"{name[:40]:40s} {fmt(us, '.0f')} us  grid {r[col['Grid Size']] if 'Grid Size' in col else '?'}  "
          f"regs {fmt(get(r, 'launch__registers_per_thread'), '.0f')}")
    print(f"    SM {fmt(get(r, 'sm__throughput.avg.pct_of_peak_sustained_elapsed'))}%  "
          f"mem {fmt(get(r, 'gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed'))}%  "
          f"DRAM {fmt(get(r, 'dram__throughput.avg.pct_of_peak_sustained_elapsed') or get(r, 'dram__cycles_active.avg.pct_of_peak_sustained_elapsed'))}%  "
          f"tensor {fmt(get(r, 'sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active'))}%  "
          f"issue {fmt(get(r, 'smsp__issue_active.avg.pct_of_peak_sustained_active'))}%  "
          f"warps/sched {fmt(get(r, 'smsp__warps_active.avg.per_cycle_active'), '.2f')}  "
          f"smem wavefronts {fmt(get(r, 'l1tex__data_pipe_lsu_wavefronts_mem_shared.sum'), '.3g')} "
          f"conflicts {fmt(get(r, 'l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum'), '.3g')}")
    dr, dw, l2 = get(r, "dram__bytes_read.sum"), get(r, "dram__bytes_write.sum"), get(r, "lts__t_bytes.sum")
    if dr is not None or l2 is not None:
        def mb(name, v):
            u = units[col[name]] if name in col else ""
            f = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}.get(u)
            return "-" if v is None or f is None else f"{v * f:.1f}"
        print(f"    DRAM read {mb('dram__bytes_read.sum', dr)} MB, written {mb('dram__bytes_write.sum', dw)} MB; "
              f"L2 {mb('lts__t_bytes.sum', l2)} MB ({fmt(get(r, 'lts__throughput.avg.pct_of_peak_sustained_elapsed'))}% of peak)")
    top = sorted(((get(r, h) or 0.0, h) for h in stalls), reverse=True)[:6]
    print("    stalls/issue: " + ", ".join(
        f"{h[len('smsp__average_warps_issue_stalled_'):-len('_per_issue_active.ratio')]} {v:.2f}" for v, h in top if v > 0))
