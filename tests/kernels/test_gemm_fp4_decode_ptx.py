"""The CUDA FP4 decode (PTX of ``lowbit.kernels.triton.gemm_fp4.decode``), executed instruction by instruction
in Python, against ``e2m1 * scale`` computed independently: bit-exact, exhaustively over the 16
codes in every nibble position of both words, every scale byte (NV: all 128 UE4M3 bytes incl. 0,
the subnormals and NaN 0x7F; MX: all 256 E8M0 bytes incl. 2^-127, overflow to inf and NaN 0xFF),
and over all 256 code pairs of the two words with random neighbours, for both decodes (DECODE 0
and 1): output ``$j`` = element j of word $8 (low lane) / $9 (high lane).

The scale operand $10 is what the kernel passes: NV ``bf16(ue4m3 * 2^118)`` (results come out times
2^-8), MX ``bf16(2^k)``. ``mul.rn.bf16x2`` is IEEE round-to-nearest-even with subnormals, as sm_90's
HMUL2.BF16 without .ftz (the GPU benchmark checks the kernels end to end)."""
import math
import struct

import numpy as np
import pytest
import torch

from lowbit.kernels.triton.gemm_fp4 import decode as d

E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
ASM = {("nv", 0): d._ASM_NV, ("mx", 0): d._ASM_MX, ("nv", 1): d._ASM_NV1, ("mx", 1): d._ASM_MX1}


def _bf16(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0]


def _round_bf16(v: float) -> int:
    """bf16 bits of ``v`` rounded to nearest even (overflow -> inf, NaN -> NaN); ``v`` is an exact
    product of two bf16 values, so the float32 step in between does not round."""
    t = torch.tensor([v], dtype=torch.float32).to(torch.bfloat16)
    return int(t.view(torch.int16).item()) & 0xFFFF


def compile_ptx(asm: str) -> list:
    """The straight-line PTX of a decode as (op, dst, sources) tuples."""
    prog = []
    for stmt in asm.replace("{", "").replace("}", "").split(";"):
        stmt = stmt.strip()
        if not stmt or stmt.startswith(".reg"):
            continue
        op, rest = stmt.split(None, 1)
        args = [x.strip() for x in rest.split(",")]
        prog.append((op, args[0], [a if a.startswith(("$", "d", "x", "y", "n", "c")) and not a.startswith("0x")
                                   else int(a, 0) for a in args[1:]]))
    return prog


def run_ptx(prog: list, regs: dict) -> dict:
    """Execute ``compile_ptx`` output: mov/and/or/shl/shr/mul.lo.u32/prmt/mul.rn.bf16x2 on 32 bits."""
    env = dict(regs)
    for op, dst, src in prog:
        v = [env[s] if isinstance(s, str) else s for s in src]
        if op == "mov.b32":
            r = v[0]
        elif op == "and.b32":
            r = v[0] & v[1]
        elif op == "or.b32":
            r = v[0] | v[1]
        elif op == "shl.b32":
            r = (v[0] << v[1]) & 0xFFFFFFFF
        elif op == "shr.b32":
            r = v[0] >> v[1]
        elif op == "mul.lo.u32":
            r = (v[0] * v[1]) & 0xFFFFFFFF
        elif op == "prmt.b32":  # default mode: byte k of d = byte sel_k of {b, a}, bit 3 = sign replicate
            src8 = [(v[0] >> 8 * i) & 0xFF for i in range(4)] + [(v[1] >> 8 * i) & 0xFF for i in range(4)]
            r = 0
            for k in range(4):
                s = (v[2] >> 4 * k) & 0xF
                byte = src8[s & 7] if not s & 8 else (0xFF if src8[s & 7] & 0x80 else 0)
                r |= byte << 8 * k
        elif op == "mul.rn.bf16x2":
            r = _round_bf16(_bf16(v[0]) * _bf16(v[1])) | _round_bf16(_bf16(v[0] >> 16) * _bf16(v[1] >> 16)) << 16
        else:
            raise AssertionError(f"unexpected PTX instruction {op}")
        env[dst] = r
    return env


def _scale_operand(kind: str, byte: int):
    """(the kernel's bf16 scale operand bits, the true scale as a Python float)."""
    if kind == "nv":
        s = float(torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).float())
        op = torch.tensor([s], dtype=torch.float32) * 2.0 ** 118
    else:
        s = math.nan if byte == 0xFF else 2.0 ** (byte - 127)
        op = torch.tensor([s], dtype=torch.float32)
    return int(op.to(torch.bfloat16).view(torch.int16).item()) & 0xFFFF, s


def _where(decode: int, out: int, lane: int):
    """(word index 0 / 1, element) that output ``$out``'s ``lane`` holds."""
    return lane, out


def _check(kind, decode, prog, w, sb):
    """Run the decode on words ``w = (w8, w9)`` with scale bytes ``sb = (s8, s9)``; compare every output."""
    ops, true = zip(*(_scale_operand(kind, b) for b in sb))
    env = run_ptx(prog, {"$8": w[0], "$9": w[1], "$10": ops[0] | ops[1] << 16})
    post = 2.0 ** 8 if kind == "nv" else 1.0
    for out in range(8):
        for lane in range(2):
            word, elem = _where(decode, out, lane)
            code = (w[word] >> 4 * elem) & 15
            # the kernel's pair of words shares one block: the lane's scale is that of its own position
            want = _round_bf16((-1.0 if code & 8 else 1.0) * E2M1_VALUES[code & 7] * true[lane] / post)
            got = (env[f"${out}"] >> 16 * lane) & 0xFFFF
            if math.isnan(_bf16(want)):
                assert math.isnan(_bf16(got)), (kind, decode, hex(w[0]), hex(w[1]), sb, out, lane)
            else:
                assert got == want, (kind, decode, hex(w[0]), hex(w[1]), sb, out, lane, _bf16(got), _bf16(want))


@pytest.mark.parametrize("decode", [0, 1])
@pytest.mark.parametrize("kind", ["nv", "mx"])
def test_ptx_decode_exhaustive_codes_and_scales(kind, decode):
    """Every code in every nibble of both words, against every scale byte (the two lanes' scale
    bytes differ, so a lane using the other's scale would show)."""
    prog = compile_ptx(ASM[kind, decode].value)
    n_bytes = 128 if kind == "nv" else 256
    for sbyte in range(n_bytes):
        other = (sbyte + 37) % n_bytes
        for c in range(16):
            w8 = sum(((c + j) % 16) << 4 * j for j in range(8))
            w9 = sum(((c + 5 * j + 3) % 16) << 4 * j for j in range(8))
            _check(kind, decode, prog, (w8, w9), (sbyte, other))


@pytest.mark.parametrize("decode", [0, 1])
def test_ptx_decode_all_code_pairs_random_neighbours(decode):
    """All 256 (code of $8, code of $9) pairs at each of the 8 nibble positions, the other nibbles
    random (a carry or a stray bit between lanes or nibbles would show), NV scales 1 and 448."""
    prog = compile_ptx(ASM["nv", decode].value)
    rng = np.random.default_rng(decode)
    one, top = 0x38, 0x7E  # UE4M3 1.0 and 448
    for pos in range(8):
        for ca in range(16):
            for cb in range(16):
                w8, w9 = (int(v) for v in rng.integers(0, 2 ** 32, 2))
                m = ~(15 << 4 * pos) & 0xFFFFFFFF
                _check("nv", decode, prog, ((w8 & m) | ca << 4 * pos, (w9 & m) | cb << 4 * pos),
                       (one, top))


def test_decodes_cost():
    """DECODE 1 spends fewer INT32-pipe instructions than DECODE 0 (the reason it exists): per 16
    weights, counted in the PTX (and/or/shr/shl/prmt; mul.lo runs on the FMA pipe)."""
    def alu(asm):
        return sum(1 for op, _, _ in compile_ptx(asm) if op in ("and.b32", "or.b32", "shl.b32", "shr.b32", "prmt.b32"))
    a0, a1 = (alu(ASM["nv", k].value) for k in (0, 1))
    assert (a0, a1) == (40, 20), (a0, a1)
