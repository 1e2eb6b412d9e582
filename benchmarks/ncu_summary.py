"""Summaries of Nsight Compute CSV exports (runs on the CPU, on files fetched from the GPU machine).

    python benchmarks/ncu_summary.py --raw RAW.csv       # ncu -i REP --csv --page raw
    python benchmarks/ncu_summary.py --source SRC.csv    # ncu -i REP --csv --page source --print-source sass

``--raw``: per kernel, the metrics that placed lowbit's GEMMs against cuBLAS (duration, SM clock,
tensor-pipe activity, L2 sectors and throughput, L2 hit rate, DRAM reads, cluster size).
``--source``: per kernel, the warp-stall samples grouped by what the sampled instruction is
(``CATEGORIES``, first match wins, on its opcode and the 12 instructions before it), then the
instructions with the most samples. Parked warps (the producer warp group's three unused warps wait
at a barrier on a ``NOP``) are their own category, so the rest reads as the working warps' time.
"""
from __future__ import annotations

import argparse
import collections
import csv
import re

RAW_METRICS = (
    ("gpu__time_duration.sum", "time"),
    ("sm__cycles_elapsed.avg.per_second", "SM clock"),
    ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe % (SM active)"),
    ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed", "tensor pipe % (elapsed)"),
    ("lts__t_sectors_srcunit_tex.sum", "L2 sectors (SM side)"),
    ("lts__throughput.avg.pct_of_peak_sustained_elapsed", "L2 throughput %"),
    ("lts__t_sector_hit_rate.pct", "L2 hit rate %"),
    ("dram__bytes_read.sum", "DRAM read"),
    ("launch__cluster_size", "cluster size"),
    ("launch__registers_per_thread", "registers"),
)

# (category, predicate on (opcode, the 12 instructions before it)): first match wins
CATEGORIES = (
    ("parked warps", lambda op, before: op == "NOP" and "BAR.SYNC" in before),
    ("mbarrier wait (data or slot)", lambda op, before: op == "BRA" and "TRYWAIT" in before),
    ("wgmma wait", lambda op, before: op.startswith("WARPGROUP.DEPBAR")),
    ("wgmma issue", lambda op, before: op.startswith(("QGMMA", "HGMMA", "WARPGROUP.ARRIVE"))),
    ("fp32 math", lambda op, before: op in ("FADD", "FMUL", "FFMA")),
    ("shared loads", lambda op, before: op.startswith("LDS")),
    ("global memory", lambda op, before: op.startswith(("LDG", "STG"))),
    ("named barrier", lambda op, before: op.startswith("BAR")),
    ("other", lambda op, before: True),
)


def _opcode(sass: str) -> str:
    """The opcode of a SASS line, past its predicate (``@!P0``)."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def read_source(path: str) -> list:
    """[(kernel name, header, rows)] of a ``--page source`` CSV (one block per profiled kernel)."""
    kernels = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                kernels.append([row[1], None, []])
            elif row[0] == "Address":
                kernels[-1][1] = row
            elif kernels:
                kernels[-1][2].append(row)
    return [tuple(k) for k in kernels]


def stall_categories(header: list, rows: list) -> collections.Counter:
    """Warp-stall samples (all samples) per category of ``CATEGORIES``."""
    col = header.index("Warp Stall Sampling (All Samples)")
    out = collections.Counter()
    for i, r in enumerate(rows):
        before = " ".join(rows[j][1] for j in range(max(0, i - 12), i))
        name = next(c for c, pred in CATEGORIES if pred(_opcode(r[1].strip()), before))
        out[name] += int(r[col] or 0)
    return out


def summarize_source(path: str, top: int = 8) -> None:
    for name, header, rows in read_source(path):
        cats = stall_categories(header, rows)
        total = sum(cats.values()) or 1
        print(f"{name}: {total} samples; " + ", ".join(f"{c} {100 * v / total:.1f}%" for c, v in cats.most_common()))
        col = header.index("Warp Stall Sampling (All Samples)")
        for i in sorted(sorted(range(len(rows)), key=lambda i: -int(rows[i][col] or 0))[:top]):
            print(f"  {i:5d} {int(rows[i][col]):7d}  {rows[i][1].strip()[:70]}")


def summarize_raw(path: str) -> None:
    with open(path, newline="") as f:
        table = list(csv.reader(f))
    header, units, data = table[0], table[1], table[2:]
    names = [re.sub(r"\(.*", "", r[header.index("Kernel Name")])[:48] for r in data]
    print(f"{'metric':28s} " + " | ".join(f"{n:>24s}" for n in names))
    for metric, label in RAW_METRICS:
        if metric in header:
            j = header.index(metric)
            print(f"{label:28s} " + " | ".join(f"{r[j][:16] + ' ' + units[j][:7]:>24s}" for r in data))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--raw")
    p.add_argument("--source")
    args = p.parse_args()
    if args.raw:
        summarize_raw(args.raw)
    if args.source:
        summarize_source(args.source)


if __name__ == "__main__":
    main()
