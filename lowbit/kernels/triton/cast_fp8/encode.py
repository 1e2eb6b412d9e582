"""Encode helpers of the FP8 casts that hold a tile in registers or write a transposed copy
(Triton jit helpers; the kernels are in ``tensorwise``, ``blocks``, ``rowwise``, ``cols_t``,
``rowlocal``).

Math (``jit_common``): ``q = RNE_fmt(clamp(RN(fp32(x) / s), -fmax, fmax))``, NaN -> 0x7F | sign,
with ``s = amax / fmax`` (IEEE; 1 when amax is 0 or the quotient is 0 / not finite) of the
element's scale block.

Finite tiles (every |x| finite, seen from the NaN-propagating maxes the amax needs anyway) take
``_codes_finite``: the magnitude from ``_div_rn``'s two Newton-Markstein steps (the remainder with
the loop-invariant ``-s'``, as ``_div_rn_lean``), ``m = min(|q|, fmax)``, the sign of x put back
on m's bits, one ``cvt.rn.satfinite`` (or the arithmetic rounding, ``HW_CVT = 0``). That is
``_encode_fp8(_div_rn(..))`` for finite x: with ``s = amax_b / fmax`` and ``|x| <= amax_b``,
``|x / s| <= fmax (1 + 2^-23)``, and with ``s = 1`` (amax_b = 0 or amax_b / fmax underflows)
``|x| < 2^-100``: ``_div_rn``'s overflow guard (``|q0| >= 2^100``) never fires, the quotient's sign
is x's (s > 0; -0 stays -0), and ``m`` is finite and within [0, fmax], so the cast needs neither a
NaN test nor a lower clamp nor any saturating behaviour of the hardware cast. No integer
overflow, no shift of a negative value (the sign is masked, ``x_bits & 0x80000000``), no NaN in
a ``tl.where``: nothing the interpreter and the GPU could do differently. Tiles holding NaN or
inf (rare) take the plain encode (``_codes_plain``: ``_quantize_fp8``, the clamp and NaN test
kept, ``HW_CVT <= 1``).

The transposed copy is written from codes made in x's layout, transposed as codes (one byte an
element through shared memory, ``_store_both``).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..jit_common import _finite_abs, _grid_round, _load_f32, _quantize_fp8

_I32 = dict.fromkeys(("R", "C", "sxr", "sxc"), "i32")
_E4M3_T = dict(FMAX=448.0, EMIN=-6, MBITS=3, IS_E4M3=True, HW_CVT=3)  # the scan specs' format, as launched


@triton.jit
def _abs_bits(x):
    """|x|'s bits as int32 (sign cleared by a mask: NaN payloads kept). For these non-negative
    patterns integer order is float order, with +inf (0x7F800000) above every finite value and
    every NaN above +inf: an integer max is a NaN-propagating float max."""
    return x.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _sign(x):
    """x's sign bit, as int32."""
    return x.to(tl.int32, bitcast=True) & -2147483648


@triton.jit
def _codes_finite(x, sgn, p2k, nsp, ys, FMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr,
                  IS_E4M3: tl.constexpr, HW_CVT: tl.constexpr):
    """uint8 float8 codes of finite ``x / s`` from ``(2^k, -s', RN(1/s'))`` of ``_div_parts(s)``
    and ``sgn = x_bits & 0x80000000`` (module docstring: equal to ``_quantize_fp8``'s for finite x
    and a scale of x's block)."""
    a = x * p2k
    q0 = a * ys
    q = tl.fma(tl.fma(q0, nsp, a), ys, q0)
    q = tl.fma(tl.fma(q, nsp, a), ys, q)
    m = tl.minimum(tl.abs(q), FMAX)
    if HW_CVT > 0:
        v = (m.to(tl.int32, bitcast=True) | sgn).to(tl.float32, bitcast=True)
        if IS_E4M3:
            return v.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
        else:
            return v.to(tl.float8e5).to(tl.uint8, bitcast=True)
    else:
        code, _ = _grid_round(m, m, EMIN, MBITS, False)
        return (code | tl.where(sgn != 0, 0x80, 0)).to(tl.uint8)


@triton.jit
def _codes_plain(x, p2k, sp, ys, FMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr,
                 IS_E4M3: tl.constexpr, HW_CVT: tl.constexpr):
    """Any x (NaN, inf): ``_quantize_fp8`` with the fast division, the plain encode and the clamp
    before the hardware cast (HW_CVT 1)."""
    if HW_CVT > 0:
        return _quantize_fp8(x, p2k, sp, ys, FMAX, EMIN, MBITS, IS_E4M3, 1, True, False)
    else:
        return _quantize_fp8(x, p2k, sp, ys, FMAX, EMIN, MBITS, IS_E4M3, 0, True, False)


@triton.jit
def _store_both(q, qt, rows, cols, R, C, q_ptr, sqr, sqc, qt_ptr):
    """``q`` (rows x cols) into the copy with x's layout, ``qt`` (cols x rows) into the contiguous
    (C, R) transposed copy."""
    r64 = rows[:, None].to(tl.int64)
    c64 = cols[None, :].to(tl.int64)
    tl.store(q_ptr + r64 * sqr + c64 * sqc, q, mask=(rows[:, None] < R) & (cols[None, :] < C))
    tl.store(qt_ptr + cols[:, None].to(tl.int64) * R + rows[None, :], qt, mask=(cols[:, None] < C) & (rows[None, :] < R))


@triton.jit
def _abs_key(x_ptr, rows, cols, R, C, sxr, sxc, IN_BF16: tl.constexpr):
    """|x| as integers in float order (NaN above inf): bf16: the 15 magnitude bits (int16, not
    widened); else the fp32 bits, sign cleared."""
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    ptrs = x_ptr + rows[:, None].to(tl.int64) * sxr + cols[None, :].to(tl.int64) * sxc
    if IN_BF16:
        return tl.load(ptrs, mask=mask, other=0) & 0x7FFF
    else:
        return _abs_bits(_load_f32(ptrs, mask, IN_BF16))


@triton.jit
def _load_tile(x_ptr, rows, cols, R, C, sxr, sxc, IN_BF16: tl.constexpr):
    """(fp32 x, |x| key) of the (rows, cols) tile, for the kernels that keep it in registers: the
    key as ``_abs_key``'s (bf16: the 15 magnitude bits of the loaded int16, one load for both)."""
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    ptrs = x_ptr + rows[:, None].to(tl.int64) * sxr + cols[None, :].to(tl.int64) * sxc
    if IN_BF16:
        bits = tl.load(ptrs, mask=mask, other=0)
        key = bits & 0x7FFF
        x = (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        x = _load_f32(ptrs, mask, IN_BF16)
        key = _abs_bits(x)
    return x, key


@triton.jit
def _key_bits(k, IN_BF16: tl.constexpr):
    """fp32 bits (int32) of an ``_abs_key``."""
    if IN_BF16:
        return k.to(tl.int32) << 16
    else:
        return k


@triton.jit
def _finite_slices_max(x_ptr, rows0, cols, R, C, sxr, sxc, IN_BF16: tl.constexpr, ROWS: tl.constexpr,
                       SUB_R: tl.constexpr):
    """Elementwise max of the finite |x| (NaN and inf count 0) over the (SUB_R, cols) slices of rows
    [rows0, rows0 + ROWS): the rare path of a tile holding NaN or inf."""
    fin = tl.zeros([SUB_R, cols.shape[0]], tl.float32)
    for r in tl.static_range(0, ROWS, SUB_R):
        rows = rows0 + r + tl.arange(0, SUB_R)
        fin = tl.maximum(fin, _finite_abs(_load_f32(x_ptr + rows[:, None].to(tl.int64) * sxr
                                                    + cols[None, :].to(tl.int64) * sxc,
                                                    (rows[:, None] < R) & (cols[None, :] < C), IN_BF16)))
    return fin
