"""The transposed copy alone (Triton): ``qt = fp8(x / s_col).t()`` (contiguous (C, R)), for the
casts that write x's own copy with a row-local kernel first (``quantize_fp8_rowblock_kernels``:
1xBC blocks, rowwise) and this one second. Bit-exact with the torch reference and with the
one-launch transposing kernels (same math, same encode: ``quantize_fp8_transpose_kernels``).

A program owns a (BR, TILE_C) tile of x, read once and held in registers (its loaded bits) from
the column amax to the codes:

* ``GIVEN = False`` (1x``BR`` blocks of ``x.t()``, i.e. BRx1 blocks of x): ``s_col = amax / fmax``
  of the tile's column (IEEE; 1 when amax is 0 or the quotient is 0 / not finite), the finite
  ``|x|`` (NaN and inf count 0) from the NaN-propagating integer max the finite test needs anyway;
  written to ``st[col, tile row]``.
* ``GIVEN = True`` (rowwise: one scale a column over all rows): ``s_col`` and its ``RN(1/s')``
  read from ``st`` / ``ysc`` (``quantize_fp8_rowwise_t_kernels._rowwise_t_scales_kernel``).

Codes: a tile whose every |x| is finite takes ``_codes_finite`` (``min(|x / s|, fmax)`` with x's
sign, one ``cvt.rn.satfinite``: valid because ``|x| <= amax`` of its column), else the plain
encode (NaN -> 0x7F | sign, the clamp). The division is ``_div_rn``'s per-scale parts. Triton
(3.6, sm_90) makes the codes in a column-major register layout (the loaded bf16 tile goes through
shared memory once; the codes' transposition is then free) and, the column amax being stored to
``st`` and read back as a fresh 1-D tensor, makes each column's two divisions in one thread
before it broadcasts the parts (TTGIR checked at the default tiles). ``REVERSE`` walks the tiles
last to first, so the tiles the row-local cast wrote last (still in L2) are read first. The rare
paths (the finite amax and the plain encode of a tile holding NaN or inf) re-read the tile from
L2 in SUB_R-row slices instead of keeping it: with them on the held tile the kernel took 255
registers and 552 bytes of stack.

Rows a thread are the lever on the per-column work: a 128x32 tile at 1 warp (16 rows x 8 columns
a thread) costs 12.7 SASS instructions an element on the finite path, 168 registers, 12 programs
an SM (sm_90, triton 3.6); 128x64 at 8 warps cost 36 (47 without the round trip through ``st``,
the divisions then in every thread holding the column). H200 (2026-12-02, 8192x8192 bf16, kernel time, bit-exact there): the kernel alone
0.066 ms (1x128) and 0.062 (rowwise, 64x32 tiles); 1x128 + T in all 0.122 ms against 0.183 for
the one-launch sweep kernel, rowwise + T 0.167 against 0.224.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .quantize_fp8_rowwise_t_kernels import _parts_of
from .quantize_fp8_transpose_kernels import _E4M3, _I32, _codes_finite, _codes_plain, _finite_slices_max, _key_bits, \
    _load_tile, _sign
from .quantize_jit_helpers import _amax_to_scale, _div_parts, _load_f32, scan_spec

__all__ = ["SCAN_SPECS"]


@triton.jit
def _cast_cols_t_kernel(x_ptr, qt_ptr, st_ptr, ysc_ptr, R, C, sxr, sxc, n_stc, IN_BF16: tl.constexpr,
                        BR: tl.constexpr, TILE_C: tl.constexpr, SUB_R: tl.constexpr, GIVEN: tl.constexpr,
                        REVERSE: tl.constexpr,
                        FMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr, IS_E4M3: tl.constexpr,
                        HW_CVT: tl.constexpr):
    """``qt[c, r] = fp8(x[r, c] / s_col)`` for the (BR, TILE_C) tile of program ``pid`` (module
    docstring: the scales computed, or ``GIVEN``)."""
    pid = tl.program_id(0)
    if REVERSE:
        pid = tl.num_programs(0) - 1 - pid
    n_tc = tl.cdiv(C, TILE_C)
    bi = pid // n_tc
    rows = bi * BR + tl.arange(0, BR)
    cols = (pid % n_tc) * TILE_C + tl.arange(0, TILE_C)
    x, key = _load_tile(x_ptr, rows, cols, R, C, sxr, sxc, IN_BF16)
    INF: tl.constexpr = 0x7F80 if IN_BF16 else 0x7F800000
    ck = tl.max(key, axis=0)
    finite = tl.max(ck, axis=0) < INF
    if GIVEN:
        p2k, sp, ys = _parts_of(tl.load(st_ptr + cols, mask=cols < C, other=1.0),
                                tl.load(ysc_ptr + cols, mask=cols < C, other=1.0))
    else:
        amax = _key_bits(ck, IN_BF16).to(tl.float32, bitcast=True)
        if not finite:  # rare: NaN or inf in the tile; the amax of the finite |x|, slice by slice from L2
            amax = tl.max(_finite_slices_max(x_ptr, bi * BR, cols, R, C, sxr, sxc, IN_BF16, BR, SUB_R), axis=0)
        # the column amax through st, read back as a fresh 1-D tensor (one column a thread): the
        # scale's two divisions are then made once a column, not in every thread holding it
        s_ptrs = st_ptr + cols.to(tl.int64) * n_stc + bi
        tl.store(s_ptrs, amax, mask=cols < C)
        tl.debug_barrier()
        cols1 = (pid % n_tc) * TILE_C + tl.arange(0, TILE_C)
        s1_ptrs = st_ptr + cols1.to(tl.int64) * n_stc + bi
        s = _amax_to_scale(tl.load(s1_ptrs, mask=cols1 < C, other=0.0), FMAX)
        p2k, sp, ys = _div_parts(s, True)
        tl.debug_barrier()  # every amax read before a scale is written over it
        tl.store(s1_ptrs, s, mask=cols1 < C)
    p2k, sp, ys = p2k[None, :], sp[None, :], ys[None, :]
    if finite:
        qt = _codes_finite(x, _sign(x), p2k, -sp, ys, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
        _store_t(qt, rows, cols, R, C, qt_ptr)
    else:  # rare: the plain encode, slice by slice from L2 (the tile's registers are not kept for it)
        for r in range(0, BR, SUB_R):
            rs = bi * BR + r + tl.arange(0, SUB_R)
            xs = _load_f32(x_ptr + rs[:, None].to(tl.int64) * sxr + cols[None, :].to(tl.int64) * sxc,
                           (rs[:, None] < R) & (cols[None, :] < C), IN_BF16)
            _store_t(_codes_plain(xs, p2k, sp, ys, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT), rs, cols, R, C, qt_ptr)


@triton.jit
def _store_t(qt, rows, cols, R, C, qt_ptr):
    """Codes ``qt`` (rows x cols of x) into the contiguous (C, R) transposed copy."""
    tl.store(qt_ptr + cols[:, None].to(tl.int64) * R + rows[None, :], tl.trans(qt),
             mask=(cols[:, None] < C) & (rows[None, :] < R))


# ---- representative sm_90 compile configurations (the GPU launches; scanned by lowbit.fma_guard) --------

SCAN_SPECS = (
    scan_spec(_cast_cols_t_kernel,
              {"x_ptr": "*i16", "qt_ptr": "*u8", "st_ptr": "*fp32", "ysc_ptr": "*fp32", **_I32, "n_stc": "i32"},
              dict(IN_BF16=True, BR=128, TILE_C=32, SUB_R=16, GIVEN=False, REVERSE=True, **_E4M3), num_warps=1),
)
