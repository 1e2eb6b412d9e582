"""Launchers of the fused quantize kernels: the ``quantize_*`` hooks of the ``"triton"`` backend.

Each entry point returns exactly what ``lowbit.kernels.cast``'s reference path returns (same
data and scale bits, shapes and dtypes, same DelayedScalingState update), or None to decline:

* ``quantize_fp8_triton(x, recipe, role, state)``: Delayed (scale from ``state``, amax fused into
  the cast, then ``state.update(amax)``), Current (amax kernel, then the cast), Rowwise (one pass:
  a program owns whole rows), Blockwise 1x128 / 128x128 and MX with FP8 elements (one pass).
* ``quantize_fp8_t_triton(x, recipe, role, state)``: ``(q, q_t)`` as ``cast.quantize_fp8_t``:
  the row-major copy and the contiguous transposed copy (tensorwise: one scale, both copies from
  one read of each tile; Rowwise: row and column scales, after a column amax pass; blocks: each
  copy with its own block scales). 1xBC blocks and Rowwise write x's copy with the row-local cast
  and the transposed copy with ``quantize_fp8_cols_t_kernels`` (``block_t_split`` /
  ``rowwise_t_split``), or both from the sweep kernels of ``quantize_fp8_transpose_kernels`` /
  ``quantize_fp8_rowwise_t_kernels``.

The FP4 casts (``quantize_fp4_triton``) are launched by ``quantize_fp4_launch``, and the FP8 casts with
the transposed copy other than the tensorwise grid-stride one by ``quantize_t_launch``, with the
helpers here.

Declined: devices other than CUDA, and CPU unless ``TRITON_INTERPRET=1`` now (read at each call)
and the kernels were defined under it (``@triton.jit`` decides at definition); dtypes other than
fp16/bf16/fp32; empty tensors; recipe types other than the built-in ones; blocks that are not
powers of two up to 128; 2-D blocks on tensors of more than two dims; inputs the reference rejects
(it then raises its error). FP8 data keeps the memory layout of a 1-D/2-D x (as the reference's
elementwise ops do); scales, FP4 data and the data of N-D inputs are contiguous.

Launch choices (tiles of ~4096 elements, 8-16 per thread; grid-stride programs where an amax is
reduced; the fast exact division; amax slots instead of a zero-filled atomic target) are the
functions of ``quantize_policy``, read at each launch; ``benchmarks/quantize.py --sweep`` checks
and times the alternatives.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..dtypes.fp8_tensor import FP8Tensor
from ..scaling.recipes import MX, ROLES, Blockwise, Current, Delayed, Rowwise
from . import quantize_fp4_kernels as _k4
from . import quantize_fp4_pairs_kernels as _k4p
from . import quantize_fp8_block_kernels as _k8b
from . import quantize_fp8_cols_t_kernels as _k8c
from . import quantize_fp8_rowblock_kernels as _k8g
from . import quantize_fp8_rowwise_t_kernels as _k8r
from . import quantize_fp8_tensor_row_kernels as _k8t
from . import quantize_fp8_transpose_kernels as _k8x
from . import quantize_policy as policy
from . import quantize_t_launch as _tl
from .interpret import interpreting
from .launch_math import cdiv, next_pow2

__all__ = ["quantize_fp8_triton", "quantize_fp8_t_triton", "SCAN_SPECS"]

SCAN_SPECS = (_k8t.SCAN_SPECS + _k8b.SCAN_SPECS + _k8x.SCAN_SPECS + _k8r.SCAN_SPECS + _k8c.SCAN_SPECS
              + _k8g.SCAN_SPECS + _k4.SCAN_SPECS + _k4p.SCAN_SPECS)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_IN_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


# ---- machine and launch policy (``quantize_policy``: one function per choice, read at each launch) ----

_interpreting = interpreting
_interpreted = policy.interpreted


def _runnable(x) -> bool:
    """CUDA; or CPU when TRITON_INTERPRET is set now and the kernels are interpreted ones."""
    return x.device.type == "cuda" or (x.device.type == "cpu" and _interpreting() and _interpreted())


def _accepts(x) -> bool:
    return (isinstance(x, torch.Tensor) and x.dtype in _DTYPES and x.dim() >= 1 and x.numel() > 0
            and _runnable(x))


def _pow2_block(n: int) -> bool:
    return 1 <= n <= 128 and n & (n - 1) == 0


def _rows(x):
    """x as a (R, C) tensor: 1-D is one row; lead dims fold into rows (a copy if not viewable)."""
    if x.dim() == 1:
        return x.unsqueeze(0)
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def _arg(x2):
    return x2.view(torch.int16) if x2.dtype == torch.bfloat16 else x2


def _fmt_consts(fmt) -> dict:
    """The element format's constexprs."""
    return dict(FMAX=fmt.max, EMIN=fmt.emin, MBITS=fmt.mbits, IS_E4M3=fmt.name == "e4m3")


def _tile(x, R: int, C: int, max_c: int = 256):
    """(BLOCK_R, BLOCK_C) of an elementwise tile: rows of up to ``max_c`` columns, ~``tile_elems``."""
    bc = min(max_c, next_pow2(C))
    return max(1, min(policy.tile_elems(x) // bc, next_pow2(R))), bc


def _tile_t(x, R: int, C: int):
    """Tile of the casts that also write the transposed copy: ``policy.transpose_tile`` (rows x
    columns, at most), clipped to the tensor."""
    max_r, max_c = policy.transpose_tile(x)
    bc = min(max_c, next_pow2(C))
    return max(1, min(max_r, next_pow2(R))), bc


# ---- FP8 ---------------------------------------------------------------------------------------

def _fp8_plan(x, recipe, role, state, transposed: bool):
    """(kind, fmt, block q, block qt in x coords) or None."""
    from ..scaling.delayed import DelayedScalingState
    if not _accepts(x) or role not in ROLES or (transposed and x.dim() != 2):
        return None
    kinds = {Delayed: "delayed", Current: "current", Rowwise: "rowwise", Blockwise: "blocks", MX: "blocks"}
    kind = kinds.get(type(recipe))  # exact types: a subclass may change the math
    if kind is None or getattr(recipe, "kind", None) != "fp8":
        return None
    if kind == "delayed" and not (isinstance(state, DelayedScalingState) and state.scale.device == x.device):
        return None
    fmt, block = recipe.format(role), recipe.granularity(role)
    if fmt.name not in ("e4m3", "e5m2"):  # e.g. MX(grad_elem="e2m1"): the reference raises
        return None
    if kind == "blocks":
        if not (_pow2_block(block.rows) and _pow2_block(block.cols)) or (block.rows > 1 and x.dim() > 2):
            return None
    return kind, fmt, block, block.t()


def _flat_tiles(x2, elems: int):
    """(BLOCK_R, BLOCK_C, tiles) of a walk over contiguous ``x2`` as a flat array: consecutive
    chunks of ``BLOCK_R x BLOCK_C`` (<= 512 columns, ~``elems``) elements."""
    n = x2.numel()
    bc = min(512, next_pow2(n))
    br = max(1, min(elems, next_pow2(n)) // bc)
    return br, bc, cdiv(n, br * bc)


def _fp32(x, *shape):
    return torch.empty(shape, dtype=torch.float32, device=x.device)


def _fp8_tensorwise(x2, q2, qt, kind, state, transposed, common):
    """Delayed: one pass (cast with the state's scale + amax), then the state update
    (``_delayed_update``). Current: the amax kernel, then the cast with ``amax_to_scale(amax)``.
    The amax goes to one slot a program (``quantize_policy.*_amax_slots``) or, by atomic max, to a
    zero-filled scalar. Non-transposed contiguous x is walked as a flat array (``FLAT``, the
    ``stream_*`` geometry). With the transposed copy and ``transpose_one_read`` the cast is
    ``quantize_t_launch._fp8_tensor_t_one_read``'s. Returns the scale."""
    delayed = kind == "delayed"
    one_read = transposed and policy.transpose_one_read()
    if one_read and delayed:  # no amax pass; the cast's own amax slots
        return _tl._fp8_tensor_t_one_read(x2, q2, qt, None, None, 0, state, common)
    R, C = x2.shape
    flat = not transposed and x2.is_contiguous() and q2.is_contiguous()
    if flat:
        (br, bc, n_tiles), n_c = _flat_tiles(x2, policy.stream_elems(x2)), 1
        opts = dict(enable_fp_fusion=False, num_warps=policy.stream_warps(br * bc))
        programs = min(n_tiles, policy.stream_programs(x2, opts["num_warps"]))
        prefetch = policy.stream_prefetch()
        # 16+ elements a thread: the amax accumulator takes the max of each 8-vector first
        vec = 8 if br * bc >= 16 * 32 * opts["num_warps"] and bc % 8 == 0 else 1
    else:
        br, bc = _tile_t(x2, R, C) if transposed else _tile(x2, R, C)
        n_c = cdiv(C, bc)
        n_tiles = cdiv(R, br) * n_c
        opts, prefetch = policy.opts(br * bc), False
        if transposed:
            warps = policy.transpose_warps(br * bc)
            opts = dict(opts, num_warps=warps, **_maxnreg(policy.transpose_maxnreg(warps)))
            prefetch = policy.transpose_prefetch()
        programs = min(n_tiles, policy.max_programs(x2, br * bc, opts["num_warps"]))
        vec = 1
    slots = policy.delayed_amax_slots() if delayed else policy.current_amax_slots()
    walk = dict(FLAT=flat, BLOCK_R=br, BLOCK_C=bc, PREFETCH=prefetch, AMAX_VEC=vec, **opts)
    if delayed:
        scale = state.scale  # read by the cast before the update below replaces it (stream order)
        n_amax = programs if slots else 1
    else:
        scale = _fp32(x2)
        n_amax = policy.current_amax_programs(x2, programs) if slots else 1
    amax = _fp32(x2, n_amax) if slots else torch.zeros((), dtype=torch.float32, device=x2.device)
    if not delayed:
        _k8t._amax_kernel[(n_amax if slots else programs,)](_arg(x2), amax, R, C, *x2.stride(), n_c, n_tiles,
                                                           IN_BF16=common["IN_BF16"], AMAX_SLOTS=slots,
                                                           REVERSE=policy.amax_reverse_walk(), **walk)
    if one_read:  # current scaling, after the amax pass
        return _tl._fp8_tensor_t_one_read(x2, q2, qt, scale, amax, n_amax, None, common)
    _k8t._cast_tensor_kernel[(programs,)](
        _arg(x2), q2, qt, scale, amax, R, C, *x2.stride(), *q2.stride(), n_c, n_tiles, n_amax, DELAYED=delayed,
        WRITE_T=transposed, AMAX_SLOTS=delayed and slots, AMAX_BLOCK=1 if delayed else _amax_block(n_amax),
        **common, **walk)
    if delayed:
        scale = _delayed_update(state, amax, n_amax)
    return scale, scale


def _amax_block(n: int) -> int:
    """``AMAX_BLOCK`` of a reduction of n amax slots (``_get_amax`` loops over blocks of it)."""
    return min(policy.amax_reduce_block(), next_pow2(n))


def _delayed_update(state, amax, n_amax: int):
    """``state.update(max of the n_amax values of amax)`` (one launch instead of a dozen small torch
    ops); returns a copy of the scale from before the update, the one the cast used. A subclass
    that overrides ``update`` gets its own method."""
    from ..scaling.delayed import DelayedScalingState
    hist = state.amax_history
    if type(state).update is not DelayedScalingState.update or not (hist.is_contiguous() and hist.dim() == 1
                                                                     and hist.dtype == torch.float32):
        used = state.scale.detach().clone()
        state.update(amax.reshape(()) if n_amax == 1 else amax.max())
        return used
    used = _fp32(amax)
    r = state.recipe
    block = _amax_block(n_amax)
    _k8t._delayed_update_kernel[(1,)](amax, hist, state.scale, used, hist.numel(), n_amax, FMAX=state.fmt.max,
                                     MARGIN_MUL=2.0 ** r.margin, MOST_RECENT=r.amax_algo == "most_recent",
                                     BLOCK=max(2, next_pow2(hist.numel())), AMAX_BLOCK=block,
                                     num_warps=1 if block <= 256 else 4)
    return used


def _fp8_rowwise(x2, q2, qt, transposed, common):
    """Without the transposed copy: one pass (``_cast_rows_kernel``, a program per few whole rows;
    the ``stream_*`` geometry). With it: ``_fp8_rowwise_t_tiles`` (``rowwise_t_tiles``), or row
    and column amax by the atomic amax kernel, then ``_cast_rowwise_kernel``.
    Returns (row scales, column scales)."""
    R, C = x2.shape
    if not transposed and _rowlocal_rowwise(C):
        scale = _fp32(x2, R)
        _fp8_rowlocal(x2, q2, scale, next_pow2(C), 1, dict(common, MX=False, RCEIL=False, ELEM_EMAX=0,
                                                           LOG2_FMAX=0))
        return scale, scale
    if not transposed:
        bc = min(1024, next_pow2(C))
        br = max(1, min(policy.stream_elems(x2) // bc, next_pow2(R)))
        scale = _fp32(x2, R)
        _k8t._cast_rows_kernel[(cdiv(R, br),)](_arg(x2), q2, scale, R, C, *x2.stride(), *q2.stride(),
                                                     BLOCK_R=br, BLOCK_C=bc, **common, enable_fp_fusion=False,
                                                     num_warps=policy.rows_warps(br * bc))
        return scale, scale
    if policy.rowwise_t_split() and _rowlocal_rowwise(C):
        return _tl._fp8_rowwise_t_split(x2, q2, qt, common)
    if policy.rowwise_t_tiles():
        return _tl._fp8_rowwise_t_tiles(x2, q2, qt, common)
    # pass 1: row and column amax, programs of ~256 rows x 128 columns
    bc = min(128, next_pow2(C))
    br = max(1, min(policy.tile_elems(x2) // bc, next_pow2(R)))
    rows_per_prog = br * max(1, 256 // br)
    row_amax = torch.zeros(R, dtype=torch.float32, device=x2.device)
    col_amax = torch.zeros(C, dtype=torch.float32, device=x2.device)
    _k8t._row_col_amax_kernel[(cdiv(R, rows_per_prog) * cdiv(C, bc),)](
        _arg(x2), row_amax, col_amax, R, C, *x2.stride(), rows_per_prog, IN_BF16=common["IN_BF16"],
        BLOCK_R=br, BLOCK_C=bc, **policy.opts(br * bc))
    # pass 2: both casts; tiles of 128 x 64 so that a thread's column scales serve several rows
    bc = min(64, next_pow2(C))
    br = max(1, min(128, 2 * policy.tile_elems(x2) // bc, next_pow2(R)))
    scale, st = _fp32(x2, R), _fp32(x2, C)
    # the plain encode here: with the lean one this kernel's codes differed on the H200 (session 4
    # sweep; bit-exact under the interpreter, so a GPU-only difference, not yet found)
    _k8t._cast_rowwise_kernel[(cdiv(R, br) * cdiv(C, bc),)](
        _arg(x2), row_amax, col_amax, q2, scale, qt, st, R, C, *x2.stride(), *q2.stride(), WRITE_T=True,
        BLOCK_R=br, BLOCK_C=bc, **dict(common, LEAN=False), **dict(policy.opts(br * bc), num_warps=8))
    return scale, st


def _fp8_rowlocal(x2, q2, scale, bc: int, n_sc: int, common):
    """The row-local walk (``quantize_fp8_rowblock_kernels``): groups of ``bc`` elements, ``n_sc``
    a row (rowwise: one, ``bc >= C``), ``scale[g]`` for group g; tiles of ``rowlocal_elems``."""
    R, C = x2.shape
    n_groups, tr, n_tiles, warps, grid = _rowlocal_grid(x2, bc, n_sc)
    flat = x2.is_contiguous() and q2.is_contiguous() and C % bc == 0
    common = dict(common, FAST_DIV=policy.rowlocal_fast_div())
    _k8g._cast_rowblock_kernel[grid](
        _arg(x2), q2, scale, R, C, *x2.stride(), *q2.stride(), n_sc, n_groups, n_tiles, FLAT=flat, TR=tr, BC=bc,
        PREFETCH=policy.rowlocal_prefetch(), FINITE=policy.rowlocal_finite_tiles(), **common, enable_fp_fusion=False,
        num_warps=warps, **_maxnreg(policy.rowlocal_maxnreg(warps)))


def _rowlocal_grid(x2, bc: int, n_sc: int):
    """(groups, groups a tile, tiles, warps, grid) of a row-local walk over ``n_sc`` groups of ``bc``
    elements a row: tiles of ``rowlocal_elems``, ``rowlocal_programs`` grid-stride programs."""
    n_groups = x2.shape[0] * n_sc
    tr = max(1, min(policy.rowlocal_elems(x2) // bc, next_pow2(n_groups)))
    n_tiles = cdiv(n_groups, tr)
    warps = policy.rowlocal_warps(tr * bc)
    return n_groups, tr, n_tiles, warps, (min(n_tiles, policy.rowlocal_programs(x2, warps)),)


def _maxnreg(n) -> dict:
    """The ``maxnreg`` launch option (registers a thread at most), or nothing."""
    return {} if n is None else dict(maxnreg=n)


def _rowlocal_rowwise(C: int) -> bool:
    """The rowwise cast without a transposed copy goes by the row-local walk."""
    return policy.rowlocal_rows() and next_pow2(C) <= policy.rowlocal_max_cols()


def _fmt_args(common) -> dict:
    return {k: common[k] for k in ("FMAX", "EMIN", "MBITS", "IS_E4M3", "HW_CVT")}


def _fp8_blocks(x2, q2, qt, recipe, fmt, block, tblock, transposed, common):
    """Blockwise / MX in one pass over x. A program's tile holds whole blocks of both copies and is
    worked through in chunks of ~``tile_elems`` elements; only the tallest blocks (128x128, or the
    128x1 blocks of a transposed 1x128 copy) may be taller than a chunk. With no block taller than
    a chunk, a tile is ``block_chunks`` chunks tall. Returns both scales."""
    mx = type(recipe) is MX
    rowlocal = dict(common, MX=mx, RCEIL=mx and recipe.scale_rule == "rceil", ELEM_EMAX=fmt.emax,
                    LOG2_FMAX=math.frexp(fmt.max)[1] - 1)  # the row-local walk's arguments
    if transposed and not mx and block.rows == 1 and block.cols >= 16 and policy.block_t_split() \
            and policy.rowlocal_blocks():
        return _tl._fp8_block_t_split(x2, q2, qt, block.cols, common, rowlocal)
    if transposed and not mx and block.rows == 1 and block.cols >= 8 and policy.block_t_tiles():
        return _tl._fp8_block_t_tiles(x2, q2, qt, block, common)
    R, C = x2.shape
    if transposed and not mx and block.rows == block.cols == tblock.rows == tblock.cols > 1 \
            and _pow2_block(block.rows) and policy.square_t_kernel():
        return _tl._fp8_square_t(x2, q2, qt, block.rows, common)
    sdt = torch.uint8 if mx else torch.float32  # MX: E8M0 codes
    if not transposed and block.rows == 1 and block.cols >= 16 and policy.rowlocal_blocks():
        scale = torch.empty((R, cdiv(C, block.cols)), dtype=sdt, device=x2.device)
        _fp8_rowlocal(x2, q2, scale, block.cols, cdiv(C, block.cols), rowlocal)
        return (scale.view(torch.float8_e8m0fnu),) * 2 if mx else (scale, scale)
    common = dict(common, FAST_DIV=policy.blocks_fast_div())
    heights = {block.rows, tblock.rows if transposed else 1}
    elems = policy.tile_elems(x2)
    tc = max(block.cols, tblock.cols if transposed else 1, min(elems // 32, next_pow2(C)))
    chunk = max([min(elems // tc, next_pow2(R))]
                + [h for h in heights if h < max(heights)])  # all but the tallest blocks fit a chunk
    tr = max(max(heights), chunk)
    if tr == chunk:  # no tall blocks: a program may take several chunks
        tr = chunk * max(1, min(policy.block_chunks(), cdiv(R, chunk)))
    n_sc, n_stc = cdiv(C, block.cols), cdiv(R, tblock.rows)
    scale = torch.empty((cdiv(R, block.rows), n_sc), dtype=sdt, device=x2.device)
    st = torch.empty((cdiv(C, tblock.cols), n_stc), dtype=sdt, device=x2.device) if transposed else scale
    _k8b._cast_blocks_kernel[(cdiv(R, tr) * cdiv(C, tc),)](
        _arg(x2), q2, scale, qt, st, R, C, *x2.stride(), *q2.stride(), n_sc, n_stc, WRITE_T=transposed,
        BR=block.rows, BC=block.cols, TBR=tblock.rows, TBC=tblock.cols, TILE_R=tr, TILE_C=tc, CHUNK_R=chunk, MX=mx,
        RCEIL=mx and recipe.scale_rule == "rceil", ELEM_EMAX=fmt.emax, LOG2_FMAX=math.frexp(fmt.max)[1] - 1,
        **common, **policy.opts(chunk * tc))
    if mx:
        return scale.view(torch.float8_e8m0fnu), st.view(torch.float8_e8m0fnu)
    return scale, st


def _launch_fp8(x, recipe, role, state, transposed: bool):
    plan = _fp8_plan(x, recipe, role, state, transposed)
    if plan is None:
        return None
    kind, fmt, block, tblock = plan
    x = x.detach()
    x2 = _rows(x)
    R, C = x2.shape
    # q keeps x's memory layout (as the reference's elementwise ops); N-D data is contiguous
    q = torch.empty_like(x, dtype=torch.uint8) if x.dim() <= 2 else torch.empty(x.shape, dtype=torch.uint8,
                                                                                   device=x.device)
    q2 = _rows(q)
    qt = torch.empty((C, R), dtype=torch.uint8, device=x.device) if transposed else q2
    common = dict(IN_BF16=x.dtype == torch.bfloat16, HW_CVT=policy.hw_cvt(x), FAST_DIV=policy.fast_div(),
                  LEAN=policy.lean_cast(), **_fmt_consts(fmt))
    if kind in ("delayed", "current"):
        scale, st = _fp8_tensorwise(x2, q2, qt, kind, state, transposed, common)
    elif kind == "rowwise":
        scale, st = _fp8_rowwise(x2, q2, qt, transposed, common)
    else:
        scale, st = _fp8_blocks(x2, q2, qt, recipe, fmt, block, tblock, transposed, common)
    out = FP8Tensor(q.view(fmt.torch_dtype), scale.reshape(block.scale_shape(x.shape)), block, x.dtype)
    if not transposed:
        return out
    st = out._scale if block.is_tensorwise else st.reshape(block.scale_shape((C, R)))  # tensorwise: shared
    return out, FP8Tensor(qt.view(fmt.torch_dtype), st, block, x.dtype)


def quantize_fp8_triton(x: torch.Tensor, recipe, role: str = "input", state=None) -> Optional[FP8Tensor]:
    """Fused ``FP8Tensor.from_float(x, recipe, role, state)``, or None (module docstring)."""
    return _launch_fp8(x, recipe, role, state, transposed=False)


def quantize_fp8_t_triton(x: torch.Tensor, recipe, role: str = "input", state=None):
    """Fused ``cast.quantize_fp8_t``: ``(q, q_t)`` from one pass over ``x``, or None."""
    return _launch_fp8(x, recipe, role, state, transposed=True)
