"""Formats, quantize/dequantize references and the FP8/FP4 tensor subclasses with their ops tables."""
import torch

from .formats import E2M1, E4M3, E5M2, E8M0, UE4M3, Format, get_format
from .philox import Philox
from .quantize import dequantize, pack_fp4, quantize, unpack_fp4
from .fp8_tensor import FP8_OPS, FP8Tensor, _rebuild_fp8
from .fp4_tensor import FP4_OPS, FP4Tensor, _rebuild_fp4
from . import ops as _ops  # noqa: F401  (fills the ops tables)

# torch.load(weights_only=True) may rebuild our tensors (their payload is plain tensors + ints).
torch.serialization.add_safe_globals([_rebuild_fp8, _rebuild_fp4])

__all__ = ["Format", "get_format", "E4M3", "E5M2", "E2M1", "E8M0", "UE4M3", "quantize", "dequantize",
           "pack_fp4", "unpack_fp4", "Philox", "FP8Tensor", "FP4Tensor", "FP8_OPS", "FP4_OPS"]
