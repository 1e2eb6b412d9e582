"""Launchers of the FP8 casts that also write the transposed copy with their own kernels (part of
``quantize``'s ``quantize_fp8_t_triton``; the tensorwise grid-stride one stays there): tensorwise
from one read of each tile; rowwise and 1xBC blocks split (x's copy by the row-local cast, the
transposed copy alone by ``quantize_fp8_cols_t_kernels``) or from the sweep kernels; BxB blocks.
Every launch choice is a ``quantize_policy`` function, read at each launch.
"""
from __future__ import annotations

import torch

from . import quantize as _q
from . import quantize_fp8_cols_t_kernels as _k8c
from . import quantize_fp8_rowwise_t_kernels as _k8r
from . import quantize_fp8_transpose_kernels as _k8x
from . import quantize_policy as policy
from .launch_math import cdiv, next_pow2


def _fp8_tensor_t_one_read(x2, q2, qt, scale, amax, n_amax: int, state, common):
    """Tensorwise with the transposed copy by ``_cast_tensor_t_reg_kernel`` (``transpose_one_read``:
    a tile of ``transpose_one_read_tile`` a program, read once and held in registers). Delayed
    (``state`` given; ``scale`` and ``amax`` unused): one amax slot a tile, then the state update. Current: ``amax`` (``n_amax``
    values) from the amax pass, ``scale`` written by the kernel. Returns the scale."""
    R, C = x2.shape
    br, bc = policy.transpose_one_read_tile()
    br, bc = min(br, next_pow2(R)), min(bc, next_pow2(C))
    n_tiles = cdiv(R, br) * cdiv(C, bc)
    warps = policy.transpose_one_read_warps(br * bc)
    delayed = state is not None
    if delayed:
        scale, amax, n_amax = state.scale, _q._fp32(x2, n_tiles), n_tiles
    _k8x._cast_tensor_t_reg_kernel[(n_tiles,)](
        _q._arg(x2), q2, qt, scale, amax, R, C, *x2.stride(), *q2.stride(), n_amax, IN_BF16=common["IN_BF16"],
        BR=br, BC=bc, DELAYED=delayed, AMAX_BLOCK=1 if delayed or amax.dim() == 0 else _q._amax_block(n_amax),
        **_q._fmt_args(common), enable_fp_fusion=False, num_warps=warps,
        **_q._maxnreg(policy.transpose_one_read_maxnreg(warps)))
    if delayed:
        scale = _q._delayed_update(state, amax, n_amax)
    return scale, scale



def _rowwise_t_amax(x2, common, row_slots: bool, reverse: bool):
    """``_rowwise_t_amax2d_kernel``: (row slots or None, column slots, slot rows of each) for
    programs of ``rowwise_t_amax_tile``."""
    R, C = x2.shape
    prog_r, sub_r, tc = policy.rowwise_t_amax_tile(x2)
    sub_r, tc = min(sub_r, next_pow2(R)), min(tc, next_pow2(C))
    prog_r = max(sub_r, min(prog_r, next_pow2(R)))
    pr, pc = cdiv(R, prog_r), cdiv(C, tc)
    cslot = torch.empty((pr, C), dtype=torch.int32, device=x2.device)
    rslot = torch.empty((pc, R), dtype=torch.int32, device=x2.device) if row_slots else cslot
    _k8r._rowwise_t_amax2d_kernel[(pr * pc,)](_q._arg(x2), rslot, cslot, R, C, *x2.stride(), IN_BF16=common["IN_BF16"],
                                              PROG_R=prog_r, SUB_R=sub_r, TILE_C=tc, ROW_SLOTS=row_slots,
                                              REVERSE=reverse, num_warps=max(1, min(8, sub_r * tc // 256)))
    return (rslot if row_slots else None), cslot, pr, pc



def _fp8_rowwise_t_tiles(x2, q2, qt, common):
    """Rowwise with the transposed copy in three launches (``quantize_fp8_rowwise_t_kernels``):
    row and column partial-amax slots (programs of ``rowwise_t_amax_tile``), row and column scales
    from the slots, then the sweep cast writing both copies. Returns (row scales, column scales)."""
    R, C = x2.shape
    scale, ys_r, st, ys_c = _q._fp32(x2, R), _q._fp32(x2, R), _q._fp32(x2, C), _q._fp32(x2, C)
    rslot, cslot, pr, pc = _rowwise_t_amax(x2, common, True, False)
    bn = min(256, next_pow2(max(R, C)))
    _k8r._rowwise_t_scales_kernel[(cdiv(R, bn) + cdiv(C, bn),)](
        rslot, cslot, scale, ys_r, st, ys_c, R, C, pr, pc, BLOCK_P=8, BLOCK_N=bn, FMAX=common["FMAX"],
        enable_fp_fusion=False, num_warps=4)
    prog_r, sub_r = policy.rowwise_t_sweep_rows()
    tc = min(policy.block_t_tile(), next_pow2(C))
    sub_r = min(sub_r, next_pow2(R))
    prog_r = max(sub_r, min(prog_r, next_pow2(R)))
    _k8r._cast_rowwise_t_sweep_kernel[(cdiv(R, prog_r) * cdiv(C, tc),)](
        _q._arg(x2), scale, ys_r, st, ys_c, q2, qt, R, C, *x2.stride(), *q2.stride(), IN_BF16=common["IN_BF16"],
        PROG_R=prog_r, SUB_R=sub_r, TILE_C=tc, **_q._fmt_args(common), enable_fp_fusion=False,
        num_warps=policy.t_sweep_warps(sub_r * tc))
    return scale, st



def _fp8_rowwise_t_split(x2, q2, qt, common):
    """Rowwise with the transposed copy as four launches (``rowwise_t_split``): column amax slots
    (last to first with ``cols_t_reverse``), column scales, x's copy by the row-local rowwise cast,
    then the transposed copy alone (``_cast_cols_t_kernel`` with the column scales given).
    Returns (row scales, column scales)."""
    R, C = x2.shape
    st, ys_c = _q._fp32(x2, C), _q._fp32(x2, C)
    _, cslot, pr, _ = _rowwise_t_amax(x2, common, False, policy.cols_t_reverse())
    bn = min(256, next_pow2(C))
    _k8r._rowwise_t_scales_kernel[(cdiv(C, bn),)](
        cslot, cslot, st, ys_c, st, ys_c, 0, C, pr, 1, BLOCK_P=8, BLOCK_N=bn, FMAX=common["FMAX"],
        enable_fp_fusion=False, num_warps=4)
    scale, _ = _q._fp8_rowwise(x2, q2, q2, False, common)
    _fp8_cols_t(x2, qt, st, ys_c, 1, policy.cols_t_rows(), True, common)
    return scale, st



def _fp8_cols_t(x2, qt, st, ysc, n_stc: int, rows: int, given: bool, common):
    """``qt`` alone by ``_cast_cols_t_kernel``: tiles of ``rows`` x ``cols_t_cols`` (``rows`` the
    block height, or ``cols_t_rows`` with the scales ``given``)."""
    R, C = x2.shape
    tc = min(policy.cols_t_cols(), next_pow2(C))
    rows = min(rows, next_pow2(R)) if given else rows
    warps = policy.cols_t_warps(rows * tc)
    _k8c._cast_cols_t_kernel[(cdiv(R, rows) * cdiv(C, tc),)](
        _q._arg(x2), qt, st, ysc, R, C, *x2.stride(), n_stc, IN_BF16=common["IN_BF16"], BR=rows, TILE_C=tc,
        SUB_R=min(rows, policy.cols_t_slice_rows()), GIVEN=given, REVERSE=policy.cols_t_reverse(),
        **_q._fmt_args(common), enable_fp_fusion=False, num_warps=warps, **_q._maxnreg(policy.cols_t_maxnreg(warps)))



def _fp8_block_t_tiles(x2, q2, qt, block, common):
    """1xBC blocks with the transposed copy (BCx1 blocks of x): a program per BC x ``block_t_tile``
    tile in two sweeps of ``block_t_sweep_rows`` rows (``_cast_1xn_t_sweep_kernel``). Returns both
    scales."""
    R, C = x2.shape
    bc = block.cols
    tc = max(bc, min(policy.block_t_tile(), next_pow2(C)))
    n_sc, n_stc = cdiv(C, bc), cdiv(R, bc)
    scale, st = _q._fp32(x2, R, n_sc), _q._fp32(x2, C, n_stc)
    sub = min(bc, policy.block_t_sweep_rows())
    _k8x._cast_1xn_t_sweep_kernel[(cdiv(R, bc) * cdiv(C, tc),)](
        _q._arg(x2), q2, scale, qt, st, R, C, *x2.stride(), *q2.stride(), n_sc, n_stc, IN_BF16=common["IN_BF16"],
        BC=bc, SUB_R=sub, TILE_C=tc, PREFETCH=policy.block_t_sweep_prefetch(), **_q._fmt_args(common),
        enable_fp_fusion=False, num_warps=policy.t_sweep_warps(sub * tc))
    return scale, st



def _fp8_block_t_split(x2, q2, qt, bc: int, common, rowlocal):
    """1xBC blocks with the transposed copy (BCx1 blocks of x) as two launches (``block_t_split``):
    x's copy by the row-local 1xBC cast (its arguments ``rowlocal``), then the transposed copy alone
    (``_cast_cols_t_kernel``, BC-row tiles). Returns both scales."""
    R, C = x2.shape
    n_sc, n_stc = cdiv(C, bc), cdiv(R, bc)
    scale, st = _q._fp32(x2, R, n_sc), _q._fp32(x2, C, n_stc)
    _q._fp8_rowlocal(x2, q2, scale, bc, n_sc, rowlocal)
    _fp8_cols_t(x2, qt, st, st, n_stc, bc, False, common)
    return scale, st



def _fp8_square_t(x2, q2, qt, b, common):
    """BxB blocks with the transposed copy (its blocks are q's): a block a program
    (``quantize_fp8_transpose_kernels._cast_square_t_reg_kernel``, the block held in registers, with
    ``square_t_one_read`` up to 128x128; else ``_cast_square_t_kernel``, two sweeps of slices).
    Returns both scales."""
    R, C = x2.shape
    n_sc, n_stc = cdiv(C, b), cdiv(R, b)
    scale, st = _q._fp32(x2, n_stc, n_sc), _q._fp32(x2, n_sc, n_stc)
    if policy.square_t_one_read() and b <= 128:
        warps = policy.square_t_one_read_warps(b * b)
        _k8x._cast_square_t_reg_kernel[(n_stc * n_sc,)](
            _q._arg(x2), q2, scale, qt, st, R, C, *x2.stride(), *q2.stride(), n_sc, n_stc, IN_BF16=common["IN_BF16"],
            B=b, **_q._fmt_args(common), enable_fp_fusion=False, num_warps=warps,
            **_q._maxnreg(policy.square_t_one_read_maxnreg(warps)))
        return scale, st
    sub = min(b, policy.block_t_sweep_rows())
    _k8x._cast_square_t_kernel[(n_stc * n_sc,)](
        _q._arg(x2), q2, scale, qt, st, R, C, *x2.stride(), *q2.stride(), n_sc, n_stc, IN_BF16=common["IN_BF16"], B=b,
        SUB_R=sub, **_q._fmt_args(common), enable_fp_fusion=False, num_warps=policy.t_sweep_warps(sub * b))
    return scale, st
