"""GEMM benchmark (H200): lowbit's Triton GEMMs against cuBLAS measured in the same run.

    python benchmarks/gemm.py --out DIR [--quick] [--budget SECONDS]

Anchors: ``torch._scaled_mm`` tensorwise (fast accumulation off and on), rowwise, blockwise
(1x128 x 128x128 scales, if this torch/cuBLAS accepts them: the layouts tried and the outcome
are recorded), bf16 ``torch.mm``. lowbit: FP8 tensorwise (promoted every 128 K, and fast
accumulation), rowwise, blockwise, NVFP4 x NVFP4, MXFP4 x MXFP4 (both vs bf16: Hopper has no FP4
cuBLAS), weight-only FP4 (bf16 activations x NV / MX FP4 weight) for M <= 128.
Shapes M x N x K: 8192^3, 16x8192x8192, 4096^3, 16384x14336x4096, 128x8192x8192, 2048x4096x4096.

Correctness first: every output (bf16) is compared with the float64 product of the dequantized
operands (``err_f64`` = ||C - ref||_F / ||ref||_F) and with its anchor (``diff_anchor``); the FP4
PTX decode is checked bit for bit against the portable decode (``note``).
Accumulation (K = 16384, every block scaled alike so all methods multiply identical FP8 codes):
error vs float64 of the blockwise GEMM (promoted per 128-K chunk), tensorwise promoted, one long
tensor-core accumulation (fast-accum: no promotion), cuBLAS with and without fast accumulation.

Timing: ``triton.testing.do_bench`` median, L2 flushed between calls. For M <= 128 (microseconds
per call) the calls are captured in a CUDA graph that cycles through several weight copies
(>= 200 MB in all, so no call finds its weight in L2) and the replay is timed: GPU time without
Python launch overhead, for anchors and lowbit alike. TFLOP/s = 2MNK / t; ratio = anchor time /
lowbit time. Autotuning happens on first use over a focused list; the chosen configurations are
printed. A time budget (default 285 s) skips what is left, saying so. Expect 3-5 minutes on an
H200 (mostly compiling). Prints the table last; JSON to DIR/gemm.json.
"""
from __future__ import annotations

import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from benchmarks.common import append_results, bench_ms, env_info, graph_ms, guarded, parse_args, print_table, \
    result_row, write_json  # noqa: E402

# in order of importance: a run out of time budget skips the tail, saying so
SHAPES = [(8192, 8192, 8192), (16, 8192, 8192), (4096, 4096, 4096), (16384, 14336, 4096),
          (128, 8192, 8192), (2048, 4096, 4096)]
QUICK = [(8192, 8192, 8192), (16, 8192, 8192)]
ROTATE_BYTES = 200e6   # small-M timing: weight copies cycled per graph replay (H200 L2: 50 MB)
DEV = "cuda"           # "cpu" only for --cpu-smoke (TRITON_INTERPRET=1, tiny shapes, timings meaningless)


def tflops(M, N, K, ms):
    return 2.0 * M * N * K / (ms * 1e-3) / 1e12


def rel(c, ref):
    """Normwise relative difference ||c - ref||_F / ||ref||_F (float64)."""
    c, ref = c.double(), ref.double()
    return float((c - ref).norm() / ref.norm().clamp_min(1e-300))


def copies_for(weight_bytes: float, small: bool) -> int:
    return max(2, math.ceil(ROTATE_BYTES / weight_bytes)) if small and DEV == "cuda" else 1


class Run:
    def __init__(self, budget):
        self.t0 = time.time()
        self.budget = budget
        self.rows = []
        self.checked_nv = False

    def left(self):
        return self.budget - (time.time() - self.t0)

    def skip(self, shape, variant):
        if self.left() > 0:
            return False
        self.rows.append({"shape": shape, "variant": variant, "note": "skipped: time budget"})
        return True

    def measure(self, fns):
        """ms per call. One callable: do_bench. Several (one per weight copy): CUDA graph of
        4 rounds through all of them, replayed under do_bench, divided by the calls."""
        if DEV != "cuda":
            t = time.perf_counter()
            fns[0]()
            return (time.perf_counter() - t) * 1e3
        if len(fns) == 1:
            return bench_ms(fns[0])
        return graph_ms(fns)

    def add(self, shape, variant, M, N, K, fns, ref=None, anchor=None, **extra):
        """Check (first callable vs ref / anchor output), time, append a row; returns (ms, out)."""
        out = fns[0]()
        row = {"shape": shape, "variant": variant, **extra}
        if ref is not None:
            row["err_f64"] = rel(out, ref)
        if anchor is not None and anchor[2] is not None:
            row["diff_anchor"] = rel(out, anchor[2])
        ms = self.measure(fns)
        row.update(ms=ms, tflops=tflops(M, N, K, ms), timing="graph x%d" % len(fns) if len(fns) > 1 else "do_bench")
        if anchor is not None and anchor[1]:
            row.update(anchor=anchor[0], ratio=anchor[1] / ms)
        self.rows.append(row)
        return ms, out


def _empty_cache():
    if DEV == "cuda":
        torch.cuda.empty_cache()


def blockwise_anchor(a, b):
    """(factory(a, b) -> callable running cuBLAS blockwise 1x128 x 128x128 on lowbit's operands, with
    the scale layouts prepared outside the timed call; description). Raises with every attempt's
    error if this torch/cuBLAS takes none of the layouts tried."""
    def layouts(a, b):
        sa_outer = a._scale.t().contiguous().t()     # (M, K/128), outer-dim-major as cuBLAS wants
        sw = b._scale.t()                            # the weight's (N/128, K/128)
        kb = sw.shape[1]
        l4 = -(-kb // 4) * 4
        sw_pad = torch.nn.functional.pad(sw, (0, l4 - kb)) if l4 != kb else sw.contiguous()
        return sa_outer, {"sb=(K/128 pad 4, N/128) view": sw_pad.t(), "sb=(N/128, K/128)": sw.contiguous(),
                          "sb=(K/128, N/128) contiguous": sw.t().contiguous()}

    ref = a.dequantize(torch.float32) @ b.dequantize(torch.float32)
    errors = []
    try:
        import torch.nn.functional as F
        v2 = (F.scaled_mm, F.ScalingType.BlockWise1x128, F.ScalingType.BlockWise128x128)
    except Exception as e:  # noqa: BLE001
        v2 = None
        errors.append(f"F.scaled_mm: {type(e).__name__}: {e}"[:160])
    for name in layouts(a, b)[1]:
        def v1(a, b, name=name):
            sa, sbs = layouts(a, b)
            sb = sbs[name]
            return lambda: torch._scaled_mm(a._data, b._data, sa, sb, out_dtype=torch.bfloat16)

        def v2f(a, b, name=name):
            sa, sbs = layouts(a, b)
            sb = sbs[name]
            return lambda: v2[0](a._data, b._data, sa, v2[1], sb, v2[2], output_dtype=torch.bfloat16)

        tries = ([("F.scaled_mm " + name, v2f)] if v2 is not None else []) + [("torch._scaled_mm " + name, v1)]
        for label, factory in tries:
            try:
                err = rel(factory(a, b)(), ref)
                if err < 1e-2:
                    return factory, label
                errors.append(f"{label}: accepted but wrong (rel err {err:.2g})")
            except Exception as e:  # noqa: BLE001
                errors.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0]}"[:200])
    raise RuntimeError("cuBLAS blockwise not available: " + " | ".join(errors))


def bench_shape(run, M, N, K):
    from lowbit.dtypes import FP4Tensor, FP8Tensor
    from benchmarks.common import lowbit_kernels
    k, pointer, portable = (lowbit_kernels(), lowbit_kernels(gemm_fp8=dict(kernel="pointer")),
                            lowbit_kernels(gemm_fp4=dict(ptx_decode=False)))
    fp8_scaled_mm = lambda a, b, od, fast_accum=False, kk=k: kk.scaled_mm(a, b, od, None, fast_accum=fast_accum)  # noqa: E731
    fp4_scaled_mm = lambda a, b, od, kk=k: kk.scaled_mm(a, b, od, None)  # noqa: E731
    from lowbit.scaling import MX, NV, Blockwise, Current, Rowwise

    shape = f"{M}x{N}x{K}"
    small = M <= 128
    g = torch.Generator(device=DEV).manual_seed(1)
    x = torch.randn(M, K, device=DEV, generator=g).to(torch.bfloat16)
    n_w = max(copies_for(N * K * 2, small), copies_for(N * K, small), copies_for(N * K / 2, small))
    ws = [(torch.randn(N, K, device=DEV, generator=g) * 0.02).to(torch.bfloat16) for _ in range(n_w)]
    bf16 = run.add(shape, "cuBLAS bf16 mm", M, N, K,
                   [lambda w=w: torch.mm(x, w.t()) for w in ws[:copies_for(N * K * 2, small)]])
    bf16_anchor = ("cuBLAS bf16 mm", bf16[0], None)

    # ---- FP8: tensorwise / rowwise / blockwise ------------------------------------------------------
    for rname, recipe in (("tensorwise", Current()), ("rowwise", Rowwise()), ("blockwise", Blockwise())):
        if run.skip(shape, rname):
            continue
        a = FP8Tensor.from_float(x, recipe, "input")
        bs = [FP8Tensor.from_float(w, recipe, "weight").t() for w in ws[:copies_for(N * K, small)]]
        ref = a.dequantize(torch.float64) @ bs[0].dequantize(torch.float64)
        anchors = {}  # fast-accum flag -> (label, ms, output)
        if rname == "blockwise":
            found = guarded(run.rows, f"{shape} cuBLAS blockwise", lambda: blockwise_anchor(a, bs[0]))
            cublas = {False: found} if found else {}
        else:
            cublas = {fast: ((lambda a, b, fast=fast: lambda: torch._scaled_mm(
                a._data, b._data, a._scale, b._scale, out_dtype=torch.bfloat16, use_fast_accum=fast)),
                f"cuBLAS {rname}" + (" fast-accum" if fast else ""))
                for fast in ((False, True) if rname == "tensorwise" else (False,))}
        for fast, (factory, label) in cublas.items():  # factory(a, b) -> the timed callable
            res = guarded(run.rows, f"{shape} {label}",
                          lambda factory=factory, label=label: run.add(shape, label, M, N, K,
                                                                       [factory(a, b) for b in bs], ref))
            if res is not None:
                anchors[fast] = (label, res[0], res[1])
        for fast in ((False, True) if rname == "tensorwise" else (False,)):
            label = f"lowbit {rname}" + (" fast-accum" if fast else "")
            guarded(run.rows, f"{shape} {label}", lambda fast=fast, label=label: run.add(
                shape, label, M, N, K, [lambda b=b: fp8_scaled_mm(a, b, torch.bfloat16, fast_accum=fast) for b in bs],
                ref, anchors.get(fast, bf16_anchor)))
        if (M, N, K) == (8192, 8192, 8192) and rname == "tensorwise":  # the non-TMA kernel, for the record
            guarded(run.rows, f"{shape} pointer", lambda: run.add(
                shape, "lowbit tensorwise (pointer kernel)", M, N, K,
                [lambda: fp8_scaled_mm(a, bs[0], torch.bfloat16, kk=pointer)], ref, anchors.get(False)))
        a = bs = ref = anchors = None  # free before the next recipe
        _empty_cache()

    # ---- FP4: NV / MX, FP4 x FP4 and weight-only --------------------------------------------------------
    for kind, recipe in (("nvfp4", NV()), ("mxfp4", MX(elem="e2m1"))):
        if run.skip(shape, kind):
            continue
        bs = [FP4Tensor.from_float(w, recipe, "weight").t() for w in ws[:copies_for(N * K / 2, small)]]
        bref = bs[0].dequantize(torch.float64)

        def full(kind=kind, recipe=recipe):
            a = FP4Tensor.from_float(x, recipe, "input")
            note = ""
            if kind == "nvfp4" and not run.checked_nv and DEV == "cuda":  # PTX decode vs portable, bitwise
                run.checked_nv = True  # once: the portable kernel is autotuned anew
                same = torch.equal(fp4_scaled_mm(a, bs[0], torch.bfloat16),
                                   fp4_scaled_mm(a, bs[0], torch.bfloat16, kk=portable))
                note = f"asm==portable: {same}"
            run.add(shape, f"lowbit {kind} x {kind}", M, N, K,
                    [lambda b=b: fp4_scaled_mm(a, b, torch.bfloat16) for b in bs],
                    a.dequantize(torch.float64) @ bref, bf16_anchor, note=note)
        guarded(run.rows, f"{shape} {kind} x {kind}", full)
        if small:
            def wo(kind=kind):
                note = ""
                if DEV == "cuda":  # same configuration, PTX decode vs portable decode, bit for bit
                    same = torch.equal(fp4_scaled_mm(x, bs[0], torch.bfloat16),
                                       fp4_scaled_mm(x, bs[0], torch.bfloat16, kk=portable))
                    note = f"asm==portable: {same}"
                run.add(shape, f"lowbit weight-only {kind}", M, N, K,
                        [lambda b=b: fp4_scaled_mm(x, b, torch.bfloat16) for b in bs],
                        x.double() @ bref, bf16_anchor, note=note)
            guarded(run.rows, f"{shape} weight-only {kind}", wo)
        bs = bref = None
        _empty_cache()


def _equal_blocks(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Scale every rows x cols block to amax 1 (so every block scale is the same power of two)."""
    R, C = t.shape
    v = t.view(R // rows, rows, C // cols, cols)
    return (v / v.abs().amax(dim=(1, 3), keepdim=True)).view(R, C)


def accumulation(run, out: dict):
    """Blockwise GEMM at K = 16384: error with promotion per 128-K chunk vs one long accumulation."""
    from lowbit.dtypes import FP8Tensor
    from benchmarks.common import lowbit_kernels
    k = lowbit_kernels()
    fp8_scaled_mm = lambda a, b, od, fast_accum=False: k.scaled_mm(a, b, od, None, fast_accum=fast_accum)  # noqa: E731
    from lowbit.scaling import Blockwise, Current

    M = N = 1024 if DEV == "cuda" else 128
    K = 16384 if DEV == "cuda" else 512
    g = torch.Generator(device=DEV).manual_seed(5)
    x = _equal_blocks(torch.randn(M, K, device=DEV, generator=g), 1, 128)
    w = _equal_blocks(torch.randn(N, K, device=DEV, generator=g), 128, 128)
    ab, bb = FP8Tensor.from_float(x, Blockwise(), "input"), FP8Tensor.from_float(w, Blockwise(), "weight").t()
    at, bt = FP8Tensor.from_float(x, Current(), "input"), FP8Tensor.from_float(w, Current(), "weight").t()
    same_codes = torch.equal(ab._data.view(torch.uint8), at._data.view(torch.uint8)) and \
        torch.equal(bb._data.view(torch.uint8), bt._data.view(torch.uint8))
    ref = ab.dequantize(torch.float64) @ bb.dequantize(torch.float64)

    def errs(c):
        d = (c.double() - ref).abs()
        return {"rel_fro": rel(c, ref), "max_abs_over_max_ref": float(d.max() / ref.abs().max())}

    res = {"M": M, "N": N, "K": K, "identical_fp8_codes": same_codes}
    cases = {
        "lowbit blockwise (promoted every 128 K)": lambda: fp8_scaled_mm(ab, bb, torch.float32),
        "lowbit tensorwise (promoted every 128 K)": lambda: fp8_scaled_mm(at, bt, torch.float32),
        "lowbit tensorwise fast-accum (one long tl.dot, never promoted)":
            lambda: fp8_scaled_mm(at, bt, torch.float32, fast_accum=True),
        "cuBLAS tensorwise": lambda: torch._scaled_mm(at._data, bt._data, at._scale, bt._scale,
                                                      out_dtype=torch.float32),
        "cuBLAS tensorwise fast-accum": lambda: torch._scaled_mm(at._data, bt._data, at._scale, bt._scale,
                                                                 out_dtype=torch.float32, use_fast_accum=True),
        "fp32 torch.mm of the dequantized operands": lambda: at.dequantize(torch.float32) @ bt.dequantize(torch.float32),
    }
    for name, fn in cases.items():
        r = guarded(run.rows, f"accumulation {name}", lambda fn=fn: errs(fn()))
        if r is not None:
            res[name] = r
    out["accumulation_K16384"] = res


def main():
    def extra(p):
        p.add_argument("--budget", type=float, default=285.0, help="seconds; what is left is skipped")
        p.add_argument("--cpu-smoke", action="store_true", help="exercise this script on the CPU under "
                       "TRITON_INTERPRET=1 with tiny shapes (checks the script, measures nothing)")
    args = parse_args(__doc__.splitlines()[0], extra)
    info = env_info()
    global DEV, SHAPES, QUICK
    if args.cpu_smoke:
        DEV, SHAPES, QUICK = "cpu", [(64, 64, 256), (16, 64, 256)], [(16, 64, 256)]
    elif not torch.cuda.is_available():
        print("benchmarks/gemm.py needs a CUDA GPU; none found (nothing was measured).")
        write_json(args.out, "gemm", {"env": info, "error": "no CUDA GPU"})
        return
    from benchmarks.common import lowbit_kernels
    kernels = lowbit_kernels()
    run = Run(args.budget)
    payload = {"env": info}
    guarded(run.rows, "accumulation", lambda: accumulation(run, payload))
    for (M, N, K) in (QUICK if args.quick else SHAPES):
        if not run.skip(f"{M}x{N}x{K}", "all"):
            guarded(run.rows, f"{M}x{N}x{K}", lambda: bench_shape(run, M, N, K))
        _empty_cache()
    payload.update(rows=run.rows, configs={**kernels.fp8_gemm.last_config(), **kernels.fp4_gemm.last_config()},
                   wall_s=time.time() - run.t0)
    path = write_json(args.out, "gemm", payload)
    append_results([result_row(info, "gemm", r["shape"], r["variant"], "ms", r["ms"], r.get("anchor", ""), r.get("ratio"))
                    for r in run.rows if "ms" in r and "shape" in r], args.out)

    print("\nenv:", {k: info.get(k) for k in ("gpu", "torch", "triton", "date")})
    print("\nautotuned configurations (kernel, tuning key -> config):")
    for k, v in payload["configs"].items():
        print(f"  {k}: {v}")
    acc = payload.get("accumulation_K16384", {})
    if acc:
        print(f"\naccumulation error vs float64, {acc['M']}x{acc['N']}x{acc['K']} (identical FP8 codes: "
              f"{acc['identical_fp8_codes']}):")
        for k, v in acc.items():
            if isinstance(v, dict):
                print(f"  {k:64s} rel_fro={v['rel_fro']:.3e}  max_abs/max_ref={v['max_abs_over_max_ref']:.3e}")
    print(f"\nJSON: {path}   wall: {payload['wall_s']:.0f} s\n")
    shown = [{**r, "error": r["error"][:90]} if "error" in r else r for r in run.rows]
    print_table(shown, ["shape", "variant", "ms", "tflops", "anchor", "ratio", "err_f64", "diff_anchor", "timing",
                        "note", "error"])


if __name__ == "__main__":
    main()
