"""FP8Tensor: E4M3/E5M2 data with scales of the recipe's granularity.

``x ~= data.float() * expand(scale)``. The scale is fp32 for tensorwise (0-dim), rowwise
(``(R, 1)``) and 1x128 / 128x128 blocks; E8M0 (``torch.float8_e8m0fnu``) for MX-32 blocks. The
block layout is ``Block`` over the last two (logical) dims; ``t()`` swaps data, scale and block
(no requantization, exact).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..scaling.blocks import TENSOR, Block, block_amax, expand_scale
from .formats import get_format
from .quantize import check_float_input, dequantize, quantize
from .subclass import LowbitTensor, OpTable

__all__ = ["FP8Tensor", "FP8_OPS"]

FP8_OPS = OpTable("FP8Tensor")


class FP8Tensor(LowbitTensor):
    OPS = FP8_OPS

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale: torch.Tensor, block: Block = TENSOR,
                orig_dtype: torch.dtype = torch.float32):
        return torch.Tensor._make_wrapper_subclass(
            cls, data.shape, strides=data.stride(), storage_offset=data.storage_offset(),
            dtype=orig_dtype, device=data.device, requires_grad=False)

    def __init__(self, data, scale, block=TENSOR, orig_dtype=torch.float32):
        if data.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise TypeError(f"FP8Tensor data must be float8_e4m3fn or float8_e5m2, got {data.dtype}")
        if scale.dtype not in (torch.float32, torch.float8_e8m0fnu):
            raise TypeError(f"FP8Tensor scale must be float32 or float8_e8m0fnu, got {scale.dtype}")
        self._data = data
        self._scale = scale
        self._block = block
        self._orig_dtype = orig_dtype

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_float(cls, x: torch.Tensor, recipe, role: str = "input", state=None,
                   amax: Optional[torch.Tensor] = None) -> "FP8Tensor":
        """Quantize ``x`` by ``recipe`` for ``role`` (``state``: a DelayedScalingState for Delayed)."""
        from ..scaling.delayed import DelayedScalingState
        from ..scaling.recipes import MX, Delayed

        check_float_input(x)
        if getattr(recipe, "kind", None) != "fp8":
            raise ValueError(f"{type(recipe).__name__} with these formats makes FP4 data; "
                             "use FP4Tensor.from_float")
        fmt = recipe.format(role)
        block = recipe.granularity(role)
        if isinstance(recipe, Delayed):
            if not isinstance(state, DelayedScalingState):
                raise TypeError("Delayed scaling needs state=DelayedScalingState(recipe, fmt)")
            scale = state.scale.detach().clone()
            state.update(block_amax(x, TENSOR) if amax is None else amax)
        else:
            scale = recipe.scales(x, role, amax)
        data = quantize(x, fmt, expand_scale(scale, x.shape, block))
        if isinstance(recipe, MX):
            scale = scale.to(torch.float8_e8m0fnu)
        return cls(data, scale, block, x.dtype)

    # ---- views of the contents ----------------------------------------------------------
    @property
    def fmt(self):
        return get_format(self._data.dtype)

    @property
    def block(self) -> Block:
        return self._block

    def scale_fp32(self) -> torch.Tensor:
        return self._scale.to(torch.float32)

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """``fp32(data * expand(scale))`` in ``dtype`` (default: the original dtype; exact for float64)."""
        s = expand_scale(self.scale_fp32(), self._data.shape, self._block)
        return dequantize(self._data, self.fmt, s, dtype or self._orig_dtype)

    # ---- subclass protocol --------------------------------------------------------------
    def __tensor_flatten__(self):
        return ["_data", "_scale"], (self._block, self._orig_dtype)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return FP8Tensor(inner["_data"], inner["_scale"], *meta)

    def __reduce_ex__(self, protocol):
        return (_rebuild_fp8, (self._data, self._scale, self._block.rows, self._block.cols,
                               self._orig_dtype))

    def __repr__(self) -> str:
        return (f"FP8Tensor(fmt={self.fmt.name}, shape={tuple(self.shape)}, block={self._block}, "
                f"orig_dtype={self._orig_dtype}, device={self.device})")


def _rebuild_fp8(data, scale, rows, cols, orig_dtype):
    return FP8Tensor(data, scale, Block(rows, cols), orig_dtype)
