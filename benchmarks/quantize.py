"""Fused quantize kernels vs device-to-device copy bandwidth (GPU; CPU smoke run with --device cpu).

Also against the eager torch reference and the torch.compile'd reference; about 1 minute on an
H200 with --no-compile and without --sweep.

    python benchmarks/quantize.py --out DIR [--quick] [--no-compile] [--sweep] [--budget S] [--shape RxC]
    python benchmarks/quantize.py --out DIR --device cpu --shape 64x256 --no-compile   (CPU smoke run)

For each variant and shape (8192x8192 and 16384x4096 bf16) it first checks that the fused kernels
are bit-exact with the torch reference on this GPU (data, scales, delayed-scaling state, generator
state; on the timed tensor and on a smaller one holding NaN and -NaN (with payloads), +-inf, -0,
subnormals and saturating values), then times the whole Python call three ways:

* ``call ms``: do_bench of the eager call (median; L2 flushed between calls). Bounded below by the
  host: Python and 2-4 kernel launches a call;
* ``graph ms``: the call captured in a CUDA graph (4 calls a graph), replays under do_bench: no
  host cost, the launches back to back;
* ``kern ms``: torch.profiler (CUDA activity), the device time of every kernel (and memset) the
  call runs, summed, averaged over 20 calls; ``main ms``: the main kernel alone (the largest
  "cast" kernel: the one that reads x and writes the FP8/FP4 data), ``launches`` per call.

Bandwidth: ``%copy X`` = ideal bytes / X-time against the copy bandwidth measured the same way in
this run (``dst.copy_(src)`` of 512 MiB, bytes read + written): ideal bytes are x read once plus
every output written once (what the op must move); ``%moved kern`` counts what the kernels move
(two-pass recipes read x twice: current scaling, rowwise with the transposed copy, NVFP4; NV
stochastic rounding also writes and reads the uniforms; one-pass rowwise's L2 re-read not counted).
Goal (issue 4): >= 80% of copy.

``--sweep``: the fields of the cast tuning table (``CastTuning.override``, ``sweep_rows``) on the
first shape, one row per override and variant, named ``variant (label)``, each through its own
backend (``make_backend(cast_tuning=...)``), bit-exact check first (a row that is not exact is not
timed), graph and kernel figures only; rows that would run past ``--budget`` seconds (whole run)
are skipped and listed. ``--sweep-only A,B``: only the rows whose label starts with one of these
("_" for a space). Prints a table last
and writes DIR/quantize.json.
"""
from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import bench_ms, env_info, graph_ms, guarded, kernel_profile, parse_args, print_table, \
    write_json, append_results, result_row  # noqa: E402
from lowbit.dtypes.formats import E2M1  # noqa: E402
from lowbit.dtypes.fp8_tensor import FP8Tensor  # noqa: E402
from lowbit.dtypes.philox import Philox  # noqa: E402
from lowbit.dtypes.quantize import pack_fp4, quantize  # noqa: E402
from lowbit.kernels import api as cast  # noqa: E402
from lowbit.kernels.triton import TRITON_BACKEND, make_backend  # noqa: E402
from lowbit.kernels.triton.cast_fp8 import CAST_TUNING  # noqa: E402
from lowbit.scaling.blocks import TENSOR, block_amax, expand_scale  # noqa: E402
from lowbit.scaling.delayed import DelayedScalingState  # noqa: E402
from lowbit.scaling.hadamard import random_signs  # noqa: E402
from lowbit.scaling.recipes import MX, NV, Blockwise, Current, Delayed, Rowwise  # noqa: E402

SHAPES = [(8192, 8192), (16384, 4096)]
TIME_BUDGET_S = 120  # no torch.compile'd reference is started past this (each compiles for ~10-20 s)
COMPILED = ("current e4m3", "block 1x128", "mxfp8 1x32", "nvfp4 1x16", "delayed e4m3", "rowwise e4m3")
PROFILED_CALLS = 20
# bf16 bit patterns planted in the special-value tensor: NaN of both signs with payloads, +-inf,
# -0, +-smallest / largest subnormal, +-max, values around the E4M3 / E5M2 saturation
BF16_BITS = (0xFFC0, 0x7F81, 0xFF81, 0x7FFF, 0x7F80, 0xFF80, 0x8000, 0x0001, 0x8001, 0x007F, 0x807F, 0x7F7F, 0xFF7F,
             0x43E0, 0xC3E0, 0x43E1, 0x4760, 0xC761)


def _bits(t):
    t = t.contiguous()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)


def _same(a, b) -> str:
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    d = _bits(a) != _bits(b)
    n = int(d.sum())
    return "" if n == 0 else f"{n} differ, e.g. {_bits(a)[d][:4].tolist()} vs {_bits(b)[d][:4].tolist()}"


def _cmp(got, ref, names) -> str:
    if got is None:
        return "declined"
    errs = [f"{n}: {e}" for n in names if (e := _same(getattr(got, n), getattr(ref, n)))]
    return "; ".join(errs)


def _wall_ms(fn, reps: int = 2) -> float:
    """Mean wall-clock ms (the CPU smoke run; the GPU uses do_bench)."""
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) * 1e3 / reps


def patterns(device):
    """Every bf16 bit pattern twice, (1024, 128): in order (runs of one exponent: blocks whose amax
    sets every scale, NaN and inf blocks) and in a random permutation (small elements under large
    ones)."""
    bits = torch.arange(-32768, 32768, dtype=torch.int32)
    perm = bits[torch.randperm(65536, generator=torch.Generator().manual_seed(5))]
    return torch.cat([bits, perm]).to(torch.int16).view(torch.bfloat16).reshape(1024, 128).to(device)


def specials(shape, device):
    """bf16 over several binades with special values; the raw ``BF16_BITS`` patterns are written
    into the bf16 bits (a float conversion on the GPU would make every NaN the positive canonical one)."""
    x = torch.randn(shape, device=device) * torch.exp2(torch.randint(-6, 7, shape, device=device).float())
    flat = x.view(-1)
    vals = [float("nan"), -float("nan"), float("inf"), -float("inf"), -0.0, -1e-40, 1e-40, 3e4, -1e-30]
    for i, v in enumerate(vals):
        flat[(i * 7919 + 3) % flat.numel()] = v
    xb = x.to(torch.bfloat16)
    bits = xb.view(torch.int16).view(-1)
    for i, b in enumerate(BF16_BITS):
        bits[(i * 6133 + 5) % bits.numel()] = b - 65536 if b >= 32768 else b
    return xb


# ---- variants: (name, kind, recipe, role, transposed) ---------------------------------------------

def variants():
    return [
        ("delayed e4m3", "fp8", Delayed(), "input", False),
        ("delayed e4m3 +T", "fp8", Delayed(), "input", True),
        ("current e4m3", "fp8", Current(), "input", False),
        ("current e5m2 +T", "fp8", Current(), "grad", True),
        ("rowwise e4m3", "fp8", Rowwise(), "input", False),
        ("rowwise e4m3 +T", "fp8", Rowwise(), "input", True),
        ("rowwise e5m2 +T", "fp8", Rowwise(), "grad", True),
        ("block 1x128", "fp8", Blockwise(), "input", False),
        ("block 1x128 +T", "fp8", Blockwise(), "input", True),
        ("block 128x128 +T", "fp8", Blockwise(), "weight", True),
        ("mxfp8 1x32", "fp8", MX(), "input", False),
        ("mxfp4 1x32", "fp4", MX(elem="e2m1"), "input", False),
        ("nvfp4 1x16", "fp4", NV(), "input", False),
        ("nvfp4 grad SR+RHT", "fp4", NV(), "grad", False),
        ("nvfp4 grad SR+RHT philox", "fp4", NV(), "grad", False),  # the Linear layers' draws, in the kernel
    ]


def _named(*names):
    return [v for v in variants() if v[0] in names]


def nbytes(name, kind, recipe, role, transposed, shape):
    """(ideal bytes, bytes moved by the fused implementation) for a bf16 input of this shape."""
    n = shape[0] * shape[1]
    blk = recipe.granularity(role)
    n_scales = 1
    for d in blk.scale_shape(shape):
        n_scales *= d
    if kind == "fp4":
        ideal = 2 * n + n // 2 + n_scales
        uniforms = "SR" in name and "philox" not in name  # a tensor of fp32 uniforms written, then read
        return ideal, ideal + (2 * n if isinstance(recipe, NV) else 0) + (8 * n if uniforms else 0)
    copies = 2 if transposed else 1
    ideal = 2 * n + copies * (n + n_scales * (1 if isinstance(recipe, MX) else 4))
    two_pass = isinstance(recipe, Current) or (isinstance(recipe, Rowwise) and transposed)
    return ideal, ideal + (2 * n if two_pass else 0)  # the amax pass reads x again


def make_calls(name, kind, recipe, role, transposed, x, be=TRITON_BACKEND):
    """(fused, eager reference, (fused state, reference state) or None, the fused call's CUDA
    generators): the callables make their own delayed-scaling state / seeded generator, so the two
    sides see the same sequence."""
    dev = x.device
    if kind == "fp8":
        states = None
        if isinstance(recipe, Delayed):
            states = tuple(DelayedScalingState(recipe, recipe.format(role)).to(dev) for _ in range(2))
        st_f, st_r = states or (None, None)
        if transposed:
            return (lambda: be.quantize_fp8_t(x, recipe, role, st_f),
                    lambda: cast.quantize_fp8_t(x, recipe, role, st_r, backend="torch"), states, ())
        return (lambda: be.quantize_fp8(x, recipe, role, st_f),
                lambda: FP8Tensor.from_float(x, recipe, role, state=st_r), states, ())
    signs = random_signs(7, dev) if "RHT" in name else None
    if "philox" in name:  # counter-based: the same key on both sides, no generator consumed
        key = torch.tensor([1, 2 ** 32 + 5], device=dev)
        return (lambda: be.quantize_fp4(x, recipe, role, Philox(key, 1), signs),
                lambda: cast.quantize_fp4(x, recipe, role, Philox(key, 1), signs, backend="torch"), None, ())
    g_f, g_r = torch.Generator(device=dev).manual_seed(1), torch.Generator(device=dev).manual_seed(1)
    return (lambda: be.quantize_fp4(x, recipe, role, g_f, signs),
            lambda: cast.quantize_fp4(x, recipe, role, g_r, signs, backend="torch"), None,
            (g_f,) if dev.type == "cuda" else ())


def check(name, kind, recipe, role, transposed, x, be=TRITON_BACKEND) -> str:
    """'' when the fused call is bit-exact with the reference on this device (delayed scaling: two
    steps, and the states' amax history and scale too)."""
    fused, ref, states, _ = make_calls(name, kind, recipe, role, transposed, x, be)
    errs = []
    for step in range(2 if states else 1):
        got, want = fused(), ref()
        if kind == "fp4":
            errs.append(_cmp(got, want, ("_qdata", "_scale", "_global_scale")))
        else:
            pairs = zip(got, want) if transposed and got is not None else [(got, want)]
            errs += [_cmp(g, w, ("_data", "_scale")) for g, w in pairs]
        if states:
            errs.append(_cmp(states[0], states[1], ("amax_history", "scale")))
    return "; ".join(e for e in errs if e)


def compiled_reference(kind, recipe, role):
    """A torch.compile'd function computing the reference's data and scales as plain tensors."""
    fmt, blk = recipe.format(role), recipe.granularity(role)
    if isinstance(recipe, NV):
        def f(x):
            s_b, s_g = recipe.scales(x, role)
            return pack_fp4(quantize(x, E2M1, expand_scale(s_b * s_g, x.shape, blk))), s_b, s_g
    elif isinstance(recipe, MX) and fmt is E2M1:
        def f(x):
            s = recipe.scales(x, role)
            return pack_fp4(quantize(x, E2M1, expand_scale(s, x.shape, blk))), s
    elif isinstance(recipe, Delayed):
        def f(x, scale):
            return quantize(x, fmt, scale), block_amax(x, TENSOR)
    else:
        def f(x):
            s = recipe.scales(x, role)
            return quantize(x, fmt, expand_scale(s, x.shape, blk)), s
    return torch.compile(f, dynamic=False)


# ---- timing -------------------------------------------------------------------------------------------

def main_kernel(kernels: dict) -> tuple:
    """(name, ms) of the main kernel: the longest whose name has "cast" in it (else the longest)."""
    casts = {k: v for k, v in kernels.items() if "cast" in k} or kernels
    name = max(casts, key=casts.get)
    return name, casts[name]


def time_fused(fn, gens, gpu: bool, call: bool = True) -> dict:
    """{"call ms", "graph ms", "kern ms", "main ms", "main kernel", "launches"} of ``fn`` (GPU);
    the wall clock of a call on the CPU. A figure whose method fails is left out (its error is
    printed and returned under "errors")."""
    if not gpu:
        return {"call ms": _wall_ms(fn)}
    out, errs = {}, []
    for key, method in (("call ms", lambda: bench_ms(fn) if call else None),
                        ("graph ms", lambda: graph_ms([fn], generators=gens)),
                        ("kern", lambda: kernel_profile(fn, PROFILED_CALLS))):
        try:
            v = method()
        except Exception as e:  # one method failing (e.g. capture) must not lose the others
            errs.append(f"{key}: {type(e).__name__}: {e}"[:200])
            print(f"    {errs[-1]}", flush=True)
            continue
        if key == "kern":
            if v is not None:
                name, ms = main_kernel(v["kernels"])
                out.update({"kern ms": v["ms"], "main ms": ms, "main kernel": name, "launches": v["launches"]})
        elif v is not None:
            out[key] = v
    if errs:
        out["errors"] = errs
    return out


def _row(shape, name, impl, t: dict, ideal, moved, copy: dict, exact=None) -> dict:
    """A table row: the times, and the % of copy of each against the copy timed the same way."""
    row = {"shape": f"{shape[0]}x{shape[1]}", "variant": name, "impl": impl, "exact": exact, **t}
    for key, ckey in (("call ms", "call"), ("graph ms", "graph"), ("kern ms", "kern"), ("main ms", "kern")):
        if t.get(key) and copy.get(ckey):
            row[f"%copy {key.split()[0]}"] = 100 * ideal / t[key] / 1e6 / copy[ckey]
    if "call ms" in t:  # the keys of the earlier runs' JSON: the eager call
        row.update({"ms": t["call ms"], "GB/s": ideal / t["call ms"] / 1e6})
    if moved is not None and t.get("kern ms") and copy.get("kern"):
        row["%moved kern"] = 100 * moved / t["kern ms"] / 1e6 / copy["kern"]
    return row


# ---- sweep --------------------------------------------------------------------------------------------

def sweep_rows():
    """[(label, {CastTuning field: value}, variants)]: the levers of the cast tuning table
    (``lowbit.kernels.triton.cast_fp8.tuning``), each on the variants whose launches it changes."""
    stream = _named("delayed e4m3", "current e4m3", "rowwise e4m3")
    blocks = _named("block 1x128", "mxfp8 1x32")
    block_t, rowwise_t = _named("block 1x128 +T"), _named("rowwise e4m3 +T")
    tw_t = _named("delayed e4m3 +T", "current e5m2 +T")
    fp4 = _named("mxfp4 1x32", "nvfp4 1x16")
    rows = [("fp4 pairs off", dict(fp4_pairs=False), fp4), ("fp4 fp32 encode", dict(fp4_ptx_encode=False), fp4),
            ("cols T forward", dict(cols_t_reverse=False), block_t + rowwise_t)]
    rows += [(f"cols T {c} cols", dict(cols_t_cols=c), block_t) for c in (16, 64)]
    rows += [(f"cols T {r}x{c}", dict(cols_t_rows=r, cols_t_cols=c), rowwise_t) for r, c in ((32, 64), (128, 32))]
    rows += [("T one read 64x128", dict(transpose_tile=(64, 128)), tw_t),
             ("T one read free regs", dict(transpose_maxnreg=None), tw_t),
             ("square T free regs", dict(square_t_maxnreg=None), _named("block 128x128 +T"))]
    rows += [(f"chunks {n}", dict(block_chunks=n), blocks) for n in (1, 2, 8)]
    rows += [("plain encode", dict(lean_encode=False), stream + blocks), ("div.rn", dict(fast_div=False), variants()),
             ("cvt nan test", dict(cvt_handles_nan=False), stream + blocks)]
    rows += [(f"tile {e}", dict(tile_elems=e), stream + blocks) for e in (2048, 8192)]
    rows += [(f"progs/SM {n} warps", dict(warps_per_sm=n), stream) for n in (128, 512)]
    rows += [("amax forward walk", dict(amax_reverse=False), _named("current e4m3", "current e5m2 +T", "nvfp4 1x16"))]
    rows += [("rowlocal no prefetch", dict(rowlocal_prefetch=False), stream[2:] + blocks),
             ("rowlocal no finite", dict(rowlocal_finite_tiles=False, rowlocal_maxnreg=None), stream[2:] + blocks),
             ("rowlocal free regs", dict(rowlocal_maxnreg=None), stream[2:] + blocks)]
    return rows


def run_sweep(args, x, small, rows, copy, t_start, save):
    """The sweep rows on x (first shape): check on x and the special tensor, then time."""
    skipped, done, t_sweep = [], 0, time.time()
    only = tuple(p.replace("_", " ") for p in (args.sweep_only or "").split(",") if p)  # "_": a space
    for label, repl, vs in sweep_rows():
        if only and not label.startswith(only):
            continue
        per_row = (time.time() - t_sweep) / done if done else 2.0  # s a variant: compile, check, time
        if time.time() - t_start + per_row * len(vs) > args.budget:  # would not fit: skip (a later,
            skipped.append(label)                                      # shorter row may still fit)
            continue
        done += len(vs)
        be = make_backend(cast_tuning=CAST_TUNING.override(**repl))
        for v in vs:
            name = f"{v[0]} ({label})"
            err = guarded(rows, f"{name} check", lambda: check(*v, x, be) + check(*v, small, be))
            if err != "":
                print(f"MISMATCH {name}: {err}", flush=True)
                rows.append({"shape": f"{x.shape[0]}x{x.shape[1]}", "variant": name, "impl": "lowbit",
                             "exact": False, "detail": err})
                continue
            fused, _, _, gens = make_calls(*v, x, be)
            t = time_fused(fused, gens, x.device.type == "cuda", call=False)
            rows.append(_row(x.shape, name, "lowbit", t, *nbytes(*v, x.shape), copy, True))
        save()
        print(f"  sweep {label} done ({time.time() - t_start:.0f} s)", flush=True)
    if skipped:
        print(f"  --budget {args.budget:.0f} s: sweep rows skipped: {', '.join(skipped)}", flush=True)


# ---- main ---------------------------------------------------------------------------------------------

def main():
    args = parse_args(__doc__.splitlines()[0], extra=lambda p: (
        p.add_argument("--no-compile", action="store_true", help="skip the torch.compile'd references"),
        p.add_argument("--sweep", action="store_true", help="also time the cast tuning levers (sweep_rows)"),
        p.add_argument("--sweep-only", default=None, help="comma-separated label prefixes of the sweep rows to run"),
        p.add_argument("--budget", type=float, default=240.0, help="seconds for the whole run: sweep rows that "
                       "would start past it are skipped (and listed)"),
        p.add_argument("--graph", action="store_true", help="no effect: CUDA-graph replays are always timed now"),
        p.add_argument("--shape", action="append", help="RxC (repeatable) instead of the default shapes"),
        p.add_argument("--variants", default=None, help="comma-separated name prefixes of the variants to run"),
        p.add_argument("--device", default="cuda", help="cpu: a smoke run of this script under TRITON_INTERPRET=1 "
                       "with a tiny --shape (wall-clock timing, no torch.compile)")))
    t_start = time.time()
    info = env_info()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: this benchmark needs one")
        write_json(args.out, "quantize", {"env": info, "error": "no CUDA GPU"})
        return
    gpu = dev.type == "cuda"
    rows, checks = [], []
    save = lambda: write_json(args.out, "quantize", {"env": info, "copy_GBps": copy, "checks": checks,  # noqa: E731
                                                     "rows": rows, "seconds": time.time() - t_start})

    # copy bandwidth in this run (bytes read + written), timed each way the kernels are
    mib = 512 if gpu else 8
    src = torch.empty(mib * 2 ** 20, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    t = time_fused(lambda s=src, d=dst: d.copy_(s), (), gpu)
    copy = {k.split()[0]: 2 * src.numel() / t[k] / 1e6 for k in ("call ms", "graph ms", "kern ms") if t.get(k)}
    del src, dst
    print("device-to-device copy (GB/s, read + write): " + ", ".join(f"{k} {v:.0f}" for k, v in copy.items())
          + f" ({mib} MiB)", flush=True)

    # 1. correctness, then lowbit and the eager reference, per shape and variant
    shapes = [tuple(map(int, sh.split("x"))) for sh in args.shape] if args.shape else \
        SHAPES[:1] if args.quick else SHAPES
    small = specials((1024, 4096) if gpu else (64, 256), dev)
    every = patterns(dev)
    prefixes = [p for p in (args.variants or "").split(",") if p]
    chosen = [v for v in variants() if not prefixes or any(v[0].startswith(p) for p in prefixes)]
    for si, shape in enumerate(shapes):
        x = torch.randn(shape, device=dev, dtype=torch.bfloat16)
        for v in chosen:
            name = v[0]
            ideal, moved = nbytes(*v, shape)
            err = guarded(rows, f"{name} check", lambda: check(*v, x) + (check(*v, small) if si == 0 else "")
                          + (check(*v, every) if si == 0 and (v[1] == "fp4" or name == "block 1x128 +T") else ""))
            err = "the check raised (see the traceback above)" if err is None else err
            if err:
                print(f"MISMATCH {name} {shape}: {err}", flush=True)
            checks.append({"variant": name, "shape": list(shape), "bit_exact": not err, "detail": err})
            fused, eager, _, gens = make_calls(*v, x)
            t = guarded(rows, f"{name} lowbit", lambda: time_fused(fused, gens, gpu))
            if t is not None:
                rows.append(_row(shape, name, "lowbit", t, ideal, moved, copy, not err))
            ms = guarded(rows, f"{name} eager ref", lambda: (bench_ms if gpu else _wall_ms)(eager))
            if ms is not None:
                rows.append(_row(shape, name, "eager ref", {"call ms": ms}, ideal, None, copy))
            r = rows[-2] if ms is not None and t is not None else {}
            print(f"  {shape} {name}: " + ", ".join(f"{k} {r[k]:.4f}" for k in ("call ms", "graph ms", "kern ms",
                                                                              "main ms") if k in r), flush=True)
        del x
        if gpu:
            torch.cuda.empty_cache()
    save()

    # 2. torch.compile'd references (first shape), while the time budget lasts
    if gpu and not args.no_compile:
        x = torch.randn(shapes[0], device=dev, dtype=torch.bfloat16)
        for v in [v for v in chosen if v[0] in COMPILED]:
            if time.time() - t_start > min(TIME_BUDGET_S, args.budget):
                print(f"time budget spent: no compiled reference for {v[0]} and later", flush=True)
                break
            fc = compiled_reference(*v[1:4])
            fn = (lambda: fc(x, torch.ones((), device=dev))) if isinstance(v[2], Delayed) else (lambda: fc(x))
            ms = guarded(rows, f"{v[0]} compiled ref", lambda: bench_ms(fn))
            if ms is not None:
                rows.append(_row(shapes[0], v[0], "compiled ref", {"call ms": ms}, nbytes(*v, shapes[0])[0], None,
                                 copy))
        del x
        save()

    # 3. optional sweep of the launch-policy levers (first shape)
    if args.sweep:
        x = torch.randn(shapes[0], device=dev, dtype=torch.bfloat16)
        run_sweep(args, x, small, rows, copy, t_start, save)

    report(rows, checks, copy, t_start)
    save()
    append_results([result_row(info, "quantize", r["shape"], f"{r['variant']} ({r['impl']})", "kernel ms", r["kern ms"],
                               "copy (read + write of the bytes moved)", r["%copy kern"] / 100 if r.get("%copy kern") else None)
                    for r in rows if r.get("kern ms")], args.out)


def report(rows, checks, copy, t_start):
    n_bad = sum(not c["bit_exact"] for c in checks)
    print(f"\nbit-exact vs the torch reference on this device: {len(checks) - n_bad}/{len(checks)} checks"
          + ("" if not n_bad else f"  (MISMATCH: {sorted({c['variant'] for c in checks if not c['bit_exact']})})"))
    ours = [r for r in rows if r.get("impl") == "lowbit" and "(" not in r["variant"]]
    for key in ("%copy call", "%copy graph", "%copy kern", "%copy main"):
        print(f"lowbit at >= 80% of copy ({key}): {sum(r.get(key, 0) >= 80 for r in ours)}/{len(ours)}")
    print(f"{time.time() - t_start:.0f} s in all. copy GB/s: " + ", ".join(f"{k} {v:.0f}" for k, v in copy.items()))
    print("call = eager do_bench of the Python call; graph = CUDA-graph replay of the call; kern = summed device "
          "time of the call's kernels (torch.profiler, mean of 20 calls); main = the main cast kernel alone. "
          "%copy X = ideal bytes / X vs the copy timed the same way; %moved kern = the bytes the kernels move.\n")
    print_table([r for r in rows if "impl" in r],
                ["shape", "variant", "impl", "call ms", "graph ms", "kern ms", "main ms", "%copy call", "%copy graph",
                 "%copy kern", "%copy main", "%moved kern", "launches", "exact"])
    errors = [r for r in rows if "error" in r]
    if errors:
        print("\nerrors:")
        print_table(errors, ["variant", "error"])


if __name__ == "__main__":
    main()
