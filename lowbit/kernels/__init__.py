"""Scaled GEMMs and quantization kernels behind a backend registry.

``scaled_mm(a, b, out_dtype, bias=None, backend="auto")``; backends: ``"torch"`` (exact emulation,
any device). Importing this package also routes mm/addmm of FP8Tensor/FP4Tensor to ``scaled_mm``.
"""
from .registry import BACKENDS, Backend, BackendRegistry
from .emulation import TORCH_BACKEND, emulated_scaled_mm
from .dispatch import scaled_mm
from .cast import quantize_fp4, quantize_fp8, quantize_fp8_t

BACKENDS.register(TORCH_BACKEND)

__all__ = ["scaled_mm", "quantize_fp8", "quantize_fp8_t", "quantize_fp4", "BACKENDS", "Backend", "BackendRegistry", "emulated_scaled_mm"]
