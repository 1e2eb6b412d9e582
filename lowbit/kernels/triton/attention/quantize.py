"""The attention's quantize pass: Q, K, V or dO (any strides, dense or packed) -> E4M3 codes in
lowbit's padded layouts, with one fp32 scale per ``BLOCK`` tokens of a head and sequence.

One program per (scale block, sequence, head); a sequence's rows are padded to a multiple of
``PAD`` (``max(128, BLOCK)``). Pass 1 reads the block (``CHUNK`` rows by ``DC``
columns at a time, rotated by the block-diagonal Hadamard ``R`` when ``ROTATE``: ``x R`` is a
``tl.dot`` with fp32 accumulation, each column chunk against its own diagonal block of R, which
is loaded once per column chunk; R comes padded to ``(DP, DP)``) and
takes ``amax`` (any inf/NaN makes the block's scale NaN); the scale is ``max(amax / 448, 2^-126)``
(``common.e4m3_scale``; 1 for an all-zero block). Pass 2 reads it again, multiplies by
``RN(1 / scale)`` and writes the RNE codes
(``cvt.rn.satfinite`` on the GPU, the exact arithmetic under the interpreter) to the natural
layout ``(Z, H, SP, DP)`` and/or the transposed one ``(Z, H, DP, SP)``. Rows past the sequence and
columns past the head dim are written as zeros, so the attention kernels read whole tiles without
masks. ``HAS_DELTA`` (dO): a third loop writes ``delta = rowsum(dO * O)`` (fp32) per token.

Layouts (``launch.Layout``): dense inputs keep their batch as Z (SP = the padded sequence length);
packed inputs (``VARLEN``) have Z = 1 and sequence b at rows ``cu_pad[b] ..`` (SP = all padded rows).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import e4m3_scale, encode_e4m3, finite_abs, load_rows, rotation_block, scan_spec, seq_bounds

__all__ = ["quantize_kernel", "SCAN_SPECS"]


@triton.jit
def quantize_kernel(X, stride_xb, stride_xh, stride_xs, stride_xd, CU, CU_PAD, R, C, CT, SC,
                    O, stride_ob, stride_oh, stride_os, stride_od, DELTA,
                    S, SP, H, NB, D,
                    BLOCK: tl.constexpr, PAD: tl.constexpr, CHUNK: tl.constexpr, DC: tl.constexpr,
                    DP: tl.constexpr, VARLEN: tl.constexpr,
                    ROTATE: tl.constexpr, R_IEEE: tl.constexpr, NATURAL: tl.constexpr,
                    TRANSPOSED: tl.constexpr, HAS_DELTA: tl.constexpr, HW_CVT: tl.constexpr):
    kb = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    start, start_pad, n, z = seq_bounds(b, CU, CU_PAD, S, VARLEN)
    n_pad = tl.cdiv(n, PAD) * PAD
    if BLOCK == 0:
        r0 = 0
        r1 = n_pad
    else:
        r0 = kb * BLOCK
        r1 = r0 + BLOCK
    if r0 < n_pad:
        x_base = b.to(tl.int64) * stride_xb + h * stride_xh + start.to(tl.int64) * stride_xs
        amax = 0.0
        bad = 0
        for c0 in range(0, DP, DC):  # pass 1: the block's amax (and inf/NaN)
            r = rotation_block(R, c0, DC, DP, ROTATE)
            for q0 in range(r0, r1, CHUNK):
                x = load_rows(X, x_base, stride_xs, stride_xd, r, q0 + tl.arange(0, CHUNK), c0, n, D, DC,
                                ROTATE, R_IEEE)
                amax = tl.maximum(amax, tl.max(tl.max(finite_abs(x), 1), 0))
                bad = tl.maximum(bad, tl.max(tl.max(tl.where(tl.abs(x) < float("inf"), 0, 1), 1), 0))
        if HAS_DELTA:  # dO: delta = rowsum(dO * O), zeros on the padding rows
            o_base = b.to(tl.int64) * stride_ob + h * stride_oh + start.to(tl.int64) * stride_os
            for q0 in range(r0, r1, CHUNK):
                rows = q0 + tl.arange(0, CHUNK)
                dsum = tl.zeros([CHUNK], tl.float32)
                for c0 in range(0, DP, DC):
                    cols = c0 + tl.arange(0, DC)
                    mask = (rows[:, None] < n) & (cols[None, :] < D)
                    x = tl.load(X + x_base + rows[:, None].to(tl.int64) * stride_xs + cols[None, :] * stride_xd,
                                mask=mask, other=0.0)
                    o = tl.load(O + o_base + rows[:, None].to(tl.int64) * stride_os + cols[None, :] * stride_od,
                                mask=mask, other=0.0)
                    dsum += tl.sum(x.to(tl.float32) * o.to(tl.float32), 1)
                tl.store(DELTA + (z * H + h).to(tl.int64) * SP + start_pad + rows, dsum)
        scale = tl.where(bad > 0, float("nan"), e4m3_scale(amax))
        inv = tl.div_rn(1.0, scale)
        tl.store(SC + (b * H + h) * NB + kb, scale)
        hz = (z * H + h).to(tl.int64) * SP * DP
        for c0 in range(0, DP, DC):  # pass 2: the codes
            r = rotation_block(R, c0, DC, DP, ROTATE)
            cols = c0 + tl.arange(0, DC)
            for q0 in range(r0, r1, CHUNK):
                rows = q0 + tl.arange(0, CHUNK)
                x = load_rows(X, x_base, stride_xs, stride_xd, r, rows, c0, n, D, DC, ROTATE, R_IEEE)
                bits = encode_e4m3(x * inv, HW_CVT).to(tl.uint8)
                if NATURAL:
                    tl.store(C + hz + (start_pad + rows[:, None]).to(tl.int64) * DP + cols[None, :], bits)
                if TRANSPOSED:
                    tl.store(CT + hz + start_pad + cols[None, :].to(tl.int64) * SP + rows[:, None], bits)


# ---- sm_90 compile configuration for fma_guard -------------------------------------------------
_SIG = {"X": "*bf16", "R": "*bf16", "C": "*u8", "CT": "*u8", "SC": "*fp32", "O": "*bf16", "DELTA": "*fp32",
        "CU": "*i32", "CU_PAD": "*i32", **{p: "i32" for p in ("stride_xb", "stride_xh", "stride_xs", "stride_xd",
                                                            "stride_ob", "stride_oh", "stride_os", "stride_od",
                                                            "S", "SP", "H", "NB", "D")}}
SCAN_SPECS = (
    scan_spec(quantize_kernel, _SIG, dict(stride_xd=1, stride_od=1, BLOCK=128, PAD=128, CHUNK=64, DC=128, DP=128,
                                          VARLEN=False, ROTATE=True,
                                          R_IEEE=False, NATURAL=True, TRANSPOSED=True, HAS_DELTA=True, HW_CVT=1), 4, 2),
)
