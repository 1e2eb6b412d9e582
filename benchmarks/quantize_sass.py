"""Static profile of the fused quantize kernels as launched on an H200, without a GPU.

    python benchmarks/quantize_sass.py [--shape 16384x4096] [--variant NAME ...] [--set attr=value ...] [--sass DIR]
                                       [--json]

For each variant of ``benchmarks/quantize.py`` it records the launches the launcher makes for a
bf16 input of the shape (meta tensors; the launcher believes it is on an sm_90 GPU with 132 SMs),
compiles each launch for ``GPUTarget("cuda", 90, 32)`` with the launcher's grid, constexprs and
options (the JIT's specialisation: 16-byte aligned pointers, ints == 1 constant, ints % 16
divisible), and reports per kernel: registers per thread, resident programs per SM (65536
registers, 2048 threads, 32 warps and 32 programs an SM; registers allocated 8 a thread at a time), bytes of
``ld.global`` in flight per SM (vector width x loads per thread per iteration x resident threads),
elements a thread per iteration, SASS instructions in the hottest loop per element (all; and those
of the half-rate integer/compare/select ("alu") and the FP32/IMAD ("fma") pipes: on sm_90 an SM
issues 4 warp instructions a clock, 2 of them alu), and the global load / store widths in bytes.
``path_per_elem`` (loop-free kernels): instructions an element on the fall-through path (the
common one: rare branches jumped to), where ``per_elem`` counts every instruction up to the EXIT.
``short_per_elem`` (loops holding an if/else): instructions an element through the loop by the
shorter arm of its largest if/else (the row-local casts' finite tiles), where ``per_elem`` counts
both arms.

``--set`` overrides a field of the cast tuning table (``CastTuning``, as the sweep does), e.g.
``--set fast_div=False --set tile_elems=8192``. Needs triton (3.6 or newer) with its
bundled ``cuobjdump``; no GPU.
"""
from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SM_REGS, SM_THREADS, SM_BLOCKS = 65536, 2048, 32  # per SM on sm_90: registers, threads, resident programs
_PTR = {torch.int16: "*i16", torch.uint8: "*u8", torch.float32: "*fp32", torch.bfloat16: "*i16", torch.int32: "*i32"}


def record(variant, shape, launches, be):
    """Run the launcher for ``variant`` on a meta bf16 tensor; the launches are recorded, not run."""
    from benchmarks.quantize import make_calls
    from lowbit.scaling.hadamard import random_signs
    x = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    name, kind, recipe, role, _ = variant
    if kind == "fp4":  # no generator on meta: the launches do not depend on it
        signs = random_signs(7, "cpu").to("meta") if "RHT" in name else None
        fused = lambda: be.quantize_fp4(x, recipe, role, None, signs)  # noqa: E731
    else:
        fused = make_calls(*variant, x, be)[0]
    try:
        fused()
    except Exception:  # building the FP8Tensor / the FP4 rand on meta may fail after the launches
        pass


def _bin(name):
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_launch(kernel, args, kw):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sig, cx, attrs = {}, {}, {}
    for i, (p, a) in enumerate(zip(inspect.signature(kernel.fn).parameters, args)):
        if isinstance(a, torch.Tensor):
            sig[p], attrs[(i,)] = _PTR[a.dtype], [["tt.divisibility", 16]]
        elif isinstance(a, bool) or a == 1:
            sig[p], cx[p] = "constexpr", a
        elif isinstance(a, float):
            sig[p] = "fp32"
        else:
            sig[p] = "i32" if -2 ** 31 <= a < 2 ** 31 else "i64"
            if a % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    kw = dict(kw)
    opts = {k: kw.pop(k) for k in ("num_warps", "enable_fp_fusion", "num_stages", "maxnreg") if k in kw}
    sig.update(dict.fromkeys(kw, "constexpr"))
    cx.update(kw)
    return triton.compile(ASTSource(kernel, sig, constexprs=cx, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                          options=opts), opts, cx


def sass_of(cubin: bytes) -> tuple[str, dict]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([_bin("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True, check=True)
        sass = subprocess.run([_bin("cuobjdump"), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    usage = dict(w.split(":") for w in res.stdout.split("Function")[-1].split() if ":" in w)
    return sass, usage


_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")


def instructions(sass: str):
    """[(address, text)] of the SASS, NOPs dropped."""
    out = []
    for m in _INSN.finditer(sass):
        text = m.group(2).strip()
        if not text.startswith("NOP"):
            out.append((int(m.group(1), 16), text))
    return out


def loops(insns):
    """[(start, end, n_instructions)] of every backward branch (a loop body), largest first."""
    found = []
    for addr, text in insns:
        m = re.search(r"BRA .*?0x([0-9a-f]+)", text)
        if m:
            target = int(m.group(1), 16)
            if target <= addr:
                found.append((target, addr, sum(1 for a, _ in insns if target <= a <= addr)))
    return sorted(found, key=lambda t: -t[2])


def fall_through(insns):
    """The instructions from the start to the first EXIT, following unconditional branches and
    falling through conditional ones: a loop-free kernel's common path (its rare branches, such as
    ``div.rn``'s slow path or a tile holding NaN, are jumped to)."""
    idx = {a: i for i, (a, _) in enumerate(insns)}
    out, seen, i = [], set(), 0
    while i < len(insns) and insns[i][0] not in seen:
        a, t = insns[i]
        seen.add(a)
        out.append(t)
        if t.startswith("EXIT"):
            break
        m = re.match(r"BRA (?:`\(\.L_x_\d+\) )?0x([0-9a-f]+)", t)
        i = idx.get(int(m.group(1), 16), len(insns)) if m else i + 1
    return out


def loop_body(insns, loop):
    return [t for a, t in insns if loop[0] <= a <= loop[1]]


_BRA = r"BRA (?:`\(\.L_x_\d+\) )?0x([0-9a-f]+)"


def diamond(insns, loop):
    """(instructions on the shorter, on the longer way through the loop's largest if/else) or
    None: a conditional forward branch whose target follows an unconditional branch past it (the
    row-local casts' finite-tile branch: the common, finite way is the shorter one)."""
    lo, hi = loop[0], loop[1]
    body = [(a, t) for a, t in insns if lo <= a <= hi]
    best = None
    for i, (a, t) in enumerate(body):
        m = re.match(r"@!?U?P\d " + _BRA, t)
        if not m or not a < int(m.group(1), 16) <= hi:
            continue
        tgt = int(m.group(1), 16)
        m2 = re.match(_BRA, [t2 for a2, t2 in body if a2 < tgt][-1])
        if m2 and int(m2.group(1), 16) > tgt and (best is None or tgt - a > best[2] - best[1]):
            best = (a, tgt, int(m2.group(1), 16))
    if best is None:
        return None
    br, tgt, join = best
    arm_a = sum(br < a < tgt for a, _ in body)
    arm_b = sum(tgt <= a < join for a, _ in body)
    rest = len(body) - arm_a - arm_b
    return rest + min(arm_a, arm_b), rest + max(arm_a, arm_b)


def profile(name, kernel, grid, args, kw, elems_per_iter):
    c, opts, cx = compile_launch(kernel, args, kw)
    sass, usage = sass_of(c.asm["cubin"])
    warps = opts.get("num_warps", 4)
    threads = 32 * warps
    regs = int(usage["REG"])
    resident = min(SM_REGS // (-(-regs // 8) * 8 * threads), SM_THREADS // threads, SM_BLOCKS)
    insns = instructions(sass)
    lps = loops(insns)
    lps = [lp for lp in lps if lp[2] > 16]  # not the atomics' retry loops
    with_st = [lp for lp in lps if any("STG" in t for t in loop_body(insns, lp))]
    hot = max(with_st, key=lambda lp: lp[2]) if with_st else min(lps, key=lambda lp: lp[0]) if lps else None
    split = diamond(insns, hot) if hot else None
    if hot:
        body = loop_body(insns, hot)
    else:  # loop-free: the straight path up to the first unconditional EXIT (slow-path subroutines follow it)
        body = []
        for _, t in insns:
            body.append(t)
            if t.startswith("EXIT"):
                break
    ldg = [t for t in body if "LDG" in t]
    width = lambda t: 16 if ".128" in t else 8 if ".64" in t else 2 if (".U16" in t or ".S16" in t) else 1 if (
        ".U8" in t or ".S8" in t) else 4  # noqa: E731
    ld_bytes = sum(width(t) for t in ldg)
    ahead = bool(ldg) and all(loaded_ahead(body, i) for i, t in enumerate(body) if "LDG" in t)
    stg = [t for t in body if "STG" in t]
    per_thread = max(1, elems_per_iter / threads)
    return dict(kernel=name, grid=grid[0], warps=warps, regs=regs, stack=int(usage.get("STACK", 0)),
                smem=int(usage.get("SHARED", 0)), resident=resident, loop=bool(lps), elems_thread=per_thread,
                alu=sum(pipe(t) == "alu" for t in body) / per_thread,
                fma=sum(pipe(t) == "fma" for t in body) / per_thread,
                body=len(body),
                elems=elems_per_iter, per_elem=len(body) / max(1, elems_per_iter / threads),
                path_per_elem=None if lps else len(fall_through(insns)) / per_thread,
                short_per_elem=split[0] / per_thread if split else None,
                ldg=len(ldg), ld_bytes_thread=ld_bytes, inflight_kb=ld_bytes * threads * resident / 1024,
                ld_widths=sorted({width(t) for t in ldg}), ahead=ahead, st_widths=sorted({width(t) for t in stg}),
                n_stg=len(stg),
                total=len(insns), ptx=c.asm["ptx"], ttgir=c.asm["ttgir"], sass=sass, constexprs=cx)


_FMA = ("FFMA", "FMUL", "FADD", "IMAD", "HFMA2", "HMUL2", "HADD2")
_OTHER = ("LDG", "STG", "LDS", "STS", "BRA", "BAR", "SHFL", "ATOM", "RED", "MUFU", "EXIT", "BSSY", "BSYNC", "CALL",
          "RET", "S2R", "S2UR", "CS2R", "U", "MEMBAR", "ERRBAR", "CGAERRBAR", "WARPSYNC", "DEPBAR", "LDC", "ULDC",
          "MOV")


def pipe(t):
    """'fma' (FP32/IMAD pipe: one warp instruction a clock per SM quarter), 'alu' (integer, compare,
    select, min/max, pack: half that rate on sm_90), 'other' (memory, control, uniform datapath)."""
    op = t.split()[1] if t.startswith("@") else t.split()[0]
    if op.startswith(_FMA):
        return "fma"
    if op.startswith(_OTHER):
        return "other"
    return "alu"


def loaded_ahead(body, i):
    """The registers the LDG at ``body[i]`` loads are first read after the loop's back-edge (a load
    issued for the next iteration), not later in the same iteration."""
    m = re.search(r"LDG\S*\s+R(\d+)", body[i])
    if not m:
        return False
    n = 4 if ".128" in body[i] else 2 if ".64" in body[i] else 1
    regs = {f"R{int(m.group(1)) + k}" for k in range(n)}
    for j, t in enumerate(body[i + 1:], i + 1):
        if j >= len(body) - 8:  # copies of the carried registers before the back-edge
            return True
        ops = re.split(r"[\s,\[\]|]+", t.split(" ", 1)[1] if " " in t else "")
        srcs = ops[1:] if not t.startswith(("ST", "@")) else ops
        if t.startswith("@"):
            srcs = ops[2:]
        if regs & {o.split(".")[0] for o in srcs}:
            return False
    return True


def elems_per_iter(kw, args, kernel):
    """Elements of x one pass of the hot loop (or the whole program, loop-free) handles."""
    if "CHUNK_R" in kw:
        return kw["CHUNK_R"] * kw["TILE_C"]
    if "SUB_R" in kw:
        return kw["SUB_R"] * kw.get("TILE_C", kw.get("B", 1))
    if "BLOCK_R" in kw and "BLOCK_C" in kw:
        return kw["BLOCK_R"] * kw["BLOCK_C"]
    if "TR" in kw and "BC" in kw:  # the row-local walk: a tile of TR groups of BC elements
        return kw["TR"] * kw["BC"]
    if "TILE_R" in kw:
        return kw["TILE_R"] * kw["TILE_C"]
    return 1


def patch_launcher(sets):
    """(backend, launches): a Triton backend whose casts believe they drive an sm_90 GPU with 132
    SMs (the H200) and record their launches instead of running them; ``sets``: "field=value"
    overrides of the cast tuning table (``CastTuning``)."""
    from lowbit.kernels.triton import cast_common, make_backend
    from lowbit.kernels.triton.cast_fp4 import launch as l4
    from lowbit.kernels.triton.cast_fp8 import CAST_TUNING
    from lowbit.kernels.triton.cast_fp8 import launch as l8
    from lowbit.kernels.triton.runtime import Launch
    h200 = lambda x: cast_common.Target(132, True, False)  # noqa: E731
    l8.target = l4.target = h200
    launches = []

    def recorded(self, *args):
        launches.append((self.kernel.fn.__name__ if hasattr(self.kernel, "fn") else str(self.kernel), self.kernel,
                         tuple(self.grid), args, dict(self.consts)))
    Launch.__call__ = recorded
    changes = {}
    for s in sets:
        attr, val = s.split("=")
        changes[attr] = eval(val)  # noqa: S307 - a developer's command line
    return make_backend(cast_tuning=CAST_TUNING.override(**changes)), launches


COLS = ("kernel", "grid", "warps", "regs", "resident", "elems_thread", "inflight_kb", "ahead", "body", "per_elem",
        "path_per_elem", "short_per_elem",
        "alu", "fma", "ld_widths", "st_widths", "smem", "stack")


def profile_rows(names=None, shape=(16384, 4096), sets=(), sass_dir=None, show=False):
    """One row per launch (the delayed-state update left out) of each variant of
    benchmarks/quantize.py named in ``names`` (all when None), with ``sets`` applied."""
    be, launches = patch_launcher(sets)
    from benchmarks.quantize import variants
    out = []
    if show:
        print(f"{'variant':22s} " + " ".join(f"{c:>10s}" for c in COLS))
    for v in variants():
        if names and v[0] not in names:
            continue
        launches.clear()
        record(v, shape, launches, be)
        for name, kernel, grid, args, kw in launches:
            if name == "_delayed_update_kernel":
                continue
            r = profile(name, kernel, grid, args, kw, elems_per_iter(kw, args, kernel))
            out.append({"variant": v[0], **{k: r[k] for k in r if k not in ("ptx", "ttgir", "sass", "constexprs")},
                        "ptx_ld_v4": "ld.global.v4.b32" in r["ptx"], "ptx_st_v4": "st.global.v4.b32" in r["ptx"]})
            if show:
                print(f"{v[0]:22s} " + " ".join(f"{str(r[c] if not isinstance(r[c], float) else round(r[c], 1)):>10s}"
                                                 for c in COLS), flush=True)
            if sass_dir:
                os.makedirs(sass_dir, exist_ok=True)
                base = os.path.join(sass_dir, f"{v[0].replace(' ', '_').replace('+', 'p')}.{name}")
                open(base + ".sass", "w").write(r["sass"])
                open(base + ".ptx", "w").write(r["ptx"])
                open(base + ".ttgir", "w").write(r["ttgir"])
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="16384x4096")
    p.add_argument("--variant", action="append", help="a variant of benchmarks/quantize.py (repeatable; default all)")
    p.add_argument("--set", action="append", default=[], help="CastTuning field=value (repeatable)")
    p.add_argument("--sass", help="folder to write each kernel's SASS and PTX")
    p.add_argument("--json", action="store_true", help="print the rows as one JSON list (last line) instead")
    a = p.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("run without TRITON_INTERPRET")
    rows = profile_rows(a.variant, tuple(map(int, a.shape.split("x"))), a.set, a.sass, show=not a.json)
    if a.json:
        import json
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
