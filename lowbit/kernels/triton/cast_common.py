"""What the FP8 and FP4 cast launchers share: input checks, the 2-D view, the target a plan is
made for, the row-local grid, and the plan cache.

A cast *plan* is made once per (recipe, role, shape, strides, dtype, device, 16-byte alignment,
transposed copy or not) and holds every launch decision (kernels, grids, constexprs, options,
output shapes), its ``runtime.Launch`` objects included; a call allocates the outputs and runs
the launches. ``PlanCache`` is the dict that owns them (one per backend, never module state).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from . import jit_common
from .runtime import cdiv, gpu, interpreting, next_pow2

__all__ = ["DTYPES", "IN_KIND", "pow2_block", "rows", "arg", "fmt_consts", "kernels_interpreted", "Target", "target",
           "rowlocal_grid", "PlanCache", "DECLINE"]

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
IN_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
DECLINE = None  # what a planner caches for a call it declines


def pow2_block(n: int) -> bool:
    return 1 <= n <= 128 and n & (n - 1) == 0


def rows(x):
    """x as a (R, C) tensor: 1-D is one row; lead dims fold into rows (a copy if not viewable)."""
    if x.dim() == 1:
        return x.unsqueeze(0)
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def arg(x2):
    """The kernel argument for x: bf16 goes in as its int16 bits."""
    return x2.view(torch.int16) if x2.dtype == torch.bfloat16 else x2


def fmt_consts(fmt) -> dict:
    """The element format's constexprs."""
    return dict(FMAX=fmt.max, EMIN=fmt.emin, MBITS=fmt.mbits, IS_E4M3=fmt.name == "e4m3")


def kernels_interpreted() -> bool:
    """The cast kernels, and triton's own jit helpers (``tl.max``), were defined under
    TRITON_INTERPRET=1: ``@triton.jit`` decides when it runs, so this cannot be switched later."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction
    return type(jit_common._load_f32).__name__ == "InterpretedFunction" and not isinstance(tl.max, JITFunction)


class Target:
    """Where a plan launches: ``sms`` (None under the interpreter: a few grid-stride programs),
    ``hw_cvt`` (the sm_89+ float8 cast instruction: the ``HW_CVT`` constexpr), ``interpreted``."""

    __slots__ = ("sms", "sm89", "interpreted")

    def __init__(self, sms: Optional[int], sm89: bool, interpreted: bool):
        self.sms, self.sm89, self.interpreted = sms, sm89, interpreted


def target(x: torch.Tensor) -> Optional[Target]:
    """The Target of a cast of ``x``, or None: CUDA; CPU when TRITON_INTERPRET is set now and the
    kernels are interpreted ones."""
    if x.device.type == "cuda":
        interp = kernels_interpreted()
        cap, sms = gpu(x.device.index or 0)
        return Target(sms, cap >= (8, 9) and not interp, interp)
    if x.device.type == "cpu" and interpreting() and kernels_interpreted():
        return Target(None, False, True)
    return None


def rowlocal_grid(tuning, tgt: Target, n_rows: int, bc: int, n_sc: int):
    """(groups, groups a tile, tiles, warps, grid) of a row-local walk over ``n_sc`` groups of
    ``bc`` elements a row: tiles of ``tile_elems``, grid-stride programs."""
    n_groups = n_rows * n_sc
    tr = max(1, min(tuning.tile(tgt.interpreted) // bc, next_pow2(n_groups)))
    n_tiles = cdiv(n_groups, tr)
    warps = tuning.rowlocal_warps(tr * bc)
    return n_groups, tr, n_tiles, warps, (min(n_tiles, tuning.programs(tgt.sms, warps)),)


def maxnreg(n) -> dict:
    """The ``maxnreg`` launch option (registers a thread at most), or nothing."""
    return {} if n is None else dict(maxnreg=n)


class PlanCache:
    """``key -> plan`` (or ``DECLINE``), filled by ``make(key)`` on a miss."""

    __slots__ = ("plans", "make")

    def __init__(self, make: Callable):
        self.plans: dict = {}
        self.make = make

    def get(self, key, *args):
        try:
            return self.plans[key]
        except KeyError:
            plan = self.plans[key] = self.make(*args)
            return plan
