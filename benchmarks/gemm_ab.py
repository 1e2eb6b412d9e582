"""Interleaved A/B timing of the warp-specialized FP8 GEMM configurations against cuBLAS (H200).

    python benchmarks/gemm_ab.py --out DIR [--configs A,B,..] [--modes M1,M2] [--shapes MxNxK,..] [--rounds R] [--bias]
                                 [--graph] [--name NAME]

Why: on the lease machine the clock drifts within a run (the same kernel timed a minute apart moves
by several percent), so configurations timed one after the other cannot be told apart at the 1-3%
level. Here every round times every variant once (``do_bench`` median, ~40 ms of calls), the
order rotating each round (``--graph``: a CUDA graph of 8 calls replayed, which removes the host's
launch cost: lowbit's Python launch, ~0.12-0.15 ms, is more than a 4096^3 GEMM takes on the GPU);
a variant's figure is the median of its per-round times, and its ratio
is the median over rounds of (anchor time / its time) in the same round, which cancels the drift.
Anchors: cuBLAS ``torch._scaled_mm`` precise (tensorwise, rowwise), cuBLAS blockwise 1x128 x 128x128
(``benchmarks/gemm.py``'s probe), bf16 ``torch.mm`` of the dequantized operands for blockwise_cols
(wgrad's 1x128 x 128x1, which no cuBLAS call here takes) and for blockwise shapes cuBLAS declines.
Every Gluon variant is first checked bit for bit against the first configuration's output (the
configurations differ in schedule only) and its relative Frobenius distance to the anchor's
output on the same codes is recorded (the same promotion interval: ~1e-5 or less; against bf16:
~3e-3). Table last; JSON to DIR/NAME.json (default gemm_ab).
"""
from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from benchmarks.common import append_results, bench_ms, env_info, graph_ms, guarded, parse_args, print_table, \
    result_row, write_json  # noqa: E402

CONFIGS = ("ws_s3_g16_eo", "ws_s3")
MODES = ("tensorwise", "rowwise", "blockwise")
SHAPES = ((8192, 8192, 8192), (16384, 14336, 4096), (4096, 4096, 4096))


def operands(mode, M, N, K, seed, device="cuda"):
    """FP8 operands of a mode's GEMM (blockwise_cols, wgrad's: B quantized 1x128 along K like A,
    i.e. 128x1 blocks of (K, N))."""
    from lowbit.dtypes import FP8Tensor
    from lowbit.scaling import Blockwise, Current, Rowwise
    recipe = {"tensorwise": Current(), "rowwise": Rowwise(), "blockwise": Blockwise(), "blockwise_cols": Blockwise()}[mode]
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K, device=device, generator=g)
    w = torch.randn(N, K, device=device, generator=g) * 0.05
    a = FP8Tensor.from_float(x, recipe, "input")
    b = FP8Tensor.from_float(w, recipe, "input" if mode == "blockwise_cols" else "weight").t()
    return a, b


def ws_variant(name):
    """``fn(a, b, bias)`` of the warp-specialized kernel in configuration ``name`` (``WS_CONFIGS``)
    for every output size and mode, through a backend of its own."""
    from benchmarks.common import lowbit_kernels
    from lowbit.kernels.triton.gemm_fp8 import WS_CONFIGS
    c = WS_CONFIGS[name]
    k = lowbit_kernels(gemm_fp8=dict(kernel="ws", ws_small=c, ws_small_blockwise=c, ws_large_scaled=c,
                                     ws_large_blockwise=c, ws_large_cols=c))
    return lambda a, b, bias: k.scaled_mm(a, b, torch.bfloat16, bias)


def variants(mode, a, b, configs, bias=None):
    """[(name, fn)] with the anchor first (``bias``: tensorwise and rowwise only, every variant)."""
    from benchmarks.gemm import blockwise_anchor
    bf = torch.bfloat16
    out = None
    if mode == "blockwise":
        bias = None  # the blockwise anchor takes none
        try:
            factory, label = blockwise_anchor(a, b)
            out = [(f"cuBLAS blockwise ({label})", factory(a, b))]
        except RuntimeError:  # a shape cuBLAS takes no blockwise layout for: the bf16 anchor below
            pass
    if mode.startswith("blockwise") and out is None:  # bf16 torch.mm of the dequantized operands
        bias = None
        xa, xb = a.dequantize(bf), b.dequantize(bf)
        out = [("bf16 torch.mm", lambda: torch.mm(xa, xb))]
    if out is None:
        out = [("cuBLAS precise", lambda: torch._scaled_mm(a._data, b._data, a._scale, b._scale, bias=bias,
                                                           out_dtype=bf))]
    return out + [(f"gluon {c}", lambda f=ws_variant(c): f(a, b, bias)) for c in configs]


def ab_shape(rows, M, N, K, mode, configs, rounds, with_bias=False, graph=False):
    shape = f"{M}x{N}x{K}" + (" +bias" if with_bias else "")
    a, b = operands(mode, M, N, K, seed=7)
    bias = torch.randn(N, device="cuda").to(torch.bfloat16) if with_bias else None
    vs = variants(mode, a, b, configs, bias)
    ref = anchor_out = None
    for name, fn in vs:  # compile, and the checks of the Gluon variants
        out = fn()
        torch.cuda.synchronize()
        if anchor_out is None:
            anchor_out = out.double()
        elif ref is None:
            ref = out
        else:
            rows.append(dict(shape=shape, mode=mode, variant=f"check: {name} == {vs[1][0]} (bitwise)",
                             note=str(torch.equal(out, ref))))
        if name.startswith("gluon"):
            rel = float((out.double() - anchor_out).norm() / anchor_out.norm())
            rows.append(dict(shape=shape, mode=mode, variant=f"check: {name} vs the anchor (rel. Frobenius)",
                             note=f"{rel:.3g}"))
    times = {name: [] for name, _ in vs}
    for r in range(rounds):
        k = r % len(vs)
        for name, fn in vs[k:] + vs[:k]:
            times[name].append(graph_ms([fn], rounds=8) if graph else bench_ms(fn, warmup=5, rep=40))
    anchor = vs[0][0]
    flops = 2.0 * M * N * K
    for name, _ in vs:
        ms = statistics.median(times[name])
        ratio = statistics.median(ta / t for ta, t in zip(times[anchor], times[name]))
        rows.append(dict(shape=shape, mode=mode, variant=name, ms=ms, tflops=flops / (ms * 1e-3) / 1e12,
                         ratio=ratio, spread=(max(times[name]) - min(times[name])) / ms, rounds=rounds,
                         timing="graph" if graph else "do_bench"))


def main():
    def extra(p):
        p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated WS_CONFIGS names (lowbit.kernels.triton.gemm_fp8)")
        p.add_argument("--modes", default=",".join(MODES))
        p.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES))
        p.add_argument("--rounds", type=int, default=7)
        p.add_argument("--name", default="gemm_ab", help="the JSON's file name (two runs in one call)")
        p.add_argument("--bias", action="store_true", help="a bf16 bias in every call (the bitwise checks cover it)")
        p.add_argument("--graph", action="store_true", help="time each call by CUDA-graph replay (8 calls a graph: "
                       "no host launch cost, operands warm in L2 as in do_bench's back-to-back calls)")
    args = parse_args(__doc__.splitlines()[0], extra)
    info = env_info()
    if not torch.cuda.is_available():
        print("benchmarks/gemm_ab.py needs a CUDA GPU; none found (nothing was measured).")
        write_json(args.out, "gemm_ab", {"env": info, "error": "no CUDA GPU"})
        return
    rows, t0 = [], time.time()
    configs = [c for c in args.configs.split(",") if c]
    for shape in args.shapes.split(","):
        M, N, K = map(int, shape.split("x"))
        for mode in args.modes.split(","):
            guarded(rows, f"{shape} {mode}", lambda: ab_shape(rows, M, N, K, mode, configs, args.rounds, args.bias,
                                                                 args.graph))
            print(f"  {shape} {mode} done ({time.time() - t0:.0f} s)", flush=True)
    path = write_json(args.out, args.name, dict(env=info, rows=rows, wall_s=time.time() - t0))
    append_results([result_row(info, f"gemm_ab {r['mode']}", r["shape"], r["variant"], "ms", r["ms"], "first variant of the round",
                               r.get("ratio")) for r in rows if "ms" in r], args.out)
    print("\nenv:", {k: info.get(k) for k in ("gpu", "torch", "triton", "date")}, f"\nJSON: {path}\n")
    print_table(rows, ["shape", "mode", "variant", "ms", "tflops", "ratio", "spread", "note", "error"])


if __name__ == "__main__":
    main()
