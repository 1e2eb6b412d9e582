"""FP4Tensor: E2M1 codes packed two per byte along K, with MX (E8M0) or NV (UE4M3 x FP32) scales.

Storage is in the orientation the tensor was quantized in, ``(*lead, R, C)`` with blocks and
packing along C (element ``2i`` in the low nibble): ``qdata`` is ``(*lead, R, C/2)`` uint8, ``scale``
is block-shaped (``float8_e8m0fnu`` for MX, ``float8_e4m3fn`` holding UE4M3 for NV) and
``global_scale`` is the NV FP32 tensor scale (1 for MX). ``x ~= e2m1 * scale * global_scale``.
``t()`` flips a ``transposed`` flag (no repacking, no requantization): the packed dim is then the
logical dim -2, which is what a GEMM's B operand wants (K along rows).

Public read-only accessors (torchao's names; its NVFP4Tensor calls the global scale
``per_tensor_scale``): ``qdata``, ``scale`` and ``global_scale`` as stored, in the orientation the
tensor was quantized in, and ``transposed``, whether the logical tensor is the transpose of that:
``dequantize()`` is ``e2m1(unpack(qdata)) * expand(scale) * global_scale``, transposed back if
``transposed``. ``codes()`` and ``block_scale_fp32()`` give the logical orientation. All are copies:
writing into one cannot change the tensor (the kernels read the private fields).

C must be even (one byte holds two elements); a partial last block is zero-padded.
NaN: E2M1 has no NaN, so a block holding NaN gets a NaN scale and dequantizes to NaN.
"""
from __future__ import annotations

from typing import Optional

import torch

from .blocks import Block, expand_scale
from .formats import E2M1
from .quantize import _decode, check_float_input, unpack_fp4
from .subclass import LowbitTensor, OpTable

__all__ = ["FP4Tensor", "FP4_OPS"]

FP4_OPS = OpTable("FP4Tensor")
_KINDS = ("mx", "nv")


class FP4Tensor(LowbitTensor):
    OPS = FP4_OPS

    @staticmethod
    def __new__(cls, qdata, scale, global_scale, block: Block, kind: str = "mx",
                transposed: bool = False, orig_dtype: torch.dtype = torch.float32):
        shape = list(qdata.shape[:-1]) + [qdata.shape[-1] * 2]
        if transposed:
            shape[-2], shape[-1] = shape[-1], shape[-2]
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=orig_dtype, device=qdata.device,
                                                   requires_grad=False)

    def __init__(self, qdata, scale, global_scale, block, kind="mx", transposed=False,
                 orig_dtype=torch.float32):
        if qdata.dtype != torch.uint8:
            raise TypeError(f"FP4Tensor qdata must be packed uint8, got {qdata.dtype}")
        if kind not in _KINDS:
            raise ValueError(f"FP4Tensor kind must be one of {_KINDS}, got {kind!r}")
        want = torch.float8_e8m0fnu if kind == "mx" else torch.float8_e4m3fn
        if scale.dtype != want:
            raise TypeError(f"{kind} FP4Tensor scale must be {want}, got {scale.dtype}")
        if transposed and qdata.dim() != 2:
            raise ValueError("only 2-D FP4Tensors can be transposed")
        self._qdata = qdata
        self._scale = scale
        self._global_scale = global_scale
        self._block = block
        self._kind = kind
        self._transposed = transposed
        self._orig_dtype = orig_dtype

    @classmethod
    def from_float(cls, x: torch.Tensor, recipe, role: str = "input",
                   generator: Optional[torch.Generator] = None, stochastic: Optional[bool] = None):
        """Quantize ``x`` by an MX(elem="e2m1") or NV recipe along its last dim.

        Stochastic rounding is used for NV gradients when ``recipe.sr_grads`` (or when
        ``stochastic=True``), with ``generator`` for reproducibility (a ``torch.Generator``, or a
        ``lowbit.dtypes.Philox`` for counter-based draws keyed on the device). The tensor knows no recipe:
        ``recipe.makes_fp4(role)`` and ``recipe.fp4_parts(x, role, generator, stochastic)`` (packed
        codes, stored block scales, tensor scale, block, kind) come from the recipe object.
        """
        check_float_input(x)
        makes = getattr(recipe, "makes_fp4", None)
        if makes is None or not makes(role):
            raise ValueError(f"FP4Tensor needs an NV recipe or MX(elem='e2m1'), got {recipe!r}")
        if x.dim() == 0 or x.shape[-1] % 2:
            raise ValueError(f"FP4 packs two elements per byte along the last dim: it must be even, "
                             f"got shape {tuple(x.shape)}")
        qdata, scale, s_global, block, kind = recipe.fp4_parts(x, role, generator, stochastic)
        return cls(qdata, scale, s_global, block, kind, False, x.dtype)

    # ---- views of the contents ----------------------------------------------------------
    @property
    def fmt(self):
        return E2M1

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def block(self) -> Block:
        """Block of the logical (possibly transposed) tensor."""
        return self._block.t() if self._transposed else self._block

    @property
    def qdata(self) -> torch.Tensor:
        """The packed E2M1 codes, uint8 ``(*lead, R, C/2)`` in the stored orientation; a copy."""
        return self._qdata.clone()

    @property
    def scale(self) -> torch.Tensor:
        """The block scales as stored (float8_e8m0fnu for MX, float8_e4m3fn holding UE4M3 for NV); a copy."""
        return self._scale.clone()

    @property
    def global_scale(self) -> torch.Tensor:
        """The fp32 tensor scale (NV; 1 for MX); a copy."""
        return self._global_scale.clone()

    @property
    def transposed(self) -> bool:
        """Whether the logical tensor is the transpose of the stored one (after ``t()``)."""
        return self._transposed

    def codes(self) -> torch.Tensor:
        """Unpacked E2M1 codes in the logical orientation."""
        c = unpack_fp4(self._qdata)
        return c.t() if self._transposed else c

    def block_scale_fp32(self) -> torch.Tensor:
        """Per-block scales (fp32) in the logical orientation."""
        s = self._scale.to(torch.float32)
        return s.transpose(-2, -1) if self._transposed else s

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """``fp32(fp32(e2m1 * block_scale) * global_scale)`` (the first product is exact; all of it
        is exact with ``dtype=float64``)."""
        dtype = dtype or self._orig_dtype
        work = torch.float64 if dtype == torch.float64 else torch.float32
        vals = _decode(unpack_fp4(self._qdata), E2M1).to(work)  # table lookup, no host sync
        s = expand_scale(self._scale.to(work), vals.shape, self._block)
        out = (vals * s) * self._global_scale.to(work)
        out = out.t() if self._transposed else out
        return out.to(dtype)

    # ---- subclass protocol --------------------------------------------------------------
    def __tensor_flatten__(self):
        return (["_qdata", "_scale", "_global_scale"],
                (self._block, self._kind, self._transposed, self._orig_dtype))

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return FP4Tensor(inner["_qdata"], inner["_scale"], inner["_global_scale"], *meta)

    def __reduce_ex__(self, protocol):
        return (_rebuild_fp4, (self._qdata, self._scale, self._global_scale, self._block.rows,
                               self._block.cols, self._kind, self._transposed, self._orig_dtype))

    def __repr__(self) -> str:
        return (f"FP4Tensor(kind={self._kind}, shape={tuple(self.shape)}, block={self.block}, "
                f"transposed={self._transposed}, orig_dtype={self._orig_dtype}, device={self.device})")


def _rebuild_fp4(qdata, scale, global_scale, rows, cols, kind, transposed, orig_dtype):
    return FP4Tensor(qdata, scale, global_scale, Block(rows, cols), kind, transposed, orig_dtype)
