"""Gluon FP8 GEMM (lowbit/kernels/gemm_gluon.py) on the H200: correctness, then speed vs cuBLAS.

    python benchmarks/gemm_gluon.py --out DIR [--budget SECONDS] [--quick]

Every check and every timed shape runs in a child process with a timeout (a hung kernel costs its
timeout, never the lease); the child prints one ``START``/``RESULT`` line per case (flushed), so a
hang names the case it hung in.

1. Correctness, per configuration (``gemm_gluon.CONFIGS``) and mode (tensorwise, rowwise,
   blockwise 1x128/128x128, blockwise_cols 1x128/128x1: the warp-specialized configurations only): fresh random FP8 codes (lowbit's quantizers), output written into a
   NaN-poisoned buffer (checked fully written), compared with float64 of the dequantized operands
   (+ bias): rel = ||C - ref||_F / ||ref||_F. Pass: rel <= 1.5 x the anchor's rel on the same
   codes (cuBLAS ``torch._scaled_mm`` precise for tensorwise fp32; lowbit's plain-Triton promoting
   kernel otherwise), or for bf16 outputs <= 1.5 x the error of rounding the reference to bf16.
   Shapes: 1024x1024x16384 (accumulation: cuBLAS precise ~1.3e-4), 1000x1030x4000 (ragged M, N, K;
   bias; bf16 and fp32 out), 4096x4096x512 (several tiles per persistent program), 130x200x272
   (partial chunks, a fully out-of-bounds half stage), 64x512x256 (M < tile). Failures print the
   max-error location.
2. Timing (configurations that passed), ``triton.testing.do_bench`` median (M <= 256: of CUDA-graph
   replays, 20 calls a replay: the host launch would dominate), bf16 out, at 8192^3,
   4096^3, 16384x14336x4096, 2048x4096x4096, 128x8192x8192, 16x8192x8192: cuBLAS precise and fast-accum (tensorwise), rowwise,
   blockwise (``F.scaled_mm`` / ``torch._scaled_mm``, via benchmarks/gemm.py's probe), lowbit's
   plain-Triton kernel, each Gluon configuration. TFLOP/s = 2MNK / t; ratio = cuBLAS precise time /
   this time (also vs cuBLAS fast-accum and vs lowbit's Triton kernel). Shapes stop when the
   budget (default 240 s) is near; the configurations of ``gemm_gluon.DEFAULT_CONFIG`` are checked
   on every shape, the others (``BENCH_CONFIGS``, or --configs) on the first two, while >= 130 s
   are left. ``--cpu-smoke`` exercises the script itself.
Expect ~3-4 minutes (first compiles included). Table last; JSON to DIR/gemm_gluon.json.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

MODES = ("tensorwise", "rowwise", "blockwise", "blockwise_cols")
CHECKS = [  # (M, N, K, out dtype, bias); the first two also run for the non-default configurations
    (1024, 1024, 16384, "float32", False),
    (4096, 4096, 512, "float32", False),
    (1000, 1030, 4000, "bfloat16", True),
    (1000, 1030, 4000, "float32", True),
    (130, 200, 272, "float32", False),
    (64, 512, 256, "bfloat16", False),
]
LITE = 2
BENCH_CONFIGS = ("ws_s3", "ws_s3_g16", "ws_s3_g16_eo", "wsfast_n256_s4", "k2_n128_s3_u2")  # default list; --configs for others
SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (16384, 14336, 4096), (2048, 4096, 4096), (128, 8192, 8192),
          (16, 8192, 8192)]
CASE_TIMEOUT = 90.0      # per check case / timed variant (the first includes compiling)
SHAPE_TIMEOUT = 150.0    # per timed shape
DEV = "cuda"             # "cpu" only under --cpu-smoke (TRITON_INTERPRET=1, tiny shapes: exercises the script)


def emit(kind, **kw):
    print(kind, json.dumps(kw, default=str), flush=True)


# ---------------------------------------------------------------------------------------------
# child side
# ---------------------------------------------------------------------------------------------
def _recipe(mode):
    from lowbit.scaling import Blockwise, Current, Rowwise
    return {"tensorwise": Current(), "rowwise": Rowwise(), "blockwise": Blockwise(), "blockwise_cols": Blockwise()}[mode]


def _operands(mode, M, N, K, seed):
    import torch
    from lowbit.dtypes import FP8Tensor
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(M, K, device=DEV, generator=g)
    w = torch.randn(N, K, device=DEV, generator=g) * 0.05
    a = FP8Tensor.from_float(x, _recipe(mode), "input")
    # blockwise_cols (wgrad): B quantized 1x128 along K like A, i.e. 128x1 blocks of (K, N)
    b = FP8Tensor.from_float(w, _recipe(mode), "input" if mode == "blockwise_cols" else "weight").t()
    return a, b


def _rel(c, ref):
    c = c.double()
    return float((c - ref).norm() / ref.norm().clamp_min(1e-300))


def _where_max(c, ref):
    d = (c.double() - ref).abs()
    i = int(d.argmax())
    r, col = divmod(i, ref.shape[1])
    return {"row": r, "col": col, "got": float(c.reshape(-1)[i]), "want": float(ref.reshape(-1)[i]),
            "abs_err": float(d.reshape(-1)[i]), "max_ref": float(ref.abs().max())}


def _anchor(mode, a, b, out_dtype, fast=False):
    """(name, fp32 output without bias) of the trusted implementation on the same codes, in the
    same accumulation mode (``fast``: one long tensor-core accumulation, no promotion)."""
    import torch
    from lowbit.kernels.gemm import fp8_scaled_mm
    kind = "fast-accum" if fast else "precise"
    if mode == "tensorwise":
        try:
            return f"cuBLAS _scaled_mm {kind}", torch._scaled_mm(
                a._data, b._data, a._scale, b._scale, out_dtype=torch.float32, use_fast_accum=fast)
        except Exception as e:  # noqa: BLE001
            emit("NOTE", msg=f"cuBLAS tensorwise fp32 failed: {e}"[:200])
    return f"lowbit triton ({kind})", fp8_scaled_mm(a, b, torch.float32, fast_accum=fast, variant="triton")


def _is_fast(config):
    from lowbit.kernels.gemm_gluon_ws import WS_CONFIGS
    return config in WS_CONFIGS and WS_CONFIGS[config][0]


def child_check(config, modes, n_checks):
    import torch
    from lowbit.kernels import gemm_gluon as gg
    emit("INFO", config=config, why_not=gg.gluon_available())
    for mode in modes:
        for ci, (M, N, K, od, has_bias) in enumerate(CHECKS[:n_checks]):
            case = f"{config} {mode} {M}x{N}x{K} {od}{' +bias' if has_bias else ''}"
            emit("START", case=case)
            t0 = time.time()
            try:
                out_dtype = getattr(torch, od)
                a, b = _operands(mode, M, N, K, seed=100 + ci)
                bias = (torch.randn(N, device=DEV) * 0.5).to(out_dtype) if has_bias else None
                out = torch.full((M, N), float("nan"), dtype=out_dtype, device=DEV)
                fast = _is_fast(config)
                res = gg.gluon_fp8_scaled_mm(a, b, out_dtype, bias, config=config, out=out, fast_accum=fast)
                if res is None:
                    why = gg.gluon_support(a._data, a._scale, b._data, b._scale, mode, out_dtype, bias, config)
                    emit("RESULT", case=case, config=config, mode=mode, status="declined", why=why)
                    continue
                _sync()
                ref = a.dequantize(torch.float64) @ b.dequantize(torch.float64)
                if bias is not None:
                    ref = ref + bias.double()[None, :]
                name, anc = _anchor(mode, a, b, out_dtype, fast)
                anc = anc.double() + (bias.double()[None, :] if bias is not None else 0)
                err, err_anchor = _rel(out, ref), _rel(anc, ref)
                floor = _rel(ref.to(out_dtype), ref) if out_dtype != torch.float32 else 0.0
                tol = 1.5 * max(err_anchor, floor)
                unwritten = int(torch.isnan(out).sum())
                ok = err <= tol and unwritten == 0 and out.data_ptr() == res.data_ptr()
                row = dict(case=case, config=config, mode=mode, status="ok" if ok else "FAIL", err=err,
                           anchor=name, err_anchor=err_anchor, tol=tol, unwritten=unwritten,
                           s=round(time.time() - t0, 2))
                if not ok:
                    row["max_err_at"] = _where_max(torch.nan_to_num(out.float(), nan=1e30), ref)
                emit("RESULT", **row)
            except Exception as e:  # noqa: BLE001
                emit("RESULT", case=case, config=config, mode=mode, status="ERROR",
                     error=f"{type(e).__name__}: {e}"[:400])
            finally:
                a = b = ref = out = res = anc = None  # noqa: F841
                _empty()


def _sync():
    import torch
    if DEV == "cuda":
        torch.cuda.synchronize()


def _empty():
    import torch
    if DEV == "cuda":
        torch.cuda.empty_cache()


def _wall_ms(fn):
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def child_time(M, N, K, configs):
    import torch
    from benchmarks.common import bench_ms, graph_ms
    from lowbit.kernels import gemm_gluon as gg
    from lowbit.kernels.gemm import fp8_scaled_mm
    shape = f"{M}x{N}x{K}"
    flops = 2.0 * M * N * K

    def timed(mode, variant, fn, ref_out=None):
        emit("START", case=f"{shape} {mode} {variant}")
        try:
            out = fn()
            if out is None:
                emit("RESULT", shape=shape, mode=mode, variant=variant, status="declined")
                return
            _sync()
            row = dict(shape=shape, mode=mode, variant=variant, status="ok")
            if ref_out is not None:
                row["diff_vs_anchor"] = _rel(out, ref_out.double())
            if DEV != "cuda":
                ms = _wall_ms(fn)
            elif M <= 256:  # microseconds of GPU work: time CUDA-graph replays, not the host launch
                ms = graph_ms([fn], rounds=20)
                row["timing"] = "cuda graph"
            else:
                ms = bench_ms(fn)
            row.update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12)
            emit("RESULT", **row)
            return out
        except Exception as e:  # noqa: BLE001
            emit("RESULT", shape=shape, mode=mode, variant=variant, status="ERROR",
                 error=f"{type(e).__name__}: {e}"[:300])

    for mode in [m for m in MODES if m in configs]:  # the modes the parent asked for
        try:
            a, b = _operands(mode, M, N, K, seed=7)
        except Exception as e:  # noqa: BLE001
            emit("RESULT", shape=shape, mode=mode, variant="operands", status="ERROR",
                 error=f"{type(e).__name__}: {e}"[:300])
            continue
        bf = torch.bfloat16
        anchor = None
        if mode == "blockwise_cols":
            pass  # no cuBLAS anchor for 1x128 x 128x1 here: the ratio is against lowbit's Triton kernel
        elif mode == "blockwise":
            try:
                from benchmarks.gemm import blockwise_anchor
                factory, label = blockwise_anchor(a, b)
                anchor = timed(mode, f"cuBLAS blockwise ({label})", factory(a, b))
            except Exception as e:  # noqa: BLE001
                emit("RESULT", shape=shape, mode=mode, variant="cuBLAS blockwise", status="unavailable",
                     error=f"{type(e).__name__}: {e}"[:300])
        else:
            anchor = timed(mode, "cuBLAS precise", lambda: torch._scaled_mm(
                a._data, b._data, a._scale, b._scale, out_dtype=bf, use_fast_accum=False))
            if mode == "tensorwise":
                timed(mode, "cuBLAS fast-accum", lambda: torch._scaled_mm(
                    a._data, b._data, a._scale, b._scale, out_dtype=bf, use_fast_accum=True))
        # variant="triton": the plain-Triton kernels ("auto" is the Gluon kernel itself now)
        timed(mode, "lowbit triton", lambda: fp8_scaled_mm(a, b, bf, variant="triton"), anchor)
        timed(mode, "lowbit auto (dispatch)", lambda: fp8_scaled_mm(a, b, bf), anchor)
        if mode == "tensorwise":
            timed(mode, "lowbit triton fast-accum", lambda: fp8_scaled_mm(a, b, bf, fast_accum=True), anchor)
        for cfg in configs.get(mode, []):
            timed(mode, f"gluon {cfg}", lambda cfg=cfg: gg.gluon_fp8_scaled_mm(
                a, b, bf, config=cfg, fast_accum=_is_fast(cfg)), anchor)
        a = b = anchor = None
        _empty()


# ---------------------------------------------------------------------------------------------
# parent side
# ---------------------------------------------------------------------------------------------
def run_child(args, timeout, case_timeout=CASE_TIMEOUT):
    """Run this script as a child (its own process group). Killed when ``timeout`` s have passed, or
    ``case_timeout`` s without a START/RESULT line. Returns (RESULT rows, the START case still in
    flight or None, status)."""
    import selectors
    cmd = [sys.executable, os.path.abspath(__file__), *(["--cpu-smoke"] if DEV == "cpu" else []), "--child", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    rows, started, status, buf = [], None, "ok", ""
    t0 = last = time.time()
    while True:
        now = time.time()
        if now - t0 > timeout or now - last > case_timeout:
            status = "timeout"
            break
        if not sel.select(timeout=1.0):
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(proc.stdout.fileno(), 65536).decode(errors="replace")
        if not chunk:
            break
        buf += chunk
        while "\n" in buf:
            line, buf = buf.split("\n", 1)
            kind, _, payload = line.partition(" ")
            if kind not in ("START", "RESULT", "INFO", "NOTE"):
                if line.strip():
                    print("  | " + line[:300], flush=True)
                continue
            try:
                d = json.loads(payload)
            except ValueError:
                print("  " + line[:300], flush=True)
                continue
            last = time.time()
            if kind == "START":
                started = d.get("case")
            elif kind == "RESULT":
                rows.append(d)
                started = None
                print("  " + _fmt(d), flush=True)
            else:
                print(f"  {kind}: {d}", flush=True)
    if status == "timeout":
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    if status == "ok" and proc.returncode != 0:
        status = f"exit {proc.returncode}"
    return rows, started, status


def _fmt(d):
    keys = ("case", "shape", "mode", "variant", "status", "err", "err_anchor", "tol", "unwritten", "ms",
            "tflops", "diff_vs_anchor", "why", "error", "max_err_at")
    return " ".join(f"{k}={d[k]:.4g}" if isinstance(d.get(k), float) else f"{k}={d[k]}" for k in keys if k in d)


def main():
    from benchmarks.common import env_info, parse_args, print_table, write_json

    def extra(p):
        p.add_argument("--budget", type=float, default=240.0, help="seconds for the whole run")
        p.add_argument("--configs", default=None, help="comma-separated CONFIGS keys (default: all)")
        p.add_argument("--shapes", default=None, help="comma-separated MxNxK to time (default: SHAPES)")
        p.add_argument("--modes", default=",".join(MODES), help="comma-separated modes to check and time")
        p.add_argument("--child", nargs="*", default=None, help=argparse_hidden())
        p.add_argument("--cpu-smoke", action="store_true", help="exercise this script on the CPU under "
                       "TRITON_INTERPRET=1 with tiny shapes (the Gluon kernel declines; measures nothing)")
    args = parse_args(__doc__.splitlines()[0], extra)
    global DEV, CHECKS, SHAPES, LITE
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # children inherit it
        DEV, SHAPES, LITE = "cpu", [(128, 128, 256)], 1
        CHECKS = [(128, 128, 512, "float32", False), (100, 144, 272, "bfloat16", True)]
    if args.child is not None:
        kind, rest = args.child[0], args.child[1:]
        if kind == "check":
            child_check(rest[0], rest[1].split(","), int(rest[2]))
        else:
            M, N, K = map(int, rest[0].split("x"))
            child_time(M, N, K, json.loads(rest[1]))
        return

    import torch
    t_start = time.time()
    info = env_info()
    payload = {"env": info}
    if DEV == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gemm_gluon.py needs a CUDA GPU; none found (nothing was measured).")
        write_json(args.out, "gemm_gluon", {"env": info, "error": "no CUDA GPU"})
        return
    from lowbit.kernels import gemm_gluon as gg
    print("env:", {k: info.get(k) for k in ("gpu", "torch", "triton", "date")}, "gluon:",
          gg.gluon_available() or "ok", flush=True)
    configs = args.configs.split(",") if args.configs else list(BENCH_CONFIGS)
    left = lambda: args.budget - (time.time() - t_start)  # noqa: E731

    # 1. correctness, one child per configuration (all modes), CASE_TIMEOUT per case
    modes = [m for m in MODES if m in args.modes.split(",")]
    checks, passed = [], {m: [] for m in modes}
    from lowbit.kernels.gemm_gluon_ws import WS_DEFAULT, promote_config
    defaults = set(gg.DEFAULT_CONFIG.values()) | set(WS_DEFAULT.values()) | {promote_config(8192, 8192)}
    for cfg in sorted(configs, key=lambda c: c not in defaults):  # the default configurations first, fully
        n_checks = len(CHECKS) if cfg in defaults else LITE
        if cfg not in defaults and left() < 130:
            checks.append({"case": f"{cfg} (all)", "config": cfg, "status": "skipped: time budget"})
            continue
        print(f"\n== correctness: {cfg} ({n_checks} shapes x {len(modes)} modes, {left():.0f} s left)", flush=True)
        rows, hung, status = run_child(["check", cfg, ",".join(modes), str(n_checks)],
                                       max(min(left() - 60, 40 * n_checks * len(modes)), 60))
        if status != "ok":
            rows.append({"case": hung or f"{cfg} (before the first case)", "config": cfg, "status": status.upper()})
            print(f"  child {status}; in flight: {hung}", flush=True)
        checks += rows
        for m in modes:
            mine = [r for r in rows if r.get("mode") == m and r.get("config") == cfg]
            if mine and status == "ok" and all(r["status"] in ("ok", "declined") for r in mine) \
                    and any(r["status"] == "ok" for r in mine):
                passed[m].append(cfg)
    payload["checks"] = checks
    payload["passed"] = passed
    print("\npassed correctness:", passed, flush=True)

    # 2. timing, one child per shape
    timing = []
    shapes = [tuple(map(int, x.split("x"))) for x in args.shapes.split(",")] if args.shapes else SHAPES
    for (M, N, K) in (shapes[:1] if args.quick else shapes):
        if left() < 40:
            timing.append({"shape": f"{M}x{N}x{K}", "status": "skipped: time budget"})
            print(f"skipped {M}x{N}x{K}: budget", flush=True)
            continue
        print(f"\n== timing {M}x{N}x{K} ({left():.0f} s left)", flush=True)
        rows, hung, status = run_child(["time", f"{M}x{N}x{K}", json.dumps(passed)],
                                       min(SHAPE_TIMEOUT, left() - 10))
        if status != "ok":
            rows.append({"shape": f"{M}x{N}x{K}", "variant": hung, "status": status.upper()})
            print(f"  child {status}; in flight: {hung}", flush=True)
        timing += rows
    # ratios vs the cuBLAS precise anchor of each (shape, mode)
    anchors = {}
    for r in timing:
        if r.get("ms") and r.get("variant", "").startswith(("cuBLAS precise", "cuBLAS blockwise")):
            anchors[(r["shape"], r["mode"])] = r["ms"]
        if r.get("ms") and r.get("variant") == "cuBLAS fast-accum":
            anchors[(r["shape"], "fast")] = r["ms"]
        if r.get("ms") and r.get("variant") == "lowbit triton":
            anchors[(r["shape"], r["mode"], "triton")] = r["ms"]
    for r in timing:
        t = anchors.get((r.get("shape"), r.get("mode"), "triton"))
        if t and r.get("ms"):
            r["ratio_vs_triton"] = t / r["ms"]
        a = anchors.get((r.get("shape"), r.get("mode")))
        if a and r.get("ms"):
            r["ratio_vs_cublas"] = a / r["ms"]
            if r.get("mode") == "tensorwise" and anchors.get((r["shape"], "fast")):
                r["ratio_vs_fast"] = anchors[(r["shape"], "fast")] / r["ms"]
    payload.update(timing=timing, wall_s=time.time() - t_start)
    path = write_json(args.out, "gemm_gluon", payload)

    print("\ncorrectness:")
    print_table([{k: (str(r.get(k))[:90] if k in ("why", "error") and r.get(k) else r.get(k))
                  for k in ("case", "status", "err", "err_anchor", "tol", "unwritten", "why", "error")}
                 for r in checks], ["case", "status", "err", "err_anchor", "tol", "unwritten", "why", "error"])
    print(f"\nJSON: {path}   wall: {payload['wall_s']:.0f} s\n")
    shown = [{**r, "error": r["error"][:90]} if r.get("error") else r for r in timing]
    print_table(shown, ["shape", "mode", "variant", "status", "ms", "tflops", "ratio_vs_cublas", "ratio_vs_fast",
                        "ratio_vs_triton", "diff_vs_anchor", "error"])


def argparse_hidden():
    import argparse
    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
