"""Launchers of the fused FP4 quantize kernels (``quantize_fp4_kernels``): the ``quantize_fp4``
hook of the ``"triton"`` backend, with ``quantize``'s input checks, tiles and row-local geometry.

``quantize_fp4_triton(x, recipe, role, generator, hadamard_signs)`` returns exactly what
``lowbit.kernels.cast.quantize_fp4``'s reference path returns (``FP4Tensor.from_float`` after the
optional Hadamard transform: same codes, block scales and tensor scale), or None to decline
(``quantize``'s declines, plus recipes other than MX(elem="e2m1") and NV, odd last dims, blocks
that are not powers of two, and Hadamard signs that are not 16 fp32 values). MX: one cast; NV:
the tensor amax, then the cast; stochastic rounding (NV gradients) uses the reference's own
``torch.rand(x.shape, generator=generator)`` draw, passed to the kernel.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..dtypes.formats import E2M1
from ..dtypes.fp4_tensor import FP4Tensor
from ..scaling.recipes import MX, NV, ROLES
from . import quantize_fp4_kernels as _k4
from . import quantize_fp4_pairs_kernels as _k4p
from . import quantize_fp8_tensor_row_kernels as _k8t
from . import quantize_policy as policy
from .interpret import interpreting
from .launch_math import cdiv
from .quantize import _IN_KIND, _accepts, _arg, _flat_tiles, _pow2_block, _rowlocal_grid, _rows, _tile

__all__ = ["quantize_fp4_triton"]


def _fp4_plan(x, recipe, role, signs):
    """(nv, stochastic, block, signs on x's device) or None."""
    if not _accepts(x) or role not in ROLES or x.shape[-1] % 2:
        return None
    if type(recipe) is NV:
        nv, stochastic = True, recipe.sr_grads and role == "grad"  # FP4Tensor.from_float's default
    elif type(recipe) is MX and recipe.format(role) is E2M1:
        nv, stochastic = False, False
    else:
        return None
    block = recipe.granularity(role)
    if not (_pow2_block(block.rows) and _pow2_block(block.cols) and block.cols >= 2):
        return None
    if block.rows > 1 and x.dim() > 2:  # 2-D blocks tile the last two dims of each matrix
        return None
    if signs is not None:
        if not (isinstance(signs, torch.Tensor) and signs.dtype == torch.float32 and signs.numel() == 16
                and x.shape[-1] % 16 == 0):
            return None
        signs = signs.to(x.device).reshape(16).contiguous()
    return nv, stochastic, block, signs


def _pairs(x2, bc: int) -> bool:
    """The row-local cast reads x as int32 words of two bf16 elements (``rowlocal_fp4_pairs``)."""
    return policy.rowlocal_fp4_pairs() and x2.dtype == torch.bfloat16 and x2.is_contiguous() \
        and x2.shape[1] % bc == 0 and x2.storage_offset() % 2 == 0


def _fp4_rowlocal(x2, q, scale, bc: int, n_sc: int, rceil: bool):
    """MX E2M1 with 1xBC blocks by the row-local walk (``_mx_fp4_rowblock_kernel``; the geometry of
    ``_fp8_rowlocal``, its own prefetch and finite-tile levers, no register cap)."""
    R, C = x2.shape
    n_groups, tr, n_tiles, warps, grid = _rowlocal_grid(x2, bc, n_sc)
    if _pairs(x2, bc):
        _k4p._mx_fp4_pairs_kernel[grid](x2.view(torch.int32), q, scale, n_groups, n_tiles, TR=tr, BC=bc,
                                       RCEIL=rceil, ASM=policy.fp4_ptx_encode() and not interpreting(),
                                       enable_fp_fusion=False, num_warps=warps)
        return
    _k4._mx_fp4_rowblock_kernel[grid](
        _arg(x2), q, scale, R, C, *x2.stride(), n_sc, n_groups, n_tiles, IN_BF16=x2.dtype == torch.bfloat16,
        FLAT=x2.is_contiguous() and C % bc == 0, TR=tr, BC=bc, PREFETCH=policy.rowlocal_fp4_prefetch(),
        FINITE=policy.rowlocal_fp4_finite(), RCEIL=rceil, enable_fp_fusion=False, num_warps=warps)


def _nvfp4_rowlocal(x2, amax, q, scale, g, bc: int, n_sc: int):
    """NV E2M1 with 1xBC blocks by the row-local walk (``_nv_fp4_rowblock_kernel``; the geometry of
    ``_fp8_rowlocal``), from the tensor amax."""
    R, C = x2.shape
    n_groups, tr, n_tiles, warps, grid = _rowlocal_grid(x2, bc, n_sc)
    if _pairs(x2, bc):
        _k4p._nv_fp4_pairs_kernel[grid](x2.view(torch.int32), amax, q, scale, g, n_groups, n_tiles, TR=tr, BC=bc,
                                       FAST_DIV=policy.fast_div(), ASM=policy.fp4_ptx_encode() and not interpreting(),
                                       enable_fp_fusion=False, num_warps=warps)
        return
    _k4._nv_fp4_rowblock_kernel[grid](
        _arg(x2), amax, q, scale, g, R, C, *x2.stride(), n_sc, n_groups, n_tiles, IN_BF16=x2.dtype == torch.bfloat16,
        FLAT=x2.is_contiguous() and C % bc == 0, TR=tr, BC=bc, PREFETCH=policy.rowlocal_fp4_prefetch(),
        FAST_DIV=policy.fast_div(), enable_fp_fusion=False, num_warps=warps)


def quantize_fp4_triton(x: torch.Tensor, recipe, role: str = "input", generator: Optional[torch.Generator] = None,
                        hadamard_signs: Optional[torch.Tensor] = None) -> Optional[FP4Tensor]:
    """Fused ``cast.quantize_fp4`` (``FP4Tensor.from_float`` after the optional Hadamard), or None.

    NV: the tensor amax kernel, then the cast; MX: the cast alone. Stochastic rounding (NV grads)
    draws ``torch.rand(x.shape, generator=generator)`` exactly as the reference does and passes it in."""
    plan = _fp4_plan(x, recipe, role, hadamard_signs)
    if plan is None:
        return None
    nv, stochastic, block, signs = plan
    x = x.detach()
    x2 = _rows(x)
    R, C = x2.shape
    dev = x.device
    tr, tc = _tile(x2, R, C, max_c=128)
    tr, tc = max(tr, block.rows), max(tc, block.cols, 16)  # whole blocks and Hadamard groups per tile
    amax = torch.zeros((), dtype=torch.float32, device=dev)
    signs_arg = amax if signs is None else signs
    common = dict(IN_KIND=_IN_KIND[x.dtype], HADAMARD=signs is not None, TILE_R=tr, TILE_C=tc, **policy.opts(tr * tc))
    if nv and signs is None and x2.is_contiguous():  # the tensor amax over flat chunks, as for FP8
        br, bc, n_tiles = _flat_tiles(x2, policy.tile_elems(x2))
        _k8t._amax_kernel[(min(n_tiles, policy.max_programs(x2, br * bc)),)](
            _arg(x2), amax, R, C, *x2.stride(), 1, n_tiles, IN_BF16=x.dtype == torch.bfloat16, FLAT=True,
            BLOCK_R=br, BLOCK_C=bc, AMAX_SLOTS=False, AMAX_VEC=1, PREFETCH=False, REVERSE=policy.amax_reverse_walk(),
            **policy.opts(br * bc))
    elif nv:
        n_c = cdiv(C, tc)
        n_tiles = cdiv(R, tr) * n_c
        _k4._nv_amax_kernel[(min(n_tiles, policy.max_programs(x2, tr * tc)),)](
            _arg(x2), signs_arg, amax, R, C, *x2.stride(), n_c, n_tiles, **common)
    u = torch.rand(x.shape, generator=generator, device=dev, dtype=torch.float32) if stochastic else amax
    q = torch.empty((R, C // 2), dtype=torch.uint8, device=dev)
    n_sc = cdiv(C, block.cols)
    scale = torch.empty((cdiv(R, block.rows), n_sc), dtype=torch.uint8, device=dev)
    g = (torch.empty if nv else torch.ones)((), dtype=torch.float32, device=dev)
    rowlocal = signs is None and block.rows == 1 and block.cols >= 16
    if not nv and rowlocal and policy.rowlocal_fp4():
        _fp4_rowlocal(x2, q, scale, block.cols, n_sc, recipe.scale_rule == "rceil")
    elif nv and rowlocal and not stochastic and policy.rowlocal_nvfp4():
        _nvfp4_rowlocal(x2, amax, q, scale, g, block.cols, n_sc)
    else:
        _k4._fp4_cast_kernel[(cdiv(R, tr) * cdiv(C, tc),)](
            _arg(x2), signs_arg, u, amax, q, scale, g, R, C, *x2.stride(), n_sc, NV=nv, STOCHASTIC=stochastic,
            RCEIL=(not nv) and recipe.scale_rule == "rceil", FAST_DIV=policy.fast_div(), BR=block.rows, BC=block.cols,
            **common)
    sdt = torch.float8_e4m3fn if nv else torch.float8_e8m0fnu
    return FP4Tensor(q.reshape(*x.shape[:-1], C // 2), scale.view(sdt).reshape(block.scale_shape(x.shape)), g,
                     block, "nv" if nv else "mx", False, x.dtype)
