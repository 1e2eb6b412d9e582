"""Fused quantize kernels vs device-to-device copy bandwidth, the eager torch reference and the
torch.compile'd reference (GPU; about 2-3 minutes on an H200).

    python benchmarks/quantize.py --out DIR [--quick] [--no-compile] [--sweep]

For each variant and shape (8192x8192 and 16384x4096 bf16) it first checks that the fused kernels
are bit-exact with the torch reference on this GPU (data, scales, delayed-scaling state, generator
state; on the timed tensor and on a smaller one holding NaN, -NaN, +-inf, -0 and subnormals), then
times them with do_bench (median). Bandwidth is reported two ways, both against the copy bandwidth
measured in this run (``dst.copy_(src)``, bytes read + written):

* ``GB/s``: ideal bytes, x read once plus every output written once (what the op must move);
* ``moved GB/s``: the bytes this implementation moves (two-pass recipes read x twice: the amax
  kernel, then the cast, for current scaling, rowwise with the transposed copy and NVFP4; NV
  stochastic rounding also writes and reads the uniforms). One-pass rowwise re-reads each row
  from L2, not counted.

``--sweep`` (about 2 more minutes) also times every variant with the per-element ``div.rn.f32``
instead of the fast exact division (``lowbit.kernels.quantize._fast_div``), the FP8 variants with
the float8 cast saturating by itself (``_cvt_saturates``: no clamp before ``cvt.rn.satfinite``),
the block casts with the fast division (``_blocks_fast_div``; they use ``div.rn.f32``, which keeps
their registers low), each checked bit-exact first, and the main kernels with 2048 / 8192 / 16384-element tiles
(default 4096) and with 1/8 (the previous policy), 1/2 and 2x the grid-stride programs; rows
named ``(div.rn)``, ``(cvt saturates)``, ``(blocks fast div)``, ``(tile N)``, ``(programs xF)``.
Prints a table last and writes DIR/quantize.json.
"""
from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import bench_ms, env_info, graph_ms, guarded, parse_args, print_table, write_json  # noqa: E402
from lowbit.dtypes.formats import E2M1  # noqa: E402
from lowbit.dtypes.fp8_tensor import FP8Tensor  # noqa: E402
from lowbit.dtypes.quantize import pack_fp4, quantize  # noqa: E402
from lowbit.kernels import cast  # noqa: E402
from lowbit.kernels import quantize as kq  # noqa: E402
from lowbit.scaling.blocks import TENSOR, block_amax, expand_scale  # noqa: E402
from lowbit.scaling.delayed import DelayedScalingState  # noqa: E402
from lowbit.scaling.hadamard import random_signs  # noqa: E402
from lowbit.scaling.recipes import MX, NV, Blockwise, Current, Delayed, Rowwise  # noqa: E402

SHAPES = [(8192, 8192), (16384, 4096)]
TIME_BUDGET_S = 120  # no torch.compile'd reference is started past this (each compiles for ~10-20 s)
COMPILED = ("current e4m3", "block 1x128", "mxfp8 1x32", "nvfp4 1x16", "delayed e4m3", "rowwise e4m3")


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


def specials(shape, device):
    x = torch.randn(shape, device=device) * torch.exp2(torch.randint(-6, 7, shape, device=device).float())
    flat = x.view(-1)
    vals = [float("nan"), -float("nan"), float("inf"), -float("inf"), -0.0, -1e-40, 1e-40, 3e4, -1e-30]
    for i, v in enumerate(vals):
        flat[(i * 7919 + 3) % flat.numel()] = v
    return x.to(torch.bfloat16)


# ---- variants: (name, kind, recipe, role, transposed) ---------------------------------------------

def variants():
    return [
        ("delayed e4m3", "fp8", Delayed(), "input", False),
        ("delayed e4m3 +T", "fp8", Delayed(), "input", True),
        ("current e4m3", "fp8", Current(), "input", False),
        ("current e5m2 +T", "fp8", Current(), "grad", True),
        ("rowwise e4m3", "fp8", Rowwise(), "input", False),
        ("rowwise e4m3 +T", "fp8", Rowwise(), "input", True),
        ("block 1x128", "fp8", Blockwise(), "input", False),
        ("block 1x128 +T", "fp8", Blockwise(), "input", True),
        ("block 128x128 +T", "fp8", Blockwise(), "weight", True),
        ("mxfp8 1x32", "fp8", MX(), "input", False),
        ("mxfp4 1x32", "fp4", MX(elem="e2m1"), "input", False),
        ("nvfp4 1x16", "fp4", NV(), "input", False),
        ("nvfp4 grad SR+RHT", "fp4", NV(), "grad", False),
    ]


def nbytes(name, kind, recipe, role, transposed, shape):
    """(ideal bytes, bytes moved by the fused implementation) for a bf16 input of this shape."""
    n = shape[0] * shape[1]
    blk = recipe.granularity(role)
    n_scales = 1
    for d in blk.scale_shape(shape):
        n_scales *= d
    if kind == "fp4":
        ideal = 2 * n + n // 2 + n_scales
        return ideal, ideal + (2 * n if isinstance(recipe, NV) else 0) + (8 * n if "SR" in name else 0)
    copies = 2 if transposed else 1
    ideal = 2 * n + copies * (n + n_scales * (1 if isinstance(recipe, MX) else 4))
    two_pass = isinstance(recipe, Current) or (isinstance(recipe, Rowwise) and transposed)
    return ideal, ideal + (2 * n if two_pass else 0)  # the amax pass reads x again


def make_calls(name, kind, recipe, role, transposed, x):
    """(fused, eager reference, (fused state, reference state) or None): the callables make their
    own delayed-scaling state / seeded generator, so the two sides see the same sequence."""
    dev = x.device
    if kind == "fp8":
        states = None
        if isinstance(recipe, Delayed):
            states = tuple(DelayedScalingState(recipe, recipe.format(role)).to(dev) for _ in range(2))
        st_f, st_r = states or (None, None)
        if transposed:
            return (lambda: kq.quantize_fp8_t_triton(x, recipe, role, st_f),
                    lambda: cast.quantize_fp8_t(x, recipe, role, st_r, backend="torch"), states)
        return (lambda: kq.quantize_fp8_triton(x, recipe, role, st_f),
                lambda: FP8Tensor.from_float(x, recipe, role, state=st_r), states)
    signs = random_signs(7, dev) if "RHT" in name else None
    g_f, g_r = torch.Generator(device=dev).manual_seed(1), torch.Generator(device=dev).manual_seed(1)
    return (lambda: kq.quantize_fp4_triton(x, recipe, role, g_f, signs),
            lambda: cast.quantize_fp4(x, recipe, role, g_r, signs, backend="torch"), None)


def check(name, kind, recipe, role, transposed, x) -> str:
    """'' when the fused call is bit-exact with the reference on this device (delayed scaling: two
    steps, and the states' amax history and scale too)."""
    fused, ref, states = make_calls(name, kind, recipe, role, transposed, x)
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


def _row(shape, name, impl, ms, ideal, moved, copy_gbs, exact=None) -> dict:
    gbs = ideal / ms / 1e6
    row = {"shape": f"{shape[0]}x{shape[1]}", "variant": name, "impl": impl, "ms": ms, "GB/s": gbs,
           "%copy": 100 * gbs / copy_gbs, "exact": exact}
    if moved is not None:
        row.update({"moved GB/s": moved / ms / 1e6, "%copy moved": 100 * moved / ms / 1e6 / copy_gbs})
    return row


def main():
    args = parse_args(__doc__.splitlines()[0], extra=lambda p: (
        p.add_argument("--no-compile", action="store_true", help="skip the torch.compile'd references"),
        p.add_argument("--graph", action="store_true", help="time CUDA-graph replays of each call (no host "
                       "launch overhead; the eager rows of 2026-12-01 may be host-bound)"),
        p.add_argument("--sweep", action="store_true", help="also time div.rn, other tile sizes and grids"),
        p.add_argument("--shape", action="append", help="RxC (repeatable) instead of the default shapes"),
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
    timer = bench_ms if gpu else _wall_ms
    if gpu and args.graph:  # replays of a captured call: no host launch cost in the figure
        timer = lambda fn: graph_ms([fn])  # noqa: E731
    rows, checks = [], []
    save = lambda: write_json(args.out, "quantize", {"env": info, "copy_GBps": copy_gbs, "checks": checks,  # noqa: E731
                                                     "rows": rows, "seconds": time.time() - t_start})

    # copy bandwidth in this run (bytes read + written)
    mib = 512 if gpu else 8
    src = torch.empty(mib * 2 ** 20, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_ms = timer(lambda: dst.copy_(src))
    copy_gbs = 2 * src.numel() / copy_ms / 1e6
    del src, dst
    print(f"device-to-device copy: {copy_gbs:.0f} GB/s ({mib} MiB, read + write)", flush=True)

    # 1. correctness, then lowbit and the eager reference, per shape and variant
    shapes = [tuple(map(int, sh.split("x"))) for sh in args.shape] if args.shape else \
        SHAPES[:1] if args.quick else SHAPES
    small = specials((1024, 4096) if gpu else (64, 256), dev)
    for si, shape in enumerate(shapes):
        x = torch.randn(shape, device=dev, dtype=torch.bfloat16)
        for v in variants():
            name = v[0]
            ideal, moved = nbytes(*v, shape)
            err = guarded(rows, f"{name} check", lambda: check(*v, x) + (check(*v, small) if si == 0 else ""))
            err = "the check raised (see the traceback above)" if err is None else err
            if err:
                print(f"MISMATCH {name} {shape}: {err}", flush=True)
            checks.append({"variant": name, "shape": list(shape), "bit_exact": not err, "detail": err})
            fused, eager, _ = make_calls(*v, x)
            for impl, fn in (("lowbit", fused), ("eager ref", eager)):
                ms = guarded(rows, f"{name} {impl}", lambda: timer(fn))
                if ms is not None:
                    lb = impl == "lowbit"
                    rows.append(_row(shape, name, impl, ms, ideal, moved if lb else None, copy_gbs,
                                     not err if lb else None))
            print(f"  {shape} {name}: " + ", ".join(f"{r['impl']} {r['GB/s']:.0f} GB/s" for r in rows[-2:]
                                                    if r.get("variant") == name), flush=True)
        del x
        if gpu:
            torch.cuda.empty_cache()
    save()

    # 2. torch.compile'd references (first shape), while the time budget lasts
    if gpu and not args.no_compile:
        x = torch.randn(shapes[0], device=dev, dtype=torch.bfloat16)
        for v in [v for v in variants() if v[0] in COMPILED]:
            if time.time() - t_start > TIME_BUDGET_S:
                print(f"time budget spent: no compiled reference for {v[0]} and later", flush=True)
                break
            fc = compiled_reference(*v[1:4])
            fn = (lambda: fc(x, torch.ones((), device=dev))) if isinstance(v[2], Delayed) else (lambda: fc(x))
            ms = guarded(rows, f"{v[0]} compiled ref", lambda: timer(fn))
            if ms is not None:
                rows.append(_row(shapes[0], v[0], "compiled ref", ms, nbytes(*v, shapes[0])[0], None, copy_gbs))
        del x
        save()

    # 3. optional sweep: div.rn instead of the fast division; tile sizes; grid-stride programs
    if args.sweep:
        x = torch.randn(shapes[0], device=dev, dtype=torch.bfloat16)
        main_kernels = [v for v in variants() if v[0] in COMPILED + ("delayed e4m3 +T", "block 1x128 +T")]
        sweeps = [("div.rn", "_fast_div", lambda: False, variants()),
                  ("cvt saturates", "_cvt_saturates", lambda: True, [v for v in variants() if v[1] == "fp8"]),
                  ("blocks fast div", "_blocks_fast_div", lambda: True,
                   [v for v in variants() if v[0].startswith(("block", "mxfp8"))])]
        sweeps += [(f"tile {e}", "_tile_elems", (lambda _x, e=e: e), main_kernels) for e in (2048, 8192, 16384)]
        progs = kq._max_programs
        sweeps += [(f"programs x{f}", "_max_programs", (lambda _x, n, f=f: max(1, int(progs(_x, n) * f))), main_kernels)
                   for f in (0.125, 0.5, 2)]
        for label, attr, repl, vs in sweeps:
            default = getattr(kq, attr)
            setattr(kq, attr, repl)
            try:
                for v in vs:
                    err = guarded(rows, f"{v[0]} ({label}) check", lambda: check(*v, x))
                    if err != "":
                        print(f"MISMATCH {v[0]} ({label}): {err}", flush=True)
                    fused, _, _ = make_calls(*v, x)
                    ms = guarded(rows, f"{v[0]} ({label})", lambda: timer(fused))
                    if ms is not None:
                        rows.append(_row(shapes[0], f"{v[0]} ({label})", "lowbit", ms, *nbytes(*v, shapes[0]),
                                         copy_gbs, err == ""))
            finally:
                setattr(kq, attr, default)
            save()
            print(f"  sweep {label} done ({time.time() - t_start:.0f} s)", flush=True)

    n_bad = sum(not c["bit_exact"] for c in checks)
    print(f"\nbit-exact vs the torch reference on this device: {len(checks) - n_bad}/{len(checks)} checks"
          + ("" if not n_bad else f"  (MISMATCH: {sorted({c['variant'] for c in checks if not c['bit_exact']})})"))
    ours = [r for r in rows if r.get("impl") == "lowbit" and "(" not in r["variant"]]
    print(f"lowbit at >= 80% of copy: {sum(r['%copy'] >= 80 for r in ours)}/{len(ours)} (ideal bytes), "
          f"{sum(r.get('%copy moved', 0) >= 80 for r in ours)}/{len(ours)} (bytes moved)")
    print(f"copy bandwidth {copy_gbs:.0f} GB/s; {time.time() - t_start:.0f} s in all; GB/s counts x read once and "
          "the outputs written once, 'moved' what the kernels move\n")
    print_table([r for r in rows if "impl" in r], ["shape", "variant", "impl", "ms", "GB/s", "%copy", "moved GB/s",
                                                   "%copy moved", "exact"])
    errors = [r for r in rows if "error" in r]
    if errors:
        print("\nerrors:")
        print_table(errors, ["variant", "error"])


if __name__ == "__main__":
    main()
