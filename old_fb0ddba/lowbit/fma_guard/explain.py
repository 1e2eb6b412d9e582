"""A concrete input where the contracted and the uncontracted computation differ, computed exactly.

For fp32 ``x`` and ``s`` the product ``P = x*s`` is exact in mpmath (48 significant bits at most),
``r = round(P)`` is the correctly rounded fp32 product (``lowbit.validate.oracle``), and the
contraction error ``e = P - r`` is itself an fp32 number with ``|e| <= ulp(r)/2``. Then:

* ``max-of-rounded-products``: at the arg-max the row max is ``m = r``. Uncontracted, the exponent
  argument is ``round(r - m) = 0``; contracted it is ``round(P - m) = e``. We pick ``x`` with the
  largest ``e > 0``: ``exp2(e) > 1``, and for ``|m| >= 2^31`` ``e`` can pass 128 and ``exp2`` overflows
  to inf (then ``inf / inf = NaN`` in the normalisation).
* ``contracted-vs-rounded-cancellation``: a constant row ``x_i = c`` has ``E[x^2] = mean^2 = c^2``.
  Uncontracted the difference is ``round(c^2) - round(c^2) = 0``; contracted one side keeps ``c^2``
  exact, giving ``+-e``. We pick ``c`` so that the variance comes out negative: ``sqrt`` gives NaN.
* ``contracted-vs-rounded-compare``: ``round(P + b) >= r`` against ``round(r + b) >= r``; we search
  ``x`` and a small ``b`` for which the two decisions differ.
"""
from __future__ import annotations

import dataclasses
import math
import struct

import mpmath

from ..dtypes.formats import FP32
from ..validate.oracle import round_to_format
from .scan import CANCEL, COMPARE, KINDS, MAX, Finding

__all__ = ["Counterexample", "explain", "DEFAULT_SCALE"]

DEFAULT_SCALE = 0.125 * 1.4426950408889634  # 1/sqrt(64) * log2(e): an attention scale for exp2


@dataclasses.dataclass(frozen=True)
class Counterexample:
    """Exact inputs and results. ``difference = contracted - uncontracted`` (exact, an fp32 number)."""
    kind: str
    inputs: dict
    exact_product: str       # P = x*s, exact decimal
    rounded_product: float   # round_fp32(P)
    contracted: float
    uncontracted: float
    difference: float
    consequence: str

    def format(self) -> str:
        ins = ", ".join(f"{k} = {v!r} ({_hex(v)})" for k, v in self.inputs.items())
        return (f"[{self.kind}] {ins}\n"
                f"    exact product      {self.exact_product}\n"
                f"    rounded product    {self.rounded_product!r}\n"
                f"    contracted (fma)   {self.contracted!r}\n"
                f"    uncontracted       {self.uncontracted!r}\n"
                f"    difference         {self.difference!r}\n"
                f"    {self.consequence}")


def _hex(v: float) -> str:
    return "0f%08X" % struct.unpack("<I", struct.pack("<f", v))[0]


def _f32(v) -> float:
    return round_to_format(v, FP32, "rne", saturate=False)


def _next_up(v: float) -> float:
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    bits = bits + 1 if v >= 0 else bits - 1
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _scale_from(finding: Finding | None) -> float | None:
    """An immediate multiplicand of the finding (``0f3E38AA3B`` style), as a float."""
    if finding is None:
        return None
    for op in finding.multiplicands:
        if isinstance(op, str) and op[:2].lower() == "0f" and len(op) == 10:
            return struct.unpack(">f", bytes.fromhex(op[2:]))[0]
    return None


def _candidates(start: float, count: int):
    """``count`` consecutive positive fp32 numbers from ``start`` up, then ``count`` with random
    mantissas in ``[start, 2 start)`` (fixed seed), as float64 (exact)."""
    import numpy as np
    bits = np.array([_f32(start)], dtype=np.float32).view(np.uint32)[0]
    near = (bits + np.arange(count, dtype=np.uint32)).view(np.float32)
    wide = (np.float32(_f32(start)) * (1 + np.random.default_rng(0).random(count))).astype(np.float32)
    return np.concatenate([near, wide]).astype(np.float64)


def _errors(xs, s: float):
    """``x*s - round_fp32(x*s)`` for fp32 ``xs``: exact in float64 (a 48-bit product; Sterbenz)."""
    import numpy as np
    p = xs * s
    return p - p.astype(np.float32).astype(np.float64)


def _is_pow2(s: float) -> bool:
    m, _ = math.frexp(abs(s))
    return m == 0.5


def explain(finding, *, scale: float | None = None, magnitude: float = 8.0, search: int = 4096) -> Counterexample:
    """Exact counterexample for a ``Finding`` (or a kind name from ``KINDS``).

    ``scale``: the multiplicand ``s`` (default: an immediate of the finding, else ``DEFAULT_SCALE``);
    ``magnitude``: where to look for ``x*s`` (default 8; ``2**40`` shows the overflow to inf);
    ``search``: how many consecutive fp32 ``x`` to try."""
    kind = finding.kind if isinstance(finding, Finding) else str(finding)
    if kind not in KINDS:
        raise ValueError(f"unknown hazard kind {kind!r}; expected one of {KINDS}")
    if not (magnitude > 0 and math.isfinite(magnitude)):
        raise ValueError(f"magnitude must be a positive finite number, got {magnitude!r}")
    s = _f32(scale if scale is not None else (_scale_from(finding if isinstance(finding, Finding) else None)
                                              or DEFAULT_SCALE))
    if s == 0 or not math.isfinite(s):
        raise ValueError(f"scale must be a nonzero finite fp32 number, got {scale!r}")
    if kind != CANCEL and _is_pow2(s):
        raise ValueError(f"scale {s!r} is a power of two: x*s is exact for every normal x, so contracted and "
                         f"uncontracted results agree (no counterexample)")
    orient = finding.orientation if isinstance(finding, Finding) else 1
    with mpmath.workprec(256):
        if kind == MAX:
            return _explain_max(s, magnitude, search)
        if kind == CANCEL:
            return _explain_cancel(magnitude, search, orient)
        return _explain_compare(s, magnitude, search)


def _product(x: float, s: float):
    p = mpmath.mpf(x) * mpmath.mpf(s)
    return p, _f32(p)


def _explain_max(s, magnitude, search) -> Counterexample:
    xs = _candidates(magnitude / abs(s), search)
    errs = _errors(xs, abs(s))  # x = +-xs so that x*s = xs*|s| > 0
    k = int(errs.argmax())
    if not errs[k] > 0:
        raise ValueError("no fp32 x in the searched range rounds x*s down; widen `search`")
    x = float(xs[k]) if s > 0 else -float(xs[k])
    p, r = _product(x, s)  # exact, confirmed with mpmath and the oracle
    contracted, uncontracted = _f32(p - mpmath.mpf(r)), _f32(mpmath.mpf(r) - mpmath.mpf(r))
    ex = mpmath.power(2, mpmath.mpf(contracted))
    ex32 = _f32(ex)
    what = "inf: the normalisation gives inf/inf = NaN" if math.isinf(ex32) else f"{ex32!r} > 1"
    return Counterexample(
        kind=MAX, inputs={"x": x, "s": s}, exact_product=mpmath.nstr(p, 20), rounded_product=r,
        contracted=contracted, uncontracted=uncontracted, difference=_f32(contracted - uncontracted),
        consequence=(f"row max m = round(x*s) = {r!r}; exponent argument x*s - m: uncontracted 0 (exp2 = 1), "
                     f"contracted {contracted!r} > 0, so exp2 = {what}; the largest argument of a "
                     f"max-subtracted softmax must be exactly 0"))


def _explain_cancel(magnitude, search, orient) -> Counterexample:
    xs = _candidates(math.sqrt(magnitude), search)
    sq_err = xs * xs - (xs * xs).astype("float32").astype("float64")  # c^2 - round(c^2), exact
    for c in xs[orient * sq_err < 0][:1]:
        c = float(c)
        p, r = _product(c, c)
        var = orient * (p - mpmath.mpf(r))  # orientation +1: exact side minus rounded side
        if var < 0:
            contracted = _f32(var)
            return Counterexample(
                kind=CANCEL, inputs={"c": c}, exact_product=mpmath.nstr(p, 20), rounded_product=r,
                contracted=contracted, uncontracted=0.0, difference=contracted,
                consequence=(f"a constant row x_i = c has E[x^2] = mean^2 = c^2: uncontracted variance "
                             f"round(c^2) - round(c^2) = 0, contracted {contracted!r} < 0, so sqrt(var) and "
                             f"rsqrt(var) are NaN"))
    raise ValueError("no c in the searched range gives a negative contracted variance; widen `search`")


def _explain_compare(s, magnitude, search) -> Counterexample:
    xs = _candidates(magnitude / abs(s), search)
    for x in xs[_errors(xs, s) != 0][:64]:
        x = float(x)
        p, r = _product(x, s)
        if p == r:
            continue
        ulp = mpmath.mpf(_next_up(abs(r)) - abs(r))
        for k in (-2, -1, 1, 2):
            b = _f32(ulp * k / 2)
            fused = _f32(p + mpmath.mpf(b)) >= r
            plain = _f32(mpmath.mpf(r) + mpmath.mpf(b)) >= r
            if fused != plain:
                cf, cu = _f32(p + mpmath.mpf(b)), _f32(mpmath.mpf(r) + mpmath.mpf(b))
                return Counterexample(
                    kind=COMPARE, inputs={"x": x, "s": s, "b": b}, exact_product=mpmath.nstr(p, 20),
                    rounded_product=r, contracted=cf, uncontracted=cu, difference=_f32(mpmath.mpf(cf) - cu),
                    consequence=(f"test x*s + b >= max(round(x*s)) = {r!r}: contracted fma gives {cf!r} -> "
                                 f"{fused}, uncontracted gives {cu!r} -> {plain}: the decision flips"))
    raise ValueError("no (x, b) in the searched range flips the comparison; widen `search`")
