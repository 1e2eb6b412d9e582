"""Exact counterexamples: checked against independent arithmetic (Fractions and numpy's fp32 multiply)."""
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit.fma_guard import explain
from lowbit.fma_guard.scan import CANCEL, COMPARE, MAX


def f32(v) -> float:
    return float(np.float32(v))


def test_max_counterexample_positive_exponent_argument():
    c = explain(MAX, scale=0.18033688)
    x, s = c.inputs["x"], c.inputs["s"]
    assert f32(x) == x and f32(s) == s
    r = float(np.float32(x) * np.float32(s))          # numpy's fp32 product is correctly rounded
    assert c.rounded_product == r
    err = Fraction(x) * Fraction(s) - Fraction(r)      # exact contraction error
    assert err > 0 and Fraction(c.contracted) == err   # representable, so the fma returns it exactly
    assert c.uncontracted == 0.0 and c.difference == c.contracted
    ulp = float(np.spacing(np.float32(r)))
    assert 0 < c.contracted <= ulp / 2
    assert "> 1" in c.consequence


def test_max_counterexample_overflows_at_large_magnitude():
    c = explain(MAX, magnitude=2.0 ** 40)
    assert c.contracted > 128 and "inf" in c.consequence


def test_cancellation_gives_negative_variance():
    c = explain(CANCEL)
    v = c.inputs["c"]
    r = float(np.float32(v) * np.float32(v))
    assert Fraction(c.contracted) == Fraction(v) * Fraction(v) - Fraction(r) < 0
    assert c.uncontracted == 0.0
    with np.errstate(invalid="ignore"):
        assert np.isnan(np.sqrt(np.float32(c.contracted)))


def test_compare_decision_flips():
    c = explain(COMPARE)
    x, s, b = c.inputs["x"], c.inputs["s"], c.inputs["b"]
    r = float(np.float32(x) * np.float32(s))
    fused = f32(Fraction(x) * Fraction(s) + Fraction(b))  # one rounding of the exact x*s + b
    plain = float(np.float32(r) + np.float32(b))
    assert (fused, plain) == (c.contracted, c.uncontracted)
    assert (fused >= r) != (plain >= r)


@settings(max_examples=20, deadline=None)
@given(st.floats(min_value=0.01, max_value=100.0, allow_nan=False).map(f32)
       .filter(lambda s: np.frexp(s)[0] != 0.5),  # a power-of-two scale makes every product exact
       st.floats(min_value=1.0, max_value=1e6, allow_nan=False))
def test_max_counterexample_for_any_scale_and_magnitude(scale, magnitude):
    c = explain(MAX, scale=scale, magnitude=magnitude, search=512)
    x, s = c.inputs["x"], c.inputs["s"]
    r = float(np.float32(x) * np.float32(s))
    assert Fraction(c.contracted) == Fraction(x) * Fraction(s) - Fraction(r) > 0


def test_finding_orientation_and_immediate_scale_are_used():
    from lowbit.fma_guard.scan import Finding
    f = Finding(kernel="k", kind=MAX, source="k.py:3", source_text="", ptx_lines=(1,), ptx_text=("fma",),
                related=(), fix="", detail="", orientation=1, multiplicands=("%r1", "0f3E38AA3B"))
    assert explain(f).inputs["s"] == f32(0.18033688)
    g = Finding(**{**f.__dict__, "multiplicands": ("%r1", "0f3E000000")})  # 0.125: every product exact
    with pytest.raises(ValueError, match="power of two"):
        explain(g)


@pytest.mark.parametrize("kwargs,err", [({"finding": "no-such-kind"}, ValueError),
                                        ({"finding": MAX, "scale": 0.0}, ValueError),
                                        ({"finding": MAX, "magnitude": -1.0}, ValueError)])
def test_bad_requests_are_clear_errors(kwargs, err):
    finding = kwargs.pop("finding")
    with pytest.raises(err):
        explain(finding, **kwargs)
