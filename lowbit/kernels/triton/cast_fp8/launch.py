"""Launcher of the FP8 casts: ``FP8Casts.quantize_fp8`` / ``quantize_fp8_t``, the ``"triton"``
backend's fused casts.

Each returns exactly what ``lowbit.kernels.api``'s reference path returns (same data and scale
bits, shapes and dtypes, same DelayedScalingState update), or None to decline:

* ``quantize_fp8(x, recipe, role, state)``: Delayed (scale from ``state``, amax fused into the
  cast, then the state update in one launch), Current (amax pass, then the cast), Rowwise (the
  row-local walk; ``_cast_rows_kernel`` for rows longer than ``rowlocal_max_cols``), Blockwise
  1xBC and MX 1xBC (the row-local walk), other blocks (``_cast_blocks_kernel``).
* ``quantize_fp8_t(x, recipe, role, state)``: ``(q, q_t)``, the row-major copy and the contiguous
  transposed copy. Tensorwise: one scale, each tile read once (``_cast_tensor_t_reg_kernel``);
  rowwise: column amax slots and column scales, the row-local cast, the column-only cast
  (``cols_t``; rows longer than ``rowlocal_max_cols``: the rowwise sweep kernels); 1xBC blocks
  (BC >= 16): the row-local cast and the column-only cast; BxB blocks: a block a program
  (``_cast_square_t_reg_kernel``); MX and other blocks: ``_cast_blocks_kernel``.

Declined: devices other than CUDA, and CPU unless ``TRITON_INTERPRET=1`` now (read at each call)
and the kernels were defined under it (``@triton.jit`` decides at definition); dtypes other than
fp16/bf16/fp32; empty tensors; recipe types other than the built-in ones (a subclass may change
the math); blocks that are not powers of two up to 128; 2-D blocks on tensors of more than two
dims; inputs the reference rejects (it then raises its error). FP8 data keeps the memory layout
of a 1-D/2-D x (as the reference's elementwise ops do); scales and the data of N-D inputs are
contiguous.

One pass on the host: a plan (``cast_common``) per (recipe, role, shape, strides, dtype, device,
alignment, state layout) holds the launches; a call allocates the outputs and runs them.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ....dtypes.fp8_tensor import FP8Tensor
from ....scaling.delayed import DelayedScalingState
from ....scaling.recipes import MX, ROLES, Blockwise, Current, Delayed, Rowwise
from ..cast_common import DECLINE, PlanCache, arg, fmt_consts, maxnreg, pow2_block, rowlocal_grid, rows, target, \
    DTYPES
from ..runtime import Launch, cdiv, next_pow2
from . import blocks as _kb
from . import cols_t as _kc
from . import rowlocal as _kl
from . import rowwise as _kr
from . import tensorwise as _kt
from .tuning import CAST_TUNING, CastTuning

__all__ = ["FP8Casts"]

_KINDS = {Delayed: "delayed", Current: "current", Rowwise: "rowwise", Blockwise: "blocks", MX: "blocks"}


def _fp32(dev, *shape):
    return torch.empty(shape, dtype=torch.float32, device=dev)


def _flat_tiles(n: int, elems: int):
    """(BLOCK_R, BLOCK_C, tiles) of a walk over ``n`` contiguous elements as a flat array:
    consecutive chunks of ``BLOCK_R x BLOCK_C`` (<= 512 columns, ~``elems``) elements."""
    bc = min(512, next_pow2(n))
    br = max(1, min(elems, next_pow2(n)) // bc)
    return br, bc, cdiv(n, br * bc)


class FP8Casts:
    """The FP8 casts of one backend: its tuning table and its plan cache."""

    def __init__(self, tuning: CastTuning = CAST_TUNING):
        self.tuning = tuning
        self._plans = PlanCache(self._make)

    # ---- entry points -------------------------------------------------------------------------
    def quantize_fp8(self, x: torch.Tensor, recipe, role: str = "input", state=None) -> Optional[FP8Tensor]:
        """Fused ``FP8Tensor.from_float(x, recipe, role, state)``, or None (module docstring)."""
        plan = self._plan(x, recipe, role, state, False)
        return None if plan is None else plan(x, state)

    def quantize_fp8_t(self, x: torch.Tensor, recipe, role: str = "input", state=None):
        """Fused ``api.quantize_fp8_t``: ``(q, q_t)``, or None."""
        plan = self._plan(x, recipe, role, state, True)
        return None if plan is None else plan(x, state)

    def _plan(self, x, recipe, role, state, transposed):
        if not isinstance(x, torch.Tensor) or x.dtype not in DTYPES:
            return None
        if type(recipe) is Delayed:
            if not isinstance(state, DelayedScalingState):
                return None
            hist = state.amax_history
            skey = (type(state), state.recipe, state.fmt.name, state.scale.device, hist.shape, hist.stride(), hist.dtype)
        else:
            skey = None
        key = (recipe, role, transposed, x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16 == 0, skey)
        if x.device.type == "cpu" and target(x) is None:  # TRITON_INTERPRET is read at each call
            return None
        return self._plans.get(key, x, recipe, role, state, transposed)

    # ---- planning -----------------------------------------------------------------------------
    def _make(self, x, recipe, role, state, transposed):
        tgt = target(x)
        if tgt is None or x.dim() < 1 or x.numel() == 0 or role not in ROLES or (transposed and x.dim() != 2):
            return DECLINE
        kind = _KINDS.get(type(recipe))  # exact types: a subclass may change the math
        if kind is None or getattr(recipe, "kind", None) != "fp8":
            return DECLINE
        if kind == "delayed" and state.scale.device != x.device:
            return DECLINE
        fmt, block = recipe.format(role), recipe.granularity(role)
        if fmt.name not in ("e4m3", "e5m2"):  # e.g. MX(grad_elem="e2m1"): the reference raises
            return DECLINE
        if kind == "blocks" and (not (pow2_block(block.rows) and pow2_block(block.cols))
                                 or (block.rows > 1 and x.dim() > 2)):
            return DECLINE
        t = self.tuning
        x2 = rows(x)
        R, C = x2.shape
        common = dict(IN_BF16=x.dtype == torch.bfloat16, HW_CVT=(3 if t.cvt_handles_nan else 1) if tgt.sm89 else 0,
                      FAST_DIV=t.fast_div, LEAN=t.lean_encode, **fmt_consts(fmt))
        plan = _Plan(x, fmt, block, transposed)
        if kind in ("delayed", "current"):
            self._tensorwise(plan, tgt, x2, kind, state, common)
        elif kind == "rowwise":
            self._rowwise(plan, tgt, x2, common)
        else:
            self._blocks(plan, tgt, x2, recipe, fmt, block, common)
        return plan

    # tensorwise ---------------------------------------------------------------------------------
    def _tensorwise(self, plan, tgt, x2, kind, state, common):
        """Delayed: one pass (the cast with the state's scale writes one amax slot a program),
        then the state update. Current: the amax pass (atomic max into a zeroed scalar), then the
        cast with ``amax_to_scale(amax)``. Non-transposed contiguous x is walked as a flat array."""
        t, delayed, dev = self.tuning, kind == "delayed", x2.device
        R, C = x2.shape
        if plan.transposed:
            self._tensorwise_t(plan, tgt, x2, delayed, state, common)
            return
        flat = x2.is_contiguous() and plan.q_contiguous
        if flat:
            br, bc, n_tiles = _flat_tiles(x2.numel(), t.tile(tgt.interpreted))
            n_c = 1
            opts = dict(enable_fp_fusion=False, num_warps=max(4, t.warps(br * bc) // 2))
            programs = min(n_tiles, t.programs(tgt.sms, opts["num_warps"]))
            # 16+ elements a thread: the amax accumulator takes the max of each 8-vector first
            vec = 8 if br * bc >= 16 * 32 * opts["num_warps"] and bc % 8 == 0 else 1
        else:
            bc = min(256, next_pow2(C))
            br = max(1, min(t.tile(tgt.interpreted) // bc, next_pow2(R)))
            n_c = cdiv(C, bc)
            n_tiles = cdiv(R, br) * n_c
            opts = t.opts(br * bc)
            programs = min(n_tiles, t.programs(tgt.sms, opts["num_warps"]))
            vec = 1
        walk = dict(FLAT=flat, BLOCK_R=br, BLOCK_C=bc, PREFETCH=False, AMAX_VEC=vec, **opts)
        geo = (R, C, *x2.stride(), *plan.q2_stride)
        if delayed:
            cast = Launch(_kt._cast_tensor_kernel, (programs,), DELAYED=True, AMAX_SLOTS=True, AMAX_BLOCK=1, **common,
                          **walk)
            update = self._delayed_update(state, programs)

            def run(x2a, q2, st):
                amax = _fp32(dev, programs)
                cast(x2a, q2, st.scale, amax, *geo, n_c, n_tiles, programs)  # reads the scale before the update
                return update(st, amax), None
        else:
            amax_k = Launch(_kt._amax_kernel, (programs,), IN_BF16=common["IN_BF16"], AMAX_SLOTS=False,
                            REVERSE=t.amax_reverse, **walk)
            cast = Launch(_kt._cast_tensor_kernel, (programs,), DELAYED=False, AMAX_SLOTS=False, AMAX_BLOCK=1, **common,
                          **walk)

            def run(x2a, q2, st):
                scale, amax = _fp32(dev), torch.zeros((), dtype=torch.float32, device=dev)
                amax_k(x2a, amax, R, C, *geo[2:4], n_c, n_tiles)
                cast(x2a, q2, scale, amax, *geo, n_c, n_tiles, 1)
                return scale, None
        plan.body = run

    def _tensorwise_t(self, plan, tgt, x2, delayed, state, common):
        """With the transposed copy: a ``transpose_tile`` tile a program, read once and held in
        registers (``_cast_tensor_t_reg_kernel``). Delayed: one amax slot a tile, then the state
        update; current: the amax pass first (atomic max), the kernel writes the scale."""
        t, dev = self.tuning, x2.device
        R, C = x2.shape
        br, bc = t.transpose_tile
        br, bc = min(br, next_pow2(R)), min(bc, next_pow2(C))
        n_tiles = cdiv(R, br) * cdiv(C, bc)
        warps = t.reg_tile_warps(br * bc)
        opts = dict(enable_fp_fusion=False, num_warps=warps, **maxnreg(t.transpose_maxnreg if warps in (4, 8) else None))
        fmt_args = {k: common[k] for k in ("FMAX", "EMIN", "MBITS", "IS_E4M3", "HW_CVT")}
        cast = Launch(_kt._cast_tensor_t_reg_kernel, (n_tiles,), IN_BF16=common["IN_BF16"], BR=br, BC=bc,
                      DELAYED=delayed, AMAX_BLOCK=1, **fmt_args, **opts)
        geo = (R, C, *x2.stride(), *plan.q2_stride)
        if delayed:
            update = self._delayed_update(state, n_tiles)

            def run(x2a, q2, st):
                qt = plan.new_qt()
                amax = _fp32(dev, n_tiles)
                cast(x2a, q2, qt, st.scale, amax, *geo, n_tiles)
                return update(st, amax), qt
        else:  # the amax pass over tiles of the grid-stride geometry of amax_t_tile
            tr, tc = t.amax_t_tile_interpreted if tgt.interpreted else t.amax_t_tile
            abc = min(tc, next_pow2(C))
            abr = max(1, min(tr, next_pow2(R)))
            n_c = cdiv(C, abc)
            a_tiles = cdiv(R, abr) * n_c
            a_opts = dict(t.opts(abr * abc), num_warps=t.amax_t_warps, **maxnreg(t.amax_t_maxnreg))
            programs = min(a_tiles, t.programs(tgt.sms, a_opts["num_warps"]))
            amax_k = Launch(_kt._amax_kernel, (programs,), IN_BF16=common["IN_BF16"], AMAX_SLOTS=False,
                            REVERSE=t.amax_reverse, FLAT=False, BLOCK_R=abr, BLOCK_C=abc, PREFETCH=True, AMAX_VEC=1,
                            **a_opts)

            def run(x2a, q2, st):
                qt = plan.new_qt()
                scale, amax = _fp32(dev), torch.zeros((), dtype=torch.float32, device=dev)
                amax_k(x2a, amax, R, C, *x2.stride(), n_c, a_tiles)
                cast(x2a, q2, qt, scale, amax, *geo, 1)
                return scale, qt
        plan.body = run

    def _delayed_update(self, state, n_amax: int):
        """``update(st, amax)``: ``st.update(max of the n_amax slots)`` in one launch, returning a
        copy of the scale from before the update (the one the cast used). A subclass that
        overrides ``update``, or a history that is not a contiguous fp32 vector, gets its own
        method."""
        hist = state.amax_history
        if type(state).update is not DelayedScalingState.update or not (hist.is_contiguous() and hist.dim() == 1
                                                                         and hist.dtype == torch.float32):
            def update(st, amax):
                used = st.scale.detach().clone()
                st.update(amax.reshape(()) if n_amax == 1 else amax.max())
                return used
            return update
        r = state.recipe
        block = min(self.tuning.amax_reduce_block, next_pow2(n_amax))
        L = hist.numel()
        k = Launch(_kt._delayed_update_kernel, (1,), FMAX=state.fmt.max, MARGIN_MUL=2.0 ** r.margin,
                   MOST_RECENT=r.amax_algo == "most_recent", BLOCK=max(2, next_pow2(L)), AMAX_BLOCK=block,
                   num_warps=1 if block <= 256 else 4)

        def update(st, amax):
            used = torch.empty((), dtype=torch.float32, device=amax.device)
            k(amax, st.amax_history, st.scale, used, L, n_amax)
            return used
        return update

    # rowwise ------------------------------------------------------------------------------------
    def _rowwise(self, plan, tgt, x2, common):
        t, dev = self.tuning, x2.device
        R, C = x2.shape
        local = next_pow2(C) <= t.rowlocal_max_cols
        if plan.transposed:
            if local:
                self._rowwise_t_split(plan, tgt, x2, common)
            else:
                self._rowwise_t_sweep(plan, tgt, x2, common)
            return
        if local:
            body = self._rowlocal(tgt, x2, plan.q2_stride, next_pow2(C), 1, plan.q_flat,
                                  dict(common, MX=False, RCEIL=False, ELEM_EMAX=0, LOG2_FMAX=0), (R,))
            plan.body = lambda x2a, q2, st: (body(x2a, q2), None)
            return
        bc = min(1024, next_pow2(C))
        br = max(1, min(t.tile(tgt.interpreted) // bc, next_pow2(R)))
        cast = Launch(_kr._cast_rows_kernel, (cdiv(R, br),), BLOCK_R=br, BLOCK_C=bc, **common, enable_fp_fusion=False,
                      num_warps=t.warps(br * bc))
        geo = (R, C, *x2.stride(), *plan.q2_stride)

        def run(x2a, q2, st):
            scale = _fp32(dev, R)
            cast(x2a, q2, scale, *geo)
            return scale, None
        plan.body = run

    def _rowwise_amax(self, tgt, x2, common, row_slots: bool, reverse: bool):
        """``_rowwise_t_amax2d_kernel``: (launch, slot rows, slot shapes) for programs of
        ``rowwise_t_amax_tile``."""
        R, C = x2.shape
        prog_r, sub_r, tc = self.tuning.rowwise_t_amax_tile
        sub_r, tc = min(sub_r, next_pow2(R)), min(tc, next_pow2(C))
        prog_r = max(sub_r, min(prog_r, next_pow2(R)))
        pr, pc = cdiv(R, prog_r), cdiv(C, tc)
        k = Launch(_kr._rowwise_t_amax2d_kernel, (pr * pc,), IN_BF16=common["IN_BF16"], PROG_R=prog_r, SUB_R=sub_r,
                   TILE_C=tc, ROW_SLOTS=row_slots, REVERSE=reverse, num_warps=max(1, min(8, sub_r * tc // 256)))
        return k, pr, pc

    def _rowwise_t_sweep(self, plan, tgt, x2, common):
        """Rows longer than ``rowlocal_max_cols``: row and column partial-amax slots, row and
        column scales from the slots, then the sweep cast writing both copies."""
        t, dev = self.tuning, x2.device
        R, C = x2.shape
        amax_k, pr, pc = self._rowwise_amax(tgt, x2, common, True, False)
        bn = min(256, next_pow2(max(R, C)))
        scales_k = Launch(_kr._rowwise_t_scales_kernel, (cdiv(R, bn) + cdiv(C, bn),), BLOCK_P=8, BLOCK_N=bn,
                          FMAX=common["FMAX"], enable_fp_fusion=False, num_warps=4)
        prog_r, sub_r = t.rowwise_t_sweep_rows
        tc = min(t.rowwise_t_sweep_cols, next_pow2(C))
        sub_r = min(sub_r, next_pow2(R))
        prog_r = max(sub_r, min(prog_r, next_pow2(R)))
        fmt_args = {k: common[k] for k in ("FMAX", "EMIN", "MBITS", "IS_E4M3", "HW_CVT")}
        cast = Launch(_kr._cast_rowwise_t_sweep_kernel, (cdiv(R, prog_r) * cdiv(C, tc),), IN_BF16=common["IN_BF16"],
                      PROG_R=prog_r, SUB_R=sub_r, TILE_C=tc, **fmt_args, enable_fp_fusion=False,
                      num_warps=t.t_sweep_warps(sub_r * tc))
        strides = (*x2.stride(), *plan.q2_stride)

        def run(x2a, q2, st):
            qt = plan.new_qt()
            scale, ys_r, st_, ys_c = _fp32(dev, R), _fp32(dev, R), _fp32(dev, C), _fp32(dev, C)
            cslot = torch.empty((pr, C), dtype=torch.int32, device=dev)
            rslot = torch.empty((pc, R), dtype=torch.int32, device=dev)
            amax_k(x2a, rslot, cslot, R, C, *x2.stride())
            scales_k(rslot, cslot, scale, ys_r, st_, ys_c, R, C, pr, pc)
            cast(x2a, scale, ys_r, st_, ys_c, q2, qt, R, C, *strides)
            return (scale, st_), qt
        plan.body = run

    def _rowwise_t_split(self, plan, tgt, x2, common):
        """Column amax slots, column scales, x's copy by the row-local rowwise cast, then the
        transposed copy alone (``_cast_cols_t_kernel`` with the column scales given)."""
        t, dev = self.tuning, x2.device
        R, C = x2.shape
        amax_k, pr, _ = self._rowwise_amax(tgt, x2, common, False, t.cols_t_reverse)
        bn = min(256, next_pow2(C))
        scales_k = Launch(_kr._rowwise_t_scales_kernel, (cdiv(C, bn),), BLOCK_P=8, BLOCK_N=bn, FMAX=common["FMAX"],
                          enable_fp_fusion=False, num_warps=4)
        row_cast = self._rowlocal(tgt, x2, plan.q2_stride, next_pow2(C), 1, plan.q_flat,
                                  dict(common, MX=False, RCEIL=False, ELEM_EMAX=0, LOG2_FMAX=0), (R,))
        cols = self._cols_t(tgt, x2, 1, t.cols_t_rows, True, common)

        def run(x2a, q2, st):
            qt = plan.new_qt()
            st_, ys_c = _fp32(dev, C), _fp32(dev, C)
            cslot = torch.empty((pr, C), dtype=torch.int32, device=dev)
            amax_k(x2a, cslot, cslot, R, C, *x2.stride())
            scales_k(cslot, cslot, st_, ys_c, st_, ys_c, 0, C, pr, 1)
            scale = row_cast(x2a, q2)
            cols(x2a, qt, st_, ys_c)
            return (scale, st_), qt
        plan.body = run

    def _cols_t(self, tgt, x2, n_stc: int, rows_: int, given: bool, common):
        """``qt`` alone by ``_cast_cols_t_kernel``: tiles of ``rows_`` x ``cols_t_cols`` (``rows_``
        the block height, or ``cols_t_rows`` with the scales ``given``)."""
        t = self.tuning
        R, C = x2.shape
        tc = min(t.cols_t_cols, next_pow2(C))
        rows_ = min(rows_, next_pow2(R)) if given else rows_
        warps = t.cols_t_warps(rows_ * tc)
        fmt_args = {k: common[k] for k in ("FMAX", "EMIN", "MBITS", "IS_E4M3", "HW_CVT")}
        k = Launch(_kc._cast_cols_t_kernel, (cdiv(R, rows_) * cdiv(C, tc),), IN_BF16=common["IN_BF16"], BR=rows_,
                   TILE_C=tc, SUB_R=min(rows_, t.cols_t_slice_rows), GIVEN=given, REVERSE=t.cols_t_reverse, **fmt_args,
                   enable_fp_fusion=False, num_warps=warps)
        strides = x2.stride()
        return lambda x2a, qt, st, ysc: k(x2a, qt, st, ysc, R, C, *strides, n_stc)

    # blocks -------------------------------------------------------------------------------------
    def _rowlocal(self, tgt, x2, q2_stride, bc: int, n_sc: int, q_flat: bool, common, shape, sdt=torch.float32):
        """``cast(x2a, q2) -> scale``: the row-local walk (``_cast_rowblock_kernel``), groups of
        ``bc`` elements, ``n_sc`` a row (rowwise: one, ``bc >= C``), ``scale[g]`` for group g, in
        a new tensor of ``shape`` (``sdt``: fp32, or uint8 E8M0 codes for MX)."""
        t, dev = self.tuning, x2.device
        R, C = x2.shape
        n_groups, tr, n_tiles, warps, grid = rowlocal_grid(t, tgt, R, bc, n_sc)
        flat = x2.is_contiguous() and q_flat and C % bc == 0
        k = Launch(_kl._cast_rowblock_kernel, grid, FLAT=flat, TR=tr, BC=bc, PREFETCH=t.rowlocal_prefetch,
                   FINITE=t.rowlocal_finite_tiles, **dict(common, FAST_DIV=t.fast_div), enable_fp_fusion=False,
                   num_warps=warps, **maxnreg(t.rowlocal_maxnreg))
        geo = (R, C, *x2.stride(), *q2_stride, n_sc, n_groups, n_tiles)

        def cast(x2a, q2):
            scale = torch.empty(shape, dtype=sdt, device=dev)
            k(x2a, q2, scale, *geo)
            return scale
        return cast

    def _blocks(self, plan, tgt, x2, recipe, fmt, block, common):
        """Blockwise / MX. 1xBC (BC >= 16): the row-local walk (and, with the transposed copy, the
        column-only cast); BxB with the transposed copy: a block a program; else
        ``_cast_blocks_kernel`` in one pass over x: a program's tile holds whole blocks of both
        copies and is worked through in chunks of ~``tile_elems``; only the tallest blocks
        (128x128, or the 128x1 blocks of a transposed 1x128 copy) may be taller than a chunk;
        with no block taller than a chunk, a tile is ``block_chunks`` chunks tall."""
        t, dev = self.tuning, x2.device
        R, C = x2.shape
        mx = type(recipe) is MX
        tblock = block.t()
        transposed = plan.transposed
        rowlocal = dict(common, MX=mx, RCEIL=mx and recipe.scale_rule == "rceil", ELEM_EMAX=fmt.emax,
                        LOG2_FMAX=math.frexp(fmt.max)[1] - 1)
        sdt = torch.uint8 if mx else torch.float32  # MX: E8M0 codes
        if transposed and not mx and block.rows == 1 and block.cols >= 16:
            bc = block.cols
            n_sc, n_stc = cdiv(C, bc), cdiv(R, bc)
            row_cast = self._rowlocal(tgt, x2, plan.q2_stride, bc, n_sc, plan.q_flat, rowlocal, (R, n_sc))
            cols = self._cols_t(tgt, x2, n_stc, bc, False, common)

            def run(x2a, q2, st):
                qt = plan.new_qt()
                scale = row_cast(x2a, q2)
                stt = _fp32(dev, C, n_stc)
                cols(x2a, qt, stt, stt)
                return (scale, stt), qt
            plan.body = run
            return
        if transposed and not mx and block.rows == block.cols == tblock.rows == tblock.cols > 1:
            b = block.rows
            n_sc, n_stc = cdiv(C, b), cdiv(R, b)
            warps = t.reg_tile_warps(b * b)
            fmt_args = {k: common[k] for k in ("FMAX", "EMIN", "MBITS", "IS_E4M3", "HW_CVT")}
            k = Launch(_kb._cast_square_t_reg_kernel, (n_stc * n_sc,), IN_BF16=common["IN_BF16"], B=b, **fmt_args,
                       enable_fp_fusion=False, num_warps=warps, **maxnreg(t.square_t_maxnreg if warps == 8 else None))
            geo = (R, C, *x2.stride(), *plan.q2_stride, n_sc, n_stc)

            def run(x2a, q2, st):
                qt = plan.new_qt()
                scale, stt = _fp32(dev, n_stc, n_sc), _fp32(dev, n_sc, n_stc)
                k(x2a, q2, scale, qt, stt, *geo)
                return (scale, stt), qt
            plan.body = run
            return
        if not transposed and block.rows == 1 and block.cols >= 16:
            n_sc = cdiv(C, block.cols)
            cast = self._rowlocal(tgt, x2, plan.q2_stride, block.cols, n_sc, plan.q_flat, rowlocal, (R, n_sc), sdt)
            plan.body = lambda x2a, q2, st: (cast(x2a, q2), None)
            return
        common = dict(common, FAST_DIV=False)  # div.rn.f32 here: fewer registers than the fast division
        heights = {block.rows, tblock.rows if transposed else 1}
        elems = t.tile(tgt.interpreted)
        tc = max(block.cols, tblock.cols if transposed else 1, min(elems // 32, next_pow2(C)))
        chunk = max([min(elems // tc, next_pow2(R))]
                    + [h for h in heights if h < max(heights)])  # all but the tallest blocks fit a chunk
        tr = max(max(heights), chunk)
        if tr == chunk:  # no tall blocks: a program may take several chunks
            tr = chunk * max(1, min(t.block_chunks, cdiv(R, chunk)))
        n_sc, n_stc = cdiv(C, block.cols), cdiv(R, tblock.rows)
        k = Launch(_kb._cast_blocks_kernel, (cdiv(R, tr) * cdiv(C, tc),), WRITE_T=transposed, BR=block.rows,
                   BC=block.cols, TBR=tblock.rows, TBC=tblock.cols, TILE_R=tr, TILE_C=tc, CHUNK_R=chunk, MX=mx,
                   RCEIL=mx and recipe.scale_rule == "rceil", ELEM_EMAX=fmt.emax, LOG2_FMAX=math.frexp(fmt.max)[1] - 1,
                   **common, **t.opts(chunk * tc))
        geo = (R, C, *x2.stride(), *plan.q2_stride, n_sc, n_stc)
        s_shape, st_shape = (cdiv(R, block.rows), n_sc), (cdiv(C, tblock.cols), n_stc)

        def run(x2a, q2, st):
            qt = plan.new_qt() if transposed else q2
            scale = torch.empty(s_shape, dtype=sdt, device=dev)
            stt = torch.empty(st_shape, dtype=sdt, device=dev) if transposed else scale
            k(x2a, q2, scale, qt, stt, *geo)
            return (scale, stt) if transposed else scale, qt if transposed else None
        plan.body = run


class _Plan:
    """One cast: output allocation, the launches (``body``), the FP8Tensor(s) built from them."""

    __slots__ = ("body", "transposed", "fmt_dtype", "block", "dtype", "s_shape", "st_shape", "qt_shape", "q2_stride",
                 "q_contiguous", "q_flat", "device", "tensorwise")

    def __init__(self, x, fmt, block, transposed):
        self.transposed, self.fmt_dtype, self.block = transposed, fmt.torch_dtype, block
        self.dtype, self.device = x.dtype, x.device
        q = self.new_q(x.to("meta") if x.device.type != "meta" else x)
        q2 = rows(q)
        self.q2_stride, self.q_contiguous = q2.stride(), q2.is_contiguous()
        self.q_flat = self.q_contiguous
        self.s_shape = block.scale_shape(x.shape)
        R, C = rows(x).shape if x.dim() else (1, 1)
        self.st_shape = block.scale_shape((C, R))
        self.qt_shape = (C, R)
        self.tensorwise = block.is_tensorwise
        self.body = None

    def new_q(self, x):
        """q keeps x's memory layout (as the reference's elementwise ops); N-D data is contiguous."""
        if x.dim() <= 2:
            return torch.empty_like(x, dtype=torch.uint8)
        return torch.empty(x.shape, dtype=torch.uint8, device=x.device)

    def new_qt(self):
        return torch.empty(self.qt_shape, dtype=torch.uint8, device=self.device)

    def __call__(self, x, state):
        x = x.detach()
        q = self.new_q(x)
        scales, qt = self.body(arg(rows(x)), rows(q), state)
        data = q.view(self.fmt_dtype)
        if not self.transposed:
            return FP8Tensor(data, _scale(scales, self.s_shape), self.block, self.dtype)
        scale, st = scales if isinstance(scales, tuple) else (scales, scales)
        out = FP8Tensor(data, _scale(scale, self.s_shape), self.block, self.dtype)
        st = out._scale if self.tensorwise else _scale(st, self.st_shape)  # tensorwise: one shared scale
        return out, FP8Tensor(qt.view(self.fmt_dtype), st, self.block, self.dtype)


def _scale(s, shape):
    s = s.reshape(shape)
    return s.view(torch.float8_e8m0fnu) if s.dtype == torch.uint8 else s
