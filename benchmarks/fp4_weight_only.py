"""Weight-only FP4 GEMM benchmark (H200): bf16 activations x NVFP4 / MXFP4 weight vs bf16 ``torch.mm``.

    python benchmarks/fp4_weight_only.py --out DIR [--quick] [--budget SECONDS]

Correctness first, on the GPU: every variant's output (poisoned with NaN beforehand, so an element
never written shows) is checked elementwise against float64 of the dequantized weight times the
activations, within ``gamma_(K+3) |X||W| + u_bf16 |ref|`` (fp32 accumulation, bf16 output), and
the normwise relative error is recorded, and the tile counters must be zero afterwards. A variant failing its
check is reported and not timed.

Timing: the calls are captured in a CUDA graph cycling through several weight copies (>= 200 MB in
all: no call finds its weight in the 50 MB L2), replayed under ``do_bench`` (median), divided by
the calls: GPU time without host overhead, for bf16 ``torch.mm`` (the anchor, same run) and lowbit
alike. ``GB/s`` = bytes of the FP4 weight (codes + scales) / time; ratio = bf16 time / lowbit time.
``kern_ms``: the same calls' device time by torch.profiler (the kernels alone: graph time minus it is
what launches cost).

Rows: M in {1, 16, 64, 128} at N = K = 8192 (autotuned, and A/B variants: see ``_v`` for the
names: tiles, warps, stages, split-K, the scales' prefetch), 16x14336x4096 and
16x4096x14336; NV with 16x16 weight blocks (the NV() default), then NV 1x16 and MX 1x32 at M = 16.
Two probes at M = 16 (results checked like the others): ``| probe: L2-resident weight`` (the same
calls on one weight copy) and ``BLOCK_M32 probe`` (twice the MMA work, the same decode). A time
budget (default 150 s) skips what is left, saying so (~1-1.5 min on an H200; compiles dominate). ``--cpu-smoke`` runs the script under TRITON_INTERPRET=1 on tiny shapes.
Prints the chosen autotune configurations and the table last; JSON to DIR/fp4_weight_only.json.
"""
from __future__ import annotations

import itertools
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from benchmarks.common import append_results, env_info, guarded, kernel_profile, parse_args, print_table, \
    result_row, write_json  # noqa: E402
from benchmarks.common import graph_ms as common_graph_ms  # noqa: E402

ROTATE_BYTES = 200e6
U_BF16 = 2.0 ** -8
DEV = "cuda"  # "cpu" only for --cpu-smoke (TRITON_INTERPRET=1, tiny shapes, timings meaningless)


def _v(bn, bk, split, warps, stages, pipe=True, bm=None, l2=False, probe=False, maxnreg=None):
    """(row name, config) of one A/B variant (``FP4Gemm._with_config``). Names: ``BLOCK_NxBLOCK_K
    wWARPS sSTAGES splitS`` then ``hand-prefetch`` (PIPE_SCALES off), ``BLOCK_M64`` etc.,
    ``maxnreg``: a register cap (default 128 at >= 256 rows; ``maxnreg=0``: none, named
    ``maxnregoff``); ``BLOCK_M32 probe`` (``probe``: MMA N = 32 at M = 16, the same HGMMA count and
    decode, twice the MMA work: if the tensor-core chains bound the kernel it is ~1.5x slower, if
    the decode does ~1x). ``l2``: also time it with one weight copy (an L2-resident probe: how
    much of the time is HBM)."""
    cfg = dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=warps, num_stages=stages)
    if not pipe:
        cfg["PIPE_SCALES"] = False
    if bm:
        cfg["BLOCK_M"] = bm
    if maxnreg or (maxnreg is None and bn >= 256):
        cfg["maxnreg"] = maxnreg or 128  # 256 rows: 2 CTAs a SM at 8 warps (as the autotuned configuration)
    name = f"{bn}x{bk} w{warps} s{stages} split{split}" + ("" if pipe else " hand-prefetch") + \
        (f" BLOCK_M{bm}" if bm else "") + (f" maxnreg{maxnreg or 'off'}" if maxnreg is not None else "") + \
        (" probe" if probe else "")
    return name, cfg, l2


# A/B at M = 16, N = K = 8192 (NV 16x16)
AB_M16 = [_v(256, 128, 8, 8, 3, l2=True), _v(256, 128, 8, 8, 4), _v(128, 128, 8, 4, 4), _v(256, 128, 8, 8, 3, bm=32, probe=True),
          _v(128, 128, 4, 8, 4), _v(64, 128, 4, 4, 4), _v(256, 64, 8, 4, 4, l2=True), _v(256, 64, 8, 4, 4, maxnreg=0),
          _v(256, 128, 8, 8, 3, pipe=False)]
AB_M1 = [_v(256, 128, 8, 8, 3), _v(256, 64, 8, 4, 4)]
AB_SMALL = [_v(256, 128, 8, 8, 3), _v(256, 64, 8, 4, 4)]
AB_M = {64: [_v(128, 128, 4, 8, 3, bm=64)], 128: [_v(128, 128, 2, 8, 3, bm=128)]}


def _weights(N, K, recipe, n):
    from lowbit.dtypes import FP4Tensor
    g = torch.Generator(device=DEV).manual_seed(2)
    ws = [(torch.randn(N, K, device=DEV, generator=g) * 0.02).to(torch.bfloat16) for _ in range(n)]
    return ws, [FP4Tensor.from_float(w, recipe, "weight").t() for w in ws]


def _fp4_bytes(b):
    return b._qdata.numel() + b._scale.numel()


def check(x, b, ref, bound, fn):
    """(ok, rel_err, note): output poisoned with NaN first (the launcher's torch.empty reuses the
    freed block), then elementwise within the bound."""
    M, N = x.shape[0], b.shape[1]
    poison = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device=DEV)
    del poison
    out = fn()
    if DEV == "cuda":
        torch.cuda.synchronize()
    err = (out.double() - ref).abs()
    finite = bool(torch.isfinite(out).all())
    within = bool((err <= bound).all())
    rel = float((out.double() - ref).norm() / ref.norm())
    note = "" if finite and within else f"FAILED: finite={finite} within_bound={within} max err/bound=" \
        f"{float((err / bound.clamp_min(1e-300)).max()):.3g}"
    return finite and within, rel, note


def graph_ms(fns):
    if DEV != "cuda":
        t = time.perf_counter()
        fns[0]()
        return (time.perf_counter() - t) * 1e3
    return common_graph_ms(fns)


def kern_ms(fns):
    """Device time per call (torch.profiler: the kernels alone, no launch gaps), cycling through the
    weight copies as the graph does; None without CUPTI or on the CPU."""
    if DEV != "cuda":
        return None
    it = itertools.cycle(fns)
    prof = kernel_profile(lambda: next(it)(), calls=2 * len(fns))
    return prof["ms"] if prof else None


class Run:
    def __init__(self, budget):
        self.t0, self.budget, self.rows = time.time(), budget, []

    def left(self):
        return self.budget - (time.time() - self.t0)


def bench_shape(run, M, N, K, kinds, variants):
    from benchmarks.common import lowbit_kernels
    from lowbit.scaling import MX, NV
    k = lowbit_kernels()

    shape = f"{M}x{N}x{K}"
    g = torch.Generator(device=DEV).manual_seed(1)
    x = torch.randn(M, K, device=DEV, generator=g).to(torch.bfloat16)
    n_bf16 = max(2, math.ceil(ROTATE_BYTES / (N * K * 2))) if DEV == "cuda" else 1
    ws = [(torch.randn(N, K, device=DEV, generator=g) * 0.02).to(torch.bfloat16) for _ in range(n_bf16)]
    bf16_ms = graph_ms([lambda w=w: torch.mm(x, w.t()) for w in ws])
    run.rows.append(dict(shape=shape, kind="bf16", variant="cuBLAS torch.mm", ms=bf16_ms,
                         gbps=N * K * 2 / bf16_ms / 1e6, kern_ms=kern_ms([lambda w=w: torch.mm(x, w.t()) for w in ws])))
    del ws
    recipes = {"nvfp4 16x16": NV(), "nvfp4 1x16": NV(weight_2d=False), "mxfp4 1x32": MX(elem="e2m1")}
    for kind in kinds:
        if run.left() <= 0:
            run.rows.append(dict(shape=shape, kind=kind, note="skipped: time budget"))
            continue
        b0 = None
        n_fp4 = max(2, math.ceil(ROTATE_BYTES / (N * K * 0.5625))) if DEV == "cuda" else 1
        _, bs = _weights(N, K, recipes[kind], n_fp4)
        b0 = bs[0]
        W = b0.dequantize(torch.float64)                      # (K, N)
        ref = x.double() @ W
        gam = (K + 3) * 2.0 ** -24 / (1 - (K + 3) * 2.0 ** -24)
        bound = gam * (x.double().abs() @ W.abs()) * (1 + U_BF16) + U_BF16 * ref.abs()
        wbytes = _fp4_bytes(b0)
        outs = {}
        for name, cfg, l2 in [("autotuned", None, False)] + variants:
            if run.left() <= 0:
                run.rows.append(dict(shape=shape, kind=kind, variant=name, note="skipped: time budget"))
                continue

            def one(name=name, cfg=cfg, l2=l2):
                call = (lambda b: k.scaled_mm(x, b, torch.bfloat16)) if cfg is None else \
                    (lambda b: k.fp4_gemm._with_config(x, b, torch.bfloat16, None, dict(BLOCK_M=16, **cfg)))
                ok, rel, note = check(x, b0, ref, bound, lambda: call(b0))
                outs[name] = call(b0)
                row = dict(shape=shape, kind=kind, variant=name, err_f64=rel, note=note,
                           config=cfg or k.fp4_gemm.last_config())
                if ok:
                    ms = graph_ms([lambda b=b: call(b) for b in bs])
                    row.update(ms=ms, gbps=wbytes / ms / 1e6, anchor_ms=bf16_ms, ratio=bf16_ms / ms,
                               kern_ms=kern_ms([lambda b=b: call(b) for b in bs]))
                run.rows.append(row)
                if ok and l2:  # probe: the same calls on ONE weight copy (36 MB: mostly L2 hits)
                    ms = graph_ms([lambda: call(b0)])
                    run.rows.append(dict(shape=shape, kind=kind, variant=f"{name} | probe: L2-resident weight",
                                         ms=ms, gbps=wbytes / ms / 1e6, ratio=bf16_ms / ms, config=row["config"]))
            guarded(run.rows, f"{shape} {kind} {name}", one)
        if DEV == "cuda":
            torch.cuda.synchronize()
        run.rows.append(dict(shape=shape, kind=kind, variant="check: tile counters zero after",
                             note=str(all(int(v.abs().sum()) == 0 for v in k.fp4_gemm.counters.buffers.values()))))
        bs = b0 = W = ref = bound = outs = None
        if DEV == "cuda":
            torch.cuda.empty_cache()


def main():
    def extra(p):
        p.add_argument("--budget", type=float, default=150.0, help="seconds; what is left is skipped")
        p.add_argument("--cpu-smoke", action="store_true", help="exercise this script on the CPU under "
                       "TRITON_INTERPRET=1 with tiny shapes (checks the script, measures nothing)")
    args = parse_args(__doc__.splitlines()[0], extra)
    info = env_info()
    global DEV
    if args.cpu_smoke:
        DEV = "cpu"
    elif not torch.cuda.is_available():
        print("benchmarks/fp4_weight_only.py needs a CUDA GPU; none found (nothing was measured).")
        write_json(args.out, "fp4_weight_only", {"env": info, "error": "no CUDA GPU"})
        return
    run = Run(args.budget)
    nv = ["nvfp4 16x16"]
    plan = [((16, 8192, 8192), nv, AB_M16), ((1, 8192, 8192), nv, AB_M1),
            ((64, 8192, 8192), nv, AB_M[64]), ((128, 8192, 8192), nv, AB_M[128]),
            ((16, 14336, 4096), nv, AB_SMALL), ((16, 4096, 14336), nv, AB_SMALL),
            ((16, 8192, 8192), ["nvfp4 1x16", "mxfp4 1x32"], AB_SMALL)]  # in order of importance
    if args.quick:
        plan = [((16, 8192, 8192), nv, AB_M16[:4])]
    if args.cpu_smoke:
        plan = [((16, 128, 1024), nv + ["mxfp4 1x32"], AB_M16[:3] + AB_M16[-1:]),
                ((3, 64, 256), nv, AB_SMALL[:1])]
    for (M, N, K), kinds, variants in plan:
        if run.left() <= 0:
            run.rows.append(dict(shape=f"{M}x{N}x{K}", note="skipped: time budget"))
            continue
        guarded(run.rows, f"{M}x{N}x{K}", lambda: bench_shape(run, M, N, K, kinds, variants))
    from benchmarks.common import lowbit_kernels
    payload = dict(env=info, rows=run.rows, configs=lowbit_kernels().fp4_gemm.last_config(), wall_s=time.time() - run.t0)
    path = write_json(args.out, "fp4_weight_only", payload)
    append_results([result_row(info, "fp4_weight_only", r["shape"], f"{r.get('kind')} {r['variant']}", "ms", r["ms"],
                               "cuBLAS bf16 torch.mm" if r.get("ratio") is not None else "", r.get("ratio"))
                    for r in run.rows if r.get("ms") and r.get("shape")], args.out)
    print("\nenv:", {k: info.get(k) for k in ("gpu", "torch", "triton", "date")})
    print("\nautotuned configurations (tuning key -> config):")
    for k, v in payload["configs"].items():
        print(f"  {k}: {v}")
    print(f"\nJSON: {path}   wall: {payload['wall_s']:.0f} s\n")
    shown = [{**r, "error": r["error"][:90]} if "error" in r else r for r in run.rows]
    print_table(shown, ["shape", "kind", "variant", "ms", "kern_ms", "gbps", "ratio", "err_f64", "note", "error"])


if __name__ == "__main__":
    main()
