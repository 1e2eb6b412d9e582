"""Shared helpers for the GPU benchmark scripts: environment record, timing, tables, JSON.

Every script: ``python benchmarks/<name>.py --out DIR``; it checks correctness first, times with
``triton.testing.do_bench`` (median, rotating inputs where the cache would flatter), prints a
table last and writes ``DIR/<name>.json``. A failing variant is recorded with its error and the
script goes on.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import traceback

RESULTS_CSV = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.csv")
RESULT_FIELDS = ("date", "gpu", "torch", "triton", "torchao", "transformers", "workload", "shape", "variant",
                 "metric", "value", "anchor", "ratio")


def env_info() -> dict:
    import torch
    info = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "python": platform.python_version()}
    try:
        import triton
        info["triton"] = triton.__version__
    except Exception as e:  # pragma: no cover - depends on the machine
        info["triton"] = f"unavailable ({e})"
    try:
        import torchao
        info["torchao"] = torchao.__version__
    except Exception:
        info["torchao"] = None
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except Exception:
        info["transformers"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    else:
        info["gpu"] = None
    return info


def parse_args(description: str, extra=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON results")
    p.add_argument("--quick", action="store_true", help="fewer shapes / repetitions")
    if extra:
        extra(p)
    return p.parse_args()


def bench_ms(fn, warmup: int = 25, rep: int = 100) -> float:
    """Median time in ms of ``fn()`` (CUDA events through triton's do_bench)."""
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def graph_ms(fns, rounds: int = 4, generators=()) -> float:
    """ms per call of ``fns`` (one callable per rotating input copy, so no call finds its inputs in
    L2): each is called once (compiled, autotuned), then a CUDA graph of ``rounds`` passes through
    all of them is replayed under do_bench; its median over ``rounds * len(fns)`` calls.
    ``generators``: the CUDA generators the calls draw from other than the default one (registered
    with the graph, as capture requires)."""
    import torch
    for f in fns:
        f()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    for g in generators:
        graph.register_generator_state(g)
    with torch.cuda.graph(graph):
        for _ in range(rounds):
            for f in fns:
                f()
    ms = bench_ms(graph.replay) / (rounds * len(fns))
    del graph
    return ms


def kernel_profile(fn, calls: int = 20):
    """GPU time of what ``fn()`` runs on the device, from ``torch.profiler`` (CUDA activity only):
    ``fn`` is called once (compiled), then ``calls`` times under the profiler. Returns
    ``{"ms": device ms per call (kernels, memsets and copies summed), "launches": device
    activities per call, "kernels": {name: ms per call}}``, or None when the profiler saw no device
    activity (no CUPTI; a CPU run)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, supported_activities
    if ProfilerActivity.CUDA not in supported_activities():
        return None
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    per, n = {}, 0
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            per[e.name] = per.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e3
            n += 1
    if not n:
        return None
    return {"ms": sum(per.values()) / calls, "launches": n / calls, "kernels": {k: v / calls for k, v in per.items()}}


def host_cprofile(fn, calls: int, top: int = 30) -> str:
    """cProfile of ``calls`` calls of ``fn`` (after one, and a device sync before and after): the
    Python functions by own time, then by cumulative time."""
    import cProfile
    import io
    import pstats
    import torch
    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    for key in ("tottime", "cumulative"):
        buf.write(f"---- by {key}\n")
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(top)
    return buf.getvalue()


def guarded(rows: list, name: str, fn):
    """Run ``fn()``; on error append a row naming the failure and continue."""
    try:
        return fn()
    except Exception as e:  # a benchmark variant failing must not stop the others
        traceback.print_exc()
        rows.append({"variant": name, "error": f"{type(e).__name__}: {e}"[:300]})
        return None


def print_table(rows: list, cols: list) -> None:
    """Plain aligned table of dict rows (missing keys print as '-')."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
        return "-" if v is None else str(v)
    cells = [[fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) if cells else len(c) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for x in cells:
        print("  ".join(v.ljust(w) for v, w in zip(x, widths)))


def result_row(env: dict, workload: str, shape: str, variant: str, metric: str, value: float,
               anchor: str = "", ratio=None) -> dict:
    """One measurement as a ``benchmarks/results.csv`` row: ``value`` of ``metric`` (e.g. "ms",
    "TFLOP/s", "GiB") for ``variant`` on ``workload``/``shape``; ``anchor`` names what ``ratio``
    compares against, measured in the same run (e.g. "bf16", "cuBLAS _scaled_mm")."""
    row = {k: env.get(k) or "" for k in ("date", "gpu", "torch", "triton", "torchao", "transformers")}
    row.update(workload=workload, shape=shape, variant=variant, metric=metric, value=f"{value:.6g}",
               anchor=anchor, ratio="" if ratio is None else f"{ratio:.4g}")
    return row


def append_results(rows: list, out_dir: str, path: str = RESULTS_CSV) -> str:
    """Append ``result_row`` dicts to ``results.csv`` (header written when the file is new) in
    ``out_dir`` (what a device call brings back; ``path``, the repo's file, when run locally)."""
    target = os.path.join(out_dir, "results.csv") if out_dir else path
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    new = not os.path.exists(target)
    with open(target, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RESULT_FIELDS)
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in RESULT_FIELDS})
    return target


def write_json(out_dir: str, name: str, payload: dict) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, default=str)
    return path


def lowbit_kernels(cast=None, gemm_fp8=None, gemm_fp4=None):
    """The Triton kernels of a lowbit backend (``TritonKernels``: ``scaled_mm``, ``plan``, the four
    families) built from tuning overrides, e.g. ``lowbit_kernels(gemm_fp8=dict(kernel="pointer"))``;
    no overrides: the default backend's own (its plans and autotuners)."""
    from lowbit.kernels.triton import TRITON_BACKEND, make_backend
    from lowbit.kernels.triton.cast_fp8 import CAST_TUNING
    from lowbit.kernels.triton.gemm_fp4 import GEMM_FP4_TUNING
    from lowbit.kernels.triton.gemm_fp8 import GEMM_FP8_TUNING
    if not (cast or gemm_fp8 or gemm_fp4):
        return TRITON_BACKEND.plan.__self__
    be = make_backend(cast_tuning=CAST_TUNING.override(**(cast or {})),
                      gemm_fp8_tuning=GEMM_FP8_TUNING.override(**(gemm_fp8 or {})),
                      gemm_fp4_tuning=GEMM_FP4_TUNING.override(**(gemm_fp4 or {})))
    return be.plan.__self__
