"""FP8 casts that write both copies from one tile of x: 1x128 blocks + the transposed copy, and
rowwise + the transposed copy (Triton). Bit-exact with the torch reference and with
``quantize_fp8_block_kernels`` / ``quantize_fp8_tensor_row_kernels`` (same data and scale bits).

Math (``quantize_jit_helpers``): ``q = RNE_fmt(clamp(RN(fp32(x) / s), -fmax, fmax))``, NaN ->
0x7F | sign, with ``s = amax / fmax`` (IEEE; 1 when amax is 0 or the quotient is 0 / not finite)
of the element's block: for 1x``BC`` blocks the row block (``q``) and the ``BC``x1 column block
(``qt``, the quantization of ``x.t()`` along its rows); for rowwise the whole row (``q``) and the
whole column (``qt``).

Tile kernels: a program loads one (TILE_R, TILE_C) tile of x once (16-byte loads), takes the row
and the column amax from the same registers, derives both scale sets, divides each element by
both scales with ``_div_rn``'s per-scale parts (``_div_parts``: one ``div.rn`` per scale, not
per element) and writes ``q`` directly and ``qt`` through ``tl.trans`` (the layout conversion
goes through shared memory), so both stores are runs of TILE_C and TILE_R contiguous bytes.

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
inf (rare) take the plain encode (``_quantize_fp8``, the clamp and NaN test kept, ``HW_CVT <= 1``).

Rowwise + transposed copy: the column amax needs every row first, so three launches, each one
streaming pass: ``_rowwise_t_amax_kernel`` (a program owns BLOCK_R whole rows: their amax is
final, it writes the row scales and RN(1/s') and one slot of column partial amax per column;
no atomics, no zero-filled buffer), ``_rowwise_t_col_kernel`` (max of the slots: column scales
and RN(1/s')), ``_cast_rowwise_t_kernel`` (the tile cast; a row whose amax pass saw a NaN or inf
is marked by a negative RN(1/s'), and a tile with such a row takes the plain encode).

Static profile, triton 3.6, sm_90, 16384x4096 bf16 (benchmarks/quantize_sass.py; ``path``: SASS
instructions an element on the common path of a loop-free kernel):

* rowwise + T, old (zero-fill x2, ``_row_col_amax_kernel``, ``_cast_rowwise_kernel``): the cast
  has 184 registers (one 8-warp program an SM: 8 warps resident), 92.9 instructions an element,
  38 ``div.rn`` a thread (the row and column scales of its 4 rows and 16 columns, each computed
  by every thread holding it). New: amax 17.0 an element in its loop (64 registers, 4 programs
  of 8 warps an SM, 16-byte loads), the slot reduction is 32 programs, the cast (128x64, 16 warps)
  47.8 on its path, 97 registers (16 warps an SM), no ``div.rn`` (the scales come from the amax
  pass: a few integer ops each), 16-byte stores of both copies, no spills.
* 1x128 + T: the tile kernel (128x128, 16 warps) has 85 instructions an element on its path and
  128 registers with 120 bytes of spills, against 57.4 in ``_cast_blocks_kernel``'s quantize loop
  (63 registers): its 128 column scales are computed by every thread that holds a column (16
  columns a thread, 32 ``div.rn``; triton moves a round trip of the amax through memory back
  into that layout), and triton splits each ``cvt`` pair into bytes and packs them again (~2
  instructions a code). It is the default all the same (``quantize_policy.block_t_tiles``): on the
  H200 it runs in 0.264 ms at 16384x4096 (8 warps) against the chunk kernel's 0.428, bit-exact.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .quantize_fp8_block_kernels import _store_block_scales
from .quantize_jit_helpers import _amax_to_scale, _block_max, _div_parts, _finite_abs, _grid_round, _load_f32, \
    _quantize_fp8, scan_spec

__all__ = ["SCAN_SPECS"]


@triton.jit
def _abs_bits(x):
    """|x|'s bits as int32 (sign cleared by a mask: NaN payloads kept). For these non-negative
    patterns integer order is float order, with +inf (0x7F800000) above every finite value and
    every NaN above +inf: an integer max is a NaN-propagating float max."""
    return x.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _block_max_nan(v, TILE_R: tl.constexpr, TILE_C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """``_block_max`` of ``_abs_bits`` for (1, BC) or (BR, 1) blocks, as fp32: the finite block
    amax of |x| when the block is finite, inf or NaN otherwise."""
    if BR == 1:
        if BC == TILE_C:
            m = tl.max(v, axis=1)[:, None]
        else:
            m = tl.max(tl.reshape(v, (TILE_R, TILE_C // BC, BC)), axis=2)
    else:
        if BR == TILE_R:
            m = tl.max(v, axis=0)[None, :]
        else:
            m = tl.max(tl.reshape(v, (TILE_R // BR, BR, TILE_C)), axis=1)
    return m.to(tl.float32, bitcast=True)


@triton.jit
def _expand(s, TILE_R: tl.constexpr, TILE_C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """``_block_max``'s shape back to the tile's, for (1, BC) / (BR, 1) blocks."""
    if BR == 1:
        if BC == TILE_C:
            return s
        else:
            return tl.reshape(tl.broadcast_to(s[:, :, None], (TILE_R, TILE_C // BC, BC)), (TILE_R, TILE_C))
    else:
        if BR == TILE_R:
            return s
        else:
            return tl.reshape(tl.broadcast_to(s[:, None, :], (TILE_R // BR, BR, TILE_C)), (TILE_R, TILE_C))


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
def _load_tile(x_ptr, rows, cols, R, C, sxr, sxc, IN_BF16: tl.constexpr):
    """(x, x.t()) of the tile as fp32: loaded once (16-byte loads along the rows), the transposed
    view made from the loaded bits (the layout conversion goes through shared memory, 2 bytes an
    element for bf16), so that ``qt``'s scale parts are per row of ``x.t()`` (few a thread) and its
    codes come out in the layout of its store."""
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    ptrs = x_ptr + rows[:, None].to(tl.int64) * sxr + cols[None, :].to(tl.int64) * sxc
    if IN_BF16:
        bits = tl.load(ptrs, mask=mask, other=0)
        return (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True), \
            (tl.trans(bits).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        v = tl.load(ptrs, mask=mask, other=0.0)
        return v.to(tl.float32), tl.trans(v).to(tl.float32)


@triton.jit
def _tile_of(pid, R, C, TILE_R: tl.constexpr, TILE_C: tl.constexpr):
    """(rows0, cols0, rows, cols) of tile ``pid``; consecutive programs walk along a row of tiles."""
    n_tc = tl.cdiv(C, TILE_C)
    rows0 = (pid // n_tc) * TILE_R
    cols0 = (pid % n_tc) * TILE_C
    return rows0, cols0, rows0 + tl.arange(0, TILE_R), cols0 + tl.arange(0, TILE_C)


@triton.jit
def _store_both(q, qt, rows, cols, R, C, q_ptr, sqr, sqc, qt_ptr):
    """``q`` (rows x cols) into the copy with x's layout, ``qt`` (cols x rows) into the contiguous
    (C, R) transposed copy."""
    r64 = rows[:, None].to(tl.int64)
    c64 = cols[None, :].to(tl.int64)
    tl.store(q_ptr + r64 * sqr + c64 * sqc, q, mask=(rows[:, None] < R) & (cols[None, :] < C))
    tl.store(qt_ptr + cols[:, None].to(tl.int64) * R + rows[None, :], qt, mask=(cols[:, None] < C) & (rows[None, :] < R))


@triton.jit
def _cast_1xn_t_kernel(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, R, C, sxr, sxc, sqr, sqc, n_sc, n_stc,
                       IN_BF16: tl.constexpr, BC: tl.constexpr, TILE_R: tl.constexpr, TILE_C: tl.constexpr,
                       FMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr, IS_E4M3: tl.constexpr,
                       HW_CVT: tl.constexpr):
    """1x``BC`` blocks -> ``q`` and scales ``s`` (``n_sc`` columns), and ``qt``, the quantization of
    ``x.t()`` with 1x``BC`` blocks, i.e. ``BC``x1 blocks of x, scales ``st`` (``n_stc`` columns), from
    one (TILE_R, TILE_C) tile (multiples of BC) of x: one read, one launch."""
    rows0, cols0, rows, cols = _tile_of(tl.program_id(0), R, C, TILE_R, TILE_C)
    x, xt = _load_tile(x_ptr, rows, cols, R, C, sxr, sxc, IN_BF16)
    ra = _block_max_nan(_abs_bits(x), TILE_R, TILE_C, 1, BC)  # (TILE_R, TILE_C // BC): blocks of q
    ca = _block_max_nan(_abs_bits(xt), TILE_C, TILE_R, 1, BC)  # (TILE_C, TILE_R // BC): blocks of qt
    finite = tl.max(tl.max(tl.where(ra < float("inf"), 0, 1), axis=1), axis=0) == 0
    if not finite:  # rare: NaN or inf in the tile; the amax of the finite |x|
        ra = _block_max(_finite_abs(x), TILE_R, TILE_C, 1, BC)
        ca = _block_max(_finite_abs(xt), TILE_C, TILE_R, 1, BC)
    s_r = _amax_to_scale(ra, FMAX)
    _store_block_scales(s_r, rows0, cols0, R, C, s_ptr, n_sc, 1, TILE_R, TILE_C, 1, BC, 1)
    s_c = _amax_to_scale(ca, FMAX)
    _store_block_scales(s_c, cols0, rows0, C, R, st_ptr, n_stc, 1, TILE_C, TILE_R, 1, BC, 1)
    p2k_r, sp_r, ys_r = _div_parts(s_r, True)
    p2k_c, sp_c, ys_c = _div_parts(s_c, True)
    p2k_r, sp_r, ys_r = (_expand(p2k_r, TILE_R, TILE_C, 1, BC), _expand(sp_r, TILE_R, TILE_C, 1, BC),
                         _expand(ys_r, TILE_R, TILE_C, 1, BC))
    p2k_c, sp_c, ys_c = (_expand(p2k_c, TILE_C, TILE_R, 1, BC), _expand(sp_c, TILE_C, TILE_R, 1, BC),
                         _expand(ys_c, TILE_C, TILE_R, 1, BC))
    if finite:
        q = _codes_finite(x, _sign(x), p2k_r, -sp_r, ys_r, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
        qt = _codes_finite(xt, _sign(xt), p2k_c, -sp_c, ys_c, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
    else:
        q = _codes_plain(x, p2k_r, sp_r, ys_r, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
        qt = _codes_plain(xt, p2k_c, sp_c, ys_c, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
    _store_both(q, qt, rows, cols, R, C, q_ptr, sqr, sqc, qt_ptr)


# ---- rowwise + transposed copy -------------------------------------------------------------------

@triton.jit
def _scale_and_recip(amax, nonfinite, FMAX: tl.constexpr):
    """(s = amax_to_scale(amax), RN(1 / s'), negated where ``nonfinite``: the flag the cast reads)."""
    s = _amax_to_scale(amax, FMAX)
    _, _, ys = _div_parts(s, True)
    return s, tl.where(nonfinite, -ys, ys)


@triton.jit
def _rowwise_t_amax_kernel(x_ptr, s_ptr, ys_ptr, slot_ptr, R, C, sxr, sxc,
                           IN_BF16: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, FMAX: tl.constexpr):
    """Program p owns rows [p * BLOCK_R, (p + 1) * BLOCK_R) of every column: their row scales
    ``s`` and RN(1/s') (``ys``, negative for a row holding NaN or inf) are final; the finite amax
    of its rows in each column goes to ``slot[p, :]``. One read of x, no atomics."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    r64 = rows[:, None].to(tl.int64)
    acc = tl.zeros([BLOCK_R, BLOCK_C], tl.int32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        mask = (rows[:, None] < R) & (cols[None, :] < C)
        b = _abs_bits(_load_f32(x_ptr + r64 * sxr + cols[None, :].to(tl.int64) * sxc, mask, IN_BF16))
        acc = tl.maximum(acc, b)
        col = tl.max(b, axis=0)
        if tl.max(col, axis=0) >= 0x7F800000:  # rare: NaN or inf here
            col = tl.max(tl.where(b < 0x7F800000, b, 0), axis=0)
        tl.store(slot_ptr + pid.to(tl.int64) * C + cols, col.to(tl.float32, bitcast=True), mask=cols < C)
    amax = tl.max(acc, axis=1).to(tl.float32, bitcast=True)
    nonfinite = ~(amax < float("inf"))
    if tl.max(nonfinite.to(tl.int32), axis=0) != 0:  # rare: these rows again, finite |x| only
        fin = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
        for c0 in range(0, C, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            mask = (rows[:, None] < R) & (cols[None, :] < C)
            fin = tl.maximum(fin, _finite_abs(_load_f32(x_ptr + r64 * sxr + cols[None, :].to(tl.int64) * sxc, mask,
                                                        IN_BF16)))
        amax = tl.max(fin, axis=1)
    s, ys = _scale_and_recip(amax, nonfinite, FMAX)
    tl.store(s_ptr + rows, s, mask=rows < R)
    tl.store(ys_ptr + rows, ys, mask=rows < R)


@triton.jit
def _rowwise_t_col_kernel(slot_ptr, st_ptr, ys_ptr, P, C, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
                          FMAX: tl.constexpr):
    """Column amax = max of the ``P`` slots of each column -> column scales ``st`` and RN(1/s')
    (``ys``; every column is marked, negative, when any slot row was: not needed, the row flags
    decide)."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
    for p0 in range(0, P, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        acc = tl.maximum(acc, tl.load(slot_ptr + p[:, None].to(tl.int64) * C + cols[None, :],
                                      mask=(p[:, None] < P) & (cols[None, :] < C), other=0.0))
    s, ys = _scale_and_recip(tl.max(acc, axis=0), cols < 0, FMAX)
    tl.store(st_ptr + cols, s, mask=cols < C)
    tl.store(ys_ptr + cols, ys, mask=cols < C)


@triton.jit
def _parts_of(s, ys):
    """``_div_parts(s, True)`` from s and its stored RN(1/s') (|ys|): (2^k, s', |ys|)."""
    e = ((s.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    k = tl.minimum(tl.maximum(-e, -126), 126)
    p2k = ((k + 127) << 23).to(tl.float32, bitcast=True)
    return p2k, s * p2k, tl.abs(ys)


@triton.jit
def _cast_rowwise_t_kernel(x_ptr, s_ptr, ysr_ptr, st_ptr, ysc_ptr, q_ptr, qt_ptr, R, C, sxr, sxc, sqr, sqc,
                           IN_BF16: tl.constexpr, TILE_R: tl.constexpr, TILE_C: tl.constexpr, FMAX: tl.constexpr,
                           EMIN: tl.constexpr, MBITS: tl.constexpr, IS_E4M3: tl.constexpr, HW_CVT: tl.constexpr):
    """``q = fp8(x / s_row)`` and ``qt = fp8(x / s_col).t()`` (contiguous) from one tile of x, with
    the scales and RN(1/s') of ``_rowwise_t_amax_kernel`` / ``_rowwise_t_col_kernel``."""
    _, _, rows, cols = _tile_of(tl.program_id(0), R, C, TILE_R, TILE_C)
    x, xt = _load_tile(x_ptr, rows, cols, R, C, sxr, sxc, IN_BF16)
    ysr = tl.load(ysr_ptr + rows, mask=rows < R, other=1.0)
    finite = tl.min(ysr, axis=0) > 0  # no row of the tile holds NaN or inf
    p2k_r, sp_r, ys_r = _parts_of(tl.load(s_ptr + rows, mask=rows < R, other=1.0), ysr)
    p2k_c, sp_c, ys_c = _parts_of(tl.load(st_ptr + cols, mask=cols < C, other=1.0),
                                  tl.load(ysc_ptr + cols, mask=cols < C, other=1.0))
    if finite:
        q = _codes_finite(x, _sign(x), p2k_r[:, None], -sp_r[:, None], ys_r[:, None], FMAX, EMIN, MBITS, IS_E4M3,
                          HW_CVT)
        qt = _codes_finite(xt, _sign(xt), p2k_c[:, None], -sp_c[:, None], ys_c[:, None], FMAX, EMIN, MBITS,
                           IS_E4M3, HW_CVT)
    else:
        q = _codes_plain(x, p2k_r[:, None], sp_r[:, None], ys_r[:, None], FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
        qt = _codes_plain(xt, p2k_c[:, None], sp_c[:, None], ys_c[:, None], FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
    _store_both(q, qt, rows, cols, R, C, q_ptr, sqr, sqc, qt_ptr)


# ---- representative sm_90 compile configurations (the GPU launches; scanned by lowbit.fma_guard) --------

_I32 = dict.fromkeys(("R", "C", "sxr", "sxc"), "i32")
_E4M3 = dict(FMAX=448.0, EMIN=-6, MBITS=3, IS_E4M3=True, HW_CVT=3)

SCAN_SPECS = (
    scan_spec(_cast_1xn_t_kernel,
              {"x_ptr": "*i16", "q_ptr": "*u8", "s_ptr": "*fp32", "qt_ptr": "*u8", "st_ptr": "*fp32", **_I32,
               "sqr": "i32", "sqc": "i32", "n_sc": "i32", "n_stc": "i32"},
              dict(IN_BF16=True, BC=128, TILE_R=128, TILE_C=128, **_E4M3)),
    scan_spec(_rowwise_t_amax_kernel,
              {"x_ptr": "*i16", "s_ptr": "*fp32", "ys_ptr": "*fp32", "slot_ptr": "*fp32", **_I32},
              dict(IN_BF16=True, BLOCK_R=64, BLOCK_C=64, FMAX=448.0), num_warps=8),
    scan_spec(_rowwise_t_col_kernel,
              {"slot_ptr": "*fp32", "st_ptr": "*fp32", "ys_ptr": "*fp32", "P": "i32", "C": "i32"},
              dict(BLOCK_P=32, BLOCK_C=128, FMAX=448.0), num_warps=4),
    scan_spec(_cast_rowwise_t_kernel,
              {"x_ptr": "*i16", "s_ptr": "*fp32", "ysr_ptr": "*fp32", "st_ptr": "*fp32", "ysc_ptr": "*fp32",
               "q_ptr": "*u8", "qt_ptr": "*u8", **_I32, "sqr": "i32", "sqc": "i32"},
              dict(IN_BF16=True, TILE_R=128, TILE_C=64, **_E4M3)),
)
