"""The "torch" backend: exact emulation of scaled GEMMs on any device.

``C = A @ B`` for A ``(M, K)``, B ``(K, N)`` (FP8Tensor / FP4Tensor, or a plain tensor for A:
weight-only). Products of FP8/FP4 codes are exact in fp32 and are accumulated in fp32:

* FP32-scaled FP8 (tensor, row, 1x128, 128x128): K is cut into chunks of ``c = gcd(kA, kB)``
  (the K extents of A's and B's scale blocks) inside which both scales are constant, as Hopper's
  blockwise recipe promotes every 128 K: ``C = sum_chunks (qA qB)_chunk * sA * sB``.
* Power-of-two (MX, E8M0) and NVFP4 (E2M1 x UE4M3) scales: ``q * s`` is exact in fp32, so the
  operands are dequantized and multiplied once; the NV tensor scales multiply the result.

Error bound against the exact product of the dequantized operands (``lowbit.validate.metrics``):
``|C - C*| <= gamma_(K + n_chunks + 2) * sum_k |a_k b_k|`` with ``gamma_n = n u / (1 - n u)``,
``u = 2^-24``, before the final cast to ``out_dtype``.
"""
from __future__ import annotations

import math

import torch

from ..dtypes.fp4_tensor import FP4Tensor
from ..dtypes.fp8_tensor import FP8Tensor
from ..dtypes.formats import E2M1
from ..dtypes.quantize import _decode, unpack_fp4
from ..scaling.blocks import expand_scale
from .registry import Backend

__all__ = ["emulated_scaled_mm", "TORCH_BACKEND", "k_chunk"]


def k_chunk(a: FP8Tensor, b: FP8Tensor) -> int:
    """Chunk of K inside which both operands' scales are constant."""
    K = a.shape[-1]
    ka = a.block.sizes(a.shape)[1]
    kb = b.block.sizes(b.shape)[0]
    return max(math.gcd(ka, kb), 1) if K else 1


def _scale_rows(t: FP8Tensor, shape, k0: int, along_rows: bool) -> torch.Tensor:
    """The scales of one K chunk, expanded over the non-K dim: A -> (M, 1), B -> (1, N)."""
    s = t.scale_fp32()
    if t.block.is_tensorwise:
        return s
    if along_rows:  # A: K is dim -1
        bk = t.block.sizes(shape)[1]
        col = s[:, k0 // bk: k0 // bk + 1]
        return expand_scale(col, (shape[0], 1), type(t.block)(t.block.rows, 1))
    bk = t.block.sizes(shape)[0]
    row = s[k0 // bk: k0 // bk + 1, :]
    return expand_scale(row, (1, shape[1]), type(t.block)(1, t.block.cols))


def _exact_dequant(t) -> bool:
    """q * scale is exact in fp32: FP4 (E2M1 x E8M0 / UE4M3) and MX FP8 (x 2^k)."""
    return isinstance(t, FP4Tensor) or (isinstance(t, FP8Tensor) and t._scale.dtype == torch.float8_e8m0fnu)


def _operand(t) -> torch.Tensor:
    """fp32 operand with block scales applied (exact) but NV tensor scales left out."""
    if isinstance(t, FP4Tensor):  # e2m1 * block scale, exact in fp32 (no detour through * g / g)
        vals = _decode(unpack_fp4(t._qdata), E2M1)
        out = vals * expand_scale(t._scale.to(torch.float32), vals.shape, t._block)
        return out.t() if t._transposed else out
    if isinstance(t, FP8Tensor):
        return t.dequantize(torch.float32)
    return t.to(torch.float32)


def _global(t) -> torch.Tensor:
    if isinstance(t, FP4Tensor) and t.kind == "nv":
        return t._global_scale
    return None


def emulated_scaled_mm(a, b, out_dtype=torch.float32, bias=None) -> torch.Tensor:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"scaled_mm: shapes {tuple(a.shape)} @ {tuple(b.shape)} do not make a 2-D product")
    if isinstance(a, FP8Tensor) and isinstance(b, FP8Tensor) and not (_exact_dequant(a) and _exact_dequant(b)):
        qa, qb = a._data.to(torch.float32), b._data.to(torch.float32)
        K, c = a.shape[1], k_chunk(a, b)
        acc = None
        for k0 in range(0, K, c):
            part = qa[:, k0:k0 + c] @ qb[k0:k0 + c, :]
            part = part * _scale_rows(a, a.shape, k0, True) * _scale_rows(b, b.shape, k0, False)
            acc = part if acc is None else acc + part
        if acc is None:
            acc = torch.zeros(a.shape[0], b.shape[1], device=a.device)
    else:
        # FP4 NV: the dequantized operand is e2m1 * s_block (exact); MX: e * 2^k (exact).
        # A plain high-precision A (weight-only GEMM) is used as given, in fp32.
        acc = _operand(a) @ _operand(b)
        ga, gb = _global(a), _global(b)
        if ga is not None or gb is not None:
            g = (ga if ga is not None else 1.0) * (gb if gb is not None else 1.0)
            acc = acc * g
    if bias is not None:
        acc = acc + bias.to(torch.float32)
    return acc.to(out_dtype)


TORCH_BACKEND = Backend("torch", emulated_scaled_mm, priority=0, devices=("cpu", "cuda", "mps", "xpu"))
