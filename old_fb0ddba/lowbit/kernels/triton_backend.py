"""The ``"triton"`` backend: lowbit's Triton kernels behind the ``Backend`` interface.

* ``scaled_mm``: FP8 x FP8 (tensorwise, rowwise, blockwise, MX-FP8; ``gemm.py``, promoting GEMMs
  on sm_90 through the Gluon kernel of ``gemm_gluon.py``), NVFP4 x NVFP4
  and MXFP4 x MXFP4 (``fp4_gemm.py``), bf16/fp16 activations x FP4 weight (weight-only).
* fused casts: ``quantize_fp8`` / ``quantize_fp8_t`` / ``quantize_fp4`` from
  ``lowbit.kernels.quantize`` when that module is present (each may decline with None).
* ``supports`` says why a call can't run here, in words that do not depend on the shape's size, so
  the registry warns once per kind of decline and falls back to ``"torch"``: CUDA below sm_89 (no
  FP8 tensor cores), K or N not a multiple of 16 (32 for FP4), K-scale chunks that are not a
  multiple of 32, operands of different kinds, FP4 operands not packed along K, fp32 activations
  for a weight-only GEMM, a malformed bias. CPU tensors run under ``TRITON_INTERPRET=1`` (read at
  call time) when the backend is asked for by name, which is how the tests run the kernels.

Registered with ``devices=("cuda",)``: ``"auto"`` picks it for CUDA tensors only, above ``"torch"``.
``make_backend(fast_accum=True)`` builds a variant whose tensorwise/rowwise FP8 GEMMs keep one
long tensor-core accumulation (no promotion), for callers who register it under another name.
"""
from __future__ import annotations

import functools
import importlib
from typing import Optional

import torch

from ..dtypes.fp4_tensor import FP4Tensor
from ..dtypes.fp8_tensor import FP8Tensor
from .cuda_device import capability
from .fp4_gemm import fp4_scaled_mm, fp4_support, fp4_weight_only_mm, weight_only_support
from .gemm import fp8_scaled_mm, fp8_support
from .interpret import interpreting
from .registry import Backend

__all__ = ["make_backend", "TRITON_BACKEND", "triton_supports", "triton_scaled_mm"]


def _device_reason(t: torch.Tensor) -> Optional[str]:
    if t.device.type == "cuda":
        major, minor = capability(t.device)
        if (major, minor) < (8, 9):
            return f"sm_{major}{minor} has no FP8 tensor cores (the triton backend needs sm_89+)"
        return None
    if t.device.type == "cpu" and interpreting():
        return None
    return f"{t.device.type} tensors run the Triton kernels only under TRITON_INTERPRET=1"


def _bias_reason(bias, n: int, device) -> Optional[str]:
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor) or not bias.is_floating_point() or bias.dim() != 1 \
            or bias.shape[0] != n or bias.device != device:
        return "bias must be a 1-D float tensor of length N on the operands' device"
    return None


def triton_supports(a, b, out_dtype=torch.float32, bias=None) -> Optional[str]:
    """None when the Triton kernels take ``a @ b (+ bias)``, else why not (shape-independent words)."""
    why = _device_reason(b)
    if why is None:
        why = _bias_reason(bias, b.shape[1], b.device)
    if why is not None:
        return why
    if isinstance(a, FP8Tensor) and isinstance(b, FP8Tensor):
        return fp8_support(a, b)
    if isinstance(a, FP4Tensor) and isinstance(b, FP4Tensor):
        return fp4_support(a, b)
    if isinstance(b, FP4Tensor) and not isinstance(a, (FP8Tensor, FP4Tensor)):
        return weight_only_support(a, b)
    if isinstance(b, FP8Tensor) and not isinstance(a, (FP8Tensor, FP4Tensor)):
        return "weight-only FP8 GEMM is not implemented in the triton backend"
    return f"mixed operands {type(a).__name__} x {type(b).__name__}"


def triton_scaled_mm(a, b, out_dtype=torch.float32, bias=None, *, fast_accum: bool = False,
                     gemm_variant: str = "auto"):
    """``a @ b (+ bias)`` on the Triton kernels (call ``triton_supports`` first); ``gemm_variant``
    is ``fp8_scaled_mm``'s ``variant`` ("auto": the Gluon kernel where it applies)."""
    if isinstance(a, FP8Tensor):
        return fp8_scaled_mm(a, b, out_dtype, bias, fast_accum=fast_accum, variant=gemm_variant)
    if isinstance(a, FP4Tensor):
        return fp4_scaled_mm(a, b, out_dtype, bias)
    return fp4_weight_only_mm(a, b, out_dtype, bias)


def _fused_cast(name: str, module: str = "quantize"):
    """The fused cast ``lowbit.kernels.<module>.<name>`` (imported on first use)."""
    def cast(x, *args):
        return getattr(importlib.import_module(f"{__package__}.{module}"), name)(x, *args)
    cast.__name__ = name
    return cast


def make_backend(name: str = "triton", priority: int = 10, fast_accum: bool = False,
                 gemm_variant: str = "auto") -> Backend:
    """A Backend running the Triton kernels (``fast_accum``: see the module docstring;
    ``gemm_variant="triton"`` keeps FP8 GEMMs off the Gluon kernel, for A/B runs)."""
    return Backend(name=name, scaled_mm=functools.partial(triton_scaled_mm, fast_accum=fast_accum,
                                                          gemm_variant=gemm_variant),
                   supports=triton_supports, priority=priority, devices=("cuda",), fast_accum=True,
                   quantize_fp8=_fused_cast("quantize_fp8_triton"),
                   quantize_fp8_t=_fused_cast("quantize_fp8_t_triton"),
                   quantize_fp4=_fused_cast("quantize_fp4_triton", "quantize_fp4_launch"))


TRITON_BACKEND = make_backend()
