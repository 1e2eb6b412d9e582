"""Pool demo runs (``demo_gpu_runs*.jsonl`` lines written by ``benchmarks/demo_gpu.py``) and give each
format's final-loss gap to bf16 over the seeds, paired by seed.

    python benchmarks/demo_gaps.py FILE.jsonl [FILE.jsonl ...] [--tag NAME=FILE ...]

For a format run from seed ``s`` the baseline is the mean final loss of every bf16 run of seed ``s``
in the given files (GPU training is not bit-reproducible, so reruns of one seed differ; averaging
them lowers the baseline's noise). Per seed: ``d_s = 100 (final_s - base_s) / base_s``; reported:
the gap of the means ``100 (mean final - mean base) / mean base`` (what ``lowbit demo`` prints),
the mean of ``d_s`` with its standard error ``std(d) / sqrt(n)``, n, and the mean gap over the
first 10 steps (the cold start). A file's runs can be kept apart with ``--tag name=file`` (the
format is then reported as ``format@name``, e.g. to compare code versions). ``--png PATH``: the
mean loss curve of each format over its seeds (bf16: over every bf16 run), through
``lowbit.demo.report.plot``, labelled with the gap of the means.
"""
from __future__ import annotations

import argparse
import json
import statistics as st
from collections import defaultdict


def load(paths, tags):
    rows = []
    for p in paths:
        tag = tags.get(p)
        with open(p) as fh:
            for line in fh:
                r = json.loads(line)
                if r.get("error") or r.get("final_loss") is None:
                    continue
                if tag and r["format"] != "bf16":
                    r["format"] = f"{r['format']}@{tag}"
                rows.append(r)
    return rows


def gaps(rows):
    base = defaultdict(list)
    base_curve = defaultdict(list)
    for r in rows:
        if r["format"] == "bf16":
            base[r["seed"]].append(r["final_loss"])
            base_curve[r["seed"]].append(st.mean(r["losses"][:10]))
    by_fmt = defaultdict(list)
    for r in rows:
        if r["format"] != "bf16" and r["seed"] in base:
            by_fmt[r["format"]].append(r)
    out = []
    for fmt, rs in sorted(by_fmt.items()):
        b = [st.mean(base[r["seed"]]) for r in rs]
        f = [r["final_loss"] for r in rs]
        d = [100 * (x - y) / y for x, y in zip(f, b)]
        d10 = [100 * (st.mean(r["losses"][:10]) - st.mean(base_curve[r["seed"]])) / st.mean(base_curve[r["seed"]])
               for r in rs]
        se = st.stdev(d) / len(d) ** 0.5 if len(d) > 1 else None
        out.append({"format": fmt, "n": len(d), "seeds": sorted(r["seed"] for r in rs),
                    "gap_of_means_pct": 100 * (st.mean(f) - st.mean(b)) / st.mean(b),
                    "mean_gap_pct": st.mean(d), "se_pct": se, "per_seed_pct": [round(v, 2) for v in d],
                    "first10_gap_pct": st.mean(d10)})
    return out


def plot_means(rows, res, path):
    """Mean loss curve per format (labels carry ``gap_of_means_pct``) -> PNG at ``path``."""
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from lowbit.demo.report import plot
    curves = defaultdict(list)
    for r in rows:
        curves[r["format"]].append(r["losses"])
    gap = {r["format"]: r["gap_of_means_pct"] for r in res}
    runs = [{"format": f"{f} (n={len(c)})", "losses": [st.mean(v) for v in zip(*c)], "gap_pct": gap.get(f)}
            for f, c in sorted(curves.items(), key=lambda kv: kv[0] != "bf16")]
    return plot({"runs": runs, "config": {"size": "50m", "device": "H200"}}, path)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("files", nargs="*")
    p.add_argument("--tag", action="append", default=[], help="name=file: keep that file's formats apart")
    p.add_argument("--png", help="write the mean loss curves here")
    a = p.parse_args()
    tags = {v.split("=", 1)[1]: v.split("=", 1)[0] for v in a.tag}
    rows = load(list(a.files) + [f for f in tags if f not in a.files], tags)
    res = gaps(rows)
    if a.png:
        print("wrote", a.png, "with", plot_means(rows, res, a.png))
    print(f"{'format':<24}{'n':>3}{'gap of means':>14}{'mean gap':>10}{'+- SE':>8}{'first 10 steps':>16}  per seed (%)")
    for r in res:
        se = "-" if r["se_pct"] is None else f"{r['se_pct']:.2f}"
        print(f"{r['format']:<24}{r['n']:>3}{r['gap_of_means_pct']:>+13.2f}%{r['mean_gap_pct']:>+9.2f}%{se:>8}"
              f"{r['first10_gap_pct']:>+15.2f}%  {r['per_seed_pct']}")


if __name__ == "__main__":
    main()
