"""Scale math (scale = dequantization factor: ``x ~= q * scale``). No scale is ever 0, inf or NaN
unless it marks a NaN block, so no quantization ever divides by zero.

* FP32 scales (tensorwise, rowwise, 1x128, 128x128): ``scale = amax / fmax * 2^margin`` (IEEE
  fp32 division); an amax of 0 (all-zero block) gives ``scale = 1``.
* MX (OCP MX v1.0), E8M0 scales: ``floor``: ``scale = 2^(floor(log2 amax) - emax_elem)``;
  ``rceil``: the smallest power of two with ``amax / scale <= fmax_elem``, i.e.
  ``2^ceil(log2(amax / fmax_elem))`` evaluated exactly (no rounded quotient). The exponent is
  clamped to E8M0's [-127, 127]; an all-zero block gets ``2^0``; a block holding NaN gets NaN.
* NV (NVFP4): ``s_global = amax_tensor / (448 * 6)`` (1 for an all-zero tensor);
  ``s_block = cast_e4m3(amax_block / 6 / s_global)`` (RNE, both divisions in fp32), raised to the
  smallest E4M3 subnormal 2^-9 if it would round to 0; a block holding NaN gets NaN.
  The element quantization uses ``fp32(s_block * s_global)``.
"""
from __future__ import annotations

import torch

from ..dtypes.formats import E2M1, E4M3, E8M0, Format
from ..dtypes.quantize import round_to_grid

__all__ = ["amax_to_scale", "mx_scale", "nv_global_scale", "nv_block_scale", "pow2", "div_exact"]

MX_RULES = ("floor", "rceil")


def div_exact(t: torch.Tensor, d: float) -> torch.Tensor:
    """IEEE fp32 ``t / d`` on every device: the divisor goes in as a device tensor, because ATen's
    CUDA kernel computes ``t * fp32(1 / d)`` for a Python-scalar divisor (not correctly rounded)."""
    return t / torch.full((), d, dtype=torch.float32, device=t.device)


def pow2(n: torch.Tensor) -> torch.Tensor:
    """2^n (float32) for integer n, exact for n in [-149, 127] (subnormals via two factors)."""
    n = n.to(torch.int32)
    hi = torch.clamp(n, min=-126)
    lo = n - hi  # <= 0, only for subnormal results
    f = lambda k: ((k + 127) << 23).view(torch.float32)  # noqa: E731
    return f(hi) * f(torch.clamp(lo, min=-126))


def amax_to_scale(amax: torch.Tensor, fmt: Format, margin: int = 0) -> torch.Tensor:
    """``amax / fmt.max * 2^margin`` in fp32, with 1 where amax is 0 or not finite."""
    amax = amax.to(torch.float32)
    s = div_exact(amax, fmt.max)
    if margin:
        s = s * (2.0 ** margin)
    good = torch.isfinite(amax) & (amax > 0) & (s > 0) & torch.isfinite(s)
    return torch.where(good, s, torch.ones_like(s))


def _floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2 a) for positive finite fp32 a, exactly (exponent bits; subnormals via frexp)."""
    _, e = torch.frexp(a)
    return e.to(torch.int32) - 1


def mx_scale(amax: torch.Tensor, elem: Format, rule: str = "floor", has_nan=None) -> torch.Tensor:
    """E8M0 block scales (as float32 powers of two, NaN marks a NaN block) from block amax."""
    if rule not in MX_RULES:
        raise ValueError(f"MX scale_rule must be one of {MX_RULES}, got {rule!r}")
    amax = amax.to(torch.float32)
    pos = amax > 0
    safe = torch.where(pos, amax, torch.ones_like(amax))
    e = _floor_log2(safe)
    if rule == "floor":
        k = e - elem.emax
    else:  # smallest k with fmax * 2^k >= amax; fmax * 2^k is exact in fp32
        k = e - _floor_log2(torch.tensor(elem.max))
        k = torch.where(elem.max * pow2(k) < safe, k + 1, k)
    k = torch.clamp(k, E8M0.emin, E8M0.emax)
    s = torch.where(pos, pow2(k), torch.ones_like(amax))
    if has_nan is not None:
        s = torch.where(has_nan, torch.full_like(s, float("nan")), s)
    return s


def nv_global_scale(amax_tensor: torch.Tensor) -> torch.Tensor:
    """``amax / (448 * 6)`` in fp32; 1 for a zero or non-finite amax."""
    amax = amax_tensor.to(torch.float32)
    s = div_exact(amax, E4M3.max * E2M1.max)
    good = torch.isfinite(amax) & (s > 0)
    return torch.where(good, s, torch.ones_like(s))


def nv_block_scale(amax_block: torch.Tensor, s_global: torch.Tensor, has_nan=None) -> torch.Tensor:
    """UE4M3 block scales as float32 values: ``cast_e4m3(amax_block / 6 / s_global)``, >= 2^-9."""
    t = div_exact(amax_block.to(torch.float32), E2M1.max) / s_global
    s = round_to_grid(t, E4M3, "rne", saturate=True)
    s = torch.clamp(s, min=E4M3.min_subnormal)
    if has_nan is not None:
        s = torch.where(has_nan, torch.full_like(s, float("nan")), s)
    return s
