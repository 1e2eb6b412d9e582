"""Stochastic rounding: only the two neighbours, unbiased (a z-test with a computed tolerance), reproducible.

With ``y = fp32(x / s)`` between grid neighbours ``lo <= |y| <= hi`` and ``f = (|y| - lo) / (hi - lo)``, each
draw is ``hi`` with probability f (up to the 2^-24 granularity of ``u``: torch.rand's float32, or the
counter-based ``Philox`` draw's 24 bits; every statistical test runs with both). Over
``N`` draws the mean of the indicator has standard deviation ``sigma = sqrt(f (1 - f) / N)``. The tests
accept ``|mean - f| <= K * sigma + 2^-24`` with ``K = 5``: a two-sided normal tail of 5.7e-7 per check,
so with the ~100 checks below a correct implementation fails with probability < 6e-5 for a random seed
(the seeds here are fixed, so the outcome is deterministic). Each check also asserts that its tolerance
is below a quarter of ``min(f, 1 - f)``, so round-to-nearest or truncation could not pass it.
"""
import itertools
import math

import numpy as np
import pytest
import torch

from lowbit.dtypes.formats import E2M1, E4M3, E5M2
from lowbit.dtypes.philox import Philox
from lowbit.dtypes.quantize import quantize
from lowbit.validate.oracle import quantize_exact, round_to_format

FORMATS = (E4M3, E5M2, E2M1)
K = 5.0
U_GRANULARITY = 2.0 ** -24


def sr(x: torch.Tensor, fmt, scale=1.0, generator=None, saturate=True) -> np.ndarray:
    """Stochastically rounded values (float64), decoded from the codes."""
    q = quantize(x, fmt, scale, rounding="stochastic", saturate=saturate, generator=generator)
    codes = q.view(torch.uint8) if fmt.torch_dtype is not None else q
    return fmt.decode(codes).double().numpy()


def source(kind: str, seed: int):
    """Successive draws: one ``torch.Generator`` that advances, or ``Philox`` keys (seed, 0), (seed, 1), ..."""
    if kind == "torch":
        g = torch.Generator().manual_seed(seed)
        return lambda: g
    steps = itertools.count()
    return lambda: Philox(torch.tensor([seed, next(steps)]))


DRAWS = ("torch", "philox")


def spread(fmt, rng, n) -> np.ndarray:
    """fp32 values log-uniform over fmt's range (subnormals to max), both signs."""
    mag = np.exp2(rng.uniform(math.log2(fmt.min_subnormal) - 1, math.log2(fmt.max), n))
    return (mag * rng.choice([-1.0, 1.0], n)).astype(np.float32).astype(np.float64)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("scale", [1.0, 2.0 ** -5, 0.37])
@pytest.mark.parametrize("draws", DRAWS)
def test_only_ever_one_of_the_two_neighbours(fmt, scale, draws):
    rng = np.random.default_rng(1)
    y = spread(fmt, rng, 5000)
    x = np.repeat((y * scale).astype(np.float32), 8)  # 8 draws of each value
    xs = x.astype(np.float64).tolist()
    down = np.array([quantize_exact(v, scale, fmt, "down") for v in xs[::8]]).repeat(8)
    up = np.array([quantize_exact(v, scale, fmt, "up") for v in xs[::8]]).repeat(8)
    got = sr(torch.from_numpy(x), fmt, scale, source(draws, 2)())
    assert np.all((got == down) | (got == up))
    between = down != up
    assert np.any(between & (got == down)) and np.any(between & (got == up))  # both are used
    assert np.array_equal(np.signbit(got), np.signbit(x))  # the sign (of zero too) is kept


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_grid_values_are_left_alone(fmt):
    v = fmt.values().float()
    got = sr(v.repeat(16), fmt, 1.0, torch.Generator().manual_seed(3))
    assert np.array_equal(got, v.repeat(16).double().numpy())
    assert np.array_equal(np.signbit(got), np.signbit(v.repeat(16).numpy()))


def z_check(hits: np.ndarray, f: float, what: str):
    n = hits.size
    sigma = math.sqrt(f * (1 - f) / n)
    tol = K * sigma + U_GRANULARITY
    assert tol < min(f, 1 - f) / 4, "test too weak: raise the number of draws"
    mean = float(hits.mean())
    assert abs(mean - f) <= tol, f"{what}: P(up) = {mean:.5f}, expected {f:.5f} +- {tol:.5f} ({K} sigma)"


# neighbours (lo, hi) in three places per format: a normal binade, the subnormals, the top binade
def neighbour_pairs(fmt):
    pos = np.unique(fmt.values().numpy())
    pos = pos[pos >= 0]
    i_one = int(np.searchsorted(pos, 1.0))
    return [(pos[i_one], pos[i_one + 1]), (pos[1], pos[2]), (pos[-2], pos[-1])]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("draws", DRAWS)
def test_unbiased_between_neighbours(fmt, draws):
    n = 1 << 16
    gen = source(draws, 4)
    for lo, hi in neighbour_pairs(fmt):
        for f in (13 / 128, 0.25, 0.5, 0.75, 115 / 128):  # exact in binary, so y is exactly lo + f (hi - lo)
            for sign in (1.0, -1.0):
                y = sign * (lo + f * (hi - lo))
                assert float(np.float32(y)) == y
                got = sr(torch.full((n,), y, dtype=torch.float32), fmt, 1.0, gen())
                assert np.all((got == sign * lo) | (got == sign * hi))
                z_check(got == sign * hi, f, f"{fmt.name} y={y}")


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("draws", DRAWS)
def test_unbiased_on_average_over_random_values(fmt, draws):
    """One draw each of many different y: sum(q - y) / ulp has mean 0 and variance sum f_i (1 - f_i)."""
    rng = np.random.default_rng(5)
    y = spread(fmt, rng, 40_000)
    y = y[np.abs(y) <= fmt.max]
    down = np.array([round_to_format(v, fmt, "rtz") for v in y.tolist()])  # the neighbour toward 0
    away = np.array([round_to_format(v, fmt, "up" if v > 0 else "down") for v in y.tolist()])
    step = np.abs(away - down)
    keep = step > 0
    f = np.abs(y - down)[keep] / step[keep]
    got = sr(torch.from_numpy(y.astype(np.float32)), fmt, 1.0, source(draws, 6)())
    up_count = float((got[keep] == away[keep]).sum())
    sigma = math.sqrt(float((f * (1 - f)).sum()))
    tol = K * sigma + U_GRANULARITY * f.size
    assert tol < 0.05 * f.size  # a bias of 1/20 ulp per value would be caught
    assert abs(up_count - f.sum()) <= tol, (up_count, f.sum(), tol)


def test_reproducible_with_the_same_seed():
    x = torch.from_numpy(spread(E4M3, np.random.default_rng(7), 4096).astype(np.float32))
    a = quantize(x, E4M3, 1.0, rounding="stochastic", generator=torch.Generator().manual_seed(11))
    b = quantize(x, E4M3, 1.0, rounding="stochastic", generator=torch.Generator().manual_seed(11))
    c = quantize(x, E4M3, 1.0, rounding="stochastic", generator=torch.Generator().manual_seed(12))
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert not torch.equal(a.view(torch.uint8), c.view(torch.uint8))  # 4096 draws: equal w.p. ~0
    g = torch.Generator().manual_seed(11)
    first = quantize(x, E4M3, 1.0, rounding="stochastic", generator=g)
    second = quantize(x, E4M3, 1.0, rounding="stochastic", generator=g)  # the generator advanced
    assert torch.equal(first.view(torch.uint8), a.view(torch.uint8))
    assert not torch.equal(first.view(torch.uint8), second.view(torch.uint8))
    torch.manual_seed(13)  # generator=None uses torch's default generator
    d = quantize(x, E2M1, 1.0, rounding="stochastic")
    torch.manual_seed(13)
    assert torch.equal(d, quantize(x, E2M1, 1.0, rounding="stochastic"))


def test_stochastic_saturates_and_keeps_nan():
    inf, nan = float("inf"), float("nan")
    for fmt in FORMATS:
        m = fmt.max
        got = sr(torch.tensor([4 * m, -4 * m, inf, -inf, 1e38] * 64), fmt, 1.0, torch.Generator().manual_seed(8))
        assert np.array_equal(got, np.tile([m, -m, m, -m, m], 64))
        between = (m + float(fmt.values()[fmt.values() < m].max())) / 2  # below max, rounds to a neighbour
        got = sr(torch.full((256,), between), fmt, 1.0, torch.Generator().manual_seed(9))
        assert np.all(got <= m) and np.any(got == m)
    assert np.all(np.isnan(sr(torch.full((64,), nan), E4M3))) and np.all(np.isnan(sr(torch.full((64,), nan), E5M2)))
    assert torch.equal(quantize(torch.full((64,), nan), E2M1, 1.0, rounding="stochastic"),
                       torch.zeros(64, dtype=torch.uint8))  # E2M1: NaN -> code 0
    assert np.all(sr(torch.full((64,), inf), E5M2, saturate=False) == inf)
