"""Tensorwise FP8 casts (Triton): one scale for the whole tensor, delayed or current scaling.

Bit-exact with the torch reference (``lowbit.dtypes.quantize``, ``lowbit.scaling``), data and scales:

    scale = amax / fmax             IEEE division; 1 when amax is 0 or the quotient is 0 / not finite
    q = RNE_fmt(clamp(RN(fp32(x) / scale), -fmax, fmax)),  NaN -> 0x7F | sign  (saturating cast)

with the exact reciprocal division ``_div_rn`` and the rounding ``_encode_fp8`` of ``jit_common``
(whose docstring gives the proofs; ``LEAN``: the same bits by its lean path). amax is the max of
the finite ``|x|`` (NaN and inf count 0): the streaming loops keep ``max(|x|)`` elementwise in
registers across a program's tiles (the hardware max ignores NaN), redo the pass without inf only
when that came out +inf, reduce once, then either ``atomic_max`` into a zero-initialised fp32
scalar (one atomic per program) or, with ``AMAX_SLOTS``, store the program's amax in its own slot
``amax[program]`` (no zero-fill launch needed: the reader takes the max of the ``n_amax`` slots;
max is exact in any order, so both give the same amax): no host synchronisation anywhere.
``PREFETCH``: the grid-stride loops issue tile t + programs's load before computing tile t.

Kernels: ``_amax_kernel`` (tensor amax; also the NV-FP4 cast's first pass), ``_cast_tensor_kernel``
(delayed scaling with the amax fused into the cast, or current scaling from a precomputed amax),
``_cast_tensor_t_reg_kernel`` (the same with the transposed copy, a tile read once and held in
registers), ``_delayed_update_kernel`` (the delayed-scaling state update in one launch).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..jit_common import _amax_to_scale, _div_parts, _finite_abs, _load_f32, _quantize_fp8, _tile_ptrs, scan_spec
from .encode import _E4M3_T, _I32, _codes_finite, _codes_plain, _key_bits, _load_tile, _sign, _store_both

__all__ = ["SCAN_SPECS"]


@triton.jit
def _walk_index(t, n_tiles, REVERSE: tl.constexpr):
    """The tile grid-stride step t takes: t, or ``n_tiles - 1 - t`` walking last to first."""
    if REVERSE:
        u = n_tiles - 1 - t
    else:
        u = t
    return u


@triton.jit
def _finite_amax_again(x_ptr, R, C, sxr, sxc, n_tiles_c, n_tiles, IN_BF16: tl.constexpr, FLAT: tl.constexpr,
                       BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, REVERSE: tl.constexpr = False):
    """Finite amax of this program's grid-stride tiles (``REVERSE``: tiles ``n_tiles - 1 - t``, the
    set ``_amax_kernel`` walked). The streaming loops keep ``max(|x|)`` (one op an element; the
    hardware max ignores NaN) and call this only when that came out +inf."""
    acc = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        u = _walk_index(t, n_tiles, REVERSE)
        rows, cols, offs, mask = _tile_ptrs(u, n_tiles_c, R, C, sxr, sxc, FLAT, BLOCK_R, BLOCK_C)
        acc = tl.maximum(acc, _finite_abs(_load_f32(x_ptr + offs, mask, IN_BF16)))
    return tl.max(tl.max(acc, axis=1), axis=0)


@triton.jit
def _prefetch(x_ptr, t, n_tiles_c, R, C, sxr, sxc, IN_BF16: tl.constexpr, FLAT: tl.constexpr,
              BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, PREFETCH: tl.constexpr):
    """Grid-stride tile ``t`` of x loaded ahead (``PREFETCH``; a scalar placeholder otherwise). A
    tile past the last one is all masked (its rows are >= R, its flat offsets >= R * C): 0s, no
    memory touched."""
    if PREFETCH:
        rows, cols, offs, mask = _tile_ptrs(t, n_tiles_c, R, C, sxr, sxc, FLAT, BLOCK_R, BLOCK_C)
        return _load_f32(x_ptr + offs, mask, IN_BF16)
    else:
        return 0.0


@triton.jit
def _tile_x(x_ptr, t, x_next, n_tiles_c, R, C, sxr, sxc, IN_BF16: tl.constexpr, FLAT: tl.constexpr,
            BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, PREFETCH: tl.constexpr):
    """(x of grid-stride tile t, the carried prefetch). ``PREFETCH``: tile t is the one loaded
    ahead, and the load of tile t + num_programs is issued now, before t is computed: two tiles in
    flight per thread, so the load latency is covered by this tile's arithmetic and not only by
    the other warps'. Otherwise tile t is loaded here."""
    if PREFETCH:
        return x_next, _prefetch(x_ptr, t + tl.num_programs(0), n_tiles_c, R, C, sxr, sxc, IN_BF16, FLAT,
                                 BLOCK_R, BLOCK_C, True)
    else:
        rows, cols, offs, mask = _tile_ptrs(t, n_tiles_c, R, C, sxr, sxc, FLAT, BLOCK_R, BLOCK_C)
        return _load_f32(x_ptr + offs, mask, IN_BF16), x_next


@triton.jit
def _acc_max(acc, a, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, AMAX_VEC: tl.constexpr):
    """``max(acc, a)`` with ``acc`` elementwise (``AMAX_VEC == 1``), or ``acc`` of shape
    (BLOCK_R, BLOCK_C // AMAX_VEC) taking the max of each AMAX_VEC consecutive elements first
    (within a thread when a thread holds them: the flat walks' 8- or 16-element vectors), which
    keeps the accumulator to a register or two a thread. Max is exact in any order."""
    if AMAX_VEC == 1:
        return tl.maximum(acc, a)
    else:
        return tl.maximum(acc, tl.max(tl.reshape(a, (BLOCK_R, BLOCK_C // AMAX_VEC, AMAX_VEC)), axis=2))


@triton.jit
def _put_amax(amax_ptr, amax, AMAX_SLOTS: tl.constexpr):
    """This program's finite amax: into its own slot (``AMAX_SLOTS``) or by atomic max."""
    if AMAX_SLOTS:
        tl.store(amax_ptr + tl.program_id(0), amax)
    else:
        tl.atomic_max(amax_ptr, amax)


@triton.jit
def _get_amax(amax_ptr, n_amax, AMAX_BLOCK: tl.constexpr):
    """The tensor amax: max of the ``n_amax`` slots (in blocks of ``AMAX_BLOCK``, a power of two),
    or the scalar at ``amax_ptr`` (``AMAX_BLOCK == 1``)."""
    if AMAX_BLOCK == 1:
        return tl.load(amax_ptr)
    else:
        i = tl.arange(0, AMAX_BLOCK)
        m = tl.load(amax_ptr + i, mask=i < n_amax, other=0.0)
        for i0 in range(AMAX_BLOCK, n_amax, AMAX_BLOCK):
            m = tl.maximum(m, tl.load(amax_ptr + i0 + i, mask=i0 + i < n_amax, other=0.0))
        return tl.max(m, axis=0)


@triton.jit
def _tensor_scale(scale_ptr, amax_ptr, n_amax, DELAYED: tl.constexpr, AMAX_BLOCK: tl.constexpr, FMAX: tl.constexpr):
    """The scale of a tensorwise cast: the state's at ``scale_ptr`` (``DELAYED``), or
    ``amax_to_scale`` of the tensor amax (``_get_amax``), which program 0 writes to ``scale_ptr``."""
    if DELAYED:
        scale = tl.load(scale_ptr)
    else:
        scale = _amax_to_scale(_get_amax(amax_ptr, n_amax, AMAX_BLOCK), FMAX)
        if tl.program_id(0) == 0:
            tl.store(scale_ptr, scale)
    return scale


@triton.jit
def _amax_kernel(x_ptr, amax_ptr, R, C, sxr, sxc, n_tiles_c, n_tiles,
                 IN_BF16: tl.constexpr, FLAT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                 AMAX_SLOTS: tl.constexpr, AMAX_VEC: tl.constexpr, PREFETCH: tl.constexpr, REVERSE: tl.constexpr):
    """Finite amax of a (R, C) tensor: by atomic_max into a zero-initialised fp32 scalar, or one
    slot a program (``AMAX_SLOTS``). Grid-stride over tiles (``FLAT``: contiguous chunks); kept
    elementwise (``_acc_max``) across the program's tiles and reduced once: one atomic (or store)
    per program. ``REVERSE`` (no prefetch then): grid-stride step i takes tile ``n_tiles - 1 - t``,
    so the tiles read last are the first ones, which a cast walking forward reads first (from L2
    where they still are); the max is the same in any order."""
    PF: tl.constexpr = PREFETCH and not REVERSE
    acc = tl.zeros([BLOCK_R, BLOCK_C // AMAX_VEC], tl.float32)
    x_next = _prefetch(x_ptr, tl.program_id(0), n_tiles_c, R, C, sxr, sxc, IN_BF16, FLAT, BLOCK_R, BLOCK_C, PF)
    for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        x, x_next = _tile_x(x_ptr, _walk_index(t, n_tiles, REVERSE), x_next, n_tiles_c, R, C, sxr, sxc, IN_BF16, FLAT,
                            BLOCK_R, BLOCK_C, PF)
        acc = _acc_max(acc, tl.abs(x), BLOCK_R, BLOCK_C, AMAX_VEC)  # max ignores NaN
    amax = tl.max(tl.max(acc, axis=1), axis=0)
    if amax == float("inf"):  # rare: an inf in this program's tiles; again, without it
        amax = _finite_amax_again(x_ptr, R, C, sxr, sxc, n_tiles_c, n_tiles, IN_BF16, FLAT, BLOCK_R, BLOCK_C, REVERSE)
    _put_amax(amax_ptr, amax, AMAX_SLOTS)


@triton.jit
def _cast_tensor_kernel(x_ptr, q_ptr, scale_ptr, amax_ptr, R, C, sxr, sxc, sqr, sqc,
                        n_tiles_c, n_tiles, n_amax,
                        IN_BF16: tl.constexpr, DELAYED: tl.constexpr,
                        FMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr, IS_E4M3: tl.constexpr,
                        HW_CVT: tl.constexpr, FAST_DIV: tl.constexpr, FLAT: tl.constexpr,
                        BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, LEAN: tl.constexpr,
                        AMAX_SLOTS: tl.constexpr, AMAX_BLOCK: tl.constexpr, AMAX_VEC: tl.constexpr,
                        PREFETCH: tl.constexpr):
    """Tensorwise cast ``q = fp8(x / scale)`` (the transposed copy: ``_cast_tensor_t_reg_kernel``).

    ``DELAYED``: ``scale`` is read from ``scale_ptr`` (the state's scale) and the finite amax of x
    is computed in the same pass into ``amax_ptr`` (one read of x, one write of q; the amax is kept
    elementwise (``_acc_max``) across the program's tiles and reduced once at the end;
    ``AMAX_SLOTS``: one slot a program). Otherwise (current scaling): ``scale =
    amax_to_scale(amax)`` with the amax of the ``n_amax`` values at ``amax_ptr`` (``_get_amax``),
    written to ``scale_ptr``."""
    pid = tl.program_id(0)
    p2k, sp, ys = _div_parts(_tensor_scale(scale_ptr, amax_ptr, n_amax, DELAYED, AMAX_BLOCK, FMAX), FAST_DIV)
    acc = tl.zeros([BLOCK_R, BLOCK_C // AMAX_VEC], tl.float32)
    x_next = _prefetch(x_ptr, pid, n_tiles_c, R, C, sxr, sxc, IN_BF16, FLAT, BLOCK_R, BLOCK_C, PREFETCH)
    for t in range(pid, n_tiles, tl.num_programs(0)):
        rows, cols, offs, mask = _tile_ptrs(t, n_tiles_c, R, C, sxr, sxc, FLAT, BLOCK_R, BLOCK_C)
        x, x_next = _tile_x(x_ptr, t, x_next, n_tiles_c, R, C, sxr, sxc, IN_BF16, FLAT, BLOCK_R, BLOCK_C, PREFETCH)
        if DELAYED:
            acc = _acc_max(acc, tl.abs(x), BLOCK_R, BLOCK_C, AMAX_VEC)  # max ignores NaN; inf: after the loop
        q = _quantize_fp8(x, p2k, sp, ys, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT, FAST_DIV, LEAN)
        if FLAT:  # q is contiguous like x
            tl.store(q_ptr + offs, q, mask=mask)
        else:
            r64 = rows[:, None].to(tl.int64)
            c64 = cols[None, :].to(tl.int64)
            tl.store(q_ptr + r64 * sqr + c64 * sqc, q, mask=mask)
    if DELAYED:
        amax = tl.max(tl.max(acc, axis=1), axis=0)
        if amax == float("inf"):  # rare: an inf in this program's tiles; again, without it
            amax = _finite_amax_again(x_ptr, R, C, sxr, sxc, n_tiles_c, n_tiles, IN_BF16, FLAT, BLOCK_R, BLOCK_C)
        _put_amax(amax_ptr, amax, AMAX_SLOTS)


@triton.jit
def _delayed_update_kernel(amax_ptr, hist_ptr, scale_ptr, out_scale_ptr, L, n_amax, FMAX: tl.constexpr,
                           MARGIN_MUL: tl.constexpr, MOST_RECENT: tl.constexpr, BLOCK: tl.constexpr,
                           AMAX_BLOCK: tl.constexpr):
    """``DelayedScalingState.update(amax)`` in one program, after copying the state's scale (the
    one the cast used) to ``out_scale``: amax (the max of the ``n_amax`` slots at ``amax_ptr``,
    ``_get_amax``; 0 if not finite) shifted into ``history[0]``; ``A = max(history)`` or
    ``history[0]``; ``new = (A / fmax) * 2^margin`` (IEEE division, exact power-of-two product);
    the scale becomes ``new`` when ``A > 0`` and ``new`` is finite and > 0."""
    amax = _get_amax(amax_ptr, n_amax, AMAX_BLOCK)
    amax = tl.where(tl.abs(amax) < float("inf"), amax, 0.0)
    old_scale = tl.load(scale_ptr)
    tl.store(out_scale_ptr, old_scale)
    i = tl.arange(0, BLOCK)
    prev = tl.load(hist_ptr + i - 1, mask=(i >= 1) & (i < L), other=0.0)
    hist = tl.where(i == 0, amax, prev)
    if MOST_RECENT:
        a = amax
    else:
        a = tl.max(tl.where(i < L, hist, -float("inf")), axis=0)
    new = tl.div_rn(a, FMAX) * MARGIN_MUL
    good = (a > 0) & (tl.abs(new) < float("inf")) & (new > 0)
    tl.debug_barrier()  # every thread has read the old history before it is overwritten
    tl.store(hist_ptr + i, hist, mask=i < L)
    tl.store(scale_ptr, tl.where(good, new, old_scale))


@triton.jit
def _cast_tensor_t_reg_kernel(x_ptr, q_ptr, qt_ptr, scale_ptr, amax_ptr, R, C, sxr, sxc, sqr, sqc, n_amax,
                              IN_BF16: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, DELAYED: tl.constexpr,
                              AMAX_BLOCK: tl.constexpr, FMAX: tl.constexpr, EMIN: tl.constexpr, MBITS: tl.constexpr,
                              IS_E4M3: tl.constexpr, HW_CVT: tl.constexpr):
    """Tensorwise ``q = fp8(x / scale)`` and ``qt = q.t()`` (contiguous), a (BR, BC) tile a program,
    read ONCE and held in registers (its loaded bits) from its amax to both stores (a grid-stride
    loop around it doubled the registers). ``DELAYED``: the state's scale at ``scale_ptr``, and the
    tile's finite amax into slot ``amax[program]``. Otherwise (current scaling) ``scale =
    amax_to_scale(max of the n_amax values at amax_ptr)``, written by program 0.

    A tile takes ``_codes_finite`` when every |x| is finite and its largest quotient stays below
    ``_div_rn``'s overflow guard: ``RN(RN(amax_t 2^k) RN(1/s')) < 2^99`` bounds every element's
    ``|q0|`` (RN is monotonic), so the guard never fires and the clamp ``min(|q|, fmax)`` is the
    reference's saturation; other tiles take the plain encode (NaN, inf, and quotients past 2^99)."""
    pid = tl.program_id(0)
    p2k, sp, ys = _div_parts(_tensor_scale(scale_ptr, amax_ptr, n_amax, DELAYED, AMAX_BLOCK, FMAX), True)
    n_bc = tl.cdiv(C, BC)
    rows = (pid // n_bc) * BR + tl.arange(0, BR)
    cols = (pid % n_bc) * BC + tl.arange(0, BC)
    x, key = _load_tile(x_ptr, rows, cols, R, C, sxr, sxc, IN_BF16)
    INF: tl.constexpr = 0x7F80 if IN_BF16 else 0x7F800000
    top = tl.max(tl.max(key, axis=1), axis=0)
    amax = _key_bits(top, IN_BF16).to(tl.float32, bitcast=True)
    finite = top < INF
    if DELAYED:
        if not finite:  # rare: NaN or inf in the tile; the amax of the finite |x|
            amax = tl.max(tl.max(_finite_abs(x), axis=1), axis=0)
        tl.store(amax_ptr + pid, amax)
    if finite & (amax * p2k * ys < 6.338253001141147e29):
        q = _codes_finite(x, _sign(x), p2k, -sp, ys, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
    else:
        q = _codes_plain(x, p2k, sp, ys, FMAX, EMIN, MBITS, IS_E4M3, HW_CVT)
    _store_both(q, tl.trans(q), rows, cols, R, C, q_ptr, sqr, sqc, qt_ptr)


# ---- representative sm_90 compile configurations (the GPU launches; scanned by lowbit.fma_guard) --------

_E4M3 = dict(FMAX=448.0, EMIN=-6, MBITS=3, IS_E4M3=True, HW_CVT=1, FAST_DIV=True)

SCAN_SPECS = (
    scan_spec(_amax_kernel,
              {"x_ptr": "*i16", "amax_ptr": "*fp32", **_I32, "n_tiles_c": "i32", "n_tiles": "i32"},
              dict(IN_BF16=True, FLAT=True, BLOCK_R=8, BLOCK_C=512, AMAX_SLOTS=False, AMAX_VEC=1, PREFETCH=False,
                   REVERSE=True)),
    scan_spec(_cast_tensor_kernel,
              {"x_ptr": "*i16", "q_ptr": "*u8", "scale_ptr": "*fp32", "amax_ptr": "*fp32", **_I32,
               "sqr": "i32", "sqc": "i32", "n_tiles_c": "i32", "n_tiles": "i32", "n_amax": "i32"},
              dict(IN_BF16=True, DELAYED=True, FLAT=False, BLOCK_R=64, BLOCK_C=64, LEAN=False,
                   AMAX_SLOTS=True, AMAX_BLOCK=1, AMAX_VEC=1, PREFETCH=False, **_E4M3)),
    scan_spec(_delayed_update_kernel,
              {"amax_ptr": "*fp32", "hist_ptr": "*fp32", "scale_ptr": "*fp32", "out_scale_ptr": "*fp32", "L": "i32",
               "n_amax": "i32"},
              dict(FMAX=448.0, MARGIN_MUL=1.0, MOST_RECENT=False, BLOCK=16, AMAX_BLOCK=4096), num_warps=4),
    scan_spec(_cast_tensor_t_reg_kernel,
              {"x_ptr": "*i16", "q_ptr": "*u8", "qt_ptr": "*u8", "scale_ptr": "*fp32", "amax_ptr": "*fp32", **_I32,
               "sqr": "i32", "sqc": "i32", "n_amax": "i32"},
              dict(IN_BF16=True, BR=128, BC=128, DELAYED=True, AMAX_BLOCK=1, **_E4M3_T), num_warps=8),
)
