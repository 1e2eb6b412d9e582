"""Scaling recipes: frozen dataclasses naming the element format and scale granularity per role.

Roles: ``"input"`` (activations, forward GEMM operand A), ``"weight"`` (operand B), ``"grad"``
(output gradient, the operand of dgrad and wgrad). Tensorwise and rowwise FP8 recipes default to
HYBRID (E4M3 forward, E5M2 gradients); Blockwise and MX use E4M3 for every role. Blocks run along
the contraction (K, the last) dimension of the forward operand.

Each recipe's ``scales(x, role, ...)`` gives the scales for its granularity (``scales.py``):

==============  =========================  ==============================================
recipe          granularity (input/weight/grad)  scale
==============  =========================  ==============================================
Delayed         tensor                     ``max(history) / fmax * 2^margin`` (module state)
Current         tensor                     ``amax / fmax``
Rowwise         1 x K per row              ``amax_row / fmax``
Blockwise       1x128 / 128x128 / 1x128    ``amax_block / fmax`` (fp32)
MX              1x32 (all roles)           E8M0 ``2^(floor(log2 amax) - emax_elem)`` (or rceil)
NV              1x16 (16x16 weight)        UE4M3 block x FP32 tensor scale
==============  =========================  ==============================================
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from ..dtypes.formats import Format, get_format
from .blocks import ROW, TENSOR, Block, block_amax, block_any
from .scales import MX_RULES, amax_to_scale, mx_scale, nv_block_scale, nv_global_scale

__all__ = ["ROLES", "Recipe", "FP8Recipe", "Delayed", "Current", "Rowwise", "Blockwise", "MX", "NV", "check_role"]

ROLES = ("input", "weight", "grad")


def check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    return role


def _check_fmt(name: str, allowed: tuple, recipe: str) -> None:
    if get_format(name).name not in allowed:
        raise ValueError(f"{recipe}: element format {name!r} not allowed here; use one of {allowed}")


@dataclass(frozen=True)
class Recipe:
    """Base class: a recipe names the element ``format(role)`` and the scale ``granularity(role)``."""

    kind = "fp8"  # "fp8" -> FP8Tensor, "fp4" -> FP4Tensor (E2M1 elements)

    def format(self, role: str) -> Format:
        raise NotImplementedError

    def granularity(self, role: str) -> Block:
        raise NotImplementedError

    def scales(self, x: torch.Tensor, role: str, amax: Optional[torch.Tensor] = None):
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class FP8Recipe(Recipe):
    """FP32 scales with one FP8 format per role (HYBRID by default).

    ``fast_accum_fwd``: the forward GEMM may keep one long tensor-core accumulation (Hopper's FP8
    MMA carries ~14 mantissa bits; relative error ~1e-3 at K = 4096, 3e-3 at K = 16384, against
    ~3e-2 from rounding the operands to E4M3), as TransformerEngine and torchao do by default;
    dgrad and wgrad (K = tokens) always promote to FP32 every 128 K. Exact backends (the torch
    emulation) ignore it; Blockwise always promotes (its scales change every 128 K)."""

    input_format: str = "e4m3"
    weight_format: str = "e4m3"
    grad_format: str = "e5m2"
    fast_accum_fwd: bool = True

    def __post_init__(self):
        for f in (self.input_format, self.weight_format, self.grad_format):
            _check_fmt(f, ("e4m3", "e5m2"), type(self).__name__)

    def format(self, role: str) -> Format:
        return get_format(getattr(self, f"{check_role(role)}_format"))

    def granularity(self, role: str) -> Block:
        check_role(role)
        return TENSOR

    def scales(self, x: torch.Tensor, role: str, amax: Optional[torch.Tensor] = None) -> torch.Tensor:
        """fp32 scales of ``granularity(role)``'s shape for ``x``; ``amax`` may be precomputed."""
        if amax is None:
            amax = block_amax(x, self.granularity(role))
        return amax_to_scale(amax, self.format(role))


@dataclass(frozen=True)
class Current(FP8Recipe):
    """Tensorwise scale from this tensor's own amax (no state)."""


@dataclass(frozen=True)
class Delayed(FP8Recipe):
    """Tensorwise scale from an amax history kept in a ``DelayedScalingState`` module.

    ``scale = A / fmax * 2^margin`` with ``A = max(history)`` (``"max"``) or the newest amax
    (``"most_recent"``); the tensor is cast with the scale in the state, then its amax is recorded.

    ``amax_init``: the training Linear's first cast of each tensor takes its scale from that
    tensor's own amax (current scaling once, torchao's ``enable_amax_init``), so step 0 is not cast
    with the placeholder scale 1 (E5M2 at scale 1 flushes gradients below 2^-16 to zero).
    ``False`` starts from scale 1, as TransformerEngine does.
    """

    history_len: int = 16
    margin: int = 0
    amax_algo: str = "max"
    amax_init: bool = True

    def __post_init__(self):
        super().__post_init__()
        if self.history_len < 1:
            raise ValueError(f"Delayed.history_len must be >= 1, got {self.history_len}")
        if self.amax_algo not in ("max", "most_recent"):
            raise ValueError(f"Delayed.amax_algo must be 'max' or 'most_recent', got {self.amax_algo!r}")

    def scales(self, x, role, amax=None):
        raise TypeError("Delayed scaling reads its scale from a DelayedScalingState "
                        "(lowbit.scaling.DelayedScalingState); pass state= to from_float")


@dataclass(frozen=True)
class Rowwise(FP8Recipe):
    """One scale per row along K (``amax_row / fmax``)."""

    def granularity(self, role):
        check_role(role)
        return ROW


@dataclass(frozen=True)
class Blockwise(FP8Recipe):
    """DeepSeek-V3 style: 1x128 activation/gradient tiles, 128x128 weight blocks, fp32 scales.

    E4M3 for every role, gradients included (DeepSeek-V3; TransformerEngine's
    ``Float8BlockScaling`` default): with one scale per 128 elements a block's dynamic range is
    small, so E5M2's extra exponent buys nothing and E4M3's extra mantissa bit halves the
    rounding error of dgrad/wgrad operands. ``grad_format="e5m2"`` gives HYBRID."""

    grad_format: str = "e4m3"
    act: Tuple[int, int] = (1, 128)
    weight: Tuple[int, int] = (128, 128)

    def __post_init__(self):
        super().__post_init__()
        for name, v in (("act", self.act), ("weight", self.weight)):
            if len(tuple(v)) != 2:
                raise ValueError(f"Blockwise.{name} must be (rows, cols), got {v!r}")
            Block(*v)  # ValueError unless each size is a positive int or -1

    def granularity(self, role):
        return Block(*self.weight) if check_role(role) == "weight" else Block(*self.act)


@dataclass(frozen=True)
class MX(Recipe):
    """OCP MX: ``block`` elements along K share an E8M0 scale (``scale_rule`` floor or rceil)."""

    block: int = 32
    elem: str = "e4m3"
    scale_rule: str = "floor"
    grad_elem: Optional[str] = None  # defaults to ``elem``

    def __post_init__(self):
        _check_fmt(self.elem, ("e4m3", "e5m2", "e2m1"), "MX")
        if self.grad_elem is not None:
            _check_fmt(self.grad_elem, ("e4m3", "e5m2", "e2m1"), "MX")
        if self.scale_rule not in MX_RULES:
            raise ValueError(f"MX.scale_rule must be one of {MX_RULES}, got {self.scale_rule!r}")
        if self.block <= 0 or self.block % 2:
            raise ValueError(f"MX.block must be a positive even number, got {self.block}")

    @property
    def kind(self):
        return "fp4" if self.elem == "e2m1" else "fp8"

    def format(self, role):
        if check_role(role) == "grad" and self.grad_elem is not None:
            return get_format(self.grad_elem)
        return get_format(self.elem)

    def granularity(self, role):
        check_role(role)
        return Block(1, self.block)

    def scales(self, x, role, amax=None):
        """Power-of-two fp32 scales (E8M0 values), NaN for a block holding NaN."""
        blk = self.granularity(role)
        if amax is None:
            amax = block_amax(x, blk)
        return mx_scale(amax, self.format(role), self.scale_rule, block_any(torch.isnan(x), blk))


@dataclass(frozen=True)
class NV(Recipe):
    """NVFP4: E2M1 elements, 16-element UE4M3 block scales times an FP32 tensor scale.

    ``weight_2d``: 16x16 weight blocks (one scale serves both the weight and its transpose);
    ``sr_grads``: stochastic rounding of gradients; ``hadamard_wgrad``: 16x16 random Hadamard
    transform on the wgrad operands (applied by ``lowbit.nn``).
    """

    block: int = 16
    weight_2d: bool = True
    sr_grads: bool = True
    hadamard_wgrad: bool = True

    kind = "fp4"

    def __post_init__(self):
        if self.block != 16:
            raise ValueError(f"NV blocks are 16 elements (UE4M3 scale range), got {self.block}")

    def format(self, role):
        check_role(role)
        return get_format("e2m1")

    def granularity(self, role):
        if check_role(role) == "weight" and self.weight_2d:
            return Block(self.block, self.block)
        return Block(1, self.block)

    def scales(self, x, role, amax=None):
        """(block scales as fp32 UE4M3 values, NaN for a NaN block; fp32 global scale)."""
        blk = self.granularity(role)
        if amax is None:
            amax = block_amax(x, blk)
        s_global = nv_global_scale(amax.amax() if amax.numel() else torch.zeros((), device=x.device))
        return nv_block_scale(amax, s_global, block_any(torch.isnan(x), blk)), s_global
