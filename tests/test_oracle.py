"""The oracle checked independently of itself.

* IEEE casts: ``round_to_format(x, FP32 | FP16)`` equals numpy's correctly rounded float64 casts,
  ``round_to_format(x, BF16)`` equals torch's float32 -> bfloat16 cast (torch's float64 -> bf16/fp16
  casts go through float32 and double-round, so they are not a reference).
* Small formats: a brute-force nearest-value search over ``fmt.values()`` (ties to the even code,
  saturating), over every bf16 bit pattern and over non-dyadic rationals.
* Directed modes bracket x between adjacent grid values; rne picks the nearer one.
* ``quantize_exact`` = ``round(fmt, fp32(x / s))`` with numpy's float32 division as the fp32 step.
* ``exact_dot`` equals a ``Fraction`` sum.
"""
import math
from bisect import bisect_right
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch

from lowbit.dtypes.formats import BF16, E2M1, E4M3, E5M2, E8M0, FP16, FP32, UE4M3
from lowbit.validate.oracle import exact_dot, quantize_exact, round_to_format, to_fraction

SMALL = (E4M3, E5M2, E2M1)


def rtf_all(xs, fmt, mode="rne", saturate=True):
    return np.array([round_to_format(x, fmt, mode, saturate) for x in xs], dtype=np.float64)


def assert_same_bits(got: np.ndarray, want: np.ndarray, xs):
    """float64 arrays equal bit for bit, any NaN matching any NaN."""
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), "NaN positions differ"
    bad = np.nonzero((got.view(np.int64) != want.view(np.int64)) & ~nan)[0]
    assert bad.size == 0, [(float(np.asarray(xs)[i]), got[i], want[i]) for i in bad[:5]]


def random_f64(rng, n, emin, emax):
    """Signed float64 values with exponents uniform in [emin, emax] and random 52-bit mantissas."""
    m = rng.random(n) + 1.0
    return np.ldexp(m, rng.integers(emin, emax + 1, n)) * rng.choice([-1.0, 1.0], n)


def midpoints(lo_vals: np.ndarray, hi_vals: np.ndarray) -> np.ndarray:
    """Exact midpoints (float64) and their float64 neighbours, both signs."""
    mid = (lo_vals + hi_vals) / 2
    near = np.concatenate([mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)])
    return np.concatenate([near, -near])


# ---------------------------------------------------------------- IEEE formats vs numpy / torch
def test_fp32_matches_numpy_float64_to_float32():
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 2 ** 63, 5_000, dtype=np.int64).view(np.float64)  # any double (NaN, inf too)
    wide = random_f64(rng, 40_000, -160, 130)  # fp32 subnormals, normals, overflow
    f = rng.integers(0, 0x7F800000, 5_000, dtype=np.uint32).view(np.float32).astype(np.float64)
    ties = midpoints(f, np.nextafter(f.astype(np.float32), np.float32(np.inf)).astype(np.float64))
    top = float(np.finfo(np.float32).max)
    edges = midpoints(np.array([top, 0.0]), np.array([2.0 ** 128, 2.0 ** -149]))
    xs = np.concatenate([raw, wide, ties, edges, [0.0, -0.0, np.inf, -np.inf]])
    with np.errstate(over="ignore", invalid="ignore"):
        want = xs.astype(np.float32).astype(np.float64)
    assert_same_bits(rtf_all(xs.tolist(), FP32, saturate=False), want, xs)


def test_fp16_matches_numpy_float64_to_float16():
    rng = np.random.default_rng(1)
    wide = random_f64(rng, 30_000, -27, 17)
    h = rng.integers(0, 0x7C00, 3_000, dtype=np.uint16).view(np.float16)
    ties = midpoints(h.astype(np.float64), np.nextafter(h, np.float16(np.inf)).astype(np.float64))
    xs = np.concatenate([wide, ties, [65504.0, 65520.0, 65519.99, 2.0 ** -25, 2.0 ** -25 * 1.0000001]])
    with np.errstate(over="ignore"):
        want = xs.astype(np.float16).astype(np.float64)
    assert_same_bits(rtf_all(xs.tolist(), FP16, saturate=False), want, xs)


def test_bf16_matches_torch_float32_to_bfloat16():
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 2 ** 32, 30_000, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 2 ** 16, 3_000, dtype=np.uint32) << 16) | 0x8000  # exact bf16 midpoints
    x32 = np.concatenate([bits, ties, ties + 1, ties - 1]).view(np.float32)
    want = torch.from_numpy(x32).to(torch.bfloat16).to(torch.float64).numpy()
    xs = torch.from_numpy(x32).to(torch.float64).numpy()
    assert_same_bits(rtf_all(xs.tolist(), BF16, saturate=False), want, xs)


# ---------------------------------------------------------------- brute force for small formats
def brute_force_rne(xs: np.ndarray, fmt) -> np.ndarray:
    """Nearest value of fmt.values() to each float64 x, ties to the even code; |x| > max -> max."""
    vals = fmt.values()
    pos = vals[~torch.signbit(vals)]  # 0 and the positive values, ascending, in code order
    P, C = pos.numpy(), fmt.encode(pos).numpy().astype(np.int64)
    ax = np.abs(xs)
    i = np.clip(np.searchsorted(P, ax, side="right") - 1, 0, len(P) - 2)
    lo, hi = P[i], P[i + 1]
    d_lo, d_hi = ax - lo, hi - ax
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (C[i] % 2 == 1))
    r = np.where(pick_hi, hi, lo)
    r = np.where(ax >= fmt.max, fmt.max, r)
    return np.where(np.isnan(xs), np.nan, np.copysign(r, xs))


@pytest.mark.parametrize("fmt", SMALL, ids=lambda f: f.name)
def test_small_formats_match_brute_force_on_all_bf16(fmt):
    xs = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    xs = xs.to(torch.float64).numpy()
    # and every exact tie of the format (between subnormals too), its neighbours, and beyond max
    P = fmt.values().numpy()
    P = np.unique(P[P >= 0])
    beyond = np.array([fmt.max + 2.0 ** (fmt.emax - fmt.mbits - 1) * k for k in (1, 2, 3)])
    extra = np.concatenate([midpoints(P[:-1], P[1:]), beyond, -beyond])
    xs = np.concatenate([xs, extra])
    assert_same_bits(rtf_all(xs.tolist(), fmt), brute_force_rne(xs, fmt), xs)


@pytest.mark.parametrize("fmt", (E4M3, E5M2), ids=lambda f: f.name)
def test_rationals_match_exact_brute_force(fmt):
    """Non-dyadic x (the Fraction path): nearest grid value by exact Fraction distances."""
    rng = np.random.default_rng(3)
    P = [Fraction(v) for v in sorted({v for v in fmt.values().tolist() if v >= 0})]
    codes = {p: int(fmt.encode(torch.tensor([float(p)], dtype=torch.float64))) for p in P}
    for _ in range(1500):
        den = int(rng.integers(3, 10 ** 6)) | 1  # odd: non-dyadic unless it divides out
        x = Fraction(int(rng.integers(1, 10 ** 6)), den) * Fraction(2) ** int(rng.integers(-20, 18))
        if x >= fmt.max:
            want = fmt.max
        else:
            i = bisect_right(P, x) - 1
            lo, hi = P[i], P[i + 1]
            pick_hi = hi - x < x - lo or (hi - x == x - lo and codes[lo] % 2 == 1)
            want = float(hi if pick_hi else lo)
        assert round_to_format(x, fmt) == want, x
        assert round_to_format(-x, fmt) == -want, x


def test_mpf_and_fraction_inputs_equal_float_inputs():
    rng = np.random.default_rng(4)
    for x in random_f64(rng, 300, -20, 17).tolist():
        for fmt in (E4M3, E5M2, FP16):
            r = round_to_format(x, fmt)
            assert round_to_format(mpmath.mpf(x), fmt) == r == round_to_format(Fraction(x), fmt)


# ---------------------------------------------------------------- directed modes
@pytest.mark.parametrize("fmt", (E4M3, E5M2, E2M1, UE4M3, FP16, BF16), ids=lambda f: f.name)
def test_directed_modes_bracket(fmt):
    rng = np.random.default_rng(5)
    grid = [Fraction(v) for v in sorted(set(fmt.values().tolist()))]  # sort floats: Fractions sort slowly
    even = {v: c % 2 == 0 for v, c in zip(fmt.values().tolist(), fmt.encode(fmt.values()).tolist()) if v >= 0}
    top = math.log2(fmt.max)
    mags = np.exp2(rng.uniform(math.log2(fmt.min_subnormal) - 2, top, 1500))
    xs = [Fraction(float(m)) for m in mags] + [Fraction(int(rng.integers(1, 999)), 3 ** int(rng.integers(1, 9)))
                                              * Fraction(fmt.max) / 1000 for _ in range(200)]
    xs += grid[len(grid) // 2: len(grid) // 2 + 20]  # exactly representable values
    if fmt.signed:
        xs += [-x for x in xs]
    for x in xs:
        d, u, z, n = (Fraction(round_to_format(x, fmt, m)) for m in ("down", "up", "rtz", "rne"))
        assert d <= x <= u, x
        i = bisect_right(grid, d) - 1
        assert grid[i] == d, x  # on the grid
        if d == x:  # exactly representable
            assert d == u == z == n == x
            continue
        assert grid[i + 1] == u, x  # adjacent grid values
        assert z == (d if x > 0 else u)
        assert n in (d, u) and abs(n - x) <= abs((u if n == d else d) - x)
        if abs(n - x) == abs(u - d) / 2:  # an exact tie picks the even code
            assert even[float(abs(n))]


def test_overflow_rules():
    # E4M3: the grid continues to 480 above 448, so 464 is a tie that rounds to 448 (even)
    assert round_to_format(464.0, E4M3, saturate=False) == 448.0
    assert math.isnan(round_to_format(464.0001, E4M3, saturate=False))
    assert round_to_format(464.0001, E4M3) == 448.0 and round_to_format(-1e30, E4M3) == -448.0
    # E5M2: 61440 is the tie between 57344 and 65536; it goes to 65536 = overflow
    assert round_to_format(61439.99, E5M2, saturate=False) == 57344.0
    assert round_to_format(61440.0, E5M2, saturate=False) == math.inf
    assert round_to_format(-61440.0, E5M2, saturate=False) == -math.inf
    assert round_to_format(61440.0, E5M2) == 57344.0
    # E2M1 saturates; without saturate it has nothing to overflow to
    assert round_to_format(6.99, E2M1, saturate=False) == 6.0 and round_to_format(7.0, E2M1) == 6.0
    with pytest.raises(ValueError, match="saturate"):
        round_to_format(7.0, E2M1, saturate=False)
    # infinities and NaN
    for fmt in SMALL:
        assert round_to_format(math.inf, fmt) == fmt.max and round_to_format(-math.inf, fmt) == -fmt.max
        assert math.isnan(round_to_format(math.nan, fmt))
    assert round_to_format(-math.inf, E5M2, saturate=False) == -math.inf
    assert math.isnan(round_to_format(math.inf, E4M3, saturate=False))
    # directed rounding toward zero never overflows; away from zero does
    assert round_to_format(1e9, E5M2, "rtz", saturate=False) == 57344.0
    assert round_to_format(1e9, E5M2, "down", saturate=False) == 57344.0
    assert round_to_format(-1e9, E5M2, "up", saturate=False) == -57344.0
    assert round_to_format(57345.0, E5M2, "up", saturate=False) == math.inf
    assert round_to_format(-57345.0, E5M2, "down", saturate=False) == -math.inf


def test_zero_sign_and_underflow():
    for fmt in SMALL + (FP32,):
        assert math.copysign(1, round_to_format(-0.0, fmt)) == -1
        assert math.copysign(1, round_to_format(0.0, fmt)) == 1
        tiny = fmt.min_subnormal / 2  # a tie with 0 (even): rounds to a signed zero
        assert round_to_format(tiny, fmt) == 0.0 and math.copysign(1, round_to_format(-tiny, fmt)) == -1
        assert round_to_format(tiny * 1.0000001, fmt) == fmt.min_subnormal
        assert round_to_format(Fraction(-1, 10 ** 60), fmt) == 0.0
        assert round_to_format(Fraction(1, 10 ** 60), fmt, "up") == fmt.min_subnormal


def test_e8m0_rounding():
    assert round_to_format(2.0 ** 5, E8M0) == 2.0 ** 5
    assert round_to_format(1.4 * 2.0 ** 5, E8M0) == 2.0 ** 5 and round_to_format(1.6 * 2.0 ** 5, E8M0) == 2.0 ** 6
    # the tie 1.5 * 2^e goes to the even code: code(2^e) = e + 127
    assert round_to_format(1.5 * 2.0 ** 5, E8M0) == 2.0 ** 5  # code 132 even
    assert round_to_format(1.5 * 2.0 ** 4, E8M0) == 2.0 ** 5  # 2^4 has code 131 (odd)
    assert round_to_format(1.9 * 2.0 ** 5, E8M0, "down") == 2.0 ** 5
    assert round_to_format(1.1 * 2.0 ** 5, E8M0, "up") == 2.0 ** 6
    assert round_to_format(Fraction(1, 3), E8M0) == 0.25 and round_to_format(Fraction(1, 3), E8M0, "up") == 0.5
    assert round_to_format(2.0 ** -140, E8M0) == 2.0 ** -127  # no zero: clamps to the smallest
    assert round_to_format(2.0 ** 200, E8M0) == 2.0 ** 127
    assert math.isnan(round_to_format(2.0 ** 200, E8M0, saturate=False))
    with pytest.raises(ValueError):
        round_to_format(0.0, E8M0)
    with pytest.raises(ValueError, match="unsigned"):
        round_to_format(-1.0, E8M0)
    with pytest.raises(ValueError, match="unsigned"):
        round_to_format(-1.0, UE4M3)
    with pytest.raises(ValueError, match="mode"):
        round_to_format(1.0, E4M3, "nearest")


# ---------------------------------------------------------------- quantize_exact
@pytest.mark.parametrize("fmt", SMALL, ids=lambda f: f.name)
def test_quantize_exact_is_round_of_fp32_division(fmt):
    """Arbitrary fp32 scales: the first rounding is an IEEE float32 division (numpy's, here)."""
    rng = np.random.default_rng(6)
    x = (random_f64(rng, 1500, -30, 30)).astype(np.float32)
    s = (rng.uniform(0.5, 1.0, 1500) * np.exp2(rng.integers(-25, 25, 1500))
         * rng.choice([-1.0, 1.0], 1500)).astype(np.float32)
    y = x / s  # float32 division, correctly rounded
    for xi, si, yi in zip(x.tolist(), s.tolist(), y.tolist()):
        assert quantize_exact(xi, si, fmt) == round_to_format(yi, fmt), (xi, si)


@pytest.mark.parametrize("fmt", SMALL, ids=lambda f: f.name)
def test_quantize_exact_pow2_path_equals_rational_path(fmt):
    rng = np.random.default_rng(7)
    x = rng.integers(0, 2 ** 32, 1500, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = x[np.isfinite(x)].astype(np.float64)
    for xi, k in zip(x.tolist(), rng.integers(-140, 128, x.size).tolist()):
        s = 2.0 ** k
        assert quantize_exact(xi, s, fmt) == quantize_exact(xi, Fraction(s), fmt), (xi, k)


def test_quantize_exact_specials():
    assert math.copysign(1, quantize_exact(-0.0, 3.0, E4M3)) == -1
    assert math.copysign(1, quantize_exact(0.0, -3.0, E4M3)) == -1
    assert math.copysign(1, quantize_exact(-1e-30, 3.0, E4M3)) == -1  # underflows to -0
    assert math.isnan(quantize_exact(math.nan, 3.0, E5M2))
    assert quantize_exact(-math.inf, 3.0, E5M2) == -57344.0
    assert quantize_exact(3.0e38, 2.0 ** -10, E4M3) == 448.0  # fp32 quotient overflows: saturate
    assert quantize_exact(3.0e38, 2.0 ** -10, E5M2, saturate=False) == math.inf
    assert quantize_exact(1.0, 3.0, E4M3) == round_to_format(float(np.float32(1) / np.float32(3)), E4M3)


# ---------------------------------------------------------------- exact_dot
def test_exact_dot_equals_fraction_sum():
    rng = np.random.default_rng(8)
    for n in (1, 7, 128, 1000):
        a = random_f64(rng, n, -40, 40).astype(np.float32).tolist()
        b = random_f64(rng, n, -40, 40).astype(np.float32).tolist()
        want = sum((Fraction(x) * Fraction(y) for x, y in zip(a, b)), Fraction(0))
        got = exact_dot(a, b)
        assert isinstance(got, mpmath.mpf) and to_fraction(got) == want


def test_exact_dot_cancellation_and_errors():
    assert to_fraction(exact_dot([1e30, 1.0, -1e30], [1.0, 1.0, 1.0])) == 1  # float sums give 0
    assert to_fraction(exact_dot([2.0 ** 60, 1.0], [1.0, 1.0])) == 2 ** 60 + 1  # > 53 bits, kept
    assert to_fraction(exact_dot([2.0 ** -149, 2.0 ** 127], [2.0 ** -149, -(2.0 ** 127)])) == \
        Fraction(2) ** -298 - Fraction(2) ** 254
    assert to_fraction(exact_dot([Fraction(3, 4)], [mpmath.mpf(0.5)])) == Fraction(3, 8)
    assert exact_dot([], []) == 0
    with pytest.raises(ValueError, match="dyadic"):
        exact_dot([Fraction(1, 3)], [1.0])
    with pytest.raises(ValueError):
        exact_dot([1.0, 2.0], [1.0])
