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
it fails ``> limit`` and ``<= tiny``. The counts are those of the division, exactly. On SQNR
steps (``SQNR``) the same pass also casts each element as lowbit does (``_cast_error``) and sums
``x^2`` and the squared error in float64 (the order of the sums is not the torch reduction's).

A program that saw a non-finite element takes a clock ticket (``atomic_add(clock, 1)``) and
keeps the smallest in ``seq``: the kernels of one stream run one after the other, so every ticket
of an earlier record is smaller. Program 0 adds the element count and the call, and writes the
scale.

The tensor is read once, in its own dtype (fp16, bf16, fp32), from any dense layout (the
statistics do not depend on the order of the elements); anything else goes back to torch ops.
Rows are offsets into the one statistics buffer, the columns constants; a monitor's session keeps
each launch it makes (``plans``), so a record costs the launcher's call, not the JIT's binding.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..kernels.triton.jit_common import _grid_round
from ..kernels.triton.runtime import Launch, cdiv, interpreting, sm_count
from .columns import COL, WIDTH, saturation_limit

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


# the row's columns (``columns.COL``), fixed: constants of every kernel
C_NF = tl.constexpr(COL["nonfinite"])
C_AMAX = tl.constexpr(COL["amax"])
C_SAT = tl.constexpr(COL["saturated"])
C_UF = tl.constexpr(COL["underflow"])
C_NZ = tl.constexpr(COL["nonzero"])
C_NUMEL = tl.constexpr(COL["numel"])
C_SEQ = tl.constexpr(COL["seq"])
C_SCALE = tl.constexpr(COL["scale"])
C_SIGNAL = tl.constexpr(COL["signal"])
C_NOISE = tl.constexpr(COL["noise"])
C_CALLS = tl.constexpr(COL["calls"])
C_WIDTH = tl.constexpr(WIDTH)


@triton.jit
def _cast_error(x, y, s, fmax, MBITS: tl.constexpr, EMIN: tl.constexpr):
    """(x^2, (x - dequant(quant(x)))^2) in float64, 0 where either is non-finite, for the quotient
    ``y = div_rn(x, s)``: ``lowbit.dtypes.quantize``'s round-to-nearest-even cast, saturated (the
    grid rounding of the casts, ``jit_common._grid_round``), dequantized as ``v * s`` in fp32."""
    a = tl.abs(y)
    a = tl.where(a > fmax, fmax, a)  # saturate (NaN stays NaN)
    _, v = _grid_round(a, a, EMIN, MBITS, False)
    dq = tl.where(y < 0, -v, v) * s
    ok = (tl.abs(x) < float("inf")) & (tl.abs(dq) < float("inf"))
    x64 = x.to(tl.float64)
    d = x64 - dq.to(tl.float64)
    return tl.where(ok, x64 * x64, 0.0), tl.where(ok, d * d, 0.0)


@triton.jit
def _commit(stats_ptr, slot, clock, n_nf, amax, n_sat, n_uf, n_nz, signal, noise, numel, go, first,
            HAS_CAST: tl.constexpr, SQNR: tl.constexpr):
    """One program's totals into row ``slot`` of ``stats`` (float64 atomics: integer counts, exact
    in any order; the max; the SQNR sums), a clock ticket (row ``clock``) if it saw a non-finite
    element; ``first`` adds the element count (``numel``, an int64 tensor) and the call."""
    row_ptr = stats_ptr + slot * C_WIDTH
    tl.atomic_add(row_ptr + C_NF, n_nf.to(tl.float64), mask=go)
    tl.atomic_max(row_ptr + C_AMAX, amax.to(tl.float64), mask=go)
    if HAS_CAST:
        tl.atomic_add(row_ptr + C_SAT, n_sat.to(tl.float64), mask=go)
        tl.atomic_add(row_ptr + C_UF, n_uf.to(tl.float64), mask=go)
        tl.atomic_add(row_ptr + C_NZ, n_nz.to(tl.float64), mask=go)
    if SQNR:
        tl.atomic_add(row_ptr + C_SIGNAL, signal, mask=go)
        tl.atomic_add(row_ptr + C_NOISE, noise, mask=go)
    bad = n_nf > 0
    ticket = tl.atomic_add(stats_ptr + clock * C_WIDTH, 1.0, mask=bad)
    tl.atomic_min(row_ptr + C_SEQ, ticket, mask=bad)
    tl.atomic_add(row_ptr + C_NUMEL, numel.to(tl.float64), mask=first)
    tl.atomic_add(row_ptr + C_CALLS, 1.0, mask=first)


@triton.jit(do_not_specialize=("slot", "clock", "when"))
def _stats_kernel(x_ptr, n, stats_ptr, slot, clock, scale_ptr, when, limit, tiny, fmax,
                  HAS_SCALE: tl.constexpr, HAS_WHEN: tl.constexpr, SQNR: tl.constexpr, MBITS: tl.constexpr,
                  EMIN: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    go = pid >= 0  # (a tensor: the masks below take it)
    if HAS_WHEN:  # record only if row ``when`` has seen a non-finite element: else no tile is read
        go = tl.load(stats_ptr + when * C_WIDTH + C_NF) > 0.0
    n_go = tl.where(go, n, 0)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    lanes = tl.arange(0, BLOCK)
    nf = tl.zeros([BLOCK], dtype=tl.int32)
    sat = tl.zeros([BLOCK], dtype=tl.int32)
    uf = tl.zeros([BLOCK], dtype=tl.int32)
    nz = tl.zeros([BLOCK], dtype=tl.int32)
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    sig = tl.zeros([BLOCK], dtype=tl.float64)
    noi = tl.zeros([BLOCK], dtype=tl.float64)
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
            if SQNR:
                xs, xe = _cast_error(x, tl.math.div_rn(x, s), s, fmax, MBITS, EMIN)
                sig += xs
                noi += xe
    first = go & (pid == 0)
    _commit(stats_ptr, slot, clock, tl.sum(nf, axis=0), tl.max(amax, axis=0), tl.sum(sat, axis=0),
            tl.sum(uf, axis=0), tl.sum(nz, axis=0), tl.sum(sig, axis=0), tl.sum(noi, axis=0),
            n + tl.zeros((), tl.int64), go, first, HAS_SCALE, SQNR)
    if HAS_SCALE:
        tl.store(stats_ptr + slot * C_WIDTH + C_SCALE, s.to(tl.float64), mask=first)


@triton.jit(do_not_specialize=("slot", "clock"))
def _block_stats_kernel(x_ptr, M, K, stride_m, s_ptr, stride_sm, stats_ptr, slot, clock, limit, tiny, fmax,
                        SQNR: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, BR: tl.constexpr,
                        BC: tl.constexpr, TM: tl.constexpr, TK: tl.constexpr):
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
    sig = tl.zeros([TM, TK], dtype=tl.float64)
    noi = tl.zeros([TM, TK], dtype=tl.float64)
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
        y = tl.math.div_rn(x, sc)
        ay = tl.abs(y)
        nonzero = a != 0.0
        sat += (ay > limit).to(tl.int32)
        uf += (nonzero & (ay <= tiny)).to(tl.int32)
        nz += nonzero.to(tl.int32)
        if SQNR:
            xs, xe = _cast_error(x, y, sc, fmax, MBITS, EMIN)
            sig += xs
            noi += xe
    _commit(stats_ptr, slot, clock, tl.sum(tl.sum(nf, axis=1), axis=0), tl.max(tl.max(amax, axis=1), axis=0),
            tl.sum(tl.sum(sat, axis=1), axis=0), tl.sum(tl.sum(uf, axis=1), axis=0),
            tl.sum(tl.sum(nz, axis=1), axis=0), tl.sum(tl.sum(sig, axis=1), axis=0),
            tl.sum(tl.sum(noi, axis=1), axis=0), (M + tl.zeros((), tl.int64)) * K, pid >= 0, pid == 0, True, SQNR)


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


def _spec(v: int) -> tuple:
    """What a launch specializes an int argument on (a constexpr 1, 16-divisible, 64-bit)."""
    return v == 1, v % 16 == 0, v >= 2 ** 31


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0


def _plan(plans: Optional[dict], kernel, key: tuple, grid: tuple, fmt, **consts):
    """(launch, the format's float arguments: saturation limit, flush edge, max) for ``key``,
    everything its kernel specializes on (dtypes, 16-byte alignment, int sizes, flags, format,
    grid), made once into ``plans`` (a monitor session's, ``registry.Session.plans``): a
    ``runtime.Launch``, whose later calls skip the JIT's binding."""
    plan = plans.get(key) if plans is not None else None
    if plan is None:
        floats = ((saturation_limit(fmt), float(fmt.min_subnormal) / 2, float(fmt.max)) if fmt is not None
                  else (0.0, 0.0, 0.0))
        bits = {"MBITS": fmt.mbits, "EMIN": fmt.emin} if fmt is not None else {"MBITS": 0, "EMIN": 0}
        plan = (Launch(kernel, grid, **consts, **bits, num_warps=8), floats)
        if plans is not None:
            plans[key] = plan
    return plan


def _rows_ok(stats: torch.Tensor, x: torch.Tensor) -> bool:
    """The buffer is a contiguous (rows, WIDTH) float64 tensor on ``x``'s device."""
    return (stats.dim() == 2 and stats.shape[1] == WIDTH and stats.dtype == torch.float64 and stats.is_contiguous()
            and x.device == stats.device)


def launch(stats: torch.Tensor, slot: int, x: torch.Tensor, scale: Optional[torch.Tensor], fmt, when: int = -1,
           sqnr: bool = False, plans: Optional[dict] = None) -> bool:
    """Reduce ``x`` into ``stats[slot]`` (if ``when >= 0``: only when ``stats[when]`` counted a
    non-finite element; ``sqnr`` with a ``scale``: also the cast's signal and noise); False
    (nothing launched) when the kernel can't take it."""
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or not _rows_ok(stats, x):
        return False
    flat = x if x.is_contiguous() else _flat(x)
    if flat is None:
        return False
    n = flat.numel()
    limit = 4 if interpreting() else PROGRAMS_PER_SM * sm_count(x.device)
    grid = (max(1, min(cdiv(n, BLOCK), limit)),)
    has_scale = scale is not None
    s = stats  # any pointer when unused
    if has_scale:
        s = scale if scale.dtype == torch.float32 else scale.to(torch.float32)
    sqnr = sqnr and has_scale
    key = (0, x.dtype, _aligned(flat), _spec(n), _aligned(s), _aligned(stats), has_scale, when >= 0, sqnr,
           fmt.name if has_scale else None, grid)
    run, (lim, tiny, fmax) = _plan(
        plans, _stats_kernel, key, grid, fmt if has_scale else None, HAS_SCALE=has_scale, HAS_WHEN=when >= 0, SQNR=sqnr,
        BLOCK=BLOCK)
    run(flat, n, stats, slot, stats.shape[0] - 1, s, max(when, 0), lim, tiny, fmax)
    return True


WHOLE = 1 << 30  # a block dim of -1 (the whole dim): every index // WHOLE is 0
TILE = (16, 256)


def launch_blocks(stats: torch.Tensor, slot: int, x: torch.Tensor, scales: torch.Tensor, block, fmt,
                  sqnr: bool = False, plans: Optional[dict] = None) -> bool:
    """Reduce the 2-D ``x`` and its cast with one scale per ``block`` (a ``lowbit.dtypes.Block``;
    ``scales`` of ``block.scale_shape(x.shape)``) into ``stats[slot]`` (with ``sqnr``, also the
    cast's signal and noise), the row's ``scale`` being the largest block scale; False (nothing
    launched) when the kernel can't take it."""
    if (x.dim() != 2 or x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or not _rows_ok(stats, x)
            or scales.device != x.device or x.stride(-1) != 1 or x.numel() == 0 or block.is_tensorwise
            or tuple(scales.shape) != tuple(block.scale_shape(x.shape))):
        return False
    M, K = x.shape
    s = scales.to(torch.float32).contiguous()
    br, bc = (WHOLE if b == -1 else b for b in (block.rows, block.cols))
    tiles = cdiv(M, TILE[0]) * cdiv(K, TILE[1])
    limit = 4 if interpreting() else PROGRAMS_PER_SM * sm_count(x.device)
    grid = (max(1, min(tiles, limit)),)
    key = (1, x.dtype, _aligned(x), _aligned(s), _aligned(stats), _spec(M), _spec(K), _spec(x.stride(0)),
           _spec(s.stride(0)), sqnr, fmt.name, br, bc, grid)
    run, (lim, tiny, fmax) = _plan(
        plans, _block_stats_kernel, key, grid, fmt, SQNR=sqnr, BR=br, BC=bc, TM=TILE[0], TK=TILE[1])
    run(x, M, K, x.stride(0), s, s.stride(0), stats, slot, stats.shape[0] - 1, lim, tiny, fmax)
    stats[slot, COL["scale"]] = s.amax()
    return True
