"""Row-local FP4 (E2M1) casts of a contiguous bf16 x on element *pairs* (Triton): MX-32 and NV-16
with 1xBC blocks (C % BC == 0), the math of ``quantize_fp4_kernels``' ``_mx_fp4_rowblock_kernel``
and ``_nv_fp4_rowblock_kernel``, bit-exact with ``FP4Tensor.from_float``.

x is read as int32 words ``w`` (elements 2i, 2i + 1 in the low / high half), widened exactly as
``lo = w << 16``, ``hi = w & 0xFFFF0000``, and a pair's code byte ``code(lo) | code(hi) << 4``
(sign bits from w's bits 15 / 31) is q's layout: words in, bytes out, the same (TR, BC / 2) tile
a program, no shuffle between load and store and no shared memory. A grid-stride walk over
tiles of TR blocks (``quantize._rowlocal_grid``). With ``ASM`` (CUDA) the block amax and NaN flag
come from bf16x2 maxima (``e2m1_encode._bf16x2_amax``) and MX encodes in PTX (``_e2m1_pairs``);
the interpreter takes the fp32 path (``_e2m1_signed`` / ``_e2m1_rne``), the same bits.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .e2m1_encode import _bf16x2_amax, _e2m1_pairs, _e2m1_rne, _e2m1_signed
from .quantize_fp4_kernels import _nv_global_scale
from .quantize_jit_helpers import _div_parts, _finite_abs, _grid_round, _mx_exponent, _pow2, scan_spec

__all__ = ["SCAN_SPECS"]


@triton.jit
def _mx_fp4_pairs_kernel(w_ptr, q_ptr, s_ptr, n_groups, n_tiles, TR: tl.constexpr, BC: tl.constexpr,
                         RCEIL: tl.constexpr, ASM: tl.constexpr):
    """MX E2M1 of a contiguous bf16 x with 1xBC blocks (C % BC == 0), the math of
    ``_mx_fp4_rowblock_kernel``, on element *pairs*: x is read as int32 words ``w`` (elements 2i,
    2i + 1 in the low / high half), widened exactly as ``lo = w << 16``, ``hi = w & 0xFFFF0000``,
    and a pair's code byte ``code(lo) | code(hi) << 4`` is q's layout: words in, bytes out, the
    same (TR, BC / 2) tile, no shuffle between load and store. Per block (a row of the tile):
    the NaN flag (the integer max of the magnitude bits above +inf; ``ASM``: a NaN-propagating
    bf16x2 max), the finite amax as max |fma(x, 0, x)|, ``k = _mx_exponent(amax)``, scale code
    ``k + 127`` (0xFF and codes 0 for a
    block holding NaN), codes of ``x * 2^-k`` by ``_e2m1_signed`` (``ASM``: ``_e2m1_pairs``, a
    pair at a time in bf16x2). Grid-stride over tiles of TR blocks."""
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    c = tl.arange(0, BC // 2)
    for t in range(pid, n_tiles, step):
        g = t * TR + tl.arange(0, TR)
        offs = g[:, None].to(tl.int64) * (BC // 2) + c[None, :]
        mask = (g < n_groups)[:, None] & (c >= 0)[None, :]
        w = tl.load(w_ptr + offs, mask=mask, other=0)
        if ASM:
            amax, has_nan = _bf16x2_amax(w, 1)
        else:
            lo = (w << 16).to(tl.float32, bitcast=True)
            hi = (w & -65536).to(tl.float32, bitcast=True)
            has_nan = tl.max(tl.maximum(w & 0x7FFF, (w >> 16) & 0x7FFF), axis=1) > 0x7F80  # NaN above +inf
            amax = tl.max(tl.maximum(tl.abs(tl.fma(lo, 0.0, lo)), tl.abs(tl.fma(hi, 0.0, hi))), axis=1)
        k = _mx_exponent(amax, RCEIL, 2, 6.0, 2)
        tl.store(s_ptr + g, tl.where(has_nan, 255, k + 127).to(tl.uint8), mask=g < n_groups)
        if ASM:
            byte = _e2m1_pairs(w, (((127 - k) << 7) * 65537)[:, None], has_nan[:, None])
        else:
            p = _pow2(-k)[:, None]
            byte = tl.where(has_nan[:, None], 0, _e2m1_signed(lo * p) | (_e2m1_signed(hi * p) << 4))
        tl.store(q_ptr + offs, byte.to(tl.uint8), mask=mask)


@triton.jit
def _nv_pair_quotients(lo, hi, s, FAST_DIV: tl.constexpr, DIRECT: tl.constexpr):
    """``|RN(x / s)|`` up to NaN for the pair halves (s per block, (TR, 1)): ``_div_rn``'s two
    Newton-Markstein steps from ``RN(1 / s')``; ``DIRECT`` (the tensor scale in [2^-60, 2^60], so
    s in [2^-69, 2^69], 1 / s normal): on x and s themselves, no 2^k rescale (a bf16 x over such
    an s neither overflows nor, where the quotient reaches 2^-3, leaves a subnormal remainder;
    a smaller quotient encodes to 0 whatever its last bits). An
    inf x gives NaN (inf - inf in the remainder), which ``min(., 6)`` (NaN-ignoring) saturates as
    the reference does; ``_div_rn``'s guard for it is not needed."""
    if not FAST_DIV:
        return tl.div_rn(lo, s), tl.div_rn(hi, s)
    if DIRECT:
        sp, ys = s, tl.div_rn(1.0, s)
        a_lo, a_hi = lo, hi
    else:
        p2k, sp, ys = _div_parts(s, True)
        a_lo, a_hi = lo * p2k, hi * p2k
    nsp = -sp  # fma(q, -s', a): the remainder a - q s' (Triton's -q is a subtraction from 0)
    q_lo, q_hi = a_lo * ys, a_hi * ys
    q_lo = tl.fma(tl.fma(q_lo, nsp, a_lo), ys, q_lo)
    q_hi = tl.fma(tl.fma(q_hi, nsp, a_hi), ys, q_hi)
    return tl.fma(tl.fma(q_lo, nsp, a_lo), ys, q_lo), tl.fma(tl.fma(q_hi, nsp, a_hi), ys, q_hi)


@triton.jit
def _nv_pairs_tile(w_ptr, q_ptr, s_ptr, t, gs, n_groups, TR: tl.constexpr, BC: tl.constexpr,
                   FAST_DIV: tl.constexpr, ASM: tl.constexpr, DIRECT: tl.constexpr):
    """Tile t of ``_nv_fp4_pairs_kernel``."""
    g = t * TR + tl.arange(0, TR)
    c = tl.arange(0, BC // 2)
    offs = g[:, None].to(tl.int64) * (BC // 2) + c[None, :]
    mask = (g < n_groups)[:, None] & (c >= 0)[None, :]
    w = tl.load(w_ptr + offs, mask=mask, other=0)
    lo = (w << 16).to(tl.float32, bitcast=True)
    hi = (w & -65536).to(tl.float32, bitcast=True)
    if ASM:
        amax, has_nan = _bf16x2_amax(w, 1)
        amax = tl.where(amax == amax, amax, 0.0)
    else:
        has_nan = tl.max(tl.maximum(w & 0x7FFF, (w >> 16) & 0x7FFF), axis=1) > 0x7F80  # NaN above +inf
        amax = tl.max(tl.maximum(_finite_abs(lo), _finite_abs(hi)), axis=1)
    tb = tl.div_rn(amax, 6.0)
    code, s_block = _grid_round(tl.minimum(tl.div_rn(tb, gs), 448.0), tb, -6, 3, False)  # UE4M3, RNE
    s_block = tl.maximum(s_block, 0.001953125)  # >= 2^-9, the smallest E4M3 subnormal
    tl.store(s_ptr + g, tl.where(has_nan, 0x7F, tl.maximum(code, 1)).to(tl.uint8), mask=g < n_groups)
    y_lo, y_hi = _nv_pair_quotients(lo, hi, (s_block * gs)[:, None], FAST_DIV, DIRECT)
    mags = _e2m1_rne(tl.minimum(tl.abs(y_lo), 6.0)) | (_e2m1_rne(tl.minimum(tl.abs(y_hi), 6.0)) << 4)
    byte = tl.where(has_nan[:, None], 0, mags | ((w >> 12) & 8) | ((w >> 24) & 0x80))
    tl.store(q_ptr + offs, byte.to(tl.uint8), mask=mask)


@triton.jit
def _nv_fp4_pairs_kernel(w_ptr, amax_ptr, q_ptr, s_ptr, g_ptr, n_groups, n_tiles, TR: tl.constexpr,
                         BC: tl.constexpr, FAST_DIV: tl.constexpr, ASM: tl.constexpr):
    """NV E2M1 of a contiguous bf16 x with 1xBC blocks (C % BC == 0), the math of
    ``_nv_fp4_rowblock_kernel``, on element pairs as ``_mx_fp4_pairs_kernel`` (int32 words in,
    code bytes out): per block the finite amax and NaN flag (``ASM``: ``_bf16x2_amax``; a block
    without a finite element has amax 0), the UE4M3 block scale, ``|y| = |RN(x / s)|``
    (``_nv_pair_quotients``, direct where the tensor scale allows it: one branch per program), the
    codes of ``min(|y|, 6)`` with x's signs (x / s has x's sign: s > 0), codes 0 and scale 0x7F
    for a block holding NaN."""
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    gs = _nv_global_scale(amax_ptr, g_ptr, pid)
    if (gs >= 8.673617379884035e-19) & (gs <= 1.152921504606847e18):  # 2^-60 .. 2^60
        for t in range(pid, n_tiles, step):
            _nv_pairs_tile(w_ptr, q_ptr, s_ptr, t, gs, n_groups, TR, BC, FAST_DIV, ASM, True)
    else:
        for t in range(pid, n_tiles, step):
            _nv_pairs_tile(w_ptr, q_ptr, s_ptr, t, gs, n_groups, TR, BC, FAST_DIV, ASM, False)


# ---- representative sm_90 compile configurations (the GPU launches; scanned by lowbit.fma_guard) --------

SCAN_SPECS = (
    scan_spec(_mx_fp4_pairs_kernel, {"w_ptr": "*i32", "q_ptr": "*u8", "s_ptr": "*u8", "n_groups": "i32", "n_tiles": "i32"},
              dict(TR=128, BC=32, RCEIL=False, ASM=True), num_warps=8),
    scan_spec(_nv_fp4_pairs_kernel, {"w_ptr": "*i32", "amax_ptr": "*fp32", "q_ptr": "*u8", "s_ptr": "*u8",
                                     "g_ptr": "*fp32", "n_groups": "i32", "n_tiles": "i32"},
              dict(TR=256, BC=16, FAST_DIV=True, ASM=True), num_warps=8),
)
