"""The correctly rounded references against independent computation.

* float64 libm (exp, exp2, log, log2; glibc's are within one float64 ulp): where the float64 value
  is farther than 2^-50 (relative) from every fp32 rounding midpoint, its rounding to fp32 is the
  correctly rounded fp32 result, whatever libm's last-bit error; the reference must equal it.
* exact rationals (``fractions.Fraction``): a Taylor series with a remainder bound brackets e^x;
  the reference's float64 result must be the rounding of every point of the bracket (exp, softmax of
  two entries), and log's float64 result must have exp(lower midpoint) < x < exp(upper midpoint).
* exact cases: 2^n, log2 of powers of two, softmax of equal entries (1/n), attention with equal
  scores (the mean of V) or one visible key (that key's value).
"""
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch

from lowbit.dtypes.formats import BF16, E4M3, FP32
from lowbit.validate import references as R
from lowbit.validate.oracle import quantize_exact, round_to_format


def f32(xs):
    return [float(v) for v in np.asarray(xs, dtype=np.float32)]


def safe_f32(v: float):
    """fp32 rounding of float64 ``v`` when no fp32 midpoint lies within 2^-50 of it, else None."""
    if not math.isfinite(v):
        return v
    lo, hi = v * (1 - 2.0 ** -50), v * (1 + 2.0 ** -50)
    a, b = round_to_format(lo, FP32, saturate=False), round_to_format(hi, FP32, saturate=False)
    return a if a == b else None


@pytest.mark.parametrize("name,fn,lo,hi", [
    ("exp", math.exp, -110.0, 89.0), ("exp2", lambda x: 2.0 ** x, -155.0, 129.0),
    ("log", math.log, -149.0, 128.0), ("log2", math.log2, -149.0, 128.0)])
def test_fp32_results_equal_float64_libm_rounded_where_that_is_safe(name, fn, lo, hi):
    rng = np.random.default_rng(hash(name) % 2 ** 32)
    if name.startswith("log"):
        xs = f32(np.exp2(rng.uniform(lo, hi, 300)))
    else:
        xs = f32(rng.uniform(lo, hi, 300))
    checked = 0
    for x in xs:
        try:
            want = fn(x)
        except OverflowError:
            want = math.inf
        want = safe_f32(want)
        if want is None:
            continue
        got = getattr(R, name)(x)
        assert got == want, (name, x, got, want)
        checked += 1
    assert checked >= 290


def test_ieee_specials():
    assert math.isnan(R.exp(math.nan)) and R.exp(math.inf) == math.inf and R.exp(-math.inf) == 0.0
    assert R.exp(0.0) == 1.0 and R.exp(100.0) == math.inf and R.exp(-104.0) == 0.0
    assert R.log(0.0) == -math.inf and math.isnan(R.log(-1.0)) and R.log(1.0) == 0.0 and R.log(math.inf) == math.inf
    assert math.isnan(R.exp(100.0, E4M3))  # no inf in E4M3: overflow is NaN, not a saturation


def test_powers_of_two_are_exact_and_ties_go_to_even():
    for n in (-149, -126, -1, 0, 1, 10, 127):
        assert R.exp2(float(n)) == 2.0 ** n and R.log2(2.0 ** n) == n
    assert R.exp2(-150.0) == 0.0  # 2^-150: the midpoint between 0 and 2^-149, ties to even
    assert R.exp2(-149.5) == 2.0 ** -149 and R.exp2(128.0) == math.inf
    assert R.exp2(0.5, BF16) == round_to_format(Fraction(math.sqrt(2)), BF16)  # 8 bits: far from a midpoint


def exp_bracket(x: Fraction, terms: int = 40):
    """Exact rationals lo < e^x < hi for |x| <= 1 (Taylor series, remainder < 3 |x|^n / n!)."""
    assert abs(x) <= 1
    s, t = Fraction(0), Fraction(1)
    for k in range(terms):
        s += t
        t = t * x / (k + 1)
    r = 3 * abs(t)
    return s - r, s + r


def fp64_neighbours(v: float):
    return np.nextafter(v, -np.inf), np.nextafter(v, np.inf)


@pytest.mark.parametrize("x", [0.1, -0.5, 0.999, -1.0, 2.0 ** -30, 0.7071067811865476])
def test_exp_fp64_is_the_rounding_of_a_rational_bracket(x):
    lo, hi = exp_bracket(Fraction(x))
    got = R.exp(x, "fp64")
    assert round_to_format(lo, R.FP64) == got == round_to_format(hi, R.FP64)


@pytest.mark.parametrize("x", [0.5, 0.9, 1.5, 2.5, 1.0 + 2.0 ** -40])
def test_log_fp64_lies_between_the_midpoints_of_its_neighbours(x):
    r = R.log(x, "fp64")
    down, up = fp64_neighbours(r)
    m_lo, m_hi = (Fraction(r) + Fraction(float(down))) / 2, (Fraction(r) + Fraction(float(up))) / 2
    assert exp_bracket(m_lo)[1] < Fraction(x) < exp_bracket(m_hi)[0]


def test_wider_than_float64_matches_mpmath_at_twice_the_precision():
    with mpmath.workprec(420):
        want = mpmath.mpf(mpmath.exp(mpmath.mpf(0.5)))
    with mpmath.workprec(200):
        want = +want  # round to 200 bits (nearest)
    assert R.exp(0.5, 200) == want
    assert R.precision(200).mbits == 199


def test_softmax_against_fractions_and_float64():
    assert R.softmax([3.0] * 3) == [round_to_format(Fraction(1, 3), FP32)] * 3
    assert R.softmax([1.0, float("-inf"), 1.0]) == [0.5, 0.0, 0.5]
    t = 0.75  # p0 = 1 / (1 + e^t): bracketed exactly
    lo, hi = exp_bracket(Fraction(t))
    p0 = R.softmax([0.0, t], "fp64")[0]
    assert round_to_format(1 / (1 + hi), R.FP64) == p0 == round_to_format(1 / (1 + lo), R.FP64)
    rng = np.random.default_rng(5)
    for _ in range(20):
        row = f32(rng.normal(0, 4, 7))
        e = np.exp(np.array(row) - max(row))
        want = [safe_f32(v) for v in e / e.sum()]
        got = R.softmax(row)
        assert all(w is None or g == w for g, w in zip(got, want))
        assert abs(sum(got) - 1) <= 7 * 2.0 ** -24


def test_logsumexp_and_its_scale():
    assert R.logsumexp([2.0]) == 2.0 and R.logsumexp([float("-inf")]) == -math.inf
    rng = np.random.default_rng(6)
    for _ in range(20):
        row = f32(rng.normal(0, 3, 5))
        want = safe_f32(float(np.logaddexp.reduce(np.array(row) * 0.5)))
        if want is not None:
            assert R.logsumexp(row, scale=0.5) == want


def test_attention_exact_cases_and_float64():
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(1, 5, 8, generator=g), torch.randn(1, 5, 8, generator=g)
    mean = [round_to_format(sum(Fraction(float(v[0, j, d])) for j in range(5)) / 5, FP32) for d in range(8)]
    out, lse = R.attention(torch.zeros(1, 3, 8), k, v, return_lse=True)  # equal scores: the mean of V
    assert out[0].tolist() == [mean] * 3
    assert lse[0, 0] == R.log(5.0)
    first = R.attention(torch.randn(1, 4, 8, generator=g), k[:, :4], v[:, :4], causal=True)
    assert first[0, 0].tolist() == v[0, 0].double().tolist()  # query 0 sees key 0 only
    none = R.attention(torch.randn(1, 2, 8, generator=g), k, v, mask=torch.zeros(2, 5, dtype=torch.bool))
    assert bool(torch.isnan(none).all())
    q = torch.randn(2, 4, 3, 8, generator=g)  # (B, Hq=4, S, D) against 2 K/V heads (GQA)
    kk, vv = torch.randn(2, 2, 6, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g)
    got = R.attention(q, kk, vv)
    s = float(torch.tensor(1 / math.sqrt(8), dtype=torch.float32))
    K2, V2 = kk.double().repeat_interleave(2, 1), vv.double().repeat_interleave(2, 1)
    ref = torch.softmax(q.double() @ K2.transpose(-1, -2) * s, -1) @ V2
    want = [safe_f32(x) for x in ref.flatten().tolist()]
    assert sum(w is not None for w in want) > 0.9 * len(want)
    assert all(w is None or a == w for a, w in zip(got.flatten().tolist(), want))


def test_oracle_fp32_quotient_fast_path_equals_the_exact_division():
    rng = np.random.default_rng(7)
    xs = f32(rng.normal(size=3000) * np.exp2(rng.integers(-140, 120, 3000)))
    ss = f32(rng.random(3000) * np.exp2(rng.integers(-140, 120, 3000)))
    for x, s in zip(xs, ss):
        q = round_to_format(Fraction(x) / Fraction(s), FP32, saturate=False)
        want = round_to_format(q, E4M3)
        assert quantize_exact(x, s, E4M3) == want or (math.isnan(want) and math.isnan(quantize_exact(x, s, E4M3)))
