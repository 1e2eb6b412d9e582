"""The backend-neutral entry points: casts into lowbit tensors and scaled GEMMs, routed to the
registered backends (``registry``), and the mm/addmm entries of the FP8Tensor/FP4Tensor ops tables.

Casts. Every path is bit-identical to the references (``FP8Tensor.from_float``,
``FP4Tensor.from_float``); backends only change the speed. ``backend="auto"`` asks the
registered backends in priority order (their ``quantize_*`` may return None to decline) and
falls back to the reference.

* ``quantize_fp8(x, recipe, role, state)``: one FP8Tensor (``state``: DelayedScalingState).
* ``quantize_fp8_t(x, recipe, role, state)``: ``(q, q_t)``: ``q`` as above for the 2-D ``x`` and
  ``q_t``, the quantization of ``x.t()`` along its own last dim (the operand that dgrad/wgrad
  need), contiguous. Tensorwise: ``q_t`` shares ``q``'s scale and values (one amax, one state
  update). Row/block recipes: ``q_t`` has its own scales (``from_float(x.t(), recipe, role)``).
* ``quantize_fp4(x, recipe, role, generator, hadamard_signs)``: FP4Tensor; with ``hadamard_signs``
  the 16x16 random Hadamard transform (``lowbit.scaling.hadamard``) is applied along the last
  dim first.

GEMMs. ``scaled_mm(a, b, out_dtype, bias, backend, fast_accum)``: ``a @ b (+ bias)``. ``torch.mm``,
``@``, ``F.linear`` and ``torch.addmm`` on lowbit tensors reach aten mm/addmm (``linear``/``matmul``
decompose into them) and are routed to ``scaled_mm`` with the ``"auto"`` backend; the output dtype
is A's original dtype. A plain tensor times a lowbit tensor is the weight-only GEMM.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..dtypes.fp4_tensor import FP4_OPS, FP4Tensor
from ..dtypes.fp8_tensor import FP8_OPS, FP8Tensor
from ..dtypes.subclass import LowbitTensor
from ..scaling.hadamard import hadamard16
from .registry import BACKENDS

aten = torch.ops.aten

__all__ = ["quantize_fp8", "quantize_fp8_t", "quantize_fp4", "scaled_mm"]

_OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ---- casts ---------------------------------------------------------------------------------------
def _fused(kind: str, backend: str, x: torch.Tensor, *args):
    cands = (BACKENDS.get(backend),) if backend != "auto" else BACKENDS.by_priority()
    dev = x.device.type
    for be in cands:
        fn = getattr(be, kind)
        if fn is not None and dev in be.devices:
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


# ---- GEMMs ---------------------------------------------------------------------------------------
def scaled_mm(a, b, out_dtype: torch.dtype = torch.float32, bias=None, backend: str = "auto",
              fast_accum: bool = False) -> torch.Tensor:
    """``a @ b (+ bias)`` with a ``(M, K)``, b ``(K, N)`` lowbit tensors (a may be a plain tensor),
    on ``backend`` ("auto", "torch", or "triton" once registered). ``fast_accum``: allow one long
    tensor-core accumulation without FP32 promotion (a request, passed to backends that declare
    ``Backend.fast_accum``; the exact emulation does not)."""
    if not isinstance(b, LowbitTensor):
        raise TypeError(f"scaled_mm: b must be an FP8Tensor or FP4Tensor, got {type(b).__name__}")
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"scaled_mm: a must be a tensor, got {type(a).__name__}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"scaled_mm: shapes {tuple(a.shape)} @ {tuple(b.shape)} do not make a 2-D product")
    if a.device != b.device:
        raise ValueError(f"scaled_mm: operands on {a.device} and {b.device}")
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"scaled_mm: out_dtype must be float32/bfloat16/float16, got {out_dtype}")
    return BACKENDS.select_run(backend, a, b, out_dtype, bias, fast_accum)(a, b, bias)


def _out_dtype(a, b):
    return a._orig_dtype if isinstance(a, LowbitTensor) else a.dtype


@FP8_OPS.implements(aten.mm.default)
@FP4_OPS.implements(aten.mm.default)
def _mm(func, types, args, kwargs):
    a, b = args
    if not isinstance(b, LowbitTensor):
        raise NotImplementedError("lowbit tensor @ plain tensor: quantize both operands or "
                                  "dequantize the lowbit one (only plain @ lowbit is a weight-only GEMM)")
    return scaled_mm(a, b, _out_dtype(a, b))


@FP8_OPS.implements(aten.addmm.default)
@FP4_OPS.implements(aten.addmm.default)
def _addmm(func, types, args, kwargs):
    bias, a, b = args
    if kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1:
        raise NotImplementedError("lowbit addmm supports beta=1, alpha=1 only")
    if not isinstance(b, LowbitTensor):
        raise NotImplementedError("lowbit tensor @ plain tensor: only plain @ lowbit is supported")
    return scaled_mm(a, b, _out_dtype(a, b), bias=bias)
