"""One pass over a tensor for every statistic of a record (``stats`` columns), in Triton.

Each program walks the flat tensor in ``BLOCK``-element tiles, grid-strided, and keeps per-lane
counters (int32) and the per-lane finite max in fp32; then it adds its totals to the row with
float64 atomics (counts are integers: the sum is exact in any order) and takes the max with an
atomic max. With a tensorwise ``scale`` it also counts ``|x / scale| > limit`` (saturated:
``stats.saturation_limit``; the quotient rounded as IEEE fp32 division, ``div_rn``) and ``x != 0
and |x / scale| <= tiny`` (flushed to zero; ``tiny = min_subnormal / 2``), without dividing an
element: ``q(a) = fl(a / |s|)`` is non-decreasing in ``a = |x|`` (round-to-nearest is monotone,
and a NaN quotient comes only at ``a`` = 0 or +inf, or from a NaN scale), so the saturated
elements are those with ``a >= a_sat``, the smallest fp32 ``a`` with ``q(a) > limit`` (NaN if
none), and the flushed ones the non-zero ``a < a_big``, the smallest with ``q(a) > tiny`` or NaN
(always exists: ``q(+inf)`` is +inf or NaN). Each program finds both by bisection over the bit
patterns of [0, +inf] (31 scalar ``div_rn`` steps each); a NaN element fails both comparisons, as
it fails ``> limit`` and ``<= tiny``. The counts are those of the division, exactly.

A program that saw a non-finite element takes a clock ticket (``atomic_add(clock, 1)``) and
keeps the smallest in ``seq``: the kernels of one stream run one after the other, so every ticket
of an earlier record is smaller. Program 0 adds the element count and the call, and writes the
scale.

The tensor is read once, in its own dtype (fp16, bf16, fp32), from any dense layout (the
statistics do not depend on the order of the elements); anything else goes back to torch ops.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..kernels.triton.runtime import cdiv, interpreting, runnable, sm_count
from .columns import COL, saturation_limit

__all__ = ["launch", "launch_blocks", "BLOCK"]

BLOCK = 4096
PROGRAMS_PER_SM = 4


@triton.jit
def _first_above(s, bound, NAN_ABOVE: tl.constexpr):
    """The smallest fp32 ``a`` in [0, +inf] with ``div_rn(a, s) > bound`` (with ``NAN_ABOVE``, or
    a NaN quotient), NaN if there is none: a bisection over the bit patterns, for a quotient that
    is non-decreasing in ``a`` (module docstring)."""
    lo = tl.full((), -1, tl.int64)  # below every pattern: taken as not above
    hi = tl.full((), 0x7F800000, tl.int64)  # +inf, checked after the loop
    for _ in range(31):  # 0x7F800001 patterns: 31 halvings leave hi = lo + 1
        mid = lo + (hi - lo) // 2
        q = tl.math.div_rn(mid.to(tl.int32).to(tl.float32, bitcast=True), s)
        above = q > bound
        if NAN_ABOVE:
            above = above | (q != q)
        hi = tl.where(above, mid, hi)
        lo = tl.where(above, lo, mid)
    a = hi.to(tl.int32).to(tl.float32, bitcast=True)
    q = tl.math.div_rn(a, s)
    above = q > bound
    if NAN_ABOVE:
        above = above | (q != q)
    return tl.where(above, a, float("nan"))


@triton.jit
def _commit(row_ptr, clock_ptr, n_nf, amax, n_sat, n_uf, n_nz, numel, go, first,
            C_NF: tl.constexpr, C_AMAX: tl.constexpr, C_SAT: tl.constexpr, C_UF: tl.constexpr, C_NZ: tl.constexpr,
            C_NUMEL: tl.constexpr, C_SEQ: tl.constexpr, C_CALLS: tl.constexpr, HAS_CAST: tl.constexpr):
    """One program's totals into the row (float64 atomics: integer counts, exact in any order; the
    max), a clock ticket if it saw a non-finite element; ``first`` adds the element count
    (``numel``, an int64 tensor even where a launch made the size a constexpr 1) and the call."""
    tl.atomic_add(row_ptr + C_NF, n_nf.to(tl.float64), mask=go)
    tl.atomic_max(row_ptr + C_AMAX, amax.to(tl.float64), mask=go)
    if HAS_CAST:
        tl.atomic_add(row_ptr + C_SAT, n_sat.to(tl.float64), mask=go)
        tl.atomic_add(row_ptr + C_UF, n_uf.to(tl.float64), mask=go)
        tl.atomic_add(row_ptr + C_NZ, n_nz.to(tl.float64), mask=go)
    bad = n_nf > 0
    ticket = tl.atomic_add(clock_ptr, 1.0, mask=bad)
    tl.atomic_min(row_ptr + C_SEQ, ticket, mask=bad)
    tl.atomic_add(row_ptr + C_NUMEL, numel.to(tl.float64), mask=first)
    tl.atomic_add(row_ptr + C_CALLS, 1.0, mask=first)


@triton.jit
def _stats_kernel(x_ptr, n, row_ptr, clock_ptr, scale_ptr, when_ptr, limit, tiny,
                  C_NF: tl.constexpr, C_AMAX: tl.constexpr, C_SAT: tl.constexpr, C_UF: tl.constexpr,
                  C_NZ: tl.constexpr, C_NUMEL: tl.constexpr, C_SEQ: tl.constexpr, C_SCALE: tl.constexpr,
                  C_CALLS: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WHEN: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    go = pid >= 0  # (a tensor: the masks below take it)
    if HAS_WHEN:  # record only if that row has seen a non-finite element: else no tile is read
        go = tl.load(when_ptr + C_NF) > 0.0
    n_go = tl.where(go, n, 0)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    lanes = tl.arange(0, BLOCK)
    nf = tl.zeros([BLOCK], dtype=tl.int32)
    sat = tl.zeros([BLOCK], dtype=tl.int32)
    uf = tl.zeros([BLOCK], dtype=tl.int32)
    nz = tl.zeros([BLOCK], dtype=tl.int32)
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    if HAS_SCALE:
        s = tl.load(scale_ptr)
        a_sat = _first_above(tl.abs(s), limit, False)
        a_big = _first_above(tl.abs(s), tiny, True)
    for start in range(pid.to(tl.int64) * BLOCK, n_go, step):
        offs = start + lanes
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
        a = tl.abs(x)
        fin = a < float("inf")  # False for NaN and +-inf
        nf += (~fin).to(tl.int32)
        amax = tl.maximum(amax, tl.where(fin, a, 0.0))
        if HAS_SCALE:
            nonzero = a != 0.0
            sat += (a >= a_sat).to(tl.int32)
            uf += (nonzero & (a < a_big)).to(tl.int32)
            nz += nonzero.to(tl.int32)
    first = go & (pid == 0)
    _commit(row_ptr, clock_ptr, tl.sum(nf, axis=0), tl.max(amax, axis=0), tl.sum(sat, axis=0), tl.sum(uf, axis=0),
            tl.sum(nz, axis=0), n + tl.zeros((), tl.int64), go, first,
            C_NF, C_AMAX, C_SAT, C_UF, C_NZ, C_NUMEL, C_SEQ, C_CALLS, HAS_SCALE)
    if HAS_SCALE:
        tl.store(row_ptr + C_SCALE, s.to(tl.float64), mask=first)


@triton.jit
def _block_stats_kernel(x_ptr, M, K, stride_m, s_ptr, stride_sm, row_ptr, clock_ptr, limit, tiny,
                        C_NF: tl.constexpr, C_AMAX: tl.constexpr, C_SAT: tl.constexpr, C_UF: tl.constexpr,
                        C_NZ: tl.constexpr, C_NUMEL: tl.constexpr, C_SEQ: tl.constexpr, C_CALLS: tl.constexpr,
                        BR: tl.constexpr, BC: tl.constexpr, TM: tl.constexpr, TK: tl.constexpr):
    """The figures of a cast with one scale per ``BR x BC`` block of the (M, K) matrix ``x``
    (rows ``stride_m`` apart, columns adjacent; scales (ceil(M / BR), ceil(K / BC)), rows
    ``stride_sm`` apart): ``TM x TK`` tiles, grid-strided, each element divided by its block's
    scale (``div_rn``, as the reference divides by the expanded scale)."""
    pid = tl.program_id(0)
    tiles_k = tl.cdiv(K, TK)
    n_tiles = tl.cdiv(M, TM) * tiles_k
    nf = tl.zeros([TM, TK], dtype=tl.int32)
    sat = tl.zeros([TM, TK], dtype=tl.int32)
    uf = tl.zeros([TM, TK], dtype=tl.int32)
    nz = tl.zeros([TM, TK], dtype=tl.int32)
    amax = tl.zeros([TM, TK], dtype=tl.float32)
    for t in range(pid, n_tiles, tl.num_programs(0)):
        rows = (t // tiles_k).to(tl.int64) * TM + tl.arange(0, TM)
        cols = (t % tiles_k) * TK + tl.arange(0, TK)
        m = (rows < M)[:, None] & (cols < K)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :], mask=m, other=0.0).to(tl.float32)
        sc = tl.load(s_ptr + (rows // BR)[:, None] * stride_sm + (cols // BC)[None, :], mask=m, other=1.0)
        a = tl.abs(x)
        fin = a < float("inf")
        nf += (~fin).to(tl.int32)
        amax = tl.maximum(amax, tl.where(fin, a, 0.0))
        y = tl.abs(tl.math.div_rn(x, sc))
        nonzero = a != 0.0
        sat += (y > limit).to(tl.int32)
        uf += (nonzero & (y <= tiny)).to(tl.int32)
        nz += nonzero.to(tl.int32)
    _commit(row_ptr, clock_ptr, tl.sum(tl.sum(nf, axis=1), axis=0), tl.max(tl.max(amax, axis=1), axis=0),
            tl.sum(tl.sum(sat, axis=1), axis=0), tl.sum(tl.sum(uf, axis=1), axis=0),
            tl.sum(tl.sum(nz, axis=1), axis=0), (M + tl.zeros((), tl.int64)) * K, pid >= 0, pid == 0,
            C_NF, C_AMAX, C_SAT, C_UF, C_NZ, C_NUMEL, C_SEQ, C_CALLS, True)


def _dense(x: torch.Tensor) -> bool:
    """Whether ``x``'s elements fill ``numel`` consecutive memory slots (some permutation of a
    contiguous tensor)."""
    expected = 1
    for size, stride in sorted((d for d in zip(x.shape, x.stride()) if d[0] != 1), key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _flat(x: torch.Tensor) -> Optional[torch.Tensor]:
    """``x``'s elements as a contiguous 1-D view of its memory (any dense layout), else None."""
    if x.is_contiguous():
        return x.reshape(-1)
    if _dense(x):
        return x.as_strided((x.numel(),), (1,), x.storage_offset())
    return None


def launch(stats: torch.Tensor, slot: int, x: torch.Tensor, scale: Optional[torch.Tensor], fmt, when: int = -1) -> bool:
    """Reduce ``x`` into ``stats[slot]`` (if ``when >= 0``: only when ``stats[when]`` counted a
    non-finite element); False (nothing launched) when the kernel can't take it."""
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or x.device != stats.device:
        return False
    flat = _flat(x)
    if flat is None:
        return False
    n = flat.numel()
    limit = 4 if interpreting() else PROGRAMS_PER_SM * sm_count(x.device)
    grid = (max(1, min(cdiv(n, BLOCK), limit)),)
    has_scale = scale is not None
    s = scale.reshape(()).to(torch.float32) if has_scale else stats  # any pointer when unused
    runnable(_stats_kernel)[grid](
        flat, n, stats[slot], stats[-1], s, stats[when] if when >= 0 else stats,
        saturation_limit(fmt) if has_scale else 0.0, float(fmt.min_subnormal) / 2 if has_scale else 0.0,
        COL["nonfinite"], COL["amax"], COL["saturated"], COL["underflow"], COL["nonzero"], COL["numel"],
        COL["seq"], COL["scale"], COL["calls"], HAS_SCALE=has_scale, HAS_WHEN=when >= 0, BLOCK=BLOCK, num_warps=8)
    return True


WHOLE = 1 << 30  # a block dim of -1 (the whole dim): every index // WHOLE is 0
TILE = (16, 256)


def launch_blocks(stats: torch.Tensor, slot: int, x: torch.Tensor, scales: torch.Tensor, block, fmt) -> bool:
    """Reduce the 2-D ``x`` and its cast with one scale per ``block`` (a ``lowbit.dtypes.Block``;
    ``scales`` of ``block.scale_shape(x.shape)``) into ``stats[slot]``, the row's ``scale`` being
    the largest block scale; False (nothing launched) when the kernel can't take it."""
    if (x.dim() != 2 or x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or x.device != stats.device
            or scales.device != x.device or x.stride(-1) != 1 or x.numel() == 0 or block.is_tensorwise
            or tuple(scales.shape) != tuple(block.scale_shape(x.shape))):
        return False
    M, K = x.shape
    s = scales.to(torch.float32).contiguous()
    br, bc = (WHOLE if b == -1 else b for b in (block.rows, block.cols))
    tiles = cdiv(M, TILE[0]) * cdiv(K, TILE[1])
    limit = 4 if interpreting() else PROGRAMS_PER_SM * sm_count(x.device)
    runnable(_block_stats_kernel)[(max(1, min(tiles, limit)),)](
        x, M, K, x.stride(0), s, s.stride(0), stats[slot], stats[-1], saturation_limit(fmt),
        float(fmt.min_subnormal) / 2, COL["nonfinite"], COL["amax"], COL["saturated"], COL["underflow"],
        COL["nonzero"], COL["numel"], COL["seq"], COL["calls"], BR=br, BC=bc, TM=TILE[0], TK=TILE[1], num_warps=8)
    stats[slot, COL["scale"]] = s.amax()
    return True

