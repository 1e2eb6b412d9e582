"""The ``"triton"`` backend: lowbit's Triton kernels behind the ``Backend`` interface, one place
per op family (``cast_fp8``, ``cast_fp4``, ``gemm_fp8``, ``gemm_fp4``; each with its kernels,
launcher and tuning table), the shared jit helpers (``jit_common``) and the runtime (``runtime``:
device facts, the interpreter switch, launches).

* ``plan`` / ``scaled_mm``: FP8 x FP8 (tensorwise, rowwise, blockwise, MX-FP8; promoting GEMMs on
  sm_90 through the warp-specialized Gluon kernel), NVFP4 x NVFP4 and MXFP4 x MXFP4, bf16/fp16
  activations x FP4 weight (weight-only). The plan of a call is made once for its shapes
  (support, configuration, layout) and cached by this backend's families.
* fused casts: ``quantize_fp8`` / ``quantize_fp8_t`` / ``quantize_fp4`` (each may decline with None).
* ``supports`` says why a call can't run here, in words that do not depend on the shape's size,
  so the registry warns once per kind of decline and falls back to ``"torch"``: CUDA below sm_89
  (no FP8 tensor cores), K or N not a multiple of 16 (32 for FP4), K-scale chunks that are not a
  multiple of 32, operands of different kinds, FP4 operands not packed along K, fp32 activations
  for a weight-only GEMM, a malformed bias. CPU tensors run under ``TRITON_INTERPRET=1`` (read at
  call time) when the backend is asked for by name, which is how the tests run the kernels.

Registered with ``devices=("cuda",)``: ``"auto"`` picks it for CUDA tensors only, above ``"torch"``;
named, it also serves CPU tensors while ``TRITON_INTERPRET`` is set (``named_devices``).
``make_backend(...)`` builds another one (its own plans and autotuners) from other tuning tables,
for benchmarks' sweeps and A/B runs; ``fast_accum=True`` there makes every tensorwise/rowwise FP8
GEMM keep one long tensor-core accumulation (no promotion).
"""
from __future__ import annotations

from typing import Optional

import torch

from ...dtypes.fp4_tensor import FP4Tensor
from ...dtypes.fp8_tensor import FP8Tensor
from ..registry import Backend
from .cast_fp4 import FP4Casts
from .cast_fp8 import CAST_TUNING, FP8Casts
from .gemm_fp4 import GEMM_FP4_TUNING, FP4Gemm
from .gemm_fp8 import GEMM_FP8_TUNING, FP8Gemm
from .runtime import capability, interpreting

__all__ = ["make_backend", "TRITON_BACKEND", "TritonKernels"]


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


class TritonKernels:
    """One backend's kernels: the four families, each with its tuning table and plan cache."""

    def __init__(self, cast_tuning=CAST_TUNING, gemm_fp8_tuning=GEMM_FP8_TUNING, gemm_fp4_tuning=GEMM_FP4_TUNING,
                 fast_accum: bool = False):
        self.fp8_casts = FP8Casts(cast_tuning)
        self.fp4_casts = FP4Casts(cast_tuning)
        self.fp8_gemm = FP8Gemm(gemm_fp8_tuning)
        self.fp4_gemm = FP4Gemm(gemm_fp4_tuning)
        self.force_fast_accum = fast_accum

    def plan(self, a, b, out_dtype=torch.float32, bias=None, fast_accum: bool = False):
        """``run(a, b, bias)`` for ``a @ b (+ bias)`` on the Triton kernels, or why not."""
        why = _device_reason(b) or _bias_reason(bias, b.shape[1], b.device)
        if why is not None:
            return why
        if isinstance(a, FP8Tensor) and isinstance(b, FP8Tensor):
            return self.fp8_gemm.plan(a, b, out_dtype, bias, fast_accum or self.force_fast_accum)
        if isinstance(b, FP4Tensor) and not isinstance(a, FP8Tensor):
            return self.fp4_gemm.plan(a, b, out_dtype, bias)
        if isinstance(b, FP8Tensor) and not isinstance(a, (FP8Tensor, FP4Tensor)):
            return "weight-only FP8 GEMM is not implemented in the triton backend"
        return f"mixed operands {type(a).__name__} x {type(b).__name__}"

    def supports(self, a, b, out_dtype=torch.float32, bias=None) -> Optional[str]:
        """None when the Triton kernels take ``a @ b (+ bias)``, else why not (shape-independent words)."""
        run = self.plan(a, b, out_dtype, bias)
        return run if isinstance(run, str) else None

    def scaled_mm(self, a, b, out_dtype=torch.float32, bias=None, *, fast_accum: bool = False):
        """``a @ b (+ bias)`` on the Triton kernels (raises when they can't take it)."""
        run = self.plan(a, b, out_dtype, bias, fast_accum)
        if isinstance(run, str):
            raise ValueError(f"triton scaled_mm: {run}")
        return run(a, b, bias)


def _interpreted_devices() -> tuple:
    """The CPU while ``TRITON_INTERPRET`` is set (read per call)."""
    return ("cpu",) if interpreting() else ()


def make_backend(name: str = "triton", priority: int = 10, fast_accum: bool = False, cast_tuning=CAST_TUNING,
                 gemm_fp8_tuning=GEMM_FP8_TUNING, gemm_fp4_tuning=GEMM_FP4_TUNING) -> Backend:
    """A Backend running the Triton kernels with these tuning tables (its own plans and
    autotuners); ``fast_accum``: see the module docstring."""
    k = TritonKernels(cast_tuning, gemm_fp8_tuning, gemm_fp4_tuning, fast_accum)
    return Backend(name=name, scaled_mm=k.scaled_mm, supports=k.supports, priority=priority, devices=("cuda",),
                   named_devices=_interpreted_devices, fast_accum=True, quantize_fp8=k.fp8_casts.quantize_fp8, quantize_fp8_t=k.fp8_casts.quantize_fp8_t,
                   quantize_fp4=k.fp4_casts.quantize_fp4, plan=k.plan)


TRITON_BACKEND = make_backend()
