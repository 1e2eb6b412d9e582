"""Attention benchmark (H200): lowbit's FP8 attention against bf16 SDPA (cuDNN and flash) in one run.

    python benchmarks/attention.py --out DIR [--quick] [--llama] [--budget SECONDS]

One call answers everything (``--quick``: about 3-4 minutes on an H200 with compilation, within
``--budget``, default 270 s quick / 560 s full; what does not fit is skipped and says so):

1. Checks (the run goes on after a failed one, and its row says so). Small shapes, outlier inputs
   (N(0, 1), 0.1% of values 20x, bf16), the Triton kernels against the torch emulation on the same
   GPU, one row per tensor part (out, dq, dk, dv): against the emulation with the Hopper
   accumulator model (``accumulator=lowbit.validate.metrics.HOPPER_FP8``: 14 bits, truncation, in
   groups of 32; must agree within ``AGREE``), against the exact-sum emulation (the interpreter's
   numbers; informative), the model's own effect (emulation with the model vs without), and the
   error against float64 over the plain per-head E4M3 baseline's (must be <= 1.25). The shapes:
   causal, GQA, window (``--quick``: the dense hd128 ones; full: also packed sequences, ragged
   lengths, head dims 64 / 256 / 192 with 128). Then the accumulator model itself against cuBLAS
   ``_scaled_mm(use_fast_accum=True)`` on E4M3 codes of K = 128 (the scores' chain): the fraction
   of outputs equal to the model's bit for bit. Long context: one causal head, S = 4k, 32k (full:
   4k, 16k, 64k), the output's error against fp32 SDPA and its growth (target <= 1.5).
2. Timing (``QUICK`` / ``FULL`` shapes): forward and forward + backward through autograd, each
   captured in a CUDA graph and the replay timed with do_bench (median), lowbit and the anchors
   alike (do_bench of the call when capture fails, and the row says so). TFLOP/s count the useful
   products: forward ``4 B Hq Sq Sk D`` (Dqk + Dv for unequal head dims), halved when causal;
   forward + backward 3.5x that, backward alone 2.5x. Ratios: anchor time / lowbit time, anchor
   cuDNN (flash where cuDNN fails); outputs and gradients against the anchor's.
3. Profile: one forward + backward at the headline shape (``QUICK[0]``) under ``torch.profiler``:
   device ms per kernel name (``common.kernel_profile``).
4. Tilings (``tuning.override``) at the headline shape (full: also the non-causal one): each forward
   configuration of ``FWD_SWEEP`` graph-timed, each backward configuration of ``BWD_SWEEP`` profiled
   per kernel (the dK/dV and the dQ kernels are separate, so the best of each is read off its own
   rows), each checked against the default tiling first; ``BEST`` rows name the fastest.

Rows go to DIR/results.csv (``benchmarks.common.result_row``), everything to DIR/attention.json;
the table prints last. ``--llama``: a Hugging Face Llama training step instead (8 layers of
Llama-3-8B shape, 2 x 4096 tokens, eager) in bf16, lowbit fp8, lowbit fp8 + FP8 attention and bf16
+ FP8 attention (about 3 minutes). ``--cpu-smoke`` runs this script on the CPU under the
interpreter at tiny shapes (checks the plumbing, measures nothing).
"""
from __future__ import annotations

import os
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
if "--cpu-smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.common import (append_results, bench_ms, env_info, graph_ms, guarded, kernel_profile,  # noqa: E402
                               parse_args, print_table, result_row, write_json)

WORKLOAD = "attention"
# (B, Hq, Hkv, S, D, Dv, causal, window)
QUICK = [(2, 32, 8, 4096, 128, 128, True, None), (4, 32, 32, 4096, 128, 128, False, None),
         (1, 32, 8, 16384, 128, 128, True, None)]
FULL = QUICK + [(8, 32, 8, 1024, 128, 128, True, None), (2, 32, 8, 8192, 128, 128, True, None),
                (1, 32, 8, 32768, 128, 128, True, None), (4, 32, 32, 4096, 64, 64, True, None),
                (2, 16, 16, 4096, 256, 256, True, None), (2, 16, 16, 4096, 192, 128, True, None),
                (1, 32, 8, 16384, 128, 128, True, 4096)]
SWEEP_SHAPES = [QUICK[0], QUICK[1]]  # quick: the first only
# Forward: (block_m, block_n, warps, stages, register cap). 64-row tiles are one warp group each (2
# CTAs an SM at triton 3.6's 205-243 registers, 3 with 64 x 64 tiles capped at 168, which spills
# nothing); 128-row tiles two warp groups sharing K and V (1 CTA an SM).
FWD_SWEEP = [dict(fwd_block_m=m, fwd_block_n=n, fwd_warps=w, fwd_stages=s, fwd_maxnreg=r)
             for m, n, w, s, r in [(128, 128, 8, 3, None), (128, 128, 8, 2, None), (64, 128, 4, 2, None),
                                   (64, 128, 4, 3, None), (64, 64, 4, 3, 168), (128, 64, 8, 3, None)]]
# Backward: dK/dV kernel (keys a program, queries a step, warps, stages), dQ kernel (queries a
# program, keys a step, warps, stages); rows = 16 a warp. 128-row programs: 1 CTA an SM, half the
# L2 traffic of 64-row ones (2 CTAs an SM; the default at head dims up to 128).
BWD_SWEEP = [dict(dkdv_block_n=kn, dkdv_block_m=km, dkdv_warps=kw, dkdv_stages=ks, dq_block_m=qm, dq_block_n=qn,
                  dq_warps=qw, dq_stages=qs)
             for kn, km, kw, ks, qm, qn, qw, qs in [(128, 64, 8, 2, 128, 64, 8, 2), (64, 64, 4, 2, 64, 64, 4, 2),
                                                    (128, 64, 8, 3, 128, 64, 8, 3), (128, 32, 8, 3, 64, 128, 4, 2),
                                                    (64, 32, 4, 3, 128, 32, 8, 2), (64, 64, 4, 2, 64, 64, 4, 3)]]
AGREE = 2e-3  # kernels vs the emulation with the accumulator model, relative L2 per part
PARTS = ("out", "dq", "dk", "dv")
DEV = "cuda"


def _flops(B, hq, S, D, Dv, causal) -> float:
    return 2.0 * B * hq * S * S * (D + Dv) * (0.5 if causal else 1.0)


def _shape_name(B, hq, hkv, S, D, Dv, causal, window) -> str:
    dims = f"D{D}" if D == Dv else f"D{D}/{Dv}"
    extra = (" causal" if causal else "") + (f" window{window}" if window else "")
    return f"B{B} Hq{hq} Hkv{hkv} S{S} {dims}{extra}"


class Run:
    def __init__(self, budget: float, env: dict):
        self.t0, self.budget, self.env = time.time(), budget, env
        self.rows, self.csv = [], []

    def left(self) -> float:
        return self.budget - (time.time() - self.t0)

    def skip(self, what: str) -> bool:
        if self.left() > 0:
            return False
        self.rows.append({"shape": what, "variant": "-", "note": "skipped: time budget"})
        return True

    def record(self, shape, variant, metric, value, anchor="", ratio=None, more=None, **extra):
        """One table row (``extra``: its other columns) and its results.csv rows: ``metric`` and each
        of ``more`` ({metric: value}, shown as columns of the same table row)."""
        more = more or {}
        self.rows.append({"shape": shape, "variant": variant, "metric": metric, "value": value, "anchor": anchor,
                          "ratio": ratio, **more, **extra})
        self.csv.append(result_row(self.env, WORKLOAD, shape, variant, metric, value, anchor, ratio))
        self.csv += [result_row(self.env, WORKLOAD, shape, variant, m, v) for m, v in more.items() if v is not None]


def _time(fn):
    """(ms, how): CUDA graph replay, else do_bench of the call."""
    if DEV != "cuda":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3, "cpu wall"
    try:
        return graph_ms([fn], rounds=2), "graph"
    except Exception as e:  # noqa: BLE001 - recorded, then timed without a graph
        torch.cuda.synchronize()
        return bench_ms(fn), f"do_bench (graph: {type(e).__name__})"


def _inputs(B, hq, hkv, S, D, Dv, seed=0, outliers=False):
    from lowbit.validate.attention_baseline import outlier_inputs
    shapes = [(B, hq, S, D), (B, hkv, S, D), (B, hkv, S, Dv), (B, hq, S, Dv)]
    if outliers:
        return [t.to(DEV).to(torch.bfloat16) for t in outlier_inputs(shapes, seed)]
    g = torch.Generator(device=DEV).manual_seed(seed)
    return [torch.randn(s, device=DEV, generator=g, dtype=torch.bfloat16) for s in shapes]


def _lowbit(q, k, v, causal, window, backend="auto"):
    from lowbit.nn.functional import scaled_dot_product_attention
    return scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1],
                                        window=window, backend=backend)


def _sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    which = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]

    def call(q, k, v, causal, window):
        from lowbit.kernels.attention_emulation import visible
        mask = None
        if window:
            mask, causal = visible(q.shape[2], k.shape[2], causal, (window - 1, window - 1), q.device), False
        with sdpa_kernel(which):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                  enable_gqa=q.shape[1] != k.shape[1])
    return call


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))


# ---- correctness ---------------------------------------------------------------------------------
SMALL = [  # (B, Hq, Hkv, Sq, Sk, D, Dv, kwargs, packed lengths)
    (2, 4, 2, 77, 77, 64, 64, dict(causal=True), None),
    (1, 4, 4, 128, 128, 128, 128, dict(causal=True), None),
    (2, 4, 2, 77, 77, 128, 128, dict(), None),
    (1, 2, 2, 100, 300, 128, 128, dict(window=(40, 10)), None),
    (1, 2, 2, 200, 200, 256, 256, dict(causal=True), None),
    (1, 2, 2, 200, 200, 192, 128, dict(causal=True, window=(64, None)), None),
    (1, 4, 2, 0, 0, 128, 128, dict(causal=True), [37, 200, 129]),
]


def check_small(run: Run, quick: bool):
    """Kernels vs the emulation (with and without the Hopper accumulator model, same device) and vs
    float64 (within 1.25x of plain per-head E4M3), bf16 inputs, one row per tensor part."""
    from lowbit.validate.attention_baseline import exact, outlier_inputs, plain_e4m3
    from lowbit.kernels.attention import attention_backward, attention_forward
    from lowbit.scaling import AttentionRecipe
    from lowbit.validate.metrics import HOPPER_FP8
    for B, hq, hkv, sq, sk, d, dv, kw, lens in SMALL:
        if quick and (d != 128 or lens):
            continue
        if DEV != "cuda":
            sq, sk, lens = min(sq, 40), min(sk, 40), (lens and [7, 20])
        mask = " ".join(f"{k_}{v_}" if v_ is not True else k_ for k_, v_ in kw.items()).replace(" ", "")
        name = f"check B{B} Hq{hq} Hkv{hkv} S{sq}x{sk} D{d}/{dv} {mask}" + (f" packed{lens}" if lens else "")
        kw = dict(dict(scale=d ** -0.5, recipe=AttentionRecipe(), window=(None, None), causal=False), **kw)

        def one(B=B, hq=hq, hkv=hkv, sq=sq, sk=sk, d=d, dv=dv, kw=kw, lens=lens, name=name):
            if lens:
                T = sum(lens)
                shapes = [(T, hq, d), (T, hkv, d), (T, hkv, dv), (T, hq, dv)]
                cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=DEV)
                extra = dict(cu_seqlens=cu, max_seqlen=max(lens))
            else:
                shapes, extra = [(B, hq, sq, d), (B, hkv, sk, d), (B, hkv, sk, dv), (B, hq, sq, dv)], {}
            q, k, v, do = (t.to(DEV) for t in outlier_inputs(shapes, dtype=torch.bfloat16))
            res = {}
            for key, backend, acc in (("kernel", "triton", None), ("exact sums", "torch", None),
                                      ("hopper model", "torch", HOPPER_FP8)):
                akw = dict(accumulator=acc) if acc is not None else {}
                out, lse, _ = attention_forward(q, k, v, backend=backend, **kw, **extra, **akw)
                res[key] = (out, *attention_backward(do, q, k, v, out, lse, backend=backend, **kw, **extra, **akw))
            ratios = [None] * 4
            if not lens:  # float64 reference and the plain baseline (dense shapes)
                mask = (kw["causal"], kw["window"], kw["scale"])
                ref = exact(q.cpu(), k.cpu(), v.cpu(), do.cpu(), *mask)
                base = plain_e4m3(q.cpu(), k.cpu(), v.cpu(), do.cpu(), *mask)
                ratios = [_rel(a.cpu(), r) / _rel(p, r) for a, p, r in zip(res["kernel"], base, ref)]
            target = "hopper model" if DEV == "cuda" else "exact sums"  # the interpreter sums exactly
            for i, part in enumerate(PARTS):
                agree = _rel(res["kernel"][i], res[target][i])
                ok = agree < AGREE and (ratios[i] is None or ratios[i] <= 1.25)
                run.record(name, f"lowbit fp8 {part}", f"rel L2 vs emulation ({target})", agree,
                           "error / plain E4M3 error" if ratios[i] is not None else "", ratios[i],
                           more={"rel L2 vs emulation (exact sums)": _rel(res["kernel"][i], res["exact sums"][i])
                                 if target != "exact sums" else None,
                                 "accumulator model effect (rel L2)": _rel(res["hopper model"][i],
                                                                           res["exact sums"][i])},
                           note="ok" if ok else f"FAILED (needs < {AGREE:g} and ratio <= 1.25)")
        guarded(run.rows, name, one)


def check_accumulator_model(run: Run):
    """The Hopper accumulator model against cuBLAS fast accumulation: E4M3 codes of outlier data,
    (256 x 128) @ (128 x 256), one chain of K = 128 (the scores' head dim): the fraction of outputs
    equal to the model's and the largest difference over the largest |C|, for HOPPER_FP8 and for
    its neighbours (bits 13-15, groups of 8-32), so one run says which model is the hardware's."""
    import dataclasses

    from lowbit.validate.attention_baseline import outlier_inputs
    from lowbit.kernels.attention_emulation import quantize_tokens, tensor_core_mm
    from lowbit.validate.metrics import HOPPER_FP8
    a, b = (quantize_tokens(t.to(DEV)[None, None], 0)[0][0, 0] for t in outlier_inputs([(256, 128), (256, 128)], 5))
    one = torch.ones((), device=DEV)
    got = torch._scaled_mm(a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).T, scale_a=one, scale_b=one,
                           out_dtype=torch.float32, use_fast_accum=True).double()
    exact_ = tensor_core_mm(a, b.T)
    shape = "E4M3 codes 256x128 @ 128x256 vs cuBLAS fast accum"
    big = exact_.abs().max()
    run.record(shape, "exact sums", "fraction equal", float((got == exact_).double().mean()),
               more={"max |diff| / max |C|": float((exact_ - got).abs().max() / big)})
    best = None
    for bits in (13, 14, 15):
        for group in (8, 16, 32):
            core = dataclasses.replace(HOPPER_FP8, bits=bits, group=group)
            model = tensor_core_mm(a, b.T, core)
            match = float((got == model).double().mean())
            if (bits, group) == (HOPPER_FP8.bits, HOPPER_FP8.group):
                run.record(shape, f"model bits {bits} group {group} (HOPPER_FP8)", "fraction equal", match,
                           more={"max |diff| / max |C|": float((model - got).abs().max() / big)},
                           note="ok" if match > 0.99 else "CHECK: not the hardware's sum")
            else:
                run.record(shape, f"model bits {bits} group {group}", "fraction equal", match)
            best = max(best or (match, bits, group), (match, bits, group))
    run.record(shape, f"BEST model bits {best[1]} group {best[2]}", "fraction equal", best[0])


def check_long_context(run: Run, quick: bool):
    """One causal head: the output's error against fp32 SDPA from the shortest to the longest S."""
    lengths = [4096, 32768] if quick else [4096, 16384, 65536]
    if DEV != "cuda":
        lengths = [64, 128]
    errs = {}
    for S in lengths:
        def one(S=S):
            q, k, v, _ = _inputs(1, 1, 1, S, 128, 128, seed=3, outliers=True)
            ref = _sdpa("efficient" if DEV == "cuda" else "math")(q.float(), k.float(), v.float(), True, None)
            errs[S] = _rel(_lowbit(q, k, v, True, None), ref)
            run.record(f"B1 H1 S{S} D128 causal", "lowbit fp8", "rel L2 vs fp32 SDPA", errs[S])
        guarded(run.rows, f"long context S{S}", one)
    if len(errs) == len(lengths):
        growth = errs[lengths[-1]] / errs[lengths[0]]
        run.record(f"B1 H1 S{lengths[0]}->{lengths[-1]} D128 causal", "lowbit fp8", "error growth", growth,
                   note="ok" if growth <= 1.5 else "FAILED (target <= 1.5)")


# ---- timing --------------------------------------------------------------------------------------
def bench_shape(run: Run, shape):
    B, hq, hkv, S, D, Dv, causal, window = shape
    name = _shape_name(*shape)
    q, k, v, do = _inputs(B, hq, hkv, S, D, Dv)
    flops = _flops(B, hq, S, D, Dv, causal)
    variants = {"lowbit fp8": lambda q, k, v: _lowbit(q, k, v, causal, window)}
    for be in ("cudnn", "flash"):
        variants[f"sdpa {be} bf16"] = lambda q, k, v, be=be: _sdpa(be)(q, k, v, causal, window)
    if DEV != "cuda":
        variants = {"lowbit fp8": variants["lowbit fp8"],
                    "sdpa math bf16": lambda q, k, v: _sdpa("math")(q, k, v, causal, window)}
    times, outs = {}, {}
    for variant, fn in variants.items():
        def fwd(fn=fn, variant=variant):
            outs[variant] = fn(q, k, v)
            ms, how = _time(lambda: fn(q, k, v))
            times[(variant, "fwd")] = ms
            run.rows.append({"shape": name, "variant": variant, "metric": "fwd ms", "value": ms, "timing": how})
        guarded(run.rows, f"{name} {variant} fwd", fwd)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]

        def step(fn=fn, leaves=leaves):
            return torch.autograd.grad(fn(*leaves), leaves, do)

        def fwd_bwd(variant=variant, step=step):
            outs[(variant, "grads")] = step()
            ms, how = _time(step)
            times[(variant, "fwd+bwd")] = ms
            run.rows.append({"shape": name, "variant": variant, "metric": "fwd+bwd ms", "value": ms, "timing": how})
        guarded(run.rows, f"{name} {variant} fwd+bwd", fwd_bwd)
        if DEV == "cuda":
            torch.cuda.empty_cache()
    anchor = next((a for a in ("sdpa cudnn bf16", "sdpa flash bf16", "sdpa math bf16") if (a, "fwd") in times), None)
    for variant in variants:
        for what, mult in (("fwd", 1.0), ("fwd+bwd", 3.5)):
            ms = times.get((variant, what))
            if ms is None:
                continue
            ref = times.get((anchor, what)) if variant == "lowbit fp8" else None
            run.record(name, variant, f"TFLOP/s {what}", mult * flops / (ms * 1e-3) / 1e12,
                       anchor if ref else "", ref / ms if ref else None)
    if anchor and "lowbit fp8" in outs and anchor in outs:
        diffs = [_rel(outs["lowbit fp8"], outs[anchor])]
        if ("lowbit fp8", "grads") in outs and (anchor, "grads") in outs:
            diffs += [_rel(a, b) for a, b in zip(outs[("lowbit fp8", "grads")], outs[(anchor, "grads")])]
        run.record(name, "lowbit fp8", "rel L2 vs " + anchor + " (out, dq, dk, dv max)", max(diffs),
                   more={f"{part} rel L2 vs {anchor}": d for part, d in zip(PARTS, diffs)},
                   note="ok" if diffs[0] < 0.1 and max(diffs) < 0.25 else "CHECK")


def _kernel_name(name: str) -> str:
    return name if len(name) <= 60 else name[:57] + "..."


def profile_step(run: Run, shape):
    """Device ms per kernel of one forward + backward through autograd (``kernel_profile``)."""
    B, hq, hkv, S, D, Dv, causal, window = shape
    q, k, v, do = _inputs(B, hq, hkv, S, D, Dv)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    prof = kernel_profile(lambda: torch.autograd.grad(_lowbit(*leaves, causal, window), leaves, do), calls=5)
    name = _shape_name(*shape) + " fwd+bwd"
    if prof is None:
        run.rows.append({"shape": name, "variant": "profile", "note": "no device activity seen (no CUPTI?)"})
        return
    run.record(name, "lowbit fp8 (all kernels)", "device ms", prof["ms"], more={"launches": prof["launches"]})
    for kname, ms in sorted(prof["kernels"].items(), key=lambda kv: -kv[1]):
        run.record(name, _kernel_name(kname), "device ms", ms, note=f"{100 * ms / prof['ms']:.0f}%")


def _label(cfg: dict, prefix: str) -> str:
    short = {"block_m": "m", "block_n": "n", "warps": "w", "stages": "s", "maxnreg": "r"}
    return " ".join(f"{short[k_[len(prefix) + 1:]]}{v_}" for k_, v_ in cfg.items()
                    if k_.startswith(prefix + "_") and v_ is not None)


def sweep(run: Run, shapes):
    """The FWD_SWEEP (graph-timed forward) and BWD_SWEEP (per-kernel device time of the backward)
    tilings at ``shapes``, each checked against the default tiling's numbers first."""
    from lowbit.kernels.attention import attention_backward, attention_forward
    from lowbit.kernels.triton.attention.tuning import override
    from lowbit.scaling import AttentionRecipe
    recipe = AttentionRecipe()
    for shape in shapes:
        B, hq, hkv, S, D, Dv, causal, window = shape
        name = _shape_name(*shape)
        q, k, v, do = _inputs(B, hq, hkv, S, D, Dv)
        kw = dict(causal=causal, scale=D ** -0.5, recipe=recipe, backend="triton")
        base, lse, _ = attention_forward(q, k, v, **kw)
        base_grads = attention_backward(do, q, k, v, base, lse, **kw)
        flops = _flops(B, hq, S, D, Dv, causal)
        best = {}
        for cfg in FWD_SWEEP:
            label = "fwd " + _label(cfg, "fwd")

            def one(cfg=cfg, label=label):
                with override(**cfg):
                    diff = _rel(attention_forward(q, k, v, **kw)[0], base)
                    ms, how = _time(lambda: attention_forward(q, k, v, **kw))
                tf = flops / (ms * 1e-3) / 1e12
                run.record(name, label, "TFLOP/s fwd", tf, more={"fwd ms": ms}, timing=how,
                           note=f"out vs default {diff:.1e}" + ("" if diff < 2e-2 else " CHECK"))
                if diff < 2e-2 and tf > best.get("fwd", (0, ""))[0]:
                    best["fwd"] = (tf, label)
            if not run.skip(f"{name} {label}"):
                guarded(run.rows, f"{name} {label}", one)
        for cfg in BWD_SWEEP:
            label = f"dkdv {_label(cfg, 'dkdv')} | dq {_label(cfg, 'dq')}"

            def one(cfg=cfg, label=label):
                with override(**cfg):
                    grads = attention_backward(do, q, k, v, base, lse, **kw)
                    diff = max(_rel(a, b) for a, b in zip(grads, base_grads))
                    prof = kernel_profile(lambda: attention_backward(do, q, k, v, base, lse, **kw), calls=5)
                    ms, how = _time(lambda: attention_backward(do, q, k, v, base, lse, **kw))
                per = {}
                for kname, kms in (prof or {}).get("kernels", {}).items():
                    key = next((k_ for k_ in ("dkdv", "dq", "quantize") if f"_{k_}_kernel" in f"_{kname}"), "other")
                    per[key] = per.get(key, 0.0) + kms
                run.record(name, label, "TFLOP/s bwd", 2.5 * flops / (ms * 1e-3) / 1e12,
                           more={"bwd ms": ms, **{f"{k_} kernel ms": v_ for k_, v_ in per.items()}}, timing=how,
                           note=f"grads vs default {diff:.1e}" + ("" if diff < 5e-2 else " CHECK"))
                for part, tag in (("dkdv", "dkdv " + _label(cfg, "dkdv")), ("dq", "dq " + _label(cfg, "dq"))):
                    if diff < 5e-2 and part in per and per[part] < best.get(part, (float("inf"), ""))[0]:
                        best[part] = (per[part], tag)
            if not run.skip(f"{name} {label}"):
                guarded(run.rows, f"{name} {label}", one)
        for part, (value, label) in best.items():
            run.record(name, "BEST " + label, "TFLOP/s fwd" if part == "fwd" else f"{part} kernel ms", value)
        if DEV == "cuda":
            torch.cuda.empty_cache()


def llama_step(run: Run):
    """Hugging Face Llama, 8 layers of Llama-3-8B shape (hidden 4096, 32 query / 8 KV heads, FFN
    14336), bf16, 2 x 4096 tokens: one training step (forward, loss, backward; eager) per variant,
    built from the same seed one after the other: bf16 (SDPA), lowbit fp8 Linear layers, and lowbit
    fp8 Linear layers + FP8 attention (``convert(attention=True)``), plus bf16 Linear + FP8 attention."""
    import warnings

    import transformers

    import lowbit
    size = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=8,
                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)
    tokens = (2, 4096)
    if DEV != "cuda":
        size = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=64)
        tokens = (2, 32)
    shape = f"HF Llama {size['num_hidden_layers']} layers h{size['hidden_size']} {tokens[0]}x{tokens[1]} tokens"
    ids = torch.randint(0, size["vocab_size"], tokens, device=DEV, generator=torch.Generator(DEV).manual_seed(0))
    variants = {"bf16 (sdpa)": None, "lowbit fp8": dict(), "lowbit fp8 + fp8 attention": dict(attention=True),
                "bf16 + fp8 attention": dict(attention=True, filter=lambda name, mod: False)}
    times = {}
    for variant, conv in variants.items():
        def one(variant=variant, conv=conv):
            torch.manual_seed(0)
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**size)).to(DEV, torch.bfloat16)
            if conv is not None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    lowbit.convert(model, "fp8", **conv)

            def step():
                for p in model.parameters():
                    p.grad = None
                model(input_ids=ids, labels=ids).loss.backward()
            step()
            ms = bench_ms(step, warmup=500, rep=2000) if DEV == "cuda" else _time(step)[0]
            times[variant] = ms
            base = times.get("bf16 (sdpa)")
            run.record(shape, variant, "step ms", ms, "bf16 (sdpa)" if base and variant != "bf16 (sdpa)" else "",
                       base / ms if base and variant != "bf16 (sdpa)" else None)
        guarded(run.rows, f"{shape} {variant}", one)
        if DEV == "cuda":
            torch.cuda.empty_cache()


def main():
    def extra(p):
        p.add_argument("--llama", action="store_true", help="time a Hugging Face Llama training step instead "
                       "(8 layers of Llama-3-8B shape): bf16, lowbit fp8, lowbit fp8 + FP8 attention")
        p.add_argument("--budget", type=float, default=None, help="seconds (default 270 quick, 560 full); what is "
                       "left is skipped")
        p.add_argument("--cpu-smoke", action="store_true", help="run on the CPU under TRITON_INTERPRET=1 at tiny "
                       "shapes (checks this script; measures nothing)")
    args = parse_args(__doc__.splitlines()[0], extra)
    env = env_info()
    global DEV, QUICK, FULL, SWEEP_SHAPES, FWD_SWEEP, BWD_SWEEP
    if args.cpu_smoke:
        DEV = "cpu"
        QUICK = FULL = SWEEP_SHAPES = [(1, 2, 1, 40, 32, 32, True, None)]
        FWD_SWEEP, BWD_SWEEP = FWD_SWEEP[:1], BWD_SWEEP[:1]
    elif not torch.cuda.is_available():
        print("benchmarks/attention.py needs a CUDA GPU; none found (nothing was measured).")
        write_json(args.out, "attention", {"env": env, "error": "no CUDA GPU"})
        return
    run = Run(args.budget or (270.0 if args.quick else 560.0), env)
    if args.llama:
        guarded(run.rows, "llama step", lambda: llama_step(run))
    else:
        guarded(run.rows, "small-shape checks", lambda: check_small(run, args.quick))
        if DEV == "cuda":
            guarded(run.rows, "accumulator model", lambda: check_accumulator_model(run))
        guarded(run.rows, "long-context check", lambda: check_long_context(run, args.quick))
        for shape in (QUICK if args.quick else FULL):
            if not run.skip(_shape_name(*shape)):
                guarded(run.rows, _shape_name(*shape), lambda shape=shape: bench_shape(run, shape))
        if not run.skip("profile"):
            guarded(run.rows, "profile", lambda: profile_step(run, QUICK[0]))
        guarded(run.rows, "sweep", lambda: sweep(run, SWEEP_SHAPES[:1] if args.quick else SWEEP_SHAPES))
    if run.csv:
        print("results:", append_results(run.csv, args.out))
    path = write_json(args.out, "attention", {"env": env, "rows": run.rows, "wall_s": time.time() - run.t0})
    print(f"\nenv: { {k: env.get(k) for k in ('gpu', 'torch', 'triton', 'date')} }   JSON: {path}   "
          f"wall: {time.time() - run.t0:.0f} s\n")
    _print(run.rows)


def _print(rows):
    """The checks, then the timings (TFLOP/s and ratios), the profile and the tilings, then errors:
    short enough that the last 12,000 characters of the output hold them all."""
    checks = [r for r in rows if "error" not in r and (str(r.get("shape", "")).startswith(("check", "E4M3", "B1 H1 S")))]
    rest = [r for r in rows if "error" not in r and r not in checks and not str(r.get("metric", "")).endswith(" ms")
            or (r.get("metric") == "device ms" and "error" not in r)]
    errors = [{"where": r.get("variant", ""), "error": r["error"][:100]} for r in rows if "error" in r]
    print_table(checks, ["shape", "variant", "metric", "value", "ratio", "rel L2 vs emulation (exact sums)",
                         "accumulator model effect (rel L2)", "note"])
    print()
    print_table([r for r in rest if r not in checks], ["shape", "variant", "metric", "value", "anchor", "ratio", "note"])
    if errors:
        print()
        print_table(errors, ["where", "error"])

if __name__ == "__main__":
    main()
