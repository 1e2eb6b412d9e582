"""Jit helpers shared by the attention kernels: sequence geometry, visible ranges, masks, the
per-block scales and the in-kernel FP8 casts of P and dS.

Visibility: key j is visible from query i when ``-left <= j - i <= right`` (``right`` already
clipped to 0 when causal; unbounded sides are ``+-BIG``) and both lie inside their sequences.
``tile_range`` turns that into block ranges along the other axis, so the kernels loop over the
blocks with a visible pair only, and mask only the blocks that also hold invisible pairs.

In-kernel casts (``fp8_codes``): on the GPU ``x.to(float8)`` (``cvt.rn.satfinite``: RNE); under
``TRITON_INTERPRET=1``, whose own fp8 cast rounds half up and flushes subnormals, the exact
arithmetic of ``_grid_round`` gives the fp32 value on the E4M3 grid and the product runs in fp32
(exact products of E4M3 values, fp32 sums: what the tensor cores compute, up to their order).
"""
from __future__ import annotations

import triton
import triton.language as tl

# The shared quantize jit helpers: this is the one import of them in the attention package.
from ..jit_common import FP32_MIN_NORMAL, _amax_to_scale, _encode_fp8, _grid_round
from ..jit_common import _finite_abs as finite_abs
from ..jit_common import scan_spec as _scan_spec

BIG = 1 << 30


@triton.jit
def seq_bounds(b, CU, CU_PAD, S, VARLEN: tl.constexpr):
    """(first token in the caller's tensors, first row in the padded layouts, length, Z index)."""
    if VARLEN:
        start = tl.load(CU + b)
        return start, tl.load(CU_PAD + b), tl.load(CU + b + 1) - start, 0
    else:
        zero = b * 0
        return zero, zero, S + zero, b


@triton.jit
def program_coords(CU, CU_PAD, S_Q, S_K, VARLEN: tl.constexpr, REVERSE: tl.constexpr):
    """(tile index on grid axis 0, head (axis 1), sequence b (axis 2), b's first token, first padded
    row, query length, key length, Z index). ``REVERSE``: the last tile first (causal: the longest
    rows start first)."""
    pid = tl.program_id(0)
    if REVERSE:
        pid = tl.num_programs(0) - 1 - pid
    b = tl.program_id(2)
    start, start_pad, n_q, z = seq_bounds(b, CU, CU_PAD, S_Q, VARLEN)
    n_k = n_q if VARLEN else S_K
    return pid, tl.program_id(1), b, start, start_pad, n_q, n_k, z


@triton.jit
def tile_range(a0, A: tl.constexpr, n_other, lo_off, hi_off, B: tl.constexpr):
    """Rows ``a0 .. a0 + A - 1`` of one axis see ``o`` on the other (length ``n_other``) when
    ``lo_off <= o - a <= hi_off``: ``(lo, lo_full, hi_full, hi)``, multiples of B, such that the
    blocks in ``[lo, hi)`` hold every visible pair and those in ``[lo_full, hi_full)`` only
    visible ones (no mask needed)."""
    lo = tl.maximum(a0 + lo_off, 0) // B * B
    hi = tl.maximum(tl.cdiv(tl.maximum(tl.minimum(n_other, a0 + A + hi_off), 0), B) * B, lo)
    lo_full = tl.minimum(tl.maximum(tl.cdiv(tl.maximum(a0 + A - 1 + lo_off, 0), B) * B, lo), hi)
    hi_full = tl.maximum(tl.minimum(tl.maximum(tl.minimum(n_other, a0 + hi_off + 1), 0) // B * B, hi), lo_full)
    return lo, lo_full, hi_full, hi


@triton.jit
def visible(rows, n_rows, cols, n_cols, lo_off, hi_off):
    """(len(rows), len(cols)) mask: ``lo_off <= col - row <= hi_off``, ``row < n_rows``, ``col < n_cols``."""
    d = cols[None, :] - rows[:, None]
    return (d >= lo_off) & (d <= hi_off) & (cols[None, :] < n_cols) & (rows[:, None] < n_rows)


@triton.jit
def block_scale(SC, base, row0, SB: tl.constexpr):
    """The scale of the block holding row ``row0`` (SB rows a scale; 0: one for the sequence)."""
    if SB == 0:
        return tl.load(SC + base)
    else:
        return tl.load(SC + base + row0 // SB)


@triton.jit
def fp8_codes(x, FMAX: tl.constexpr, INTERPRET: tl.constexpr):
    """E4M3 (RNE) of ``x`` (|x| <= FMAX): float8 on the GPU, exact fp32 grid values when interpreted."""
    if INTERPRET:
        a = tl.minimum(tl.abs(x), FMAX)
        _, v = _grid_round(a, a, -6, 3, False)
        return tl.where(x == x, tl.where(x < 0, -v, v), x)
    else:
        return x.to(tl.float8e4nv)


@triton.jit
def fp8_dot(a, b, INTERPRET: tl.constexpr):
    """``a @ b`` of E4M3 operands (codes, or ``fp8_codes``' fp32 values when interpreted), fp32 result."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def rotation_block(R, c0, DC: tl.constexpr, DP: tl.constexpr, ROTATE: tl.constexpr):
    """R's (DC, DC) diagonal block at ``c0`` (R is padded to (DP, DP) with zeros); 0 unless ROTATE."""
    if ROTATE:
        rr = c0 + tl.arange(0, DC)
        return tl.load(R + rr[:, None] * DP + rr[None, :])
    else:
        return 0.0


@triton.jit
def rotate(x, r, R_IEEE: tl.constexpr):
    """``x @ r`` with fp32 sums: an fp32 ``input_precision="ieee"`` dot (``R_IEEE``), else a
    tensor-core dot in x's dtype (r's entries are +-1 or 0: exact in every float dtype)."""
    if R_IEEE:
        return tl.dot(x.to(tl.float32), r.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(x, r.to(x.dtype))


@triton.jit
def load_rows(X, x_base, stride_xs, stride_xd, r, rows, c0, n_rows, D,
              DC: tl.constexpr, ROTATE: tl.constexpr, R_IEEE: tl.constexpr):
    """fp32 (CHUNK, DC) tile of rows ``rows`` (masked past ``n_rows``) and columns ``c0 ..`` (masked
    past D), times the rotation block ``r`` when ROTATE."""
    cols = c0 + tl.arange(0, DC)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < D)
    x = tl.load(X + x_base + rows[:, None].to(tl.int64) * stride_xs + cols[None, :] * stride_xd, mask=mask, other=0.0)
    if ROTATE:
        x = rotate(x, r, R_IEEE)
    return x.to(tl.float32)


@triton.jit
def encode_e4m3(y, HW_CVT: tl.constexpr):
    """E4M3 bits (int32) of the saturating RNE cast of fp32 ``y`` (``HW_CVT``: the hardware cast)."""
    return _encode_fp8(y, 448.0, -6, 3, True, HW_CVT)


@triton.jit
def e4m3_scale(amax):
    """The recipe's scale of a finite amax: ``max(amax / 448, 2^-126)``, 1 for 0 (the floor keeps
    the reciprocal the codes are made with finite)."""
    return tl.maximum(_amax_to_scale(amax, 448.0), FP32_MIN_NORMAL)


@triton.jit
def tile_amax(x):
    """(max |x| over the finite entries, 1 if x holds inf/NaN else 0) of a 2-D tile."""
    amax = tl.max(tl.max(finite_abs(x), 1), 0)
    return amax, tl.max(tl.max(tl.where(tl.abs(x) < float("inf"), 0, 1), 1), 0)


@triton.jit
def quantize_tile(x, amax, bad, INTERPRET: tl.constexpr):
    """(E4M3 codes of ``x * RN(1 / s)``, s) with the scale ``s = e4m3_scale(amax)`` of a block whose
    ``tile_amax`` is (amax, bad) (NaN if it holds inf/NaN): the numbers of the quantize pass."""
    s = tl.where(bad > 0, float("nan"), e4m3_scale(amax))
    return fp8_codes(x * tl.div_rn(1.0, s), 448.0, INTERPRET), s


@triton.jit
def quantize_rows(x, INTERPRET: tl.constexpr):
    """(E4M3 codes of ``x * RN(1 / s_r)``, s_r) for an fp32 tile with one scale per row,
    ``s_r = e4m3_scale(amax_r)``. A row holding inf gets a NaN scale and a NaN gets a NaN code, so
    every product such a row enters is NaN, never a clip. The row's amax is a reduction inside one
    warp when a warp holds the row (the attention kernels' MMA layouts)."""
    amax = tl.max(tl.abs(x), 1)
    s = tl.where(amax < float("inf"), e4m3_scale(amax), float("nan"))
    return fp8_codes(x * tl.div_rn(1.0, s)[:, None], 448.0, INTERPRET), s


def scan_spec(kernel, signature: dict, constexprs: dict, num_warps: int, num_stages: int) -> dict:
    """A ``SCAN_SPECS`` entry (``lowbit.fma_guard.shipped``) with the parameters in the kernel's order."""
    spec = _scan_spec(kernel, signature, constexprs, num_warps)
    spec["num_stages"] = num_stages
    return spec
