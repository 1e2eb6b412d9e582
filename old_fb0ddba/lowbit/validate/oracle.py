"""Exact references: correctly rounded casts and exact dot products (mpmath, no torch casts).

Everything here is derived from a format's definition (``lowbit.dtypes.formats``) and exact
rational arithmetic: a real ``x`` is held as an exact ``fractions.Fraction`` (floats, ints,
mpmath ``mpf`` convert exactly), rounded once to the format's grid, and returned as a Python float
(every value of every lowbit format is a float64, ``-0.0`` included).

Rounding of a finite nonzero ``x`` to a format with ``mbits`` mantissa bits and minimum normal
exponent ``emin``: ``e = max(floor(log2|x|), emin)``, ``ulp = 2^(e - mbits)``, and ``|x| / ulp`` is
rounded to an integer by the mode (``rne`` ties to even, ``rtz`` toward zero, ``up`` toward +inf,
``down`` toward -inf), with the exponent unbounded above. A result above ``max`` overflows: with
``saturate`` it is ``±max``; without, ``±inf`` where the format has inf, NaN where it has only NaN.
``±inf`` in gives ``±max`` with ``saturate`` (as PTX ``cvt.satfinite``), NaN in gives NaN.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Iterable, Union

import mpmath
from mpmath import libmp

from ..dtypes.formats import FP32, Format, get_format

__all__ = ["round_to_format", "quantize_exact", "exact_dot", "to_fraction"]

ROUNDING_MODES = ("rne", "rtz", "up", "down")
Real = Union[int, float, Fraction, "mpmath.mpf"]


def to_fraction(x) -> Fraction:
    """Exact rational value of a finite int / float / Fraction / mpf (or a 0-dim tensor)."""
    if isinstance(x, Fraction):
        return x
    if isinstance(x, int):
        return Fraction(x)
    if isinstance(x, float):
        return Fraction(x)
    if isinstance(x, mpmath.mpf):
        sign, man, exp, _ = x._mpf_
        if not man and exp:  # inf / nan in mpmath's representation
            raise ValueError("to_fraction: non-finite mpf")
        v = Fraction(man) * (Fraction(2) ** exp)
        return -v if sign else v
    if hasattr(x, "item"):
        return to_fraction(float(x.item()))
    raise TypeError(f"to_fraction: unsupported type {type(x).__name__}")


def _floor_log2(a: Fraction) -> int:
    """floor(log2(a)) for a > 0, exactly."""
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    elif Fraction(2) ** (e + 1) <= a:
        e += 1
    return e


def _round_int(q: Fraction, mode: str, negative: bool) -> int:
    """Round the nonnegative rational q = |x| / ulp to an integer per mode (sign of x given)."""
    lo = q.numerator // q.denominator
    rem = q - lo
    if rem == 0:
        return lo
    if mode == "rtz":
        return lo
    if mode == "up":
        return lo if negative else lo + 1
    if mode == "down":
        return lo + 1 if negative else lo
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and lo % 2 == 1):
        return lo + 1
    return lo


def round_to_format(x: Real, fmt, mode: str = "rne", saturate: bool = True) -> float:
    """Correctly rounded value of the real ``x`` in ``fmt`` (see module docstring for the rules)."""
    fmt = get_format(fmt)
    if mode not in ROUNDING_MODES:
        raise ValueError(f"mode must be one of {ROUNDING_MODES}, got {mode!r}")
    if isinstance(x, float) and math.isnan(x) or isinstance(x, mpmath.mpf) and mpmath.isnan(x):
        return float("nan")
    negative = (x < 0) if not isinstance(x, float) else math.copysign(1.0, x) < 0
    if not fmt.signed and negative and x != 0:
        raise ValueError(f"{fmt.name} is unsigned; cannot round {x}")
    is_inf = (isinstance(x, float) and math.isinf(x)) or (isinstance(x, mpmath.mpf) and mpmath.isinf(x))
    sign = -1.0 if negative else 1.0
    if is_inf:
        return _overflow(fmt, sign, saturate)
    if isinstance(x, float) and fmt.subnormals and x != 0:
        return _round_float(x, fmt, mode, saturate, negative)
    a = abs(to_fraction(x))
    if a == 0:
        if not fmt.has_zero:
            raise ValueError(f"{fmt.name} has no zero")
        return sign * 0.0
    if fmt.mbits == 0 and not fmt.subnormals:
        return _round_pow2(a, fmt, mode, saturate)
    d = a.denominator
    if d & (d - 1) == 0:  # dyadic (every float): integer fast path, a = n * 2^E
        n, E = a.numerator, -(d.bit_length() - 1)
        e = max(n.bit_length() - 1 + E, fmt.emin)
        shift = e - fmt.mbits - E  # a / ulp = n / 2^shift
        if shift <= 0:
            k = n << -shift
        else:
            k = _round_int(Fraction(n, 1 << shift), mode, negative)
        v = Fraction(k) * Fraction(2) ** (e - fmt.mbits)
    else:
        e = max(_floor_log2(a), fmt.emin)
        ulp = Fraction(2) ** (e - fmt.mbits)
        v = _round_int(a / ulp, mode, negative) * ulp
    if v > fmt.max:
        if mode == "rtz" or (mode == "up" and negative) or (mode == "down" and not negative):
            return sign * fmt.max  # directed rounding toward zero never overflows past max
        return _overflow(fmt, sign, saturate)
    return sign * float(v)


def _round_float(x: float, fmt: Format, mode: str, saturate: bool, negative: bool) -> float:
    """The dyadic path for a finite nonzero float, in integers: |x| = n * 2^E, n < 2^53."""
    m, E = math.frexp(abs(x))
    n, E = int(m * (1 << 53)), E - 53
    e = max(n.bit_length() - 1 + E, fmt.emin)
    shift = e - fmt.mbits - E
    if shift <= 0:
        k = n << -shift
    else:
        k, rem = n >> shift, n & ((1 << shift) - 1)
        if rem:
            half = 1 << (shift - 1)
            if mode == "rne":
                k += rem > half or (rem == half and k & 1)
            elif mode == "up":
                k += not negative
            elif mode == "down":
                k += negative
    v = math.ldexp(k, e - fmt.mbits)
    sign = -1.0 if negative else 1.0
    if v > fmt.max:
        if mode == "rtz" or (mode == "up" and negative) or (mode == "down" and not negative):
            return sign * fmt.max
        return _overflow(fmt, sign, saturate)
    return sign * v


def _round_pow2(a: Fraction, fmt: Format, mode: str, saturate: bool) -> float:
    """E8M0 (powers of two only): round in the linear domain between 2^e and 2^(e+1);
    an rne tie (1.5 * 2^e) goes to the even code."""
    e = _floor_log2(a)
    exact = a == Fraction(2) ** e
    if mode == "rne":
        mid = Fraction(3, 2) * Fraction(2) ** e
        k = e + 1 if a > mid or (a == mid and (e + fmt.bias) % 2 == 1) else e
    elif mode in ("rtz", "down"):
        k = e
    else:
        k = e if exact else e + 1
    if k > fmt.emax:
        return _overflow(fmt, 1.0, saturate)
    return 2.0 ** max(k, fmt.emin)


def _overflow(fmt: Format, sign: float, saturate: bool) -> float:
    if saturate:
        return sign * fmt.max
    if fmt.has_inf:
        return sign * float("inf")
    if fmt.has_nan:
        return float("nan")
    raise ValueError(f"{fmt.name} has neither inf nor NaN: overflow needs saturate=True")


def quantize_exact(x: Real, scale: Real, fmt, mode: str = "rne", saturate: bool = True) -> float:
    """The quantization contract: ``round(fmt, fp32(x / scale))``: the quotient is rounded once
    to FP32 (an IEEE division), then once to ``fmt``. With a power-of-two scale the first rounding
    is exact unless the quotient leaves FP32's range."""
    if isinstance(x, float) and math.isnan(x):
        return float("nan")
    if isinstance(x, float) and math.isinf(x):
        return round_to_format(x, fmt, mode, saturate)
    if isinstance(x, float) and isinstance(scale, float) and math.frexp(abs(scale))[0] == 0.5:
        q = x / scale  # a power-of-two scale: exact in float64 for every float32 x
        return round_to_format(round_to_format(q, FP32, "rne", saturate=False), fmt, mode, saturate)
    q = to_fraction(x) / to_fraction(scale)
    if q == 0 and (isinstance(x, float) and math.copysign(1.0, x) < 0) != (float(scale) < 0):
        q32 = -0.0
    else:
        q32 = round_to_format(q, FP32, "rne", saturate=False)
    return round_to_format(q32, fmt, mode, saturate)


def exact_dot(a: Iterable[Real], b: Iterable[Real]) -> mpmath.mpf:
    """Exact ``sum_i a_i * b_i`` of finite binary numbers, as an mpmath ``mpf`` (no rounding:
    libmp adds and multiplies with ``prec=0``, i.e. exactly)."""
    acc = libmp.fzero
    for x, y in zip(a, b, strict=True):
        acc = libmp.mpf_add(acc, libmp.mpf_mul(_mpf_exact(x), _mpf_exact(y), 0), 0)
    return mpmath.mp.make_mpf(acc)  # not mpmath.mpf(acc): that rounds to the working precision


def _mpf_exact(x):
    """Raw exact libmp value of a finite binary number."""
    f = to_fraction(x)
    if f.denominator & (f.denominator - 1):
        raise ValueError(f"exact_dot takes binary (dyadic) numbers, got {x!r}")
    return libmp.from_man_exp(f.numerator, -(f.denominator.bit_length() - 1))
