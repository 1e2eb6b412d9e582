"""Row-local FP8 casts without a transposed copy (Triton): rowwise, 1xBC blocks (1x128) and MX
1xBC blocks (MX-FP8 1x32) as one grid-stride walk over *groups*, the runs of elements that share
a scale, each group held whole by a few lanes of one warp (or, for a long row, by the program).

A group is BC consecutive elements of a row: a 1xBC block (``n_sc = cdiv(C, BC)`` a row), or, for
rowwise, the whole row (``BC = next_pow2(C) >= C``, ``n_sc = 1``; the columns past C are masked,
load 0 and count nothing). Group g is block column ``g % n_sc`` of row ``g // n_sc``, whose scale
is ``s[g]`` (row-major (R, n_sc) scales, (R,) for rowwise). A tile is TR consecutive groups,
shaped (TR, BC): a thread holds 16 consecutive elements of one group (8 warps, 4096-element
tiles: two 16-byte loads of bf16, one 16-byte store of codes), so the group max is an in-thread
max and a few shuffles (1x128: 8 lanes; 1x32: 2; a 4096-element row: the whole program, one
reduction through shared memory). ``FLAT`` (x and q contiguous, C % BC == 0): group g is elements
[g BC, (g + 1) BC) of the flat array, no index division.

Math, per group (bit-exact with the torch reference ``lowbit.dtypes.quantize`` /
``lowbit.scaling``, data and scales, as ``quantize_fp8_block_kernels`` computes it):

    amax_g = max over g of the finite |x|  (NaN and inf count 0)
           = max of |fma(x, 0, x)| with the NaN-ignoring hardware max: fma(x, 0, x) is exactly x
             for finite x (x * 0 = +-0, +-0 + x = x) and NaN for +-inf and NaN (inf * 0 = NaN),
             so one fma and one max (with its |.| operand) an element; a group with no finite
             element reduces to NaN, which the scale rules treat as 0 (``amax > 0`` is false)
    Blockwise / rowwise: s_g = amax_g / fmax (IEEE; 1 when amax_g is 0 or the quotient is 0 / not
             finite), q = RNE_fmt(clamp(RN(fp32(x) / s_g), -fmax, fmax)) by ``_div_rn`` (the exact
             reciprocal with ``FAST_DIV``, ``div.rn.f32`` without; ``LEAN``: the lean encode)
    MX:      s_g = 2^k (E8M0 code k + 127, floor / rceil rule), q = RNE_fmt(clamp(x * 2^-k, ..));
             a group holding NaN (``max(|x| bits) > 0x7F800000``: an integer max of the
             sign-cleared bits, NaN above +inf) gets code 0xFF and every element the NaN code
    NaN -> 0x7F | sign

``PREFETCH``: the load of tile t + programs is issued before tile t is reduced and cast, so a
thread has two tiles of loads in flight while it works (as the tensorwise flat walk's
``quantize_policy.stream_prefetch``). A tile past the last one is all masked: no memory touched.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .quantize_fp8_block_kernels import _block_parts
from .quantize_fp8_transpose_kernels import _codes_finite, _sign
from .quantize_jit_helpers import _encode_fp8, _encode_fp8_lean, _grid_round, _load_f32, _quantize_fp8, scan_spec

__all__ = ["SCAN_SPECS"]


@triton.jit
def _group_offsets(t, R, C, sxr, sxc, sqr, sqc, n_sc, n_groups, FLAT: tl.constexpr, TR: tl.constexpr,
                   BC: tl.constexpr):
    """(g, x offsets, q offsets, mask) of tile t: groups g = t TR .. t TR + TR - 1, (TR, BC)
    elements. ``FLAT``: offsets g BC + c in x and q alike; else row g // n_sc, columns
    (g % n_sc) BC + c through the strides (rowwise: n_sc == 1, the division folds away)."""
    g = t * TR + tl.arange(0, TR)
    c = tl.arange(0, BC)
    if FLAT:
        offs = g[:, None].to(tl.int64) * BC + c[None, :]
        return g, offs, offs, (g < n_groups)[:, None] & (c < BC)[None, :]
    else:
        r = g // n_sc
        col = (g - r * n_sc)[:, None] * BC + c[None, :]
        r64 = r[:, None].to(tl.int64)
        c64 = col.to(tl.int64)
        return g, r64 * sxr + c64 * sxc, r64 * sqr + c64 * sqc, (r < R)[:, None] & (col < C)


@triton.jit
def _walk_first(x_ptr, pid, R, C, sxr, sxc, n_sc, n_groups, FLAT: tl.constexpr, TR: tl.constexpr, BC: tl.constexpr,
                IN_BF16: tl.constexpr, PREFETCH: tl.constexpr):
    """The ``x_next`` a grid-stride walk starts with: program ``pid``'s first tile with
    ``PREFETCH`` (a scalar placeholder otherwise)."""
    if PREFETCH:
        _, xo, _, mask = _group_offsets(pid, R, C, sxr, sxc, 0, 0, n_sc, n_groups, FLAT, TR, BC)
        x_next = _load_f32(x_ptr + xo, mask, IN_BF16)
    else:
        x_next = 0.0
    return x_next


@triton.jit
def _walk_tile(x_ptr, t, step, x_next, R, C, sxr, sxc, sqr, sqc, n_sc, n_groups, FLAT: tl.constexpr,
               TR: tl.constexpr, BC: tl.constexpr, IN_BF16: tl.constexpr, PREFETCH: tl.constexpr):
    """Tile t of a grid-stride walk (stride ``step``): (g, q offsets, mask, x, the next x). With
    ``PREFETCH`` tile t's x came as ``x_next`` from the call for tile t - step, and tile t + step's
    load is issued here, before tile t is worked on."""
    g, xo, qo, mask = _group_offsets(t, R, C, sxr, sxc, sqr, sqc, n_sc, n_groups, FLAT, TR, BC)
    if PREFETCH:
        x = x_next
        _, xo_n, _, mask_n = _group_offsets(t + step, R, C, sxr, sxc, sqr, sqc, n_sc, n_groups, FLAT, TR, BC)
        x_next = _load_f32(x_ptr + xo_n, mask_n, IN_BF16)
    else:
        x = _load_f32(x_ptr + xo, mask, IN_BF16)
    return g, qo, mask, x, x_next


@triton.jit
def _group_amax(x, key, MX: tl.constexpr):
    """Per group (row of the tile) from any x: the finite amax (module docstring), and for ``MX``
    +inf where the group holds a NaN (``key``, the group's max of the sign-cleared bits, above
    0x7F800000: the flag ``_block_parts`` reads)."""
    amax = tl.max(tl.abs(tl.fma(x, 0.0, x)), axis=1)  # hardware max ignores NaN
    if MX:
        amax = tl.where(key > 0x7F800000, float("inf"), amax)
    return amax


@triton.jit
def _codes_any(x, pa, pb, pc, MX: tl.constexpr, FMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr,
               IS_E4M3: tl.constexpr, HW_CVT: tl.constexpr, FAST_DIV: tl.constexpr, LEAN: tl.constexpr):
    """uint8 codes of any x (NaN, inf) with its group's ``_block_parts`` factors (TR, 1): as
    ``quantize_fp8_block_kernels._quantize_chunk``."""
    if MX:
        y = x * pa
        if LEAN:
            return _encode_fp8_lean(y, y, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT).to(tl.uint8)
        else:
            return _encode_fp8(y, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT).to(tl.uint8)
    else:
        return _quantize_fp8(x, pa, pb, pc, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT, FAST_DIV, LEAN)


@triton.jit
def _codes_all_finite(x, pa, pb, pc, MX: tl.constexpr, FMAX: tl.constexpr, EMIN: tl.constexpr,
                      MBITS: tl.constexpr, IS_E4M3: tl.constexpr, HW_CVT: tl.constexpr, FAST_DIV: tl.constexpr):
    """uint8 codes of a tile of finite x (``FINITE``, module docstring): ``m = min(|x / s|, fmax)``
    (MX: ``|x * 2^-k|``; the fast division by ``_codes_finite``), x's sign on m's bits, one cast."""
    sgn = _sign(x)
    if not MX and FAST_DIV:
        q = _codes_finite(x, sgn, pa, -pb, pc, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
    else:
        if MX:
            m = tl.minimum(tl.abs(x * pa), FMAX)
        else:
            m = tl.minimum(tl.abs(tl.div_rn(x, pb)), FMAX)
        if HW_CVT > 0:
            v = (m.to(tl.int32, bitcast=True) | sgn).to(tl.float32, bitcast=True)
            if IS_E4M3:
                q = v.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
            else:
                q = v.to(tl.float8e5).to(tl.uint8, bitcast=True)
        else:
            code, _ = _grid_round(m, m, EMIN, MBITS, False)
            q = (code | tl.where(sgn != 0, 0x80, 0)).to(tl.uint8)
    return q


@triton.jit
def _cast_rowblock_kernel(x_ptr, q_ptr, s_ptr, R, C, sxr, sxc, sqr, sqc, n_sc, n_groups, n_tiles,
                          IN_BF16: tl.constexpr, FLAT: tl.constexpr, TR: tl.constexpr, BC: tl.constexpr,
                          PREFETCH: tl.constexpr, FINITE: tl.constexpr, MX: tl.constexpr, RCEIL: tl.constexpr,
                          ELEM_EMAX: tl.constexpr, LOG2_FMAX: tl.constexpr, FMAX: tl.constexpr, EMIN: tl.constexpr,
                          MBITS: tl.constexpr, IS_E4M3: tl.constexpr, HW_CVT: tl.constexpr,
                          FAST_DIV: tl.constexpr, LEAN: tl.constexpr):
    """Grid-stride over tiles of TR groups of BC elements (module docstring): per group the
    amax, the scale (fp32 ``amax / fmax``, or the E8M0 code with ``MX``) to ``s[g]``, and the
    codes of its elements to q. ``FINITE``: a tile whose every x is finite (its max of the
    sign-cleared bits below 0x7F800000, one reduction across the program) takes the amax from
    those bits and ``_codes_all_finite``; the others (and every tile without it) ``_codes_any``."""
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    x_next = _walk_first(x_ptr, pid, R, C, sxr, sxc, n_sc, n_groups, FLAT, TR, BC, IN_BF16, PREFETCH)
    for t in range(pid, n_tiles, step):
        g, qo, mask, x, x_next = _walk_tile(x_ptr, t, step, x_next, R, C, sxr, sxc, sqr, sqc, n_sc, n_groups, FLAT,
                                            TR, BC, IN_BF16, PREFETCH)
        key = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)  # integer order: NaN > inf > finite
        if FINITE:
            finite = tl.max(key, axis=0) < 0x7F800000
        else:
            finite = False
        if finite:  # the stores in each branch: codes yielded from an if would take a register each
            s, pa, pb, pc = _block_parts(key.to(tl.float32, bitcast=True), MX, RCEIL, ELEM_EMAX, LOG2_FMAX, FMAX,
                                         FAST_DIV)
            tl.store(s_ptr + g[:, None], s[:, None], mask=(g < n_groups)[:, None])  # (TR, 1): the tile's layout
            tl.store(q_ptr + qo, _codes_all_finite(x, pa[:, None], pb[:, None], pc[:, None], MX, FMAX, EMIN, MBITS,
                                                   IS_E4M3, HW_CVT, FAST_DIV), mask=mask)
        else:
            s, pa, pb, pc = _block_parts(_group_amax(x, key, MX), MX, RCEIL, ELEM_EMAX, LOG2_FMAX, FMAX, FAST_DIV)
            tl.store(s_ptr + g[:, None], s[:, None], mask=(g < n_groups)[:, None])
            tl.store(q_ptr + qo, _codes_any(x, pa[:, None], pb[:, None], pc[:, None], MX, FMAX, EMIN, MBITS, IS_E4M3,
                                            HW_CVT, FAST_DIV, LEAN), mask=mask)


# ---- representative sm_90 compile configurations (the GPU launches; scanned by lowbit.fma_guard) --------

_SIG = {"x_ptr": "*i16", "q_ptr": "*u8", "s_ptr": "*fp32",
        **dict.fromkeys(("R", "C", "sxr", "sxc", "sqr", "sqc", "n_sc", "n_groups", "n_tiles"), "i32")}
_E4M3 = dict(FMAX=448.0, EMIN=-6, MBITS=3, IS_E4M3=True, HW_CVT=3, FAST_DIV=True, LEAN=True)

SCAN_SPECS = (
    scan_spec(_cast_rowblock_kernel, _SIG,
              dict(IN_BF16=True, FLAT=True, TR=32, BC=128, PREFETCH=True, FINITE=True, MX=False, RCEIL=False, ELEM_EMAX=8,
                   LOG2_FMAX=8, **_E4M3), num_warps=8),
)
