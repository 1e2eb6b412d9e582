"""Reference quantize / dequantize in torch (any device; the contract every kernel matches bit for bit).

``quantize(x, fmt, scale)`` computes ``y = fp32(x) / fp32(scale)`` (one IEEE division) and rounds
``y`` onto the format's grid:

* ``|y|`` is clamped to ``fmt.max`` first when ``saturate`` (so finite overflow and ``±inf`` give
  ``±max``, as PTX ``cvt.satfinite``); NaN stays NaN;
* with ``e = max(floor(log2|y|), emin)`` the grid step is ``ulp = 2^(e - mbits)``;
  ``rne``: ``round_half_even(|y| / ulp) * ulp`` (``|y| / ulp`` is exact: a power-of-two scaling);
  ``stochastic``: ``floor(|y| / ulp) + [u < frac]`` with ``u ~ U[0, 1)`` from ``generator`` (a
  ``torch.Generator``'s ``torch.rand``, or a ``Philox``'s counter-based draw), so the result is one
  of the two neighbours and ``E[q] = y`` (up to the 2^-24 granularity of ``u``);
* without ``saturate``, a result above ``max`` is inf (E5M2) or NaN (E4M3); E2M1 must saturate.

Result: a float8 tensor for E4M3/E5M2, unpacked uint8 codes for E2M1 (``pack_fp4`` packs them).
E2M1 has no NaN code: a NaN element gets code 0 and the caller carries the NaN in the block
scale (``FP4Tensor`` does). ``dequantize(q, fmt, scale) = fp32(decode(q) * scale)`` (exact in
float64 when asked for float64).
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from .formats import E2M1, Format, get_format
from .philox import Philox

__all__ = ["quantize", "dequantize", "round_to_grid", "pack_fp4", "unpack_fp4", "check_float_input"]

QUANTIZE_FORMATS = ("e4m3", "e5m2", "e2m1")


def check_float_input(x, what: str = "input") -> None:
    """TypeError naming the dtype unless x is a floating-point tensor."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):  # also no float8/float4
        raise TypeError(f"{what} must be a float16/bfloat16/float32/float64 tensor, got dtype {x.dtype}")


def _pow2(n: torch.Tensor) -> torch.Tensor:
    """Exact 2^n as float32 for integer n in [-126, 127], built from the exponent bits."""
    return ((n + 127) << 23).to(torch.int32).view(torch.float32)


def round_to_grid(y: torch.Tensor, fmt: Format, rounding: str = "rne", saturate: bool = True,
                  generator: Optional[Union[torch.Generator, Philox]] = None) -> torch.Tensor:
    """float32 ``y`` -> float32 values on ``fmt``'s grid (module docstring)."""
    a = y.abs()
    if saturate:
        a = torch.clamp(a, max=fmt.max)
    e = ((a.view(torch.int32) >> 23) & 0xFF) - 127
    e = torch.clamp(e, min=fmt.emin, max=127 - fmt.mbits)  # e = 128 (inf/NaN) stays non-finite below
    k = a * _pow2(fmt.mbits - e)  # exact: |y| / ulp
    if rounding == "rne":
        k = torch.round(k)  # half to even
    elif rounding == "stochastic":
        lo = torch.floor(k)
        # (no generator= without a generator: rand's generator overload takes no symbolic sizes, which
        # a fake-tensor trace with dynamic token counts passes; the default generator draws the same)
        if isinstance(generator, Philox):  # counter-based: a function of (seed, stream, step, index)
            u = generator.uniform(k.shape, k.device)
        else:
            kw = {} if generator is None else {"generator": generator}
            u = torch.rand(k.shape, device=k.device, dtype=torch.float32, **kw)
        k = lo + (u < (k - lo)).to(k.dtype)
    else:
        raise ValueError(f"rounding must be 'rne' or 'stochastic', got {rounding!r}")
    v = k * _pow2(e - fmt.mbits)
    if not saturate:
        over = v > fmt.max
        v = torch.where(over, torch.full_like(v, float("inf") if fmt.has_inf else float("nan")), v)
    return torch.copysign(v, y)


def quantize(x: torch.Tensor, fmt, scale, rounding: str = "rne", saturate: bool = True,
             generator: Optional[Union[torch.Generator, Philox]] = None) -> torch.Tensor:
    """``cast_fmt(fp32(x) / fp32(scale))``; ``scale`` broadcasts against ``x`` (module docstring)."""
    check_float_input(x)
    fmt = get_format(fmt)
    if fmt.name not in QUANTIZE_FORMATS:
        raise ValueError(f"quantize targets {QUANTIZE_FORMATS}, got {fmt.name} "
                         "(scales are made by lowbit.scaling)")
    if not saturate and not (fmt.has_inf or fmt.has_nan):
        raise ValueError(f"{fmt.name} has neither inf nor NaN: quantize needs saturate=True")
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    y = x.to(torch.float32) / scale
    v = round_to_grid(y, fmt, rounding, saturate, generator)
    if fmt.torch_dtype is not None:
        return v.to(fmt.torch_dtype)
    return _e2m1_codes(v)


def _e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """E2M1 grid values -> codes: |v| in {0,.5,1,1.5} -> 2|v|, {2,3,4,6} -> 4,5,6,7; sign bit 8."""
    a = torch.nan_to_num(v.abs(), nan=0.0)
    mag = torch.where(a < 2, a * 2, torch.where(a < 4, a + 2, a * 0.5 + 4))
    return (mag.to(torch.uint8) | (torch.signbit(v) & ~torch.isnan(v)).to(torch.uint8) << 3)


def _decode(q: torch.Tensor, fmt: Format) -> torch.Tensor:
    if fmt.torch_dtype is not None:
        if q.dtype != fmt.torch_dtype:
            raise TypeError(f"dequantize: {fmt.name} data must be {fmt.torch_dtype}, got {q.dtype}")
        return q.to(torch.float32)
    if q.dtype != torch.uint8:
        raise TypeError(f"dequantize: {fmt.name} codes must be uint8 (unpacked), got {q.dtype}")
    table = torch.tensor([E2M1.decode_code(c) for c in range(16)], dtype=torch.float32, device=q.device)
    return table[(q & 0xF).to(torch.int64)]


def dequantize(q: torch.Tensor, fmt, scale, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``fp32(decode(q) * scale)`` cast to ``dtype``; with ``dtype=float64`` the product is exact
    (an FP8/FP4 value times an fp32 scale has at most 28 significant bits)."""
    fmt = get_format(fmt)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    scale = torch.as_tensor(scale, device=q.device).to(work)
    return (_decode(q, fmt).to(work) * scale).to(dtype)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack E2M1 codes along the last dim: byte i = code[2i] | code[2i+1] << 4 (torch.float4_e2m1fn_x2 layout)."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"pack_fp4 takes uint8 codes, got {codes.dtype}")
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4 needs an even last dimension, got shape {tuple(codes.shape)}")
    c = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (c[..., 0] & 0xF) | ((c[..., 1] & 0xF) << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_fp4: (..., n) bytes -> (..., 2n) codes."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack_fp4 takes uint8, got {packed.dtype}")
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])
