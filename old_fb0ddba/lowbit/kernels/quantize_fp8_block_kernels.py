"""Fused FP8 quantize kernel with block scales (Triton): 1x128, 128x128 and MX-32 blocks.

Bit-exact with the torch reference (``lowbit.dtypes.quantize``, ``lowbit.scaling.blocks``), data
and scales, per (BR, BC) block b of x:

    amax_b = max over b of the finite |x|   (NaN and inf count 0)
    Blockwise: s_b = amax_b / fmax (IEEE; 1 when amax_b is 0 or the quotient is 0 / not finite),
               q = RNE_fmt(clamp(RN(fp32(x) / s_b), -fmax, fmax))  by ``_div_rn``: ``div.rn.f32`` as
               launched (``quantize_policy.blocks_fast_div``: fewer registers), the exact reciprocal with ``FAST_DIV``
    MX:        s_b = 2^k (E8M0 code k + 127; k by the floor / rceil rule, ``_mx_exponent``),
               q = RNE_fmt(clamp(x * 2^-k, -fmax, fmax))  (x / 2^k == x * 2^-k exactly);
               a block holding NaN gets code 0xFF and every element the NaN code
    NaN -> 0x7F | sign (torch's float8 NaN codes)

``LEAN``: the same bits by ``quantize_jit_helpers``' lean encode (magnitude and sign apart).

The helpers and their proofs are in ``quantize_jit_helpers``. With the transposed copy, ``qt`` is
the quantization of ``x.t()`` with its own blocks and scales, written by the same pass.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .quantize_jit_helpers import _amax_to_scale, _block_expand, _block_max, _div_parts, _encode_fp8, \
    _encode_fp8_lean, _finite_abs, _load_f32, _mx_exponent, _pow2, _quantize_fp8, scan_spec

__all__ = ["SCAN_SPECS"]


@triton.jit
def _block_parts(amax, MX: tl.constexpr, RCEIL: tl.constexpr, ELEM_EMAX: tl.constexpr,
                 LOG2_FMAX: tl.constexpr, FMAX: tl.constexpr, FAST_DIV: tl.constexpr):
    """Per-block (scale to store, three factors for ``_quantize_chunk``) from the block amax of
    ``_load_chunk``'s ``a``. MX: the E8M0 code and 2^-k (x / 2^k == x * 2^-k exactly: one rounding
    of the same real number; an amax of +inf marks a block holding NaN: code 0xFF, factor NaN).
    Blockwise: the fp32 scale and ``_div_parts`` of it."""
    if MX:
        has_nan = amax == float("inf")
        k = _mx_exponent(amax, RCEIL, ELEM_EMAX, FMAX, LOG2_FMAX)
        inv = tl.where(has_nan, float("nan"), _pow2(-k))
        return tl.where(has_nan, 255, k + 127).to(tl.uint8), inv, inv, inv
    else:
        s = _amax_to_scale(amax, FMAX)
        p2k, sp, ys = _div_parts(s, FAST_DIV)
        return s, p2k, sp, ys


@triton.jit
def _store_block_scales(scale, rows0, cols0, R, C, s_ptr, s_stride_r, s_stride_c, CHUNK_R: tl.constexpr,
                        TILE_C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, ER: tl.constexpr):
    """Scales shaped (CHUNK_R // ER, TILE_C // BC) of the blocks from (rows0, cols0) to
    ``s_ptr + block_row * s_stride_r + block_col * s_stride_c``."""
    brow = rows0 // BR + tl.arange(0, CHUNK_R // ER)
    bcol = cols0 // BC + tl.arange(0, TILE_C // BC)
    s_mask = (brow[:, None] < tl.cdiv(R, BR)) & (bcol[None, :] < tl.cdiv(C, BC))
    tl.store(s_ptr + brow[:, None].to(tl.int64) * s_stride_r + bcol[None, :].to(tl.int64) * s_stride_c, scale,
             mask=s_mask)


@triton.jit
def _quantize_chunk(x, pa, pb, pc, q_ptrs, mask, CHUNK_R: tl.constexpr, TILE_C: tl.constexpr, BC: tl.constexpr,
                    ER: tl.constexpr, MX: tl.constexpr, FMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr,
                    IS_E4M3: tl.constexpr, HW_CVT: tl.constexpr, FAST_DIV: tl.constexpr, LEAN: tl.constexpr):
    """Quantize a (CHUNK_R, TILE_C) chunk with the ``_block_parts`` factors of its (ER, BC) blocks."""
    if MX:
        y = x * _block_expand(pa, CHUNK_R, TILE_C, ER, BC)
        if LEAN:
            q = _encode_fp8_lean(y, y, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT).to(tl.uint8)
        else:
            q = _encode_fp8(y, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT).to(tl.uint8)
    else:
        q = _quantize_fp8(x, _block_expand(pa, CHUNK_R, TILE_C, ER, BC), _block_expand(pb, CHUNK_R, TILE_C, ER, BC),
                          _block_expand(pc, CHUNK_R, TILE_C, ER, BC), FMAX, EMIN, MBITS, IS_E4M3, HW_CVT, FAST_DIV,
                          LEAN)
    tl.store(q_ptrs, q, mask=mask)


@triton.jit
def _load_chunk(x_ptr, rows, cols, R, C, sxr, sxc, IN_BF16: tl.constexpr, NAN_INF: tl.constexpr):
    """(x, a, mask) of the chunk at rows x cols: a = finite |x| (NaN and inf count 0), except that
    NaN counts +inf with ``NAN_INF`` (so one max gives both the finite amax and the NaN flag)."""
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    x = _load_f32(x_ptr + rows[:, None].to(tl.int64) * sxr + cols[None, :].to(tl.int64) * sxc, mask, IN_BF16)
    a = _finite_abs(x)
    if NAN_INF:
        a = tl.where(x == x, a, float("inf"))
    return x, a, mask


@triton.jit
def _cast_blocks_kernel(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, R, C, sxr, sxc, sqr, sqc, n_sc, n_stc,
                        IN_BF16: tl.constexpr, WRITE_T: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
                        TBR: tl.constexpr, TBC: tl.constexpr, TILE_R: tl.constexpr, TILE_C: tl.constexpr,
                        CHUNK_R: tl.constexpr, MX: tl.constexpr, RCEIL: tl.constexpr, ELEM_EMAX: tl.constexpr,
                        LOG2_FMAX: tl.constexpr, FMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr,
                        IS_E4M3: tl.constexpr, HW_CVT: tl.constexpr, FAST_DIV: tl.constexpr,
                        LEAN: tl.constexpr):
    """Block quantization with the scales computed in the program: (BR, BC) blocks -> ``q`` and
    scales ``s`` (``n_sc`` columns); with ``WRITE_T`` also ``qt``, the quantization of ``x.t()``
    with its own blocks, which are (TBR, TBC) blocks of x, scales ``st`` (``n_stc`` columns).
    fp32 scales ``amax / fmax`` (Blockwise) or E8M0 codes (``MX``).

    A program covers TILE_R x TILE_C (whole blocks of both copies) in chunks of CHUNK_R rows.
    Blocks taller than a chunk (128x128; the 128x1 blocks of the transposed 1x128 copy) are as
    tall as the tile: their amax comes from a first pass over the chunks (the second read of the
    tile is served by the cache), their scales and division factors are computed and stored once;
    every chunk is then quantized.

    1x128 with the transposed copy (triton 3.6, sm_90, 16384x4096 bf16; 0.428 ms = 15% of copy on
    the H200): 57.4 SASS instructions an element in the quantize loop (``div.rn`` per element:
    each with its range check and slow-path branch), 63 registers (2 programs of 16 warps an SM,
    16 KB of loads in flight an SM, no load issued ahead), two passes over every 128x128 tile (the
    column amax pass reduces each 32-row chunk across the 16 warps through shared memory: 9
    barriers an iteration), and the transposed copy leaves through a byte-wise shared-memory
    conversion (8 ``STS.U8`` a thread) as 8-byte stores of 32-byte runs (a chunk is 32 rows).
    ``quantize_fp8_transpose_kernels`` has the sweep alternatives (``block_t_tiles``,
    ``square_t_kernel``)."""
    rows0 = (tl.program_id(0) // tl.cdiv(C, TILE_C)) * TILE_R  # consecutive programs walk along a row of tiles
    cols0 = (tl.program_id(0) % tl.cdiv(C, TILE_C)) * TILE_C
    cols = cols0 + tl.arange(0, TILE_C)
    c64 = cols[None, :].to(tl.int64)
    amax_q = tl.zeros([1, TILE_C // BC], tl.float32)
    amax_t = tl.zeros([1, TILE_C // TBC], tl.float32)
    if BR > CHUNK_R or (WRITE_T and TBR > CHUNK_R):  # blocks taller than a chunk: amax first
        for r in range(rows0, rows0 + TILE_R, CHUNK_R):
            x, a, mask = _load_chunk(x_ptr, r + tl.arange(0, CHUNK_R), cols, R, C, sxr, sxc, IN_BF16, MX)
            if BR > CHUNK_R:
                amax_q = tl.maximum(amax_q, _block_max(a, CHUNK_R, TILE_C, CHUNK_R, BC))
            if WRITE_T and TBR > CHUNK_R:
                amax_t = tl.maximum(amax_t, _block_max(a, CHUNK_R, TILE_C, CHUNK_R, TBC))
    # the tall blocks' scales and factors, once per program
    sq, qa, qb, qc = _block_parts(amax_q, MX, RCEIL, ELEM_EMAX, LOG2_FMAX, FMAX, FAST_DIV)
    st, ta, tb, tc = _block_parts(amax_t, MX, RCEIL, ELEM_EMAX, LOG2_FMAX, FMAX, FAST_DIV)
    if BR > CHUNK_R:
        _store_block_scales(sq, rows0, cols0, R, C, s_ptr, n_sc, 1, CHUNK_R, TILE_C, BR, BC, CHUNK_R)
    if WRITE_T and TBR > CHUNK_R:
        _store_block_scales(st, rows0, cols0, R, C, st_ptr, 1, n_stc, CHUNK_R, TILE_C, TBR, TBC, CHUNK_R)
    for r in range(rows0, rows0 + TILE_R, CHUNK_R):
        rows = r + tl.arange(0, CHUNK_R)
        x, a, mask = _load_chunk(x_ptr, rows, cols, R, C, sxr, sxc, IN_BF16, MX)
        r64 = rows[:, None].to(tl.int64)
        if BR > CHUNK_R:
            _quantize_chunk(x, qa, qb, qc, q_ptr + r64 * sqr + c64 * sqc, mask, CHUNK_R, TILE_C, BC, CHUNK_R, MX,
                            FMAX, EMIN, MBITS, IS_E4M3, HW_CVT, FAST_DIV, LEAN)
        else:
            s, pa, pb, pc = _block_parts(_block_max(a, CHUNK_R, TILE_C, BR, BC), MX, RCEIL, ELEM_EMAX, LOG2_FMAX,
                                         FMAX, FAST_DIV)
            _store_block_scales(s, r, cols0, R, C, s_ptr, n_sc, 1, CHUNK_R, TILE_C, BR, BC, BR)
            _quantize_chunk(x, pa, pb, pc, q_ptr + r64 * sqr + c64 * sqc, mask, CHUNK_R, TILE_C, BC, BR, MX,
                            FMAX, EMIN, MBITS, IS_E4M3, HW_CVT, FAST_DIV, LEAN)
        if WRITE_T and TBR > CHUNK_R:
            _quantize_chunk(x, ta, tb, tc, qt_ptr + c64 * R + r64, mask, CHUNK_R, TILE_C, TBC, CHUNK_R, MX,
                            FMAX, EMIN, MBITS, IS_E4M3, HW_CVT, FAST_DIV, LEAN)
        elif WRITE_T:
            s, pa, pb, pc = _block_parts(_block_max(a, CHUNK_R, TILE_C, TBR, TBC), MX, RCEIL, ELEM_EMAX, LOG2_FMAX,
                                         FMAX, FAST_DIV)
            _store_block_scales(s, r, cols0, R, C, st_ptr, 1, n_stc, CHUNK_R, TILE_C, TBR, TBC, TBR)
            _quantize_chunk(x, pa, pb, pc, qt_ptr + c64 * R + r64, mask, CHUNK_R, TILE_C, TBC, TBR, MX,
                            FMAX, EMIN, MBITS, IS_E4M3, HW_CVT, FAST_DIV, LEAN)


# ---- representative sm_90 compile configurations (the GPU launches; scanned by lowbit.fma_guard) --------

_I32 = dict.fromkeys(("R", "C", "sxr", "sxc"), "i32")
_E4M3 = dict(FMAX=448.0, EMIN=-6, MBITS=3, IS_E4M3=True, HW_CVT=1, FAST_DIV=False)  # as launched (blocks_fast_div)

SCAN_SPECS = (
    scan_spec(_cast_blocks_kernel,
              {"x_ptr": "*i16", "q_ptr": "*u8", "s_ptr": "*fp32", "qt_ptr": "*u8", "st_ptr": "*fp32", **_I32,
               "sqr": "i32", "sqc": "i32", "n_sc": "i32", "n_stc": "i32"},
              dict(IN_BF16=True, WRITE_T=True, BR=1, BC=128, TBR=128, TBC=1, TILE_R=128, TILE_C=128, CHUNK_R=32,
                   MX=False, RCEIL=False, ELEM_EMAX=8, LOG2_FMAX=8, LEAN=False, **_E4M3)),
)
