"""FP4Tensor: E2M1 codes packed two per byte along K, with MX (E8M0) or NV (UE4M3 x FP32) scales.

Storage is in the orientation the tensor was quantized in, ``(*lead, R, C)`` with blocks and
packing along C (element ``2i`` in the low nibble): ``qdata`` is ``(*lead, R, C/2)`` uint8, ``scale``
is block-shaped (``float8_e8m0fnu`` for MX, ``float8_e4m3fn`` holding UE4M3 for NV) and
``global_scale`` is the NV FP32 tensor scale (1 for MX). ``x ~= e2m1 * scale * global_scale``.
``t()`` flips a ``transposed`` flag (no repacking, no requantization): the packed dim is then the
logical dim -2, which is what a GEMM's B operand wants (K along rows).

C must be even (one byte holds two elements); a partial last block is zero-padded.
NaN: E2M1 has no NaN, so a block holding NaN gets a NaN scale and dequantizes to NaN.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..scaling.blocks import Block, expand_scale
from .formats import E2M1
from .quantize import _decode, check_float_input, pack_fp4, quantize, unpack_fp4
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
        ``stochastic=True``), with ``generator`` for reproducibility.
        """
        from ..scaling.recipes import MX, NV

        check_float_input(x)
        if not (isinstance(recipe, NV) or (isinstance(recipe, MX) and recipe.format(role) is E2M1)):
            raise ValueError(f"FP4Tensor needs an NV recipe or MX(elem='e2m1'), got {recipe!r}")
        if x.dim() == 0 or x.shape[-1] % 2:
            raise ValueError(f"FP4 packs two elements per byte along the last dim: it must be even, "
                             f"got shape {tuple(x.shape)}")
        block = recipe.granularity(role)
        if isinstance(recipe, NV):
            s_block, s_global = recipe.scales(x, role)
            eff = s_block * s_global
            kind, scale = "nv", s_block.to(torch.float8_e4m3fn)
            if stochastic is None:
                stochastic = recipe.sr_grads and role == "grad"
        else:
            s = recipe.scales(x, role)
            s_global = torch.ones((), dtype=torch.float32, device=x.device)
            eff, kind, scale = s, "mx", s.to(torch.float8_e8m0fnu)
        codes = quantize(x, E2M1, expand_scale(eff, x.shape, block),
                         rounding="stochastic" if stochastic else "rne", generator=generator)
        return cls(pack_fp4(codes), scale, s_global, block, kind, False, x.dtype)

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
