"""Exact definitions of the low-precision formats lowbit uses.

A format is fixed by its bit layout: ``ebits`` exponent bits, ``mbits`` mantissa bits,
``bias``, whether it is signed, and how it spends the top exponent code:

* ``"ieee"``: the top exponent field holds inf (mantissa 0) and NaN (mantissa != 0) (E5M2, FP16, BF16, FP32);
* ``"fn"``: finite only; the single all-ones code ``S.1111.111`` is NaN (E4M3 "fn", UE4M3, E8M0);
* ``"none"``: every code is a finite number (E2M1).

A code with exponent field ``E`` and mantissa field ``M`` has the value
``(-1)^S * 2^(E - bias) * (1 + M / 2^mbits)`` when ``E > 0`` and
``(-1)^S * 2^(1 - bias) * (M / 2^mbits)`` when ``E == 0`` (subnormal), except for E8M0, which has
no mantissa, no zero and no subnormals: code ``c`` is ``2^(c - 127)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional

import torch

__all__ = ["Format", "E4M3", "E5M2", "E2M1", "E8M0", "UE4M3", "FP16", "BF16", "FP32",
           "FORMATS", "get_format"]


@dataclass(frozen=True)
class Format:
    """A binary floating-point format, defined by its bit layout alone (see module docstring)."""

    name: str
    ebits: int
    mbits: int
    bias: int
    signed: bool = True
    special: str = "ieee"  # "ieee" | "fn" | "none"
    subnormals: bool = True
    torch_dtype_name: Optional[str] = None
    description: str = field(default="", compare=False)

    # ---- bit layout -------------------------------------------------------------------
    @property
    def nbits(self) -> int:
        return int(self.signed) + self.ebits + self.mbits

    @property
    def torch_dtype(self) -> Optional[torch.dtype]:
        """The torch dtype holding this format's codes, or None (E2M1 lives packed in uint8)."""
        return getattr(torch, self.torch_dtype_name, None) if self.torch_dtype_name else None

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number, ``1 - bias`` (``-bias`` for E8M0)."""
        return 1 - self.bias if self.subnormals else -self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number."""
        top = (1 << self.ebits) - 1
        if self.special == "ieee" or (self.special == "fn" and self.mbits == 0):
            top -= 1
        return top - self.bias

    # ---- extreme values ---------------------------------------------------------------
    @property
    def max(self) -> float:
        """Largest finite value: ``2^emax * (2 - 2^-mbits)``, one mantissa step less for "fn"."""
        steps = (1 << self.mbits) - 1  # largest mantissa field
        if self.special == "fn" and self.mbits > 0:
            steps -= 1  # the all-ones mantissa in the top binade is NaN
        return 2.0 ** self.emax * (1 + steps / (1 << self.mbits))

    @property
    def min_normal(self) -> float:
        return 2.0 ** self.emin

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value: ``2^(emin - mbits)`` (``min_normal`` without subnormals)."""
        return 2.0 ** (self.emin - self.mbits) if self.subnormals else self.min_normal

    @property
    def has_inf(self) -> bool:
        return self.special == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.special != "none"

    @property
    def has_zero(self) -> bool:
        return self.subnormals

    @property
    def inf_code(self) -> Optional[int]:
        """Code of +inf, or None."""
        return ((1 << self.ebits) - 1) << self.mbits if self.has_inf else None

    @property
    def nan_code(self) -> Optional[int]:
        """Canonical (positive) NaN code, or None: ``0.11111.10`` (IEEE quiet) or all ones ("fn")."""
        if self.special == "ieee":
            return (((1 << self.ebits) - 1) << self.mbits) | (1 << max(self.mbits - 1, 0))
        if self.special == "fn":
            return (1 << (self.ebits + self.mbits)) - 1
        return None

    # ---- codes <-> values -------------------------------------------------------------
    def decode_code(self, code: int) -> float:
        """Value of one code as a Python float (exact: every value here fits in float64)."""
        if not 0 <= code < (1 << self.nbits):
            raise ValueError(f"{self.name}: code {code} outside 0..{(1 << self.nbits) - 1}")
        sign = -1.0 if self.signed and code >> (self.ebits + self.mbits) & 1 else 1.0
        e = (code >> self.mbits) & ((1 << self.ebits) - 1)
        m = code & ((1 << self.mbits) - 1)
        body = code & ((1 << (self.ebits + self.mbits)) - 1)
        if self.special == "fn" and body == (1 << (self.ebits + self.mbits)) - 1:
            return float("nan")
        if self.special == "ieee" and e == (1 << self.ebits) - 1:
            return sign * float("inf") if m == 0 else float("nan")
        if not self.subnormals:
            return sign * 2.0 ** (e - self.bias)
        if e == 0:
            return sign * 2.0 ** self.emin * (m / (1 << self.mbits))
        return sign * 2.0 ** (e - self.bias) * (1 + m / (1 << self.mbits))

    @cached_property
    def _table(self) -> torch.Tensor:
        """float64 value of every code, indexed by code."""
        return torch.tensor([self.decode_code(c) for c in range(1 << self.nbits)], dtype=torch.float64)

    @cached_property
    def _finite_sorted(self):
        """(sorted finite values, their codes), with +0 preferred over -0 for value 0."""
        vals, codes = [], []
        for c in range(1 << self.nbits):
            v = self.decode_code(c)
            if v == v and abs(v) != float("inf"):
                vals.append(v)
                codes.append(c)
        order = sorted(range(len(vals)), key=lambda i: (vals[i], codes[i]))
        return (torch.tensor([vals[i] for i in order], dtype=torch.float64),
                torch.tensor([codes[i] for i in order], dtype=torch.int64))

    def values(self) -> torch.Tensor:
        """Every finite value (float64), in code order (``-0`` included where it exists)."""
        t = self._table
        return t[torch.isfinite(t)]

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """uint8 (or integer) codes -> float32 values (E8M0's 2^127 and 2^-127 are exact in float32)."""
        if codes.dtype.is_floating_point or codes.dtype == torch.bool:
            raise TypeError(f"{self.name}.decode takes integer codes, got {codes.dtype}")
        idx = codes.to(torch.int64)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= (1 << self.nbits)):
            raise ValueError(f"{self.name}.decode: codes must lie in 0..{(1 << self.nbits) - 1}")
        return self._table.to(codes.device)[idx].to(torch.float32)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Exactly representable values -> uint8 codes (int64 for FP16/BF16; ``-0`` keeps its sign, NaN -> ``nan_code``).

        Raises ValueError for a value the format does not hold (round first with ``quantize``).
        """
        if not x.dtype.is_floating_point:
            raise TypeError(f"{self.name}.encode takes floating-point values, got {x.dtype}")
        xd = x.detach().to(torch.float64)
        vals, codes = (t.to(x.device) for t in self._finite_sorted)
        pos = torch.searchsorted(vals, xd.clamp(vals[0], vals[-1]).contiguous()).clamp_max(len(vals) - 1)
        out = codes[pos]
        finite = torch.isfinite(xd)
        ok = finite & (vals[pos] == xd)
        nan = torch.isnan(xd)
        inf = torch.isinf(xd)
        if self.signed and self.has_zero:
            neg_zero = (xd == 0) & torch.signbit(xd)
            out = torch.where(neg_zero, torch.full_like(out, 1 << (self.ebits + self.mbits)), out)
        if self.has_nan:
            out = torch.where(nan, torch.full_like(out, self.nan_code), out)
            ok |= nan
        if self.has_inf:
            sign_bit = 1 << (self.ebits + self.mbits)
            out = torch.where(inf, self.inf_code + torch.signbit(xd).long() * sign_bit, out)
            ok |= inf
        if not bool(ok.all()):
            bad = xd[~ok].flatten()[:4].tolist()
            raise ValueError(f"{self.name}.encode: values not representable exactly, e.g. {bad}")
        return out.to(torch.uint8 if self.nbits <= 8 else torch.int64)  # 16-bit codes don't fit uint8

    def __str__(self) -> str:
        return self.name


E4M3 = Format("e4m3", 4, 3, 7, special="fn", torch_dtype_name="float8_e4m3fn",
              description="FP8 forward operands; max 448, no inf, NaN = S.1111.111")
E5M2 = Format("e5m2", 5, 2, 15, special="ieee", torch_dtype_name="float8_e5m2",
              description="FP8 gradients; max 57344, IEEE inf/NaN")
E2M1 = Format("e2m1", 2, 1, 1, special="none",
              description="FP4 elements: +-{0, .5, 1, 1.5, 2, 3, 4, 6}; packed two per uint8")
E8M0 = Format("e8m0", 8, 0, 127, signed=False, special="fn", subnormals=False,
              torch_dtype_name="float8_e8m0fnu", description="MX block scale: 2^(c-127), 0xFF = NaN")
UE4M3 = Format("ue4m3", 4, 3, 7, signed=False, special="fn", torch_dtype_name="float8_e4m3fn",
               description="NVFP4 block scale: E4M3 with the sign bit 0")
FP16 = Format("fp16", 5, 10, 15, torch_dtype_name="float16", description="IEEE half")
BF16 = Format("bf16", 8, 7, 127, torch_dtype_name="bfloat16", description="bfloat16")
FP32 = Format("fp32", 8, 23, 127, torch_dtype_name="float32", description="IEEE single")

FORMATS = {f.name: f for f in (E4M3, E5M2, E2M1, E8M0, UE4M3, FP16, BF16, FP32)}


def get_format(fmt) -> Format:
    """A Format from itself, its name ("e4m3"), or its torch dtype."""
    if isinstance(fmt, Format):
        return fmt
    if isinstance(fmt, str) and fmt.lower() in FORMATS:
        return FORMATS[fmt.lower()]
    if isinstance(fmt, torch.dtype):
        for f in (E4M3, E5M2, E8M0, FP16, BF16, FP32):
            if f.torch_dtype == fmt:
                return f
    raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
