"""The size rule of ``lowbit.convert``: keep a Linear in high precision when it is too small to
gain from its format on the device at hand.

The cost of one Linear's training step (x: M x K tokens, W: N x K), as in torchao's derivation:

    t_hp  = 3 GEMMs of 2MKN flops at the high-precision rate
    t_low = 3 GEMMs of 2MKN flops at the low-precision rate + the casts (x and its transpose,
            W and its transpose, the gradient and its transpose: bytes ~ MK + NK + MN) + their launches

and the layer gains when ``1 - t_low / t_hp >= min_gain``. The GEMM saving is a fixed fraction
while the cast share falls like ``1/K + 1/N`` (plus ``1/M`` for the weight's cast), so for the
token counts of training the region where a layer gains is bounded in K and N alone: an up-right
staircase in the (K, N) plane, given by its corners ``(min K, min N)``: a layer gains if
``K >= k and N >= n`` for one corner (``LayerSizes.gains``).

* The token count M is not known at convert time: a rule assumes ``tokens`` (M) per GEMM, the
  size of a training micro-batch (batch x sequence). More tokens only raise the gain (the weight
  cast is amortized, GEMMs run closer to peak), so a larger M keeps the rule safe; with far fewer
  tokens (M in the hundreds) converted layers near a corner can be slower than bf16.
* The rule judges device time (what a compiled or CUDA-graph step pays); the host time of an
  eager step is not in it.
* ``min_gain`` (a fraction of t_hp): below it a layer is kept in high precision. A layer that would
  save less is not worth the rounding error, and the margin covers the error of the figures.
* Where the rule is known: CUDA devices of a ``SizeRule``'s compute capability (``RULES``; Hopper,
  sm_90). Elsewhere no layer is skipped for its size: on the CPU the torch emulation is for
  exactness, not speed; other GPUs, and models on the meta device (no device yet), have no
  measured rule. A family mapped to None is not converted for speed on that device (FP4 on
  Hopper: no FP4 tensor cores; its GEMMs dequantize to bf16, so it reproduces Blackwell numerics
  and never runs faster than bf16), so the rule keeps every layer of it.
* ``filter=`` in ``lowbit.convert`` replaces the default filter, this rule included.

``HOPPER``'s corners of the delayed tensorwise and blockwise families are the ones
``corners_from_gains`` derives from ``benchmarks/layer_gain.py`` on an H200 (its rows in
``benchmarks/results.csv``, ``min_gain`` 0.10, 8192 tokens, the grid 768..8192); those of current
tensorwise and rowwise come from the cost model above with the H200 anchor figures until that
script has measured them. MX-FP8 gains at no measured size on Hopper (its 32-element scales have
no tensor-core support there; its GEMM promotes every 32 K): like FP4 it is converted for its
numerics, not for speed, so no layer of it is skipped for size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import torch

from .scaling.recipes import MX, NV, Blockwise, Current, Delayed, Recipe, Rowwise

__all__ = ["FAMILIES", "LayerSizes", "SizeRule", "HOPPER", "RULES", "family", "rule_for", "size_problem",
           "corners_from_gains"]

FAMILIES = ("tensorwise-delayed", "tensorwise-current", "rowwise", "blockwise", "mx8", "fp4")


@dataclass(frozen=True)
class LayerSizes:
    """The (K, N) region where a family gains: corners ``(min K, min N)``, K = in_features."""

    corners: Tuple[Tuple[int, int], ...]

    def __post_init__(self):
        for (k0, n0), (k1, n1) in zip(self.corners, self.corners[1:]):
            if not (k0 < k1 and n0 > n1):
                raise ValueError(f"LayerSizes corners must rise in K and fall in N (each one minimal), got "
                                 f"{self.corners}")

    def gains(self, k: int, n: int) -> bool:
        return any(k >= a and n >= b for a, b in self.corners)


@dataclass(frozen=True)
class SizeRule:
    """Per device class: the assumed token count, ``min_gain``, and each family's ``LayerSizes``
    (None: the family is not converted for speed there, no layer of it is skipped)."""

    name: str
    capability: Tuple[int, int]
    tokens: int
    min_gain: float
    families: Tuple[Tuple[str, Optional[LayerSizes]], ...]

    def __post_init__(self):
        if tuple(f for f, _ in self.families) != FAMILIES:
            raise ValueError(f"SizeRule {self.name}: families must be {FAMILIES} in that order")

    def sizes(self, fam: str) -> Optional[LayerSizes]:
        return dict(self.families)[fam]


HOPPER = SizeRule(
    name="Hopper (sm_90)", capability=(9, 0), tokens=8192, min_gain=0.10,
    families=(
        ("tensorwise-delayed", LayerSizes(((768, 8192), (2048, 2048)))),
        ("tensorwise-current", LayerSizes(((1024, 14336), (1536, 4096), (2048, 3072), (3072, 2048), (4096, 1536),
                                           (14336, 1024)))),
        ("rowwise", LayerSizes(((1536, 14336), (2048, 8192), (3072, 3072), (8192, 2048), (14336, 1536)))),
        ("blockwise", LayerSizes(((2048, 8192), (4096, 4096), (8192, 2048)))),
        ("mx8", None),
        ("fp4", None),
    ))
RULES: Tuple[SizeRule, ...] = (HOPPER,)


def family(recipe: Recipe) -> str:
    """The format family whose costs a recipe shares (its cast kernels and GEMM)."""
    if isinstance(recipe, Delayed):
        return "tensorwise-delayed"
    if isinstance(recipe, Current):
        return "tensorwise-current"
    if isinstance(recipe, Rowwise):
        return "rowwise"
    if isinstance(recipe, Blockwise):
        return "blockwise"
    if isinstance(recipe, NV) or (isinstance(recipe, MX) and recipe.kind == "fp4"):
        return "fp4"
    if isinstance(recipe, MX):
        return "mx8"
    raise TypeError(f"no size family for {recipe!r}")


def rule_for(device: torch.device) -> Optional[SizeRule]:
    """The rule of a CUDA device's class, or None (CPU, meta, a GPU without a measured rule)."""
    if device.type != "cuda":
        return None
    from .kernels.triton.runtime import capability
    cap = tuple(capability(device))
    return next((r for r in RULES if r.capability == cap), None)


def size_problem(recipe: Recipe, in_features: int, out_features: int, device: torch.device,
                 backend: str = "auto", rule: Optional[SizeRule] = None) -> Optional[str]:
    """None, or why a layer of this shape is too small to gain from ``recipe`` on ``device``
    (``rule``: the device's, ``rule_for(device)``, unless given). Backend "torch" (the exact
    emulation, never chosen for speed) has no size rule."""
    rule = rule if rule is not None else rule_for(device)
    if rule is None or backend == "torch":
        return None
    sizes = rule.sizes(family(recipe))
    if sizes is None or sizes.gains(in_features, out_features):
        return None
    corners = ", ".join(f"{k}x{n}" for k, n in sizes.corners)
    return (f"too small to gain from {type(recipe).__name__} on {rule.name}: K x N = {in_features}x{out_features}, "
            f"a {rule.min_gain:.0%} gain at {rule.tokens} tokens needs K x N >= one of {corners} "
            f"(lowbit.sizing; filter= overrides)")


def corners_from_gains(ks: Sequence[int], ns: Sequence[int], gain: Dict[Tuple[int, int], float],
                       min_gain: float) -> Tuple[Tuple[int, int], ...]:
    """The staircase of a measured grid: ``(k, n)`` is in the region when every grid shape with
    ``K >= k`` and ``N >= n`` gains at least ``min_gain`` (so the rule is monotone and never keeps
    a shape whose larger neighbours lose); the corners are the region's minimal points, K
    ascending. A missing grid point counts as no gain."""
    ks, ns = sorted(ks), sorted(ns)
    region = {(k, n) for k in ks for n in ns
              if all(gain.get((k2, n2), float("-inf")) >= min_gain for k2 in ks if k2 >= k for n2 in ns if n2 >= n)}
    corners, best_n = [], None
    for k in ks:
        n = min((n for n in ns if (k, n) in region), default=None)
        if n is not None and (best_n is None or n < best_n):
            corners.append((k, n))
            best_n = n
    return tuple(corners)
