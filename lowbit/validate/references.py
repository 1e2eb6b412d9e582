"""Correctly rounded references for the transcendental parts of kernels (mpmath, any precision).

Every function returns the exact mathematical result rounded once (round-to-nearest-even) to
``fmt``: a lowbit format ("fp32", "bf16", "e4m3", ...), ``"fp64"``, or an int ``p`` for a binary
format of ``p`` significant bits (``precision(p)``). Values are Python floats (for formats wider
than float64: mpmath ``mpf`` numbers, rounded to ``p`` bits with an unbounded exponent; float64
tensors for ``attention``).

Method (Ziv's loop with rigorous enclosures): the result is evaluated in mpmath interval arithmetic
(``mpmath.iv``, outward rounding) at ``prec`` bits; if both ends of the enclosure round to the same
value of ``fmt``, that value is the correctly rounded result; otherwise ``prec`` doubles. Inputs are
exact (floats, Fractions, mpf), so only a result that *is* a rounding midpoint keeps straddling:
2^n below a format's smallest subnormal (``exp2`` of an integer, computed exactly), or an
attention output that equals a value of ``v`` which is a midpoint of a coarser ``fmt``. Past
``MAX_PREC`` bits an enclosure that narrow around one midpoint is taken to be that midpoint.

* ``exp(x)``, ``exp2(x)``, ``log(x)``, ``log2(x)``: IEEE specials: ``exp(-inf) = 0``,
  ``exp(+inf) = inf``, ``log(0) = -inf``, ``log(x < 0) = NaN``, NaN in -> NaN out; overflow gives
  ``inf`` where ``fmt`` has it (saturation is a cast's business, not a function's).
* ``softmax(row, scale)``: ``p_i = e^(s x_i) / sum_j e^(s x_j)``; ``logsumexp(row, scale)``:
  ``log sum_j e^(s x_j)``. ``s x_i`` is exact; entries ``-inf`` are masked (weight 0).
* ``attention(q, k, v, scale, causal, mask)``: ``O = softmax(scale * q k^T, masked) v`` per query
  row with ``q k^T`` exact (``exact_dot``); ``scale`` defaults to ``1/sqrt(D)`` rounded to fp32 (as
  a kernel passes it); ``causal`` as torch SDPA's ``is_causal`` (query ``i`` sees keys ``j <= i``,
  top-left aligned); ``mask`` boolean (True = attend) broadcastable to (..., Sq, Sk). Leading
  (batch, head) dims loop; fewer K/V heads than Q heads (GQA) are repeated. Returns ``O`` (and
  ``lse``, natural log, with ``return_lse``), float64 tensors of correctly rounded values; a row
  that sees no key is NaN (as SDPA gives it).
"""
from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import torch
from mpmath import iv, libmp

from ..dtypes.formats import Format, get_format
from .oracle import exact_dot, round_to_format, to_fraction

__all__ = ["FP64", "precision", "exp", "exp2", "log", "log2", "softmax", "logsumexp", "attention", "MAX_PREC"]

FP64 = Format("fp64", 11, 52, 1023, torch_dtype_name="float64", description="IEEE double")
MAX_PREC = 1 << 12
_GUARD = 64  # bits beyond the format's precision at the first try


def precision(p: int) -> Format:
    """A binary format of ``p`` significant bits (float64's exponent range, which results wider than
    float64 do not observe)."""
    if p < 2:
        raise ValueError(f"precision needs p >= 2 significant bits, got {p}")
    return Format(f"p{p}", 11, p - 1, 1023, description=f"{p}-bit significand")


def as_format(fmt) -> Format:
    """``fmt`` as a Format: a lowbit format or its name, "fp64", or a precision in bits."""
    if isinstance(fmt, int):
        return precision(fmt)
    if fmt in ("fp64", "float64", torch.float64):
        return FP64
    return get_format(fmt)


# ---- Ziv's loop ----------------------------------------------------------------------------------------
def _ends(r):
    a, b = r._mpi_
    return mpmath.mp.make_mpf(a), mpmath.mp.make_mpf(b)


def _round(v, fmt: Format):
    """RNE of an exact finite real (Fraction, mpf) or an infinite mpf onto ``fmt``: a float, or an
    mpf for formats wider than float64."""
    if isinstance(v, mpmath.mpf) and mpmath.isinf(v):
        return math.copysign(math.inf, float(v)) if fmt.has_inf else math.nan
    if fmt.mbits <= 52:
        return round_to_format(v, fmt, saturate=False)
    f = to_fraction(v)
    return mpmath.mp.make_mpf(libmp.from_rational(f.numerator, f.denominator, fmt.mbits + 1, "n"))


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)


def _ziv(evaluate, fmt: Format) -> list:
    """Correctly rounded values of the exact results enclosed by ``evaluate() -> [interval]``
    (called at growing working precision)."""
    prec = fmt.mbits + 1 + _GUARD
    while True:
        saved, iv.prec = iv.prec, prec
        try:
            rs = evaluate()
        finally:
            iv.prec = saved
        out = []
        for r in rs:
            lo, hi = _ends(r)
            a, b = _round(lo, fmt), _round(hi, fmt)
            if not _same(a, b):
                if prec < MAX_PREC:
                    break
                a = _midpoint(lo, hi, a, b, fmt)
            out.append(a if a != 0 else 0.0)  # an exact zero is +0
        else:
            return out
        prec *= 2


def _midpoint(lo, hi, a: float, b: float, fmt: Format) -> float:
    """An enclosure narrower than ``2^-MAX_PREC`` relative straddling a midpoint: the midpoint, rounded."""
    if hi - lo > max(abs(lo), abs(hi)) * mpmath.mpf(2) ** (8 - MAX_PREC):
        raise ArithmeticError(f"reference did not converge within {MAX_PREC} bits: [{lo}, {hi}]")
    return _round((to_fraction(a) + to_fraction(b)) / 2, fmt)


def _iv(x):
    """Enclosure of an exact real (float, int, Fraction, mpf)."""
    f = to_fraction(x)
    return iv.mpf(f.numerator) / iv.mpf(f.denominator)


# ---- elementary functions ------------------------------------------------------------------------------
def _exp_special(x, fmt: Format):
    """exp / exp2 of NaN and +-inf, else None."""
    if isinstance(x, float) and not math.isfinite(x):
        if x != x:
            return math.nan
        return 0.0 if x < 0 else (math.inf if fmt.has_inf else math.nan)
    return None


def exp(x, fmt="fp32") -> float:
    """Correctly rounded ``e^x``."""
    fmt = as_format(fmt)
    special = _exp_special(x, fmt)
    if special is not None:
        return special
    if to_fraction(x) == 0:
        return 1.0
    return _ziv(lambda: [iv.exp(_iv(x))], fmt)[0]


def exp2(x, fmt="fp32") -> float:
    """Correctly rounded ``2^x`` (exact for integer x, ties to even below the smallest subnormal)."""
    fmt = as_format(fmt)
    special = _exp_special(x, fmt)
    if special is not None:
        return special
    f = to_fraction(x)
    if f.denominator == 1:
        if f.numerator > fmt.emax + 1:
            return math.inf if fmt.has_inf else math.nan
        return _round(Fraction(2) ** f.numerator, fmt)
    return _ziv(lambda: [iv.exp(_iv(f) * iv.log(2))], fmt)[0]


def log(x, fmt="fp32") -> float:
    """Correctly rounded natural ``log x`` (``log 0 = -inf``, ``log(x < 0) = NaN``)."""
    return _log(x, as_format(fmt), base2=False)


def log2(x, fmt="fp32") -> float:
    """Correctly rounded ``log2 x`` (exact for powers of two)."""
    return _log(x, as_format(fmt), base2=True)


def _log(x, fmt: Format, base2: bool) -> float:
    if isinstance(x, float) and not math.isfinite(x):
        return x if x > 0 else math.nan  # +inf -> +inf, -inf and NaN -> NaN
    f = to_fraction(x)
    if f < 0:
        return math.nan
    if f == 0:
        return -math.inf if fmt.has_inf else math.nan
    n, d = f.numerator, f.denominator
    if n & (n - 1) == 0 and d & (d - 1) == 0:  # a power of two: log2 exact, log rational only at 1
        e = n.bit_length() - d.bit_length()
        if base2 or e == 0:
            return _round(Fraction(e), fmt)
    return _ziv(lambda: [iv.log(_iv(f)) / (iv.log(2) if base2 else 1)], fmt)[0]


# ---- softmax, logsumexp ----------------------------------------------------------------------------------
def _scores(row, scale) -> list:
    """Exact ``scale * x`` as Fractions, None for masked (-inf) entries; NaN raises."""
    s = to_fraction(scale)
    out = []
    for x in row:
        x = float(x) if not isinstance(x, (Fraction, mpmath.mpf, int)) else x
        if isinstance(x, float) and x != x:
            raise ValueError("softmax reference: NaN input")
        if isinstance(x, float) and math.isinf(x):
            if x > 0:
                raise ValueError("softmax reference: +inf input")
            out.append(None)
        else:
            out.append(s * to_fraction(x))
    return out


def _weights(scores: list):
    """Intervals ``e^(s_j - m)`` (0 for masked) and the max m; None if everything is masked."""
    live = [s for s in scores if s is not None]
    if not live:
        return None, None
    m = max(live)
    return [iv.mpf(0) if s is None else (iv.mpf(1) if s == m else iv.exp(_iv(s - m))) for s in scores], m


def softmax(row, fmt="fp32", scale=1.0) -> list:
    """Correctly rounded ``softmax(scale * row)`` (``-inf`` entries masked to weight 0)."""
    fmt = as_format(fmt)
    scores = _scores(row, scale)
    live = [s for s in scores if s is not None]
    if not live:
        return [math.nan] * len(scores)
    if all(s == live[0] for s in live):  # rational: 1/n
        return [0.0 if s is None else _round(Fraction(1, len(live)), fmt) for s in scores]

    def evaluate():
        w, _ = _weights(scores)
        total = sum(w[1:], w[0])
        return [wj / total for wj in w]
    return _ziv(evaluate, fmt)


def logsumexp(row, fmt="fp32", scale=1.0) -> float:
    """Correctly rounded ``log sum_j e^(scale * row_j)`` (``-inf`` if every entry is masked)."""
    fmt = as_format(fmt)
    scores = _scores(row, scale)
    live = [s for s in scores if s is not None]
    if not live:
        return -math.inf if fmt.has_inf else math.nan
    m = max(live)
    if len(live) == 1:
        return _round(m, fmt)

    def evaluate():
        w, _ = _weights(scores)
        return [_iv(m) + iv.log(sum(w[1:], w[0]))]
    return _ziv(evaluate, fmt)[0]


# ---- attention ---------------------------------------------------------------------------------------
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale=None, causal: bool = False,
              mask=None, fmt="fp32", return_lse: bool = False):
    """Correctly rounded ``softmax(scale q k^T) v`` (module docstring); float64 tensors."""
    fmt = as_format(fmt)
    if fmt.mbits > 52:
        raise ValueError(f"attention reference returns float64 tensors: {fmt.name} is wider than float64")
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError("attention reference: q, k, v must have the same rank >= 2")
    if scale is None:
        scale = float(torch.tensor(1.0 / math.sqrt(q.shape[-1]), dtype=torch.float32))
    lead = q.shape[:-2]
    if k.shape[:-3] != q.shape[:-3] or (q.dim() >= 3 and q.shape[-3] % k.shape[-3]):
        raise ValueError(f"attention reference: K/V heads {tuple(k.shape)} do not divide Q heads {tuple(q.shape)}")
    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    Sq, Sk = q.shape[-2], k.shape[-2]
    allowed = torch.ones(Sq, Sk, dtype=torch.bool)
    if causal:
        allowed = torch.tril(allowed)
    allowed = allowed.expand(*lead, Sq, Sk) if mask is None else allowed & torch.as_tensor(mask).expand(*lead, Sq, Sk)
    qf, kf, vf = (t.to(torch.float64).reshape(-1, *t.shape[-2:]) for t in (q, k, v))
    allowed = allowed.reshape(-1, Sq, Sk)
    out = torch.empty(*qf.shape[:-1], v.shape[-1], dtype=torch.float64)
    lse = torch.empty(qf.shape[:-1], dtype=torch.float64)
    s = to_fraction(scale)
    for b in range(qf.shape[0]):
        Q, K, V, A = qf[b].tolist(), kf[b].tolist(), vf[b].tolist(), allowed[b].tolist()
        for i in range(Sq):
            scores = [s * to_fraction(exact_dot(Q[i], K[j])) if A[i][j] else None for j in range(Sk)]
            row, l_i = _attention_row(scores, V, fmt)
            out[b, i] = torch.tensor(row, dtype=torch.float64)
            lse[b, i] = l_i
    out = out.reshape(*lead, Sq, v.shape[-1])
    return (out, lse.reshape(*lead, Sq)) if return_lse else out


def _attention_row(scores: list, V: list, fmt: Format):
    live = [j for j, s in enumerate(scores) if s is not None]
    D = len(V[0]) if V else 0
    if not live:
        return [math.nan] * D, math.nan
    if all(scores[j] == scores[live[0]] for j in live):  # equal weights: the mean, rational
        n = len(live)
        row = [_round(sum((to_fraction(V[j][d]) for j in live), Fraction(0)) / n, fmt) for d in range(D)]
        m = scores[live[0]]
        lse = _round(m, fmt) if n == 1 else _ziv(lambda: [_iv(m) + iv.log(n)], fmt)[0]
        return row, lse

    def evaluate():
        w, m = _weights(scores)
        total = sum((w[j] for j in live[1:]), w[live[0]])
        outs = []
        for d in range(D):
            num = sum((w[j] * _iv(V[j][d]) for j in live[1:]), w[live[0]] * _iv(V[live[0]][d]))
            outs.append(num / total)
        return outs + [_iv(m) + iv.log(total)]
    vals = _ziv(evaluate, fmt)
    return vals[:-1], vals[-1]
