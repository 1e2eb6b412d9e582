"""Fused FP4 (E2M1) quantize kernels (Triton): MX-32 (E8M0 scales) and NV-16 (UE4M3 x FP32).

Bit-exact with ``FP4Tensor.from_float`` (and ``lowbit.kernels.api.quantize_fp4`` with a Hadamard
transform); the math is the reference's:

* optional 16x16 random Hadamard transform along the last dim, in ``hadamard16``'s order (signs,
  butterflies ``(a, b) -> (a + b, a - b)`` at strides 1, 2, 4, 8, ``* 0.25``), all in fp32, then
  rounded to the input dtype (RNE, as ``.to(x.dtype)``); launched without FP contraction, so it
  matches bit for bit;
* block amax over the finite ``|x|``; a block holding NaN gets a NaN scale (E8M0 0xFF, UE4M3 0x7F)
  and codes 0;
* MX: ``scale = 2^k`` (``_mx_exponent``), ``y = x * 2^-k`` (equal to ``x / 2^k``);
  NV: ``s_global = amax / 2688`` (1 if that is 0 / amax not finite), ``s_block =
  max(RNE_e4m3(min(amax_b / 6 / s_global, 448)), 2^-9)``, ``y = x / fp32(s_block * s_global)``
  (IEEE divisions; the per-element one by jit_common's ``_div_rn``);
* E2M1 code of ``min(|y|, 6)``: RNE, or stochastic ``floor(k) + [u < frac]`` with ``u`` the
  reference's own draw ``torch.rand(x.shape, generator=g)`` passed in as a tensor (so the kernel
  consumes the generator exactly as the reference does), or, for a ``lowbit.dtypes.Philox``
  generator, the counter-based draw computed in the kernel; sign bit 8; packed two per byte,
  element 2i in the low nibble.

Two passes for NV (the tensor amax: ``cast_fp8.tensorwise``' flat ``_amax_kernel``, or
``_nv_amax_kernel`` with the Hadamard transform; then the cast); one for MX. Without the Hadamard
transform (and for NV without stochastic rounding) the cast of 1xBC blocks is a row-local walk
(``cast_fp8.rowlocal``'s tiles): ``_mx_fp4_rowblock_kernel``, ``_nv_fp4_rowblock_kernel``; for a
contiguous bf16 x, the pair kernels of ``pairs``; else ``_fp4_cast_kernel``'s 2-D tiles.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..cast_fp8.rowlocal import _walk_first, _walk_tile
from ..jit_common import _block_expand, _block_max, _div_parts, _div_rn, _finite_abs, _grid_round, _load_f32, \
    _mx_exponent, _philox_uniform, _pow2, scan_spec
from .e2m1 import _e2m1_rne, _e2m1_signed

__all__ = ["SCAN_SPECS"]


@triton.jit
def _hadamard16(x, signs, TILE_R: tl.constexpr, TILE_C: tl.constexpr):
    """``hadamard16`` on each 16 consecutive elements of a row, same operations in the same order.

    The 16 elements are viewed as a 2x2x2x2 cube (index bits b3 b2 b1 b0); each stage splits the
    last axis (the butterfly's partner bit), joins ``(a + b, a - b)`` and rotates the axes so the
    next stride's bit comes last; after four stages the order is the original one."""
    y = tl.reshape(x, (TILE_R, TILE_C // 16, 16)) * signs[None, None, :]
    t = tl.reshape(y, (TILE_R * TILE_C // 16, 2, 2, 2, 2))
    for _ in tl.static_range(4):
        a, b = tl.split(t)
        t = tl.permute(tl.join(a + b, a - b), (0, 4, 1, 2, 3))
    return tl.reshape(t, (TILE_R, TILE_C)) * 0.25


@triton.jit
def _round_to_input(h, IN_KIND: tl.constexpr):
    """fp32 -> input dtype -> fp32 (RNE). bf16 on the bits (torch's rule), as the interpreter's
    own bf16 cast truncates; 0: fp32, 1: bf16, 2: fp16."""
    if IN_KIND == 1:
        b = h.to(tl.int32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & -65536
        h = tl.where(h == h, b.to(tl.float32, bitcast=True), h)
    elif IN_KIND == 2:
        h = h.to(tl.float16).to(tl.float32)
    return h


@triton.jit
def _load_input(x_ptr, signs_ptr, rows, cols, R, C, sxr, sxc, IN_KIND: tl.constexpr,
                HADAMARD: tl.constexpr, TILE_R: tl.constexpr, TILE_C: tl.constexpr):
    """(fp32 tile of x, optionally Hadamard-transformed and re-rounded, mask)."""
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    ptrs = x_ptr + rows[:, None].to(tl.int64) * sxr + cols[None, :].to(tl.int64) * sxc
    x = _load_f32(ptrs, mask, IN_KIND == 1)
    if HADAMARD:
        signs = tl.load(signs_ptr + tl.arange(0, 16))
        x = _round_to_input(_hadamard16(x, signs, TILE_R, TILE_C), IN_KIND)
    return x, mask


@triton.jit
def _nv_amax_kernel(x_ptr, signs_ptr, amax_ptr, R, C, sxr, sxc, n_tiles_c, n_tiles,
                    IN_KIND: tl.constexpr, HADAMARD: tl.constexpr, TILE_R: tl.constexpr, TILE_C: tl.constexpr):
    """Finite amax of x (of its Hadamard transform with ``HADAMARD``) into ``amax_ptr`` (atomic max;
    kept elementwise across the program's tiles, reduced once: one atomic per program)."""
    acc = tl.zeros([TILE_R, TILE_C], tl.float32)
    for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        rows = (t // n_tiles_c) * TILE_R + tl.arange(0, TILE_R)
        cols = (t % n_tiles_c) * TILE_C + tl.arange(0, TILE_C)
        x, mask = _load_input(x_ptr, signs_ptr, rows, cols, R, C, sxr, sxc, IN_KIND, HADAMARD, TILE_R, TILE_C)
        acc = tl.maximum(acc, _finite_abs(x))
    tl.atomic_max(amax_ptr, tl.max(tl.max(acc, axis=1), axis=0))


@triton.jit
def _fp4_cast_kernel(x_ptr, signs_ptr, u_ptr, amax_ptr, q_ptr, s_ptr, g_ptr, R, C, sxr, sxc, n_sc,
                     IN_KIND: tl.constexpr, HADAMARD: tl.constexpr, NV: tl.constexpr,
                     STOCHASTIC: tl.constexpr, RCEIL: tl.constexpr, FAST_DIV: tl.constexpr,
                     BR: tl.constexpr, BC: tl.constexpr,
                     TILE_R: tl.constexpr, TILE_C: tl.constexpr, PHILOX: tl.constexpr = False,
                     STREAM: tl.constexpr = 0):
    """E2M1 codes packed two per byte into ``q`` (R, C/2), block scale codes into ``s`` (``n_sc``
    columns), NV global scale into ``g`` (from the tensor amax at ``amax_ptr``). Stochastic
    rounding reads its uniforms at ``u_ptr`` (R, C), or with ``PHILOX`` draws them from the
    (seed, step) key at ``u_ptr`` (``_philox_uniform``, stream ``STREAM``)."""
    pid_r = tl.program_id(0) // tl.cdiv(C, TILE_C)  # consecutive programs walk along a row of tiles
    pid_c = tl.program_id(0) % tl.cdiv(C, TILE_C)
    rows = pid_r * TILE_R + tl.arange(0, TILE_R)
    cols = pid_c * TILE_C + tl.arange(0, TILE_C)
    x, mask = _load_input(x_ptr, signs_ptr, rows, cols, R, C, sxr, sxc, IN_KIND, HADAMARD, TILE_R, TILE_C)

    # block scales
    amax = _block_max(tl.where(x == x, _finite_abs(x), float("inf")), TILE_R, TILE_C, BR, BC)  # NaN: +inf
    has_nan = amax == float("inf")
    brow = pid_r * (TILE_R // BR) + tl.arange(0, TILE_R // BR)
    bcol = pid_c * (TILE_C // BC) + tl.arange(0, TILE_C // BC)
    s_mask = (brow[:, None] < tl.cdiv(R, BR)) & (bcol[None, :] < tl.cdiv(C, BC))
    s_ptrs = s_ptr + brow[:, None].to(tl.int64) * n_sc + bcol[None, :]
    if NV:
        t_amax = tl.load(amax_ptr)
        g = tl.div_rn(t_amax, 2688.0)
        t = tl.div_rn(amax, 6.0)
        g = tl.where((t_amax < float("inf")) & (g > 0), g, 1.0)
        if (pid_r == 0) & (pid_c == 0):
            tl.store(g_ptr, g)
        code, s_block = _grid_round(tl.minimum(tl.div_rn(t, g), 448.0), t, -6, 3, False)  # UE4M3, RNE
        s_block = tl.maximum(s_block, 0.001953125)  # >= 2^-9, the smallest E4M3 subnormal
        tl.store(s_ptrs, tl.where(has_nan, 0x7F, tl.maximum(code, 1)).to(tl.uint8), mask=s_mask)
        eff = tl.where(has_nan, float("nan"), s_block * g)
        p2k, sp, ys = _div_parts(eff, FAST_DIV)
        y = _div_rn(x, _block_expand(p2k, TILE_R, TILE_C, BR, BC), _block_expand(sp, TILE_R, TILE_C, BR, BC),
                    _block_expand(ys, TILE_R, TILE_C, BR, BC), FAST_DIV)
    else:
        k = _mx_exponent(amax, RCEIL, 2, 6.0, 2)
        tl.store(s_ptrs, tl.where(has_nan, 255, k + 127).to(tl.uint8), mask=s_mask)
        inv = tl.where(has_nan, float("nan"), _pow2(-k))
        y = x * _block_expand(inv, TILE_R, TILE_C, BR, BC)

    # E2M1 elements
    if STOCHASTIC:
        if PHILOX:
            u = _philox_uniform(u_ptr, rows[:, None].to(tl.int64) * C + cols[None, :], STREAM)
        else:
            u = tl.load(u_ptr + rows[:, None].to(tl.int64) * C + cols[None, :], mask=mask, other=0.0)
    else:
        u = y
    a = tl.where(y == y, tl.minimum(tl.abs(y), 6.0), 0.0)
    if STOCHASTIC:
        code, _ = _grid_round(a, u, 0, 1, True)
    else:
        code = _e2m1_rne(a)
    sign = (y.to(tl.int32, bitcast=True) >> 31) & 1
    code = tl.where(y == y, code | (sign << 3), 0)
    lo, hi = tl.split(tl.reshape(code, (TILE_R, TILE_C // 2, 2)))
    hcols = pid_c * (TILE_C // 2) + tl.arange(0, TILE_C // 2)
    q_mask = (rows[:, None] < R) & (hcols[None, :] < C // 2)
    tl.store(q_ptr + rows[:, None].to(tl.int64) * (C // 2) + hcols[None, :], (lo | (hi << 4)).to(tl.uint8),
             mask=q_mask)


@triton.jit
def _e2m1_packed(y, TR: tl.constexpr, BC: tl.constexpr):
    """uint8 (TR, BC // 2): E2M1 codes of y (RNE of ``min(|y|, 6)``, sign bit 8; NaN -> 0), two a
    byte, element 2i in the low nibble."""
    code = tl.where(y == y, _e2m1_signed(y), 0)
    lo, hi = tl.split(tl.reshape(code, (TR, BC // 2, 2)))
    return (lo | (hi << 4)).to(tl.uint8)


@triton.jit
def _store_packed(q_ptr, q, g, R, C, n_sc, n_groups, FLAT: tl.constexpr, BC: tl.constexpr):
    """The packed codes (TR, BC // 2) of groups g into q (R, C / 2), contiguous."""
    c2 = tl.arange(0, BC // 2)[None, :]
    if FLAT:  # group g's bytes: [g BC / 2, (g + 1) BC / 2)
        tl.store(q_ptr + g[:, None].to(tl.int64) * (BC // 2) + c2, q, mask=(g < n_groups)[:, None] & (c2 >= 0))
    else:  # row g // n_sc, bytes (g % n_sc) BC / 2 + c of that row
        r = g // n_sc
        c2 = (g - r * n_sc)[:, None] * (BC // 2) + c2
        tl.store(q_ptr + r[:, None].to(tl.int64) * (C // 2) + c2, q, mask=(r < R)[:, None] & (c2 < C // 2))


@triton.jit
def _mx_fp4_rowblock_kernel(x_ptr, q_ptr, s_ptr, R, C, sxr, sxc, n_sc, n_groups, n_tiles,
                            IN_BF16: tl.constexpr, FLAT: tl.constexpr, TR: tl.constexpr, BC: tl.constexpr,
                            RCEIL: tl.constexpr):
    """MX E2M1 with 1xBC blocks (no Hadamard transform) by the row-local walk: tiles of TR blocks
    (``cast_fp8.rowlocal._group_offsets``; q is (R, C / 2), contiguous), per block the
    finite amax ``max |fma(x, 0, x)|`` (inf and NaN -> NaN, ignored by the hardware max; a block
    with no finite element reduces to NaN: k = 0, as for amax 0), the NaN flag from the integer
    max of the sign-cleared bits, ``k = _mx_exponent(amax)``, scale code ``k + 127`` (0xFF and
    codes 0 for a block holding NaN), the codes of ``x * 2^-k``."""
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    x_next = _walk_first(x_ptr, pid, R, C, sxr, sxc, n_sc, n_groups, FLAT, TR, BC, IN_BF16, False)
    for t in range(pid, n_tiles, step):
        g, _, mask, x, x_next = _walk_tile(x_ptr, t, step, x_next, R, C, sxr, sxc, 0, 0, n_sc, n_groups, FLAT, TR, BC,
                                           IN_BF16, False)
        key = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)  # integer order: NaN > inf > finite
        s_mask = (g < n_groups)[:, None]
        has_nan = key > 0x7F800000
        k = _mx_exponent(tl.max(tl.abs(tl.fma(x, 0.0, x)), axis=1), RCEIL, 2, 6.0, 2)
        tl.store(s_ptr + g[:, None], tl.where(has_nan, 255, k + 127).to(tl.uint8)[:, None], mask=s_mask)
        code = tl.where(has_nan[:, None], 0, _e2m1_signed(x * _pow2(-k)[:, None]))
        lo, hi = tl.split(tl.reshape(code, (TR, BC // 2, 2)))
        _store_packed(q_ptr, (lo | (hi << 4)).to(tl.uint8), g, R, C, n_sc, n_groups, FLAT, BC)


@triton.jit
def _nv_global_scale(amax_ptr, g_ptr, pid):
    """NV ``s_global = amax / 2688`` of the tensor amax at ``amax_ptr`` (1 if that is 0 or amax is
    not finite), stored to ``g_ptr`` by program 0."""
    t_amax = tl.load(amax_ptr)
    gs = tl.div_rn(t_amax, 2688.0)
    gs = tl.where((t_amax < float("inf")) & (gs > 0), gs, 1.0)
    if pid == 0:
        tl.store(g_ptr, gs)
    return gs


@triton.jit
def _nv_fp4_rowblock_kernel(x_ptr, amax_ptr, q_ptr, s_ptr, g_ptr, R, C, sxr, sxc, n_sc, n_groups, n_tiles,
                            IN_BF16: tl.constexpr, FLAT: tl.constexpr, TR: tl.constexpr, BC: tl.constexpr,
                            FAST_DIV: tl.constexpr):
    """NV E2M1 with 1xBC blocks (no Hadamard transform, round to nearest) by the row-local walk
    of ``_mx_fp4_rowblock_kernel``, from the tensor amax at ``amax_ptr``: ``_fp4_cast_kernel``'s NV
    math per block (``s_global``, the UE4M3 block scale, ``y = x / fp32(s_block * s_global)`` by
    ``_div_rn``); ``s_global`` stored by program 0."""
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    gs = _nv_global_scale(amax_ptr, g_ptr, pid)
    x_next = _walk_first(x_ptr, pid, R, C, sxr, sxc, n_sc, n_groups, FLAT, TR, BC, IN_BF16, False)
    for t in range(pid, n_tiles, step):
        g, _, mask, x, x_next = _walk_tile(x_ptr, t, step, x_next, R, C, sxr, sxc, 0, 0, n_sc, n_groups, FLAT, TR, BC,
                                           IN_BF16, False)
        amax = tl.max(tl.where(x == x, _finite_abs(x), float("inf")), axis=1)  # NaN: +inf
        has_nan = amax == float("inf")
        tb = tl.div_rn(amax, 6.0)
        code, s_block = _grid_round(tl.minimum(tl.div_rn(tb, gs), 448.0), tb, -6, 3, False)  # UE4M3, RNE
        s_block = tl.maximum(s_block, 0.001953125)  # >= 2^-9, the smallest E4M3 subnormal
        tl.store(s_ptr + g[:, None], tl.where(has_nan, 0x7F, tl.maximum(code, 1)).to(tl.uint8)[:, None],
                 mask=(g < n_groups)[:, None])
        p2k, sp, ys = _div_parts(tl.where(has_nan, float("nan"), s_block * gs), FAST_DIV)
        y = _div_rn(x, p2k[:, None], sp[:, None], ys[:, None], FAST_DIV)
        _store_packed(q_ptr, _e2m1_packed(y, TR, BC), g, R, C, n_sc, n_groups, FLAT, BC)


# ---- representative sm_90 compile configurations (the GPU launches; scanned by lowbit.fma_guard) --------

_XS = {"x_ptr": "*i16", "signs_ptr": "*fp32"}
_I32 = dict.fromkeys(("R", "C", "sxr", "sxc"), "i32")

SCAN_SPECS = (
    scan_spec(_nv_amax_kernel, {**_XS, "amax_ptr": "*fp32", **_I32, "n_tiles_c": "i32", "n_tiles": "i32"},
              dict(IN_KIND=1, HADAMARD=True, TILE_R=32, TILE_C=128)),
    scan_spec(_fp4_cast_kernel,  # (the Linear layers' stochastic rounding: Philox draws in the kernel)
              {**_XS, "u_ptr": "*i64", "amax_ptr": "*fp32", "q_ptr": "*u8", "s_ptr": "*u8", "g_ptr": "*fp32", **_I32,
               "n_sc": "i32"},
              dict(IN_KIND=1, HADAMARD=True, NV=True, STOCHASTIC=True, RCEIL=False, FAST_DIV=True, BR=1, BC=16,
                   TILE_R=32, TILE_C=128, PHILOX=True, STREAM=1)),
    scan_spec(_mx_fp4_rowblock_kernel,
              {"x_ptr": "*i16", "q_ptr": "*u8", "s_ptr": "*u8",
               **dict.fromkeys(("R", "C", "sxr", "sxc", "n_sc", "n_groups", "n_tiles"), "i32")},
              dict(IN_BF16=True, FLAT=True, TR=128, BC=32, RCEIL=False), num_warps=8),
    scan_spec(_nv_fp4_rowblock_kernel,
              {"x_ptr": "*i16", "amax_ptr": "*fp32", "q_ptr": "*u8", "s_ptr": "*u8", "g_ptr": "*fp32",
               **dict.fromkeys(("R", "C", "sxr", "sxc", "n_sc", "n_groups", "n_tiles"), "i32")},
              dict(IN_BF16=True, FLAT=True, TR=256, BC=16, FAST_DIV=True), num_warps=8),
)
