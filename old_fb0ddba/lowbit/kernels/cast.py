"""Casts into lowbit tensors, routed to a backend's fused kernel when it has one.

Every path is bit-identical to the references (``FP8Tensor.from_float``, ``FP4Tensor.from_float``);
backends only change the speed. ``backend="auto"`` asks the registered backends in priority
order (their ``quantize_*`` may return None to decline) and falls back to the reference.

* ``quantize_fp8(x, recipe, role, state)``: one FP8Tensor (``state``: DelayedScalingState).
* ``quantize_fp8_t(x, recipe, role, state)``: ``(q, q_t)``: ``q`` as above for the 2-D ``x`` and
  ``q_t``, the quantization of ``x.t()`` along its own last dim (the operand that dgrad/wgrad
  need), contiguous. Tensorwise: ``q_t`` shares ``q``'s scale and values (one amax, one state
  update). Row/block recipes: ``q_t`` has its own scales (``from_float(x.t(), recipe, role)``).
* ``quantize_fp4(x, recipe, role, generator, hadamard_signs)``: FP4Tensor; with ``hadamard_signs``
  the 16x16 random Hadamard transform (``lowbit.scaling.hadamard``) is applied along the last
  dim first.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..dtypes.fp4_tensor import FP4Tensor
from ..dtypes.fp8_tensor import FP8Tensor
from ..scaling.hadamard import hadamard16
from .registry import BACKENDS

__all__ = ["quantize_fp8", "quantize_fp8_t", "quantize_fp4"]


def _fused(kind: str, backend: str, x: torch.Tensor, *args):
    cands = [BACKENDS.get(backend)] if backend != "auto" else \
        sorted(BACKENDS.backends.values(), key=lambda b: -b.priority)
    for be in cands:
        fn = getattr(be, kind)
        if fn is not None and x.device.type in be.devices:
            out = fn(x, *args)
            if out is not None:
                return out
    return None


def quantize_fp8(x: torch.Tensor, recipe, role: str = "input", state=None, backend: str = "auto") -> FP8Tensor:
    out = _fused("quantize_fp8", backend, x, recipe, role, state)
    return out if out is not None else FP8Tensor.from_float(x, recipe, role, state=state)


def quantize_fp8_t(x: torch.Tensor, recipe, role: str = "input", state=None, backend: str = "auto"):
    if x.dim() != 2:
        raise ValueError(f"quantize_fp8_t takes a 2-D tensor, got shape {tuple(x.shape)}")
    out = _fused("quantize_fp8_t", backend, x, recipe, role, state)
    if out is not None:
        return out
    q = FP8Tensor.from_float(x, recipe, role, state=state)
    if q.block.is_tensorwise:
        return q, FP8Tensor(q._data.t().contiguous(), q._scale, q.block, q._orig_dtype)
    return q, FP8Tensor.from_float(x.t().contiguous(), recipe, role)


def quantize_fp4(x: torch.Tensor, recipe, role: str = "input", generator: Optional[torch.Generator] = None,
                 hadamard_signs: Optional[torch.Tensor] = None, backend: str = "auto") -> FP4Tensor:
    out = _fused("quantize_fp4", backend, x, recipe, role, generator, hadamard_signs)
    if out is not None:
        return out
    if hadamard_signs is not None:
        x = hadamard16(x, hadamard_signs).to(x.dtype)
    return FP4Tensor.from_float(x, recipe, role, generator=generator)
