"""fma_guard on the GPU: fused vs unfused differential runs on the planted hazards, and the guard's cost.

    python benchmarks/fma_guard_gpu.py --out DIR        (about 3 minutes on one H200)

1. Differential (tests/fma_guard/fixtures): each hazardous kernel and its safe twin launched with
   ``enable_fp_fusion`` True and False on adversarial inputs (``adversarial_scores``: every row max
   rounds down when scaled; for the variance, constant rows whose exact variance is 0 and whose
   unfused variance is exactly 0, built from values c with round(c^2) != c^2). Correctness first: the unfused output against a float64 torch reference. Reported:
   positive exponent arguments (the softmax invariant says the largest is exactly 0), negative
   variances, NaN/Inf (for the variance: NaN rstd from a negative variance), max |fused - unfused|,
   and the CPU scan's verdict beside it.
2. Guard cost: the same kernels timed fused and guarded (``enable_fp_fusion=False``) with
   ``triton.testing.do_bench`` (median): the online softmax (8192 x 8192 fp32) and a batched
   FlashAttention-style forward (B*H 32, S 4096, D 64, fp16; scale after the dot), with
   ``F.scaled_dot_product_attention`` as the anchor.
3. torch.compile on CUDA: the kernels inductor generates for a scaled softmax, scanned.

Prints a table last and writes DIR/fma_guard_gpu.json. A failing variant prints its error and the
script goes on.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import lowbit.fma_guard as fg  # noqa: E402

DEV = "cuda"  # "cpu" with --cpu-check (TRITON_INTERPRET=1, small shapes: checks the script, not the GPU)
SCALE = 0.125 * 1.4426950408889634  # 1/sqrt(64) * log2(e), an fp32 number that is not a power of two
FIX = os.path.join(ROOT, "tests", "fma_guard", "fixtures")


def load(name):
    spec = importlib.util.spec_from_file_location(f"fma_gpu_{name}", os.path.join(FIX, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _name(k):
    return k.fn.__name__ if hasattr(k.fn, "__name__") else k.__name__


def launch(kernel, grid, args, cx, fusion):
    kernel[grid](*args, **cx, enable_fp_fusion=fusion)
    if DEV == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------- 1
def softmax_case(kernel, sig, cx, use_exp2, rows=4096, cols=4096):
    x = fg.adversarial_scores(rows, cols, SCALE, seed=0, device=DEV)
    out = {}
    for fusion in (True, False):
        p, arg = torch.empty_like(x), torch.empty_like(x)
        launch(kernel, (rows,), [x, p, arg, SCALE, cols], cx, fusion)
        out[fusion] = (p, arg)
    ref = torch.softmax(x.double() * SCALE * (math.log(2.0) if use_exp2 else 1.0), dim=1)
    err = float(((out[False][0].double() - ref).abs() / ref.clamp_min(1e-30)).max())
    return {"correct": err < 1e-4, "max_rel_err_unfused": err,
            "positive_args": [int((out[f][1] > 0).sum()) for f in (True, False)],
            "max_arg": [float(out[f][1].max()) for f in (True, False)],
            "nan_inf": [int((~torch.isfinite(out[f][0])).sum()) for f in (True, False)],
            "max_abs_diff": float((out[True][0] - out[False][0]).abs().max()), "elements": rows * cols}


def lse_case(kernel, rows=8192, n=1024):
    x = fg.adversarial_scores(rows, n, SCALE, seed=1, device=DEV)
    out = {}
    for fusion in (True, False):
        o, arg = torch.empty(rows, device=DEV), torch.empty_like(x)
        launch(kernel, (rows,), [x, o, arg, SCALE], {"N": n}, fusion)
        out[fusion] = (o, arg)
    ref = torch.logsumexp(x.double() * SCALE, dim=1)
    err = float((out[False][0].double() - ref).abs().max())
    return {"correct": err < 1e-4 * float(ref.abs().max()), "max_abs_err_unfused": err,
            "positive_args": [int((out[f][1] > 0).sum()) for f in (True, False)],
            "max_arg": [float(out[f][1].max()) for f in (True, False)],
            "nan_inf": [int((~torch.isfinite(out[f][0])).sum()) for f in (True, False)],
            "max_abs_diff": float((out[True][0] - out[False][0]).abs().max()), "elements": rows * n}


def variance_case(kernel, rows=8192, n=1024):
    # correctness on random rows
    xr = torch.randn(rows, n, device=DEV)
    var, rstd = torch.empty(rows, device=DEV), torch.empty(rows, device=DEV)
    launch(kernel, (rows,), [xr, var, rstd], {"N": n}, False)
    ref = xr.double().var(dim=1, unbiased=False)
    err = float((var.double() - ref).abs().max())
    # constant rows x_i = c: exact variance 0. c has <= 14 significant bits and round(c^2) <= 14 bits
    # (but != c^2), so every partial sum is exact and the unfused kernel returns exactly 0.
    import numpy as np
    ks = np.arange(1, 2 ** 13)
    cs = 1 + ks * 2.0 ** -13
    r = (cs.astype(np.float32) ** 2).astype(np.float64)
    cs = cs[(np.round(r * 2 ** 12) == r * 2 ** 12) & (r != cs * cs)]
    g = np.random.default_rng(0)
    c = cs[g.integers(0, len(cs), rows)] * 2.0 ** g.integers(-8, 9, rows) * g.choice([-1.0, 1.0], rows)
    xc = torch.tensor(c, dtype=torch.float32)[:, None].expand(rows, n).contiguous().to(DEV)
    out = {}
    for fusion in (True, False):
        v, rs = torch.empty(rows, device=DEV), torch.empty(rows, device=DEV)
        launch(kernel, (rows,), [xc, v, rs], {"N": n}, fusion)
        out[fusion] = (v, rs)
    return {"correct": err < 1e-4 and bool((out[False][0] == 0).all()), "max_abs_err_unfused": err,
            "negative_var": [int((out[f][0] < 0).sum()) for f in (True, False)],
            "nonzero_var": [int((out[f][0] != 0).sum()) for f in (True, False)],
            "nan_inf": [int((~torch.isfinite(out[f][0])).sum() + torch.isnan(out[f][1]).sum()) for f in (True, False)],
            "max_abs_diff": float((out[True][0] - out[False][0]).abs().max()), "elements": rows}


def attention_case(kernel, n_ctx=4096, d=64, bm=64, bn=64):
    torch.manual_seed(0)
    q = (torch.randn(n_ctx, d, device=DEV) * 2).half()
    k = (torch.randn(n_ctx, d, device=DEV) * 2).half()
    v = torch.randn(n_ctx, d, device=DEV).half()
    out = {}
    for fusion in (True, False):
        o, arg = torch.empty(n_ctx, d, device=DEV), torch.empty(n_ctx, bn, device=DEV)
        launch(kernel, (n_ctx // bm,), [q, k, v, o, arg, SCALE, n_ctx], {"D": d, "BM": bm, "BN": bn}, fusion)
        out[fusion] = (o, arg)
    ref = torch.softmax((q.double() @ k.double().T) * SCALE * math.log(2.0), dim=-1) @ v.double()
    err = float((out[False][0].double() - ref).abs().max())
    return {"correct": err < 2e-2, "max_abs_err_unfused": err,
            "positive_args": [int((out[f][1] > 0).sum()) for f in (True, False)],
            "max_arg": [float(out[f][1].max()) for f in (True, False)],
            "nan_inf": [int((~torch.isfinite(out[f][0])).sum()) for f in (True, False)],
            "max_abs_diff": float((out[True][0] - out[False][0]).abs().max()), "elements": n_ctx * bn}


# ---------------------------------------------------------------------------------------------- 2
@triton.jit
def _attn_bench(Q, K, V, O, s, n_ctx, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Batched FlashAttention forward, scale applied after the dot (the hazardous form)."""
    pid, bh = tl.program_id(0), tl.program_id(1)
    base = bh.to(tl.int64) * n_ctx * D
    om = pid * BM + tl.arange(0, BM)
    od = tl.arange(0, D)
    q = tl.load(Q + base + om[:, None] * D + od[None, :])
    m_i = tl.full([BM], -float("inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in range(0, n_ctx, BN):
        on = start + tl.arange(0, BN)
        k = tl.load(K + base + on[None, :] * D + od[:, None])
        qk = tl.dot(q, k) * s
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + base + on[:, None] * D + od[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    tl.store(O + base + om[:, None] * D + od[None, :], (acc / l_i[:, None]).to(tl.float16))


def guard_cost(sm):
    from triton.testing import do_bench
    rows = {}
    # online softmax, memory-bound
    n = 8192
    x = torch.randn(n, n, device=DEV)
    p, arg = torch.empty_like(x), torch.empty_like(x)
    k = sm.online_softmax_exp2_before
    t = {f: do_bench(lambda f=f: k[(n,)](x, p, arg, SCALE, n, BLOCK=256, enable_fp_fusion=f)) for f in (True, False)}
    rows["online_softmax_exp2 8192x8192 fp32"] = {"fused_ms": t[True], "guarded_ms": t[False],
                                                   "cost_pct": 100 * (t[False] / t[True] - 1)}
    # batched attention, compute-bound
    bh, s_len, d, bm, bn = 32, 4096, 64, 128, 64
    q, kk, v = (torch.randn(bh, s_len, d, device=DEV, dtype=torch.float16) for _ in range(3))
    o = torch.empty_like(q)
    grid = (s_len // bm, bh)
    ref = torch.nn.functional.scaled_dot_product_attention(q[None], kk[None], v[None], scale=SCALE * math.log(2.0))[0]
    for f in (True, False):
        _attn_bench[grid](q, kk, v, o, SCALE, s_len, D=d, BM=bm, BN=bn, num_warps=8, num_stages=3, enable_fp_fusion=f)
        torch.cuda.synchronize()
        assert float((o.float() - ref.float()).abs().max()) < 2e-2, "attention kernel disagrees with SDPA"
    t = {f: do_bench(lambda f=f: _attn_bench[grid](q, kk, v, o, SCALE, s_len, D=d, BM=bm, BN=bn, num_warps=8,
                                                   num_stages=3, enable_fp_fusion=f)) for f in (True, False)}
    t_sdpa = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q[None], kk[None], v[None],
                                                                               scale=SCALE * math.log(2.0)))
    flops = 4 * bh * s_len * s_len * d
    rows["attention fwd B*H32 S4096 D64 fp16"] = {
        "fused_ms": t[True], "guarded_ms": t[False], "cost_pct": 100 * (t[False] / t[True] - 1),
        "fused_tflops": flops / t[True] * 1e-9, "guarded_tflops": flops / t[False] * 1e-9,
        "sdpa_ms": t_sdpa, "fused_vs_sdpa": t_sdpa / t[True]}
    return rows


# ---------------------------------------------------------------------------------------------- 3
def inductor_case():
    def scaled_softmax(x, s):
        qk = x * s
        e = torch.exp(qk - qk.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)
    reports = fg.scan_inductor(scaled_softmax, torch.randn(64, 1024, device=DEV), 0.125)
    return {"kernels": len(reports), "findings": [f"{f.kind} at {f.source}: {f.source_text}"
                                                  for r in reports for f in r.findings]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu-check", action="store_true",
                    help="run the differential part on the CPU interpreter with small shapes (needs TRITON_INTERPRET=1)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    global DEV
    if args.cpu_check:
        DEV = "cpu"
    elif not torch.cuda.is_available():
        print("no CUDA GPU: nothing to run (the CPU suite covers the scan; --cpu-check exercises this script)")
        return 2
    env = {"gpu": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (interpreter)", "torch": torch.__version__,
           "triton": triton.__version__,
           "date": datetime.date.today().isoformat(), "scale": SCALE}
    print(env)
    sm, rw, at = load("online_softmax"), load("rowwise"), load("attention")
    results, errors = {}, {}

    cases = []
    small = DEV == "cpu"
    for k in sm.HAZARDOUS + sm.SAFE:
        name = _name(k)
        cases.append((name, k, sm.SIGNATURE, sm.CONSTEXPRS,
                      lambda k=k, name=name: softmax_case(k, sm.SIGNATURE, sm.CONSTEXPRS, "exp2" in name,
                                                          *((8, 512) if small else ()))))
    for k in (rw.logsumexp_rows, rw.logsumexp_rows_safe):
        cases.append((_name(k), k, rw.LSE_SIGNATURE, rw.CONSTEXPRS, lambda k=k: lse_case(k, *((8,) if small else ()))))
    for k in (rw.variance_rows, rw.variance_rows_safe):
        cases.append((_name(k), k, rw.VAR_SIGNATURE, rw.CONSTEXPRS,
                      lambda k=k: variance_case(k, *((64,) if small else ()))))
    for k in (at.attention_fwd, at.attention_fwd_safe):
        cases.append((_name(k), k, at.SIGNATURE, at.CONSTEXPRS,
                      lambda k=k: attention_case(k, *((128,) if small else ()))))

    for name, k, sig, cx, run in cases:
        try:
            r = run()
            r["scan_flagged"] = not fg.scan(k, sig, cx).clean
            r["guard_scan_clean"] = fg.guard(k).scan(sig, cx).clean
            results[name] = r
            print(name, r)
        except Exception as e:  # noqa: BLE001 - report and go on
            errors[name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
    timing, inductor = {}, {}
    for key, fn in (("guard_cost", lambda: guard_cost(sm)), ("inductor", inductor_case)):
        if DEV != "cuda":
            break
        try:
            if key == "guard_cost":
                timing = fn()
            else:
                inductor = fn()
        except Exception as e:  # noqa: BLE001
            errors[key] = f"{type(e).__name__}: {e}"
            traceback.print_exc()

    with open(os.path.join(args.out, "fma_guard_gpu.json"), "w") as f:
        json.dump({"env": env, "differential": results, "guard_cost": timing, "inductor": inductor,
                   "errors": errors}, f, indent=1)

    print("\n== differential: fused / unfused (adversarial inputs) ==")
    print(f"{'kernel':36s} {'scan':>6s} {'ok':>3s} {'pos.args f/u':>13s} {'neg.var f/u':>12s} "
          f"{'NaN/Inf f/u':>11s} {'max|f-u|':>9s}")
    for name, r in results.items():
        pos = "/".join(map(str, r.get("positive_args", ["-", "-"])))
        neg = "/".join(map(str, r.get("negative_var", ["-", "-"])))
        nan = "/".join(map(str, r["nan_inf"]))
        print(f"{name:36s} {'HAZARD' if r['scan_flagged'] else 'clean':>6s} {'y' if r['correct'] else 'N':>3s} "
              f"{pos:>13s} {neg:>12s} {nan:>11s} {r['max_abs_diff']:9.2e}")
    print("\n== guard cost (do_bench median) ==")
    for name, r in timing.items():
        extra = f"  ({r['fused_tflops']:.0f} TFLOP/s fused; SDPA {r['sdpa_ms']:.3f} ms)" if "sdpa_ms" in r else ""
        print(f"{name:40s} fused {r['fused_ms']:.3f} ms  guarded {r['guarded_ms']:.3f} ms  "
              f"cost {r['cost_pct']:+.1f}%{extra}")
    if inductor:
        print(f"\n== torch.compile (CUDA): {inductor['kernels']} kernel(s), findings: {inductor['findings']}")
    for name, e in errors.items():
        print(f"ERROR {name}: {e}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
