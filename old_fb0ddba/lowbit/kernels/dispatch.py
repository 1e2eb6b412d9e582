"""``scaled_mm`` and the mm/addmm entries of the FP8Tensor/FP4Tensor ops tables.

``torch.mm``, ``@``, ``F.linear`` and ``torch.addmm`` on lowbit tensors reach aten mm/addmm
(``linear``/``matmul`` decompose into them) and are routed to ``scaled_mm`` with the ``"auto"``
backend; the output dtype is A's original dtype. A plain tensor times a lowbit tensor is the
weight-only GEMM.
"""
from __future__ import annotations

import torch

from ..dtypes.fp4_tensor import FP4_OPS
from ..dtypes.fp8_tensor import FP8_OPS
from ..dtypes.subclass import LowbitTensor
from .registry import BACKENDS

aten = torch.ops.aten

__all__ = ["scaled_mm"]


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
    if out_dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"scaled_mm: out_dtype must be float32/bfloat16/float16, got {out_dtype}")
    be = BACKENDS.select(backend, a, b, out_dtype, bias)
    if fast_accum and be.fast_accum:
        return be.scaled_mm(a, b, out_dtype, bias, fast_accum=True)
    return be.scaled_mm(a, b, out_dtype, bias)


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
