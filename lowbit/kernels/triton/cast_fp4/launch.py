"""Launcher of the FP4 casts: ``FP4Casts.quantize_fp4``, the ``"triton"`` backend's fused FP4 cast.

``quantize_fp4(x, recipe, role, generator, hadamard_signs)`` returns exactly what
``lowbit.kernels.api.quantize_fp4``'s reference path returns (``FP4Tensor.from_float`` after the
optional Hadamard transform: same codes, block scales and tensor scale), or None to decline (the
FP8 casts' declines, plus recipes other than MX(elem="e2m1") and NV, odd last dims, blocks that
are not powers of two, and Hadamard signs that are not 16 fp32 values). MX: one cast; NV: the
tensor amax, then the cast; stochastic rounding (NV gradients) uses the reference's own
``torch.rand(x.shape, generator=generator)`` draw, passed to the kernel, or, when ``generator`` is
a ``lowbit.dtypes.Philox``, the same counter-based draw made in the kernel (no tensor of uniforms,
nothing read on the host: what a CUDA graph can replay).

Which kernel: 1xBC blocks without the Hadamard transform (and for NV without stochastic rounding)
take the row-local walk, on bf16 pairs where x is contiguous bf16 with whole blocks a row
(``pairs``), else one element at a time (``kernels``); the rest ``_fp4_cast_kernel``'s 2-D tiles.
A plan (``cast_common``) per (recipe, role, shape, strides, dtype, device, alignment, Hadamard or
not) holds the launches.
"""
from __future__ import annotations

from typing import Optional

import torch

from ....dtypes.formats import E2M1
from ....dtypes.fp4_tensor import FP4Tensor
from ....dtypes.philox import Philox
from ....scaling.recipes import MX, NV, ROLES
from ..cast_common import DECLINE, DTYPES, IN_KIND, PlanCache, arg, pow2_block, rowlocal_grid, rows, target
from ..cast_fp8 import tensorwise as _kt
from ..cast_fp8.tuning import CAST_TUNING, CastTuning
from ..runtime import Launch, cdiv, next_pow2
from . import kernels as _k4
from . import pairs as _k4p

__all__ = ["FP4Casts"]


class FP4Casts:
    """The FP4 casts of one backend: its tuning table (shared with the FP8 casts) and plans."""

    def __init__(self, tuning: CastTuning = CAST_TUNING):
        self.tuning = tuning
        self._plans = PlanCache(self._make)

    def quantize_fp4(self, x: torch.Tensor, recipe, role: str = "input", generator: Optional[torch.Generator] = None,
                     hadamard_signs: Optional[torch.Tensor] = None) -> Optional[FP4Tensor]:
        """Fused ``api.quantize_fp4`` (``FP4Tensor.from_float`` after the optional Hadamard), or None."""
        if not isinstance(x, torch.Tensor) or x.dtype not in DTYPES:
            return None
        signs = hadamard_signs
        if signs is not None and not (isinstance(signs, torch.Tensor) and signs.dtype == torch.float32
                                      and signs.numel() == 16 and x.shape[-1] % 16 == 0 if x.dim() else False):
            return None
        if x.device.type == "cpu" and target(x) is None:
            return None
        stream = generator.stream if isinstance(generator, Philox) else None  # a counter-based draw, in the kernel
        key = (recipe, role, x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16 == 0, x.storage_offset() % 2,
               signs is not None, stream)
        plan = self._plans.get(key, x, recipe, role, signs is not None, stream)
        if plan is None:
            return None
        if signs is not None:
            signs = signs.to(x.device).reshape(16).contiguous()
        return plan(x, generator, signs)

    def _make(self, x, recipe, role, hadamard: bool, stream: Optional[int]):
        tgt = target(x)
        if tgt is None or x.dim() < 1 or x.numel() == 0 or role not in ROLES or x.shape[-1] % 2:
            return DECLINE
        if type(recipe) is NV:
            nv, stochastic = True, recipe.sr_grads and role == "grad"  # FP4Tensor.from_float's default
        elif type(recipe) is MX and recipe.format(role) is E2M1:
            nv, stochastic = False, False
        else:
            return DECLINE
        block = recipe.granularity(role)
        if not (pow2_block(block.rows) and pow2_block(block.cols) and block.cols >= 2):
            return DECLINE
        if block.rows > 1 and x.dim() > 2:  # 2-D blocks tile the last two dims of each matrix
            return DECLINE
        t, dev = self.tuning, x.device
        x2 = rows(x)
        R, C = x2.shape
        elems = t.tile(tgt.interpreted)
        bc = min(128, next_pow2(C))
        tr, tc = max(1, min(elems // bc, next_pow2(R))), bc
        tr, tc = max(tr, block.rows), max(tc, block.cols, 16)  # whole blocks and Hadamard groups per tile
        common = dict(IN_KIND=IN_KIND[x.dtype], HADAMARD=hadamard, TILE_R=tr, TILE_C=tc, **t.opts(tr * tc))
        in_bf16 = x.dtype == torch.bfloat16
        strides = x2.stride()
        # the tensor amax (NV)
        amax_run = None
        if nv and not hadamard and x2.is_contiguous():  # over flat chunks, as the FP8 tensorwise casts
            n = x2.numel()
            abc = min(512, next_pow2(n))
            abr = max(1, min(elems, next_pow2(n)) // abc)
            n_tiles = cdiv(n, abr * abc)
            ka = Launch(_kt._amax_kernel, (min(n_tiles, t.programs(tgt.sms, t.warps(abr * abc))),), IN_BF16=in_bf16,
                        FLAT=True, BLOCK_R=abr, BLOCK_C=abc, AMAX_SLOTS=False, AMAX_VEC=1, PREFETCH=False,
                        REVERSE=t.amax_reverse, **t.opts(abr * abc))
            amax_run = lambda x2a, signs, amax: ka(x2a, amax, R, C, *strides, 1, n_tiles)  # noqa: E731
        elif nv:
            n_c = cdiv(C, tc)
            n_tiles = cdiv(R, tr) * n_c
            ka = Launch(_k4._nv_amax_kernel, (min(n_tiles, t.programs(tgt.sms, common["num_warps"])),), **common)
            amax_run = lambda x2a, signs, amax: ka(x2a, signs, amax, R, C, *strides, n_c, n_tiles)  # noqa: E731
        # the cast
        n_sc = cdiv(C, block.cols)
        rowlocal = not hadamard and block.rows == 1 and block.cols >= 16
        pairs = t.fp4_pairs and in_bf16 and x2.is_contiguous() and C % block.cols == 0 and x2.storage_offset() % 2 == 0
        asm = t.fp4_ptx_encode and not tgt.interpreted
        if rowlocal and (not nv or not stochastic):
            n_groups, g_tr, g_tiles, warps, grid = rowlocal_grid(t, tgt, R, block.cols, n_sc)
            flat = x2.is_contiguous() and C % block.cols == 0
            if not nv and pairs:
                k = Launch(_k4p._mx_fp4_pairs_kernel, grid, TR=g_tr, BC=block.cols,
                           RCEIL=recipe.scale_rule == "rceil", ASM=asm, enable_fp_fusion=False, num_warps=warps)
                cast = lambda x2, q, scale, g, u, amax, signs: k(x2.view(torch.int32), q, scale, n_groups,  # noqa: E731
                                                                 g_tiles)
            elif not nv:
                k = Launch(_k4._mx_fp4_rowblock_kernel, grid, IN_BF16=in_bf16, FLAT=flat, TR=g_tr, BC=block.cols,
                           RCEIL=recipe.scale_rule == "rceil", enable_fp_fusion=False, num_warps=warps)
                cast = lambda x2, q, scale, g, u, amax, signs: k(arg(x2), q, scale, R, C, *strides,  # noqa: E731
                                                                 n_sc, n_groups, g_tiles)
            elif pairs:
                k = Launch(_k4p._nv_fp4_pairs_kernel, grid, TR=g_tr, BC=block.cols, FAST_DIV=t.fast_div, ASM=asm,
                           enable_fp_fusion=False, num_warps=warps)
                cast = lambda x2, q, scale, g, u, amax, signs: k(x2.view(torch.int32), amax, q, scale, g,  # noqa: E731
                                                                 n_groups, g_tiles)
            else:
                k = Launch(_k4._nv_fp4_rowblock_kernel, grid, IN_BF16=in_bf16, FLAT=flat, TR=g_tr, BC=block.cols,
                           FAST_DIV=t.fast_div, enable_fp_fusion=False, num_warps=warps)
                cast = lambda x2, q, scale, g, u, amax, signs: k(arg(x2), amax, q, scale, g, R, C,  # noqa: E731
                                                                 *strides, n_sc, n_groups, g_tiles)
        else:
            philox = stochastic and stream is not None
            k = Launch(_k4._fp4_cast_kernel, (cdiv(R, tr) * cdiv(C, tc),), NV=nv, STOCHASTIC=stochastic,
                       RCEIL=(not nv) and recipe.scale_rule == "rceil", FAST_DIV=t.fast_div, BR=block.rows,
                       BC=block.cols, PHILOX=philox, STREAM=stream if philox else 0, **common)
            cast = lambda x2, q, scale, g, u, amax, signs: k(arg(x2), signs, u, amax, q, scale, g, R, C,  # noqa: E731
                                                             *strides, n_sc)
        s_rows = cdiv(R, block.rows)
        sdt = torch.float8_e4m3fn if nv else torch.float8_e8m0fnu
        kind = "nv" if nv else "mx"
        scale_shape = block.scale_shape(x.shape)
        lead = x.shape[:-1]
        dtype = x.dtype

        def run(x, generator, signs):
            x = x.detach()
            x2 = rows(x)
            amax = torch.zeros((), dtype=torch.float32, device=dev)
            signs_arg = amax if signs is None else signs
            if amax_run is not None:
                amax_run(arg(x2), signs_arg, amax)
            if not stochastic:
                u = amax  # (unused)
            elif stream is not None:  # the kernel draws from the (seed, step) key
                u = generator.key_on(dev)
            else:
                u = torch.rand(x.shape, generator=generator, device=dev, dtype=torch.float32)
            q = torch.empty((R, C // 2), dtype=torch.uint8, device=dev)
            scale = torch.empty((s_rows, n_sc), dtype=torch.uint8, device=dev)
            g = (torch.empty if nv else torch.ones)((), dtype=torch.float32, device=dev)
            cast(x2, q, scale, g, u, amax, signs_arg)
            return FP4Tensor(q.reshape(*lead, C // 2), scale.view(sdt).reshape(scale_shape), g, block, kind, False,
                             dtype)
        return run
