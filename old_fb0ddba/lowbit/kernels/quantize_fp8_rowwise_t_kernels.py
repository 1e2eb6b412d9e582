"""Rowwise FP8 cast with the transposed copy (Triton): ``q = fp8(x / s_row)`` with one scale a
row and ``qt = fp8(x / s_col).t()`` (contiguous) with one scale a column of x (a row of
``x.t()``), bit-exact with the torch reference (the math and the encode of
``quantize_fp8_transpose_kernels``).

The column amax needs every row first, so three launches: ``_rowwise_t_amax2d_kernel`` (a program
owns a block of rows and columns: one slot of partial finite amax a row and a column, the row's
sign bit set where its part holds NaN or inf; no atomics, no zero-filled buffer),
``_rowwise_t_scales_kernel`` (max of the slots: row and column scales and RN(1/s'), negative for a
flagged row) and ``_cast_rowwise_t_sweep_kernel`` (the cast in slices of a (PROG_R, TILE_C) block,
the column parts once a program, both codes made in x's layout; a slice with a flagged row takes
the plain encode). With ``rowwise_t_split`` (the default) the amax pass runs without its row
slots (``ROW_SLOTS``), the slot reduction makes the column scales only, and the casts are the
row-local rowwise one and ``quantize_fp8_cols_t_kernels`` (the scales given).

H200 (2026-12-01, 16384x4096 bf16, kernel time, bit-exact there): 0.218 ms in all (29% of copy;
session 5: 0.339), the cast 0.143 of it (session 5's 64x64 tile kernel: 0.195), the amax pass
and the slot reduction ~0.075 (session 5's pass of whole rows: 0.146). sm_90 (triton 3.6): the
amax pass 48 registers and 11 SASS instructions an element in its loop, 16-byte loads; the cast
255 registers at 4 warps, 16-byte stores of both copies, no spills.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .quantize_fp8_transpose_kernels import _E4M3, _I32, _abs_key, _codes_finite, _codes_plain, _key_bits, _sign, \
    _store_both
from .quantize_jit_helpers import _amax_to_scale, _div_parts, _load_f32, scan_spec

__all__ = ["SCAN_SPECS"]


@triton.jit
def _scale_and_recip(amax, nonfinite, FMAX: tl.constexpr):
    """(s = amax_to_scale(amax), RN(1 / s'), negated where ``nonfinite``: the flag the cast reads)."""
    s = _amax_to_scale(amax, FMAX)
    _, _, ys = _div_parts(s, True)
    return s, tl.where(nonfinite, -ys, ys)


@triton.jit
def _amax_slice(x_ptr, rslot_ptr, raw, cacc, rows, cols, pj, R, C, sxr, sxc, IN_BF16: tl.constexpr, INF: tl.constexpr,
                ROW_SLOTS: tl.constexpr):
    """One slice of ``_rowwise_t_amax2d_kernel``: the finite row maxima to ``rslot[pj, rows]``
    (with ``ROW_SLOTS``); returns the elementwise (raw, finite) maxima so far."""
    k = _abs_key(x_ptr, rows, cols, R, C, sxr, sxc, IN_BF16)
    raw = tl.maximum(raw, k)
    k = tl.where(k < INF, k, 0)
    if ROW_SLOTS:
        tl.store(rslot_ptr + pj.to(tl.int64) * R + rows, _key_bits(tl.max(k, axis=1), IN_BF16), mask=rows < R)
    return raw, tl.maximum(cacc, k)


@triton.jit
def _rowwise_t_amax2d_kernel(x_ptr, rslot_ptr, cslot_ptr, R, C, sxr, sxc, IN_BF16: tl.constexpr,
                             PROG_R: tl.constexpr, SUB_R: tl.constexpr, TILE_C: tl.constexpr,
                             ROW_SLOTS: tl.constexpr, REVERSE: tl.constexpr):
    """Program (i, j) owns rows [i PROG_R, (i + 1) PROG_R) x columns [j TILE_C, (j + 1) TILE_C):
    the finite amax of its part of each row -> ``rslot[j, row]`` (with ``ROW_SLOTS``; fp32 bits as
    int32, the sign bit set for a part holding NaN or inf), of each column -> ``cslot[i, col]``.
    Slices of SUB_R rows: a row max a slice, the column max kept elementwise, reduced once; no
    atomics. ``REVERSE``: program p takes the blocks' last-to-first order."""
    INF: tl.constexpr = 0x7F80 if IN_BF16 else 0x7F800000
    pid = tl.program_id(0)
    if REVERSE:
        pid = tl.num_programs(0) - 1 - pid
    n_tc = tl.cdiv(C, TILE_C)
    rows0 = (pid // n_tc) * PROG_R
    pj = pid % n_tc
    cols = pj * TILE_C + tl.arange(0, TILE_C)
    kt: tl.constexpr = tl.int16 if IN_BF16 else tl.int32
    cacc = tl.zeros([SUB_R, TILE_C], kt)
    raw = tl.zeros([SUB_R, TILE_C], kt)
    for r in range(0, PROG_R, SUB_R):
        raw, cacc = _amax_slice(x_ptr, rslot_ptr, raw, cacc, rows0 + r + tl.arange(0, SUB_R), cols, pj, R, C, sxr, sxc,
                                IN_BF16, INF, ROW_SLOTS)
    tl.store(cslot_ptr + (pid // n_tc).to(tl.int64) * C + cols, _key_bits(tl.max(cacc, axis=0), IN_BF16),
             mask=cols < C)
    if ROW_SLOTS:
        if tl.max(tl.max(raw, axis=1), axis=0) >= INF:  # rare: NaN or inf here; flag the rows holding it
            for r in range(0, PROG_R, SUB_R):
                rows = rows0 + r + tl.arange(0, SUB_R)
                k = _abs_key(x_ptr, rows, cols, R, C, sxr, sxc, IN_BF16)
                bad = tl.max(k, axis=1) >= INF
                fin = _key_bits(tl.max(tl.where(k < INF, k, 0), axis=1), IN_BF16)
                tl.store(rslot_ptr + pj.to(tl.int64) * R + rows, fin | tl.where(bad, -2147483648, 0), mask=rows < R)


@triton.jit
def _reduce_slots(slot_ptr, s_ptr, ys_ptr, blk, N, P, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
                  FMAX: tl.constexpr):
    """Entries [blk BLOCK_N, ...) of N: amax = max over the P slot rows (low 31 bits), flagged
    when any slot's sign bit is set -> (s, RN(1/s'), negative where flagged)."""
    idx = blk * BLOCK_N + tl.arange(0, BLOCK_N)
    amax = tl.zeros([BLOCK_P, BLOCK_N], tl.int32)
    low = tl.zeros([BLOCK_P, BLOCK_N], tl.int32)
    for p0 in range(0, P, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        v = tl.load(slot_ptr + p[:, None].to(tl.int64) * N + idx[None, :], mask=(p[:, None] < P) & (idx[None, :] < N),
                    other=0)
        amax = tl.maximum(amax, v & 0x7FFFFFFF)
        low = tl.minimum(low, v)
    s, ys = _scale_and_recip(tl.max(amax, axis=0).to(tl.float32, bitcast=True), tl.min(low, axis=0) < 0, FMAX)
    tl.store(s_ptr + idx, s, mask=idx < N)
    tl.store(ys_ptr + idx, ys, mask=idx < N)


@triton.jit
def _rowwise_t_scales_kernel(rslot_ptr, cslot_ptr, s_ptr, ysr_ptr, st_ptr, ysc_ptr, R, C, PR, PC,
                             BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FMAX: tl.constexpr):
    """Row scales (programs [0, cdiv(R, BLOCK_N))) from the PC slot rows of ``rslot`` and column
    scales (the rest) from the PR of ``cslot``, with RN(1/s') (negative for a row holding NaN or
    inf: the cast's flag)."""
    pid = tl.program_id(0)
    n_rp = tl.cdiv(R, BLOCK_N)
    if pid < n_rp:
        _reduce_slots(rslot_ptr, s_ptr, ysr_ptr, pid, R, PC, BLOCK_P, BLOCK_N, FMAX)
    else:
        _reduce_slots(cslot_ptr, st_ptr, ysc_ptr, pid - n_rp, C, PR, BLOCK_P, BLOCK_N, FMAX)


@triton.jit
def _parts_of(s, ys):
    """``_div_parts(s, True)`` from s and its stored RN(1/s') (|ys|): (2^k, s', |ys|)."""
    e = ((s.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    k = tl.minimum(tl.maximum(-e, -126), 126)
    p2k = ((k + 127) << 23).to(tl.float32, bitcast=True)
    return p2k, s * p2k, tl.abs(ys)


@triton.jit
def _cast_rowwise_t_sweep_kernel(x_ptr, s_ptr, ysr_ptr, st_ptr, ysc_ptr, q_ptr, qt_ptr, R, C, sxr, sxc, sqr, sqc,
                                 IN_BF16: tl.constexpr, PROG_R: tl.constexpr, SUB_R: tl.constexpr,
                                 TILE_C: tl.constexpr, FMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr,
                                 IS_E4M3: tl.constexpr, HW_CVT: tl.constexpr):
    """``q = fp8(x / s_row)`` and ``qt = fp8(x / s_col).t()`` (contiguous) from a (PROG_R, TILE_C)
    block of x in (SUB_R, TILE_C) slices, with the scales and RN(1/s') of ``_rowwise_t_scales_kernel``:
    the column parts once a program, the row parts a slice, both codes made in x's layout (a
    thread holds few columns) and ``qt``'s transposed as codes."""
    pid = tl.program_id(0)
    n_tc = tl.cdiv(C, TILE_C)
    rows0 = (pid // n_tc) * PROG_R
    cols = (pid % n_tc) * TILE_C + tl.arange(0, TILE_C)
    p2k_c, sp_c, ys_c = _parts_of(tl.load(st_ptr + cols, mask=cols < C, other=1.0),
                                  tl.load(ysc_ptr + cols, mask=cols < C, other=1.0))
    p2k_c, sp_c, ys_c = p2k_c[None, :], sp_c[None, :], ys_c[None, :]
    for r in range(0, PROG_R, SUB_R):
        rows = rows0 + r + tl.arange(0, SUB_R)
        mask = (rows[:, None] < R) & (cols[None, :] < C)
        x = _load_f32(x_ptr + rows[:, None].to(tl.int64) * sxr + cols[None, :].to(tl.int64) * sxc, mask, IN_BF16)
        ysr = tl.load(ysr_ptr + rows, mask=rows < R, other=1.0)
        p2k_r, sp_r, ys_r = _parts_of(tl.load(s_ptr + rows, mask=rows < R, other=1.0), ysr)
        p2k_r, sp_r, ys_r = p2k_r[:, None], sp_r[:, None], ys_r[:, None]
        if tl.min(ysr, axis=0) > 0:  # no row of the slice holds NaN or inf
            sgn = _sign(x)
            q = _codes_finite(x, sgn, p2k_r, -sp_r, ys_r, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
            qt = _codes_finite(x, sgn, p2k_c, -sp_c, ys_c, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
        else:
            q = _codes_plain(x, p2k_r, sp_r, ys_r, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
            qt = _codes_plain(x, p2k_c, sp_c, ys_c, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
        _store_both(q, tl.trans(qt), rows, cols, R, C, q_ptr, sqr, sqc, qt_ptr)


# ---- representative sm_90 compile configurations (the GPU launches; scanned by lowbit.fma_guard) --------

SCAN_SPECS = (
    scan_spec(_rowwise_t_amax2d_kernel,
              {"x_ptr": "*i16", "rslot_ptr": "*i32", "cslot_ptr": "*i32", **_I32},
              dict(IN_BF16=True, PROG_R=512, SUB_R=32, TILE_C=128, ROW_SLOTS=True, REVERSE=False), num_warps=8),
    scan_spec(_rowwise_t_scales_kernel,
              {"rslot_ptr": "*i32", "cslot_ptr": "*i32", "s_ptr": "*fp32", "ysr_ptr": "*fp32", "st_ptr": "*fp32",
               "ysc_ptr": "*fp32", "R": "i32", "C": "i32", "PR": "i32", "PC": "i32"},
              dict(BLOCK_P=8, BLOCK_N=256, FMAX=448.0), num_warps=4),
    scan_spec(_cast_rowwise_t_sweep_kernel,
              {"x_ptr": "*i16", "s_ptr": "*fp32", "ysr_ptr": "*fp32", "st_ptr": "*fp32", "ysc_ptr": "*fp32",
               "q_ptr": "*u8", "qt_ptr": "*u8", **_I32, "sqr": "i32", "sqc": "i32"},
              dict(IN_BF16=True, PROG_R=128, SUB_R=32, TILE_C=128, **_E4M3), num_warps=4),
)
