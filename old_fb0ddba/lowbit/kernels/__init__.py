"""Scaled GEMMs and quantization kernels behind a backend registry.

``scaled_mm(a, b, out_dtype, bias=None, backend="auto")``; backends: ``"torch"`` (exact emulation,
any device) and, where triton is installed, ``"triton"`` (the Triton kernels; CUDA sm_89+, or CPU
under ``TRITON_INTERPRET=1`` when named). Importing this package also routes mm/addmm of
FP8Tensor/FP4Tensor to ``scaled_mm``.
"""
from importlib.util import find_spec

from .registry import BACKENDS, Backend, BackendRegistry
from .emulation import TORCH_BACKEND, emulated_scaled_mm
from .dispatch import scaled_mm
from .cast import quantize_fp4, quantize_fp8, quantize_fp8_t

BACKENDS.register(TORCH_BACKEND)
if find_spec("triton") is not None:  # the Triton kernels ("triton" backend) where triton exists
    from .triton_backend import TRITON_BACKEND
    BACKENDS.register(TRITON_BACKEND)

__all__ = ["scaled_mm", "quantize_fp8", "quantize_fp8_t", "quantize_fp4", "BACKENDS", "Backend", "BackendRegistry", "emulated_scaled_mm"]
