"""Scaled GEMMs and casts behind a backend registry.

``scaled_mm(a, b, out_dtype, bias=None, backend="auto")`` and the casts ``quantize_fp8``,
``quantize_fp8_t``, ``quantize_fp4`` (``api``); backends (``registry``): ``"torch"`` (the exact
emulation, any device: ``emulation``) and, where triton is installed, ``"triton"`` (``triton/``:
the Triton kernels by op family; CUDA sm_89+, or CPU under ``TRITON_INTERPRET=1`` when named).
Importing this package also routes mm/addmm of FP8Tensor/FP4Tensor to ``scaled_mm``.
"""
from importlib.util import find_spec

from .registry import BACKENDS, Backend, BackendRegistry
from .emulation import TORCH_BACKEND, emulated_scaled_mm
from .api import quantize_fp4, quantize_fp8, quantize_fp8_t, scaled_mm

BACKENDS.register(TORCH_BACKEND)
if find_spec("triton") is not None:  # the Triton kernels ("triton" backend) where triton exists
    from .triton import TRITON_BACKEND
    BACKENDS.register(TRITON_BACKEND)

__all__ = ["scaled_mm", "quantize_fp8", "quantize_fp8_t", "quantize_fp4", "BACKENDS", "Backend", "BackendRegistry",
           "emulated_scaled_mm"]
