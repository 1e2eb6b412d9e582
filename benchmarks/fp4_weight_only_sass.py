"""Static cost of the weight-only FP4 GEMM's K loop on sm_90, from its SASS (no GPU needed).

    python benchmarks/fp4_weight_only_sass.py [--names SUBSTR ...] [--json PATH]

Each configuration is compiled for sm_90 (``triton.compile``, ``GPUTarget("cuda", 90, 32)``) as
an M = 16, N = K = 8192 NVFP4 16x16 launch would be; the K loop is the longest backward branch
holding an MMA. Counts are SASS instructions of ONE warp per loop trip, divided by the weights a
thread decodes per trip (``BLOCK_N * BLOCK_K / (32 * warps)``): so "per unit" = per warp and per
16 bytes of FP4 codes (32 weights). Pipes (H200 / sm_90, per SM sub-partition and clock): issue 1
warp instruction; FP32/FP16x2 (FFMA, FMUL, HMUL2, HFMA2, F2FP, HADD2) 1; INT "alu" (LOP3, SHF,
PRMT, LEA, IADD3, ISETP, SEL, ...) 0.5 (64 INT32 lanes a SM); IMAD* ("fmaheavy") 0.5. A loop
bound = max(issue, 2 x alu, 2 x imad) cycles per unit; the whole GEMM has ``N K / 32`` units
over 528 sub-partitions. Also: registers, spills, shared memory, CTAs a SM.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ALU = ("LOP3", "SHF", "PRMT", "LEA", "IADD3", "ISETP", "SEL", "PLOP3", "IABS", "IMNMX", "FLO", "POPC", "BMSK",
       "SGXT", "VIADD", "MOV", "P2R", "R2P", "VIMNMX")
HEAVY = ("IMAD",)
FP = ("FFMA", "FMUL", "FADD", "HMUL2", "HFMA2", "HADD2", "F2FP", "FSEL", "FMNMX", "HMNMX2")
MEM = ("LDS", "STS", "LDG", "STG", "LDGSTS", "LDSM", "STSM", "ATOM", "RED")
SYNC = ("BAR", "DEPBAR", "LDGDEPBAR", "MEMBAR", "FENCE", "WARPGROUP", "ERRBAR", "CGAERRBAR")
MMA = ("HGMMA", "HMMA")


def _sass(cubin: bytes, tool: str) -> str:
    import triton
    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([exe, tool, f.name], capture_output=True, text=True, check=True).stdout


def loop_body(sass: str) -> list:
    """SASS instructions (text) of the longest loop (backward branch) that holds an MMA."""
    ins = [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    best = []
    for addr, txt in ins:
        m = re.search(r"\bBRA\s+(?:`\(\.L_x_\d+\)|)\s*(0x[0-9a-f]+)", txt)
        if m and int(m.group(1), 16) < addr:
            body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
            if any(t.split()[0].startswith(MMA) or "MMA" in t for t in body) and len(body) > len(best):
                best = body
    return best


def opcode(txt: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", txt).split()[0]


def classify(op: str) -> str:
    base = op.split(".")[0]
    if op.startswith("U") and base not in ("UISETP",) or base.startswith("U"):
        return "uniform"
    for name, group in (("mma", MMA), ("heavy", HEAVY), ("fp", FP), ("mem", MEM), ("sync", SYNC), ("alu", ALU)):
        if base in group or any(base == g for g in group):
            return name
    return "other"


def analyse(compiled, weights_per_thread: int) -> dict:
    """Counts per unit (one warp, 16 bytes of codes) of the K loop, and the resource usage."""
    sass = _sass(compiled.asm["cubin"], "-sass")
    res = _sass(compiled.asm["cubin"], "-res-usage").split("Function")[-1]
    use = dict(w.split(":") for w in res.split() if ":" in w)
    body = loop_body(sass)
    ops = collections.Counter(opcode(t) for t in body)
    groups = collections.Counter()
    for op, n in ops.items():
        groups[classify(op)] += n
    per = float(weights_per_thread)
    dummy = sum(1 for t in body if t.startswith("@!PT"))
    out = {"regs": int(use["REG"]), "stack": int(use["STACK"]), "shared": compiled.metadata.shared,
           "loop_instr": len(body), "per_unit": round(len(body) / per, 3), "dummy_per_unit": round(dummy / per, 3),
           "groups_per_unit": {k: round(v / per, 3) for k, v in sorted(groups.items())},
           "ops_per_unit": {k: round(v / per, 3) for k, v in ops.most_common()},
           "ldg128_or_ldgsts128": sum(n for op, n in ops.items() if op.startswith(("LDG.E.128", "LDGSTS.E.BYPASS.128",
                                                                                  "LDGSTS.E.128")))}
    out["mma"] = sorted({op for op in ops if op.startswith(MMA)})
    out["pack_pairs_words"] = pack_pairs_words(compiled.asm["ttgir"])
    out["decoded_via_smem"] = decoded_via_smem(compiled.asm["ttgir"])
    alu = groups["alu"] / per
    heavy = groups["heavy"] / per
    out["cycles_per_unit"] = {"issue": out["per_unit"], "alu": round(2 * alu, 3), "imad": round(2 * heavy, 3)}
    out["bound_cycles_per_unit"] = max(out["cycles_per_unit"].values())
    return out


def _layouts(ttgir: str) -> dict:
    return dict(re.findall(r"^(#\w+) = (.*)$", ttgir, re.M))


def pack_pairs_words(ttgir: str) -> bool:
    """Every PTX decode (``inline_asm``, pack 2) takes words ``(2v, 2v + 1)`` of one row as a pair:
    the first register basis of its word operand's layout is ``[0, 1]`` (as DECODE 2 requires: it
    mixes the two words' halves and multiplies them by one scale pair)."""
    defs = _layouts(ttgir)
    ok = []
    for m in re.finditer(r"elementwise_inline_asm.*?: tensor<\d+x\d+xi32, (#\w+|#ttg\.dot_op<\{[^}]*\}>)>", ttgir):
        enc = defs.get(m.group(1), m.group(1))
        lin = re.search(r"register = \[\[(\d+), (\d+)\]", enc)
        blk = re.search(r"sizePerThread = \[\d+, (\d+)\].*order = \[1, 0\]", enc)
        dot = re.search(r"opIdx = 0, .*kWidth = (\d+)", enc)  # the words as operand A: K (words) runs of kWidth
        ok.append(bool(lin and lin.groups() == ("0", "1")) or bool(blk and int(blk.group(1)) >= 2)
                  or bool(dot and int(dot.group(1)) >= 2))
    return bool(ok) and all(ok)


def decoded_via_smem(ttgir: str) -> bool:
    """The decoded weight reaches the MMA through shared memory (a ``local_alloc`` of a bf16 register
    tensor of the loop: MMAv2's operand layout not met) rather than in registers."""
    return bool(re.search(r"ttg\.local_alloc %\S+ : \(tensor<\d+x\d+xbf16", ttgir)) and "warp_group_dot" not in ttgir


def residency(regs: int, shared: int, warps: int) -> int:
    regs = -(-regs // 8) * 8
    return min(65536 // (regs * 32 * warps), (228 * 1024) // (shared + 1024), 32 // warps)


def compile_wo(cfg: dict, sblock=16, srows=16, mx=False):
    """Compile ``_wo_kernel`` for sm_90 with configuration ``cfg`` (BLOCK_*, SPLIT_K, num_warps, ...)."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from lowbit.kernels import fp4_weight_only as wo
    fn = wo._wo_kernel
    c = dict(cfg)
    warps, stages, maxnreg = c.pop("num_warps"), c.pop("num_stages"), c.pop("maxnreg", None)
    c.setdefault("REDUCE", 2 if c["SPLIT_K"] > 1 else 0)
    c.setdefault("PIPE_SCALES", wo.pipe_scales(c["BLOCK_N"], c["BLOCK_K"], sblock, warps))
    c.setdefault("DECODE", wo.DEFAULT_DECODE)
    c.setdefault("SLOT_DOTS", False)
    c.setdefault("ACCS", 1)
    cx = dict(SBLOCK=sblock, SROWS=srows, MX=mx, HAS_BIAS=False, ASM=True, EVEN_K=True, DOT_DTYPE=tl.bfloat16,
              stride_cn=1, **c)
    cx = {k: v for k, v in cx.items() if k in fn.arg_names}
    sig, attrs = {}, {}
    for i, p in enumerate(fn.arg_names):
        sig[p] = "constexpr" if p in cx else wo._SIG[p]
        if p not in cx and (wo._SIG[p].startswith("*") or p in ("N", "K", "stride_w", "stride_s", "stride_xm",
                                                                  "stride_cm")):
            attrs[(i,)] = [["tt.divisibility", 16]]
    opts = dict(num_warps=warps, num_stages=stages)
    if maxnreg:
        opts["maxnreg"] = maxnreg
    return triton.compile(ASTSource(fn, sig, constexprs=cx, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                          options=opts), warps


def project(per_unit_cycles: float, N=8192, K=8192, ghz=1.7) -> float:
    """Microseconds for the whole GEMM at ``per_unit_cycles`` on every one of the 528 schedulers."""
    return N * K / 32 * per_unit_cycles / 528 / (ghz * 1e3)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--names", nargs="*", default=None, help="only variants whose name contains one of these")
    p.add_argument("--decode", nargs="*", type=int, default=None, help="also compile with these DECODE values")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import triton
    from benchmarks.fp4_weight_only import AB_M16
    rows = []
    todo = [(name, cfg) for name, cfg, _ in AB_M16 if not args.names or any(s in name for s in args.names)]
    if args.decode:
        todo = [(f"{name} decode{d}", {**cfg, "DECODE": d}) for name, cfg in todo for d in args.decode]
    for name, cfg in todo:
        full = {"BLOCK_M": 16, **cfg}
        comp, warps = compile_wo(full)
        a = analyse(comp, full["BLOCK_N"] * full["BLOCK_K"] // (32 * warps))
        a.update(name=name, ctas_per_sm=residency(a["regs"], a["shared"], warps), warps=warps,
                 us_at_bound_1p7ghz=round(project(a["bound_cycles_per_unit"]), 2))
        rows.append(a)
        g = a["groups_per_unit"]
        print(f"{name:44s} regs {a['regs']:3d} ctas/SM {a['ctas_per_sm']} smem {a['shared'] // 1024:3d}K  "
              f"per 16B: {a['per_unit']:.2f} instr (alu {g.get('alu', 0):.2f} imad {g.get('heavy', 0):.2f} "
              f"fp {g.get('fp', 0):.2f} mem {g.get('mem', 0):.2f} sync {g.get('sync', 0):.2f} "
              f"mma {g.get('mma', 0):.3f} unif {g.get('uniform', 0):.2f})  bound {a['bound_cycles_per_unit']:.2f} "
              f"cyc = {a['us_at_bound_1p7ghz']:.1f} us @1.7GHz  {'/'.join(a['mma'])} stack {a['stack']}"
              + (" A-via-smem" if a["decoded_via_smem"] else "") + ("" if a["pack_pairs_words"] else " PACK?"),
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(triton=triton.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
