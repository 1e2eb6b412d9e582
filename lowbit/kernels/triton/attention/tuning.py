"""Tile sizes, warps and pipeline stages of the attention kernels, per padded head dim.

``tuning_for(dp, dvp)`` gives the ``AttentionTuning`` a launch uses: the table below on the GPU,
``INTERPRET`` under ``TRITON_INTERPRET=1`` (small tiles, so tests at a few dozen tokens still
cross tiles). ``override(**fields)`` replaces fields for the calls inside a ``with`` block (a
context variable: benchmarks/attention.py times its list of tilings in one run).
Backward tiles: the dK/dV kernel owns ``dkdv_block_n`` keys and steps over ``dkdv_block_m``
queries (the width of the dS rows its dK product rounds with one scale); the dQ kernel owns
``dq_block_m`` queries and steps over ``dq_block_n`` keys (likewise for dQ). A program's rows are
16 a warp (``rows = 16 * warps``) so that each warp group owns 64 rows and the row reductions
stay inside warps. At head dims up to 128 the defaults put one warp group (64 rows) on a program
and two programs on an SM: the tiles a step loads serve half as many rows as with 128-row programs
(twice the L2 -> SM traffic a product), and the two programs hide each other's softmax and
rescaling. Every tile is clipped to the recipe's scale block, and the tiles that set a scale
block's width (``fwd_block_n``, ``dkdv_block_m``, ``dq_block_n``) give the same bits under any
choice of the other fields.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from dataclasses import dataclass
from typing import Optional

__all__ = ["AttentionTuning", "TABLE", "INTERPRET", "tuning_for", "kernel_tiles", "padded_dim", "override"]


@dataclass(frozen=True)
class AttentionTuning:
    fwd_block_m: int = 64
    fwd_block_n: int = 128
    fwd_warps: int = 4
    fwd_stages: int = 3
    fwd_maxnreg: Optional[int] = None  # a register cap (ptxas), e.g. 168: three 4-warp CTAs an SM
    dkdv_block_n: int = 64
    dkdv_block_m: int = 64
    dkdv_warps: int = 4
    dkdv_stages: int = 2
    dq_block_m: int = 64
    dq_block_n: int = 64
    dq_warps: int = 4
    dq_stages: int = 3
    quant_chunk: int = 64
    quant_warps: int = 4


# Keyed by the padded QK head dim (192 pads to 256). Compiled for sm_90a on the CPU (ptxas of triton
# 3.6, the lent H200's, and 3.9): at head dims 64 and 128 no kernel spills (the dK/dV kernel holds
# its 2 x 64 x 128 fp32 accumulators in one warp group's registers); at 256 every kernel puts two
# warp groups on a 64-row tile (they split its columns, halving the accumulators a thread holds;
# the row reductions then cross warp groups), which spills 20 bytes or none, where one warp group a
# tile spills 0.7-1.9 KB.
TABLE = {
    32: AttentionTuning(),
    64: AttentionTuning(),
    128: AttentionTuning(),
    256: AttentionTuning(fwd_block_n=64, fwd_warps=8, fwd_stages=2, dkdv_warps=8, dq_warps=8, dq_stages=2,
                         quant_chunk=32),
}
INTERPRET = AttentionTuning(fwd_block_m=32, fwd_block_n=32, fwd_warps=4, fwd_stages=1, dkdv_block_n=32,
                            dkdv_block_m=32, dkdv_warps=4, dkdv_stages=1, dq_block_m=32, dq_block_n=32, dq_warps=4,
                            dq_stages=1, quant_chunk=128)

_OVERRIDE: contextvars.ContextVar = contextvars.ContextVar("lowbit_attention_tuning", default=None)


def padded_dim(d: int) -> int:
    """A head dim as the kernels tile it: the next power of two, at least 32 (FP8 wgmma's K step)."""
    return max(32, 1 << (d - 1).bit_length())


def tuning_for(dp: int, interpret: bool) -> AttentionTuning:
    """The tuning of a call with padded QK head dim ``dp`` (``override`` applied)."""
    base = INTERPRET if interpret else TABLE[dp]
    fields = _OVERRIDE.get()
    return dataclasses.replace(base, **fields) if fields else base


def kernel_tiles(head_dim: int, recipe, interpret: bool):
    """(forward block_n, dK/dV kernel block_m, dQ kernel block_n) of a call with this QK head dim,
    clipped to ``recipe``'s scale block: the forward's key blocks (its running max) and the widths
    of the dS rows the backward rounds with one scale, which the emulation needs."""
    tune = tuning_for(padded_dim(head_dim), interpret)
    return (recipe.tiles(tune.fwd_block_m, tune.fwd_block_n)[1], recipe.tiles(1, tune.dkdv_block_m)[1],
            recipe.tiles(1, tune.dq_block_n)[1])


@contextlib.contextmanager
def override(**fields):
    """``with override(fwd_block_n=64, fwd_warps=4): ...`` (unknown names raise TypeError)."""
    dataclasses.replace(AttentionTuning(), **fields)  # validate the names now
    token = _OVERRIDE.set({**(_OVERRIDE.get() or {}), **fields})
    try:
        yield
    finally:
        _OVERRIDE.reset(token)
