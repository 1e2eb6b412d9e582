"""Triton jit helpers shared by the op families (casts and GEMMs), and ``scan_spec``.

The cast kernels reproduce the torch reference (``lowbit.dtypes.quantize``, ``lowbit.scaling``) bit for
bit with these pieces:

    y = fp32(x) / scale            correctly rounded (IEEE) quotient, see ``_div_rn``
    q = sign(y) * RNE_fmt(min(|y|, fmax)),  NaN -> 0x7F | sign(y)  (torch's float8 NaN codes)

* Division: ``_div_rn`` (``FAST_DIV``) gives the IEEE quotient without a per-element division:
  per scale ``s = s' * 2^-k`` with ``s'`` in [2^-23, 2) (k from the exponent bits, exact) and
  ``y = RN(1 / s')`` (one ``div.rn`` per scale, ``_div_parts``); per element ``a = x * 2^k`` (exact
  unless it overflows, which saturates anyway, or the quotient is below 2^-126, where every float8
  cast gives a signed 0), ``q0 = RN(a * y)`` (within 1.5 ulp), two Newton-Markstein steps
  ``r = fma(-q, s', a)``, ``q = fma(r, y, q)``: the first makes q faithful (error < 1/2 ulp +
  3 * 2^-24 ulp), the second then returns ``RN(a / s')`` (Markstein's theorem: y within 1/2 ulp of
  1/s', q faithful, so the remainder is exact). ``|q0| >= 2^100`` (overflow, inf, NaN) keeps q0:
  it saturates or is NaN either way (a NaN keeps the sign this device's arithmetic gives it,
  as the reference's division does). The sign of x is put back on q (``-0 / s`` must stay -0).
  Without ``FAST_DIV``: ``tl.div_rn`` per element (``div.rn.f32``: a reciprocal, three fma,
  a range check and a slow-path branch each).
* Rounding (``_encode_fp8``): on sm_89+ the hardware cast ``cvt.rn.satfinite`` (RNE, subnormals
  exact) after the clamp; elsewhere, and under ``TRITON_INTERPRET=1`` (whose own fp8 cast rounds
  half up), the reference's arithmetic (``_grid_round``). Both are exact, so both equal the reference.
* Lean path (``_quantize_fp8`` with ``LEAN``): the same bits with fewer
  operations. The float8 code is built from the magnitude and the sign apart,
  ``code(min(|y|, fmax)) | sign << 7`` (``_encode_fp8_lean``): the cast sees only ``|y|``, so the
  fast division needs no sign fix-up (its magnitude is exact; the sign is read from
  ``q0 = (x * 2^k) * RN(1 / s')``, whose sign is the quotient's for every x, zeros and NaN included:
  ``s' > 0``, and a NaN made or carried by the product has the sign this device's arithmetic gives
  it, as the reference's division), and the negated ``s'`` of the two remainders is computed once
  per scale instead of once per element.
* Scales from an amax: ``amax / fmax`` (IEEE division, as ``scaling.scales.div_exact`` on every
  device); 1 when amax is 0 or the quotient is 0 / not finite (``_amax_to_scale``). MX: ``2^k``
  from the exponent bits (floor / rceil rules, ``_mx_exponent``), applied as an exact
  multiplication by ``2^-k`` (``_pow2``).
* amax: max of the finite ``|x|`` (NaN and inf count 0, ``_finite_abs``); ``_block_max`` /
  ``_block_expand`` reduce a tile to its blocks and back.
* bf16 inputs are read as int16 bits and widened with ``<< 16`` (exact on every backend, ``_load_f32``).
* Stochastic rounding's counter-based draws: ``_philox_uniform`` (``lowbit.dtypes.philox``).

* GEMM epilogue and tile order: ``_e8m0_to_fp32`` (exact E8M0 decode), ``_tile_coords`` (grouped
  tile order), ``_store_tile`` (bias, cast, masked store), used by the FP8 and FP4 GEMMs.
"""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["scan_spec"]

FP32_MIN_NORMAL = tl.constexpr(1.1754943508222875e-38)


@triton.jit
def _load_f32(ptrs, mask, IN_BF16: tl.constexpr):
    """fp32 values at ``ptrs`` (0 where masked); bf16 arrives as int16 bits."""
    if IN_BF16:
        bits = tl.load(ptrs, mask=mask, other=0)
        return (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _finite_abs(x):
    """|x| with NaN and +-inf counted as 0 (``lowbit.scaling.blocks.finite_abs``)."""
    a = tl.abs(x)
    return tl.where(a < float("inf"), a, 0.0)


@triton.jit
def _pow2(n):
    """Exact 2^n (fp32) for integer n in [-127, 127] (2^-127 is the subnormal 0x00400000)."""
    return tl.where(n >= -126, (n + 127) << 23, 0x00400000).to(tl.float32, bitcast=True)


@triton.jit
def _grid_round(a, u, EMIN: tl.constexpr, MBITS: tl.constexpr, STOCHASTIC: tl.constexpr):
    """(code, value) of finite ``0 <= a <= fmax`` on a format's grid (``round_to_grid``):
    ``e = max(floor(log2 a), EMIN)``, ``k = a * 2^(MBITS - e)`` (exact), k rounded half-even
    (the fp32 add ``(k + 2^23) - 2^23`` rounds it) or stochastically (``floor(k) + [u < frac]``),
    ``value = k * 2^(e - MBITS)``, ``code = ((e - EMIN) << MBITS) + k`` (sign bit not included).
    The powers of two are built from exponent bits (both exponents are normal here)."""
    e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, EMIN)
    k = a * ((MBITS - e + 127) << 23).to(tl.float32, bitcast=True)
    if STOCHASTIC:
        lo = tl.floor(k)
        k = lo + tl.where(u < k - lo, 1.0, 0.0)
    else:
        k = (k + 8388608.0) - 8388608.0
    return ((e - EMIN) << MBITS) + k.to(tl.int32), k * ((e - MBITS + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _philox_uniform(key_ptr, idx, STREAM: tl.constexpr):
    """fp32 uniforms ``(r >> 8) * 2^-24`` for int64 element indices ``idx``: ``r`` the first word of
    Philox4x32-10 at counter (idx lo, idx hi, step lo, step hi) and key (seed lo, ``STREAM``), with
    (seed, step) the int64 pair at ``key_ptr`` (``lowbit.dtypes.philox``, the reference)."""
    seed = tl.load(key_ptr)
    step = tl.load(key_ptr + 1)
    zero = tl.zeros(idx.shape, tl.uint32)
    c2 = zero + (step & 0xFFFFFFFF).to(tl.uint32)
    c3 = zero + (step >> 32).to(tl.uint32)
    r, _, _, _ = tl.philox_impl((idx & 0xFFFFFFFF).to(tl.uint32), (idx >> 32).to(tl.uint32), c2, c3,
                                (seed & 0xFFFFFFFF).to(tl.uint32), tl.full((), STREAM, tl.uint32))
    return (r >> 8).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def _encode_fp8(y, FMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr,
                IS_E4M3: tl.constexpr, HW_CVT: tl.constexpr):
    """float8 bits (int32) of the saturating RNE cast of fp32 ``y``; NaN -> 0x7F | sign.
    ``HW_CVT``: 0: the arithmetic (``_grid_round``); 1: clamp to +-fmax, then ``cvt.rn.satfinite``;
    2: ``cvt.rn.satfinite`` alone (it saturates out-of-range values and, per PTX, +-inf to +-fmax:
    two operations an element fewer; benchmarks/quantize.py --sweep checks it on the GPU); 3: as 2
    (only ``_encode_fp8_lean`` tells 3 from 2)."""
    sign = (y.to(tl.int32, bitcast=True) >> 31) & 1
    if HW_CVT > 0:
        if HW_CVT == 1:
            yc = tl.minimum(tl.maximum(y, -FMAX), FMAX)
        else:
            yc = y
        if IS_E4M3:
            bits = yc.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32)
        else:
            bits = yc.to(tl.float8e5).to(tl.uint8, bitcast=True).to(tl.int32)
    else:
        a = tl.where(y == y, tl.minimum(tl.abs(y), FMAX), 0.0)
        code, _ = _grid_round(a, a, EMIN, MBITS, False)
        bits = code | (sign << 7)
    return tl.where(y == y, bits, 0x7F | (sign << 7))


@triton.jit
def _amax_to_scale(amax, FMAX: tl.constexpr):
    """``amax_to_scale``: amax / fmax (IEEE), else 1."""
    s = tl.div_rn(amax, FMAX)
    good = (amax > 0) & (amax < float("inf")) & (s > 0) & (s < float("inf"))
    return tl.where(good, s, 1.0)


@triton.jit
def _div_parts(s, FAST_DIV: tl.constexpr):
    """Per-scale part of ``_div_rn``: (2^k, s' = s * 2^k, RN(1 / s')) with s' in [2^-23, 2) for a
    positive finite s (a NaN s gives NaN parts; s = +inf gives (0, 1, 1): ``a = x * 0`` is the
    signed zero of ``x / inf`` for finite x and the invalid-operation NaN for inf and NaN x, as
    the division's). Without ``FAST_DIV``: (1, s, s)."""
    if FAST_DIV:
        e = ((s.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        k = tl.minimum(tl.maximum(-e, -126), 126)
        p2k = ((k + 127) << 23).to(tl.float32, bitcast=True)
        inf = s == float("inf")
        sp = tl.where(inf, 1.0, s * p2k)
        return tl.where(inf, 0.0, p2k), sp, tl.div_rn(1.0, sp)
    else:
        return tl.full(s.shape, 1.0, tl.float32), s, s


@triton.jit
def _div_rn(x, p2k, sp, ys, FAST_DIV: tl.constexpr):
    """IEEE ``RN(x / s)`` from ``_div_parts(s)`` (module docstring: exact where a float8 cast can
    tell; the sign of x is kept on a zero quotient)."""
    if FAST_DIV:
        a = x * p2k
        q0 = a * ys
        q = tl.fma(tl.fma(-q0, sp, a), ys, q0)
        q = tl.fma(tl.fma(-q, sp, a), ys, q)
        sign = x.to(tl.int32, bitcast=True) & -2147483648
        q = ((q.to(tl.int32, bitcast=True) & 0x7FFFFFFF) | sign).to(tl.float32, bitcast=True)
        return tl.where(tl.abs(q0) < 1.2676506002282294e30, q, q0)  # NaN: q0's sign, as the device divides
    else:
        return tl.div_rn(x, sp)


@triton.jit
def _div_rn_lean(x, p2k, sp, ys, FAST_DIV: tl.constexpr):
    """(y, s) for ``_encode_fp8_lean``: ``|y| = |RN(x / s)|`` (``_div_rn`` without its sign fix-up;
    a zero quotient may carry the wrong sign) and ``s`` an fp32 with the quotient's sign: ``q0``
    (module docstring). The remainders are ``fma(q, -s', a)`` with ``-s'`` loop-invariant: the same
    values as ``_div_rn``'s ``fma(-q, s', a)`` up to the sign of a zero remainder, which moves
    neither the next step's magnitude nor, through ``|y|``, the code. Without ``FAST_DIV``:
    ``tl.div_rn`` (``div.rn.f32``), which is exact, sign included: (y, y)."""
    if FAST_DIV:
        a = x * p2k
        q0 = a * ys
        nsp = -sp
        q = tl.fma(tl.fma(q0, nsp, a), ys, q0)
        q = tl.fma(tl.fma(q, nsp, a), ys, q)
        return tl.where(tl.abs(q0) < 1.2676506002282294e30, q, q0), q0
    else:
        y = tl.div_rn(x, sp)
        return y, y


@triton.jit
def _encode_fp8_lean(y, s, FMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr,
                     IS_E4M3: tl.constexpr, HW_CVT: tl.constexpr):
    """float8 bits (int32) of the saturating RNE cast of a value of magnitude ``|y|`` and the sign
    of ``s``: ``code(min(|y|, fmax)) | sign(s) << 7``, NaN -> ``0x7F | sign(s) << 7`` (what
    ``_encode_fp8`` gives for ``y`` when ``sign(y) == sign(s)``). ``HW_CVT``: 0: the arithmetic
    (``_grid_round``); 1 and 2: ``cvt.rn.satfinite`` of ``min(|y|, fmax)`` (one ``max`` with an
    abs operand: the hardware min turns a NaN into fmax, code 0x7E for E4M3, 0x7B for E5M2),
    then OR 0x7F where y is NaN (0x7E | 0x7F = 0x7B | 0x7F = 0x7F); 3: the min lets NaN through
    (``min.NaN``) and the cast's own code for a positive NaN is kept, no NaN test: right where
    ``cvt.rn.satfinite`` writes 0x7F for it (``benchmarks/bitexact.py`` checks it on the GPU)."""
    sgn = (s.to(tl.int32, bitcast=True) >> 24) & 0x80
    if HW_CVT > 0:
        if HW_CVT == 3:
            m = tl.minimum(tl.abs(y), FMAX, propagate_nan=tl.PropagateNan.ALL)
        else:
            m = tl.minimum(tl.abs(y), FMAX)
        if IS_E4M3:
            bits = m.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32)
        else:
            bits = m.to(tl.float8e5).to(tl.uint8, bitcast=True).to(tl.int32)
        if HW_CVT != 3:
            bits = bits | tl.where(y == y, 0, 0x7F)
    else:
        a = tl.where(y == y, tl.minimum(tl.abs(y), FMAX), 0.0)
        code, _ = _grid_round(a, a, EMIN, MBITS, False)
        bits = tl.where(y == y, code, 0x7F)
    return bits | sgn


@triton.jit
def _quantize_fp8(x, p2k, sp, ys, FMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr,
                  IS_E4M3: tl.constexpr, HW_CVT: tl.constexpr, FAST_DIV: tl.constexpr, LEAN: tl.constexpr):
    """uint8 float8 codes of ``x / s`` from ``_div_parts(s)``: ``_encode_fp8(_div_rn(..))``, or
    with ``LEAN`` the same bits by ``_encode_fp8_lean(*_div_rn_lean(..))``."""
    if LEAN:
        y, s = _div_rn_lean(x, p2k, sp, ys, FAST_DIV)
        return _encode_fp8_lean(y, s, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT).to(tl.uint8)
    else:
        return _encode_fp8(_div_rn(x, p2k, sp, ys, FAST_DIV), FMAX, EMIN, MBITS, IS_E4M3, HW_CVT).to(tl.uint8)


@triton.jit
def _mx_exponent(amax, RCEIL: tl.constexpr, ELEM_EMAX: tl.constexpr, ELEM_FMAX: tl.constexpr,
                 LOG2_FMAX: tl.constexpr):
    """E8M0 exponent k of ``mx_scale``: floor: floor(log2 amax) - emax_elem; rceil: the smallest
    k with amax <= fmax * 2^k; clamped to [-127, 127]; 0 for an all-zero block."""
    pos = amax > 0
    safe = tl.where(pos, amax, 1.0)
    sub = safe < FP32_MIN_NORMAL  # subnormal: read the exponent of safe * 2^64 (exact)
    norm = tl.where(sub, tl.where(sub, safe, 0.0) * 18446744073709551616.0, safe)  # (no overflow where unused)
    e = ((norm.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127 - tl.where(sub, 64, 0)
    if RCEIL:
        k = e - LOG2_FMAX
        up = ELEM_FMAX * _pow2(tl.maximum(k, -127)) < safe  # exact product for k >= -127
        k = tl.where(k < -127, k, k + up.to(tl.int32))
    else:
        k = e - ELEM_EMAX
    k = tl.minimum(tl.maximum(k, -127), 127)
    return tl.where(pos, k, 0)


@triton.jit
def _block_max(v, TILE_R: tl.constexpr, TILE_C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """Max over each (BR, BC) block of a (TILE_R, TILE_C) tile -> (TILE_R // BR, TILE_C // BC)."""
    if BR == 1:
        if BC == TILE_C:
            return tl.max(v, axis=1)[:, None]
        else:
            return tl.max(tl.reshape(v, (TILE_R, TILE_C // BC, BC)), axis=2)
    elif BC == 1:
        if BR == TILE_R:
            return tl.max(v, axis=0)[None, :]
        else:
            return tl.max(tl.reshape(v, (TILE_R // BR, BR, TILE_C)), axis=1)
    else:
        v4 = tl.reshape(v, (TILE_R // BR, BR, TILE_C // BC, BC))
        return tl.max(tl.max(v4, axis=3), axis=1)


@triton.jit
def _block_expand(s, TILE_R: tl.constexpr, TILE_C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """Inverse of ``_block_max``'s shape: repeat each block's value over its (BR, BC) elements."""
    if BR == 1:
        if BC == TILE_C:
            return tl.broadcast_to(s, (TILE_R, TILE_C))
        else:
            return tl.reshape(tl.broadcast_to(s[:, :, None], (TILE_R, TILE_C // BC, BC)), (TILE_R, TILE_C))
    elif BC == 1:
        if BR == TILE_R:
            return tl.broadcast_to(s, (TILE_R, TILE_C))
        else:
            return tl.reshape(tl.broadcast_to(s[:, None, :], (TILE_R // BR, BR, TILE_C)), (TILE_R, TILE_C))
    else:
        s4 = tl.broadcast_to(s[:, None, :, None], (TILE_R // BR, BR, TILE_C // BC, BC))
        return tl.reshape(s4, (TILE_R, TILE_C))


@triton.jit
def _tile_ptrs(t, n_tiles_c, R, C, sr, sc, FLAT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """(rows, cols, offsets, mask) of grid-stride tile ``t``. ``FLAT``: x is contiguous and the
    tile is BLOCK_R * BLOCK_C consecutive elements (no tile-index division, 16-byte accesses);
    ``rows``/``cols`` are then unused. Otherwise a (BLOCK_R, BLOCK_C) tile of ``n_tiles_c`` per row."""
    if FLAT:
        zero = tl.zeros([1, 1], tl.int64)  # int64 offsets (t and R may be Python ints here)
        offs = (t + zero) * (BLOCK_R * BLOCK_C) + (tl.arange(0, BLOCK_R)[:, None] * BLOCK_C
                                                   + tl.arange(0, BLOCK_C)[None, :])
        rows = tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_C)
        return rows, cols, offs, offs < (R + zero) * C
    else:
        rows = (t // n_tiles_c) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = (t % n_tiles_c) * BLOCK_C + tl.arange(0, BLOCK_C)
        offs = rows[:, None].to(tl.int64) * sr + cols[None, :].to(tl.int64) * sc
        return rows, cols, offs, (rows[:, None] < R) & (cols[None, :] < C)


# ---- GEMM helpers --------------------------------------------------------------------------------
@triton.jit
def _e8m0_to_fp32(e):
    """E8M0 byte -> fp32 ``2^(e - 127)`` exactly (e = 0 is the subnormal 2^-127; 0xFF is NaN)."""
    e = e.to(tl.int32)
    bits = tl.where(e == 0, 0x00400000, e << 23)
    return tl.where(e == 255, float("nan"), bits.to(tl.float32, bitcast=True))


@triton.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Grouped ordering: GROUP_M row-tiles share each B column-tile while it sits in L2."""
    width = GROUP_M * num_pid_n
    first_m = (tile // width) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % width) % group_m
    pid_n = (tile % width) // group_m
    return pid_m, pid_n


@triton.jit
def _store_tile(c_ptr, bias_ptr, out, off_m, off_n, M, N, stride_cm, stride_cn,
                HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``C[tile] = out (+ bias)`` cast to C's dtype, masked at the edges."""
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        out = out + tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
             out.to(c_ptr.dtype.element_ty), mask=mask)


# ---- SCAN_SPECS entries (representative sm_90 compile configurations, scanned by lowbit.fma_guard) ----

def scan_spec(kernel, signature: dict, constexprs: dict, num_warps: int = 16) -> dict:
    """One SCAN_SPECS entry: ``signature`` names every parameter in order, constexprs as "constexpr";
    ``num_warps`` as launched (4096-element tiles, 8 elements per thread)."""
    import inspect
    types = {**signature, **dict.fromkeys(constexprs, "constexpr")}
    return {"kernel": kernel, "signature": {p: types[p] for p in inspect.signature(kernel.fn).parameters},
            "constexprs": dict(constexprs), "num_warps": num_warps}
