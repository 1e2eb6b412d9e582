"""Casts bit-exact against the oracle: ``quantize(x, fmt, s)`` has the code of ``quantize_exact(x, s, fmt)``.

Inputs, for E4M3, E5M2 and E2M1:
* every bf16 and every fp16 bit pattern, at power-of-two scales that also push ``x / s`` past FP32's
  range (inf -> saturate), into FP32 subnormals and into the format's subnormals and zero;
* >= 10^6 fp32 values per format: log-uniform over the format's range with elementwise power-of-two
  scales, raw random bit patterns (NaN, inf, huge, tiny), values within 2 fp32 ulps of every grid
  value and every tie (midpoints, subnormal ones and the overflow tie above max), fp32 subnormals
  with tiny scales, plus a deterministic edge list (+-0, max, just above max, ties, inf, NaN);
* a sample at non-power-of-two scales, tensorwise and per row (the oracle's rational path).

Codes are compared (``.view(torch.uint8)``), so -0 vs +0 counts; any NaN code matches a NaN;
E2M1 has no NaN and gives code 0 for NaN (quantize's docstring).

The oracle runs once per distinct value: ``quantize_exact(x, s) = round_to_format(fp32(x / s))``,
staged as (1) ``y = fp32(x / s)``: for ``s = 2^k`` the float64 quotient (exact), rounded by
``round_to_format(., FP32, saturate=False)`` where it is not an fp32 number; for other ``s``,
``quantize_exact(x, s, FP32, saturate=False)``; (2)
``round_to_format(y, fmt)`` cached per distinct y. ``test_staged_oracle_is_quantize_exact`` checks
the staging against ``quantize_exact`` itself.
"""
import numpy as np
import pytest
import torch

from lowbit.dtypes.formats import E2M1, E4M3, E5M2, FP32
from lowbit.dtypes.quantize import quantize
from lowbit.validate.oracle import quantize_exact, round_to_format

FORMATS = (E4M3, E5M2, E2M1)
SATURATE = [(f, True) for f in FORMATS] + [(E4M3, False), (E5M2, False)]  # E2M1 must saturate
IDS = [f"{f.name}-{'sat' if s else 'nosat'}" for f, s in SATURATE]
# power-of-two scales: 2^-126 overflows fp32 for x > 4 and brings bf16 subnormals into range; 2^100
# sends x < 2^-26 to fp32 subnormals; 2^-9 / 2^-113 overflow the format / fp32; 2^14 makes fmt subnormals.
# Without saturation only overflow differs, so fewer scales there.
BF16_SCALES = {True: (1.0, 2.0 ** -20, 2.0 ** 20, 2.0 ** 100, 2.0 ** -126), False: (1.0, 2.0 ** -126)}
FP16_SCALES = {True: (1.0, 2.0 ** -9, 2.0 ** 14, 2.0 ** -113), False: (1.0, 2.0 ** -9, 2.0 ** -113)}
N_RANDOM = 1_000_000


class Oracle:
    """The staged oracle (module docstring), memoised for the whole module."""

    def __init__(self):
        self.rounded = {}  # (fmt, saturate) -> {float64 bits of y: round_to_format(y)}
        self.fp32_div = {}  # (x bits, s bits) -> fp32(x / s), for quotients that need rounding

    def fp32_quotient(self, x: np.ndarray, s: np.ndarray) -> np.ndarray:
        s = np.ascontiguousarray(np.broadcast_to(np.asarray(s, dtype=np.float64), x.shape)).ravel()
        x = np.ascontiguousarray(x, dtype=np.float64).ravel()
        q = x / s  # exact in float64 when s = 2^k (fp32 x, |k| < 150)
        pow2 = np.frexp(np.abs(s))[0] == 0.5
        with np.errstate(all="ignore"):
            exact = pow2 & (q.astype(np.float32).astype(np.float64) == q)
        # s = 2^k, quotient outside fp32's range: the exact quotient rounded to FP32, as quantize_exact does
        idx = np.nonzero(pow2 & ~exact)[0]
        q[idx] = self.round(q[idx], FP32, saturate=False)
        # any other s: quantize_exact's rational path, once per (x, s)
        idx = np.nonzero(~pow2)[0]
        keys = zip(x[idx].view(np.int64).tolist(), s[idx].view(np.int64).tolist())
        for i, key, xi, si in zip(idx.tolist(), keys, x[idx].tolist(), s[idx].tolist()):
            if key not in self.fp32_div:
                self.fp32_div[key] = quantize_exact(xi, si, FP32, "rne", saturate=False)
            q[i] = self.fp32_div[key]
        return q

    def round(self, y: np.ndarray, fmt, saturate: bool) -> np.ndarray:
        memo = self.rounded.setdefault((fmt.name, saturate), {})
        uniq, inv = np.unique(np.ascontiguousarray(y, dtype=np.float64).view(np.int64), return_inverse=True)
        keys = uniq.tolist()
        todo = [k for k in keys if k not in memo]
        for k, v in zip(todo, np.array(todo, dtype=np.int64).view(np.float64).tolist()):
            memo[k] = round_to_format(v, fmt, "rne", saturate)
        return np.array([memo[k] for k in keys], dtype=np.float64)[inv.ravel()]

    def quantize(self, x: np.ndarray, s, fmt, saturate: bool) -> np.ndarray:
        return self.round(self.fp32_quotient(x, s), fmt, saturate)


@pytest.fixture(scope="module")
def oracle():
    return Oracle()


def check_cast(x: torch.Tensor, s, fmt, saturate, oracle):
    """quantize(x, fmt, s) against the oracle, code for code; ``s`` a float or an array broadcasting to x."""
    s_np = np.asarray(s, dtype=np.float64)
    got = quantize(x, fmt, torch.as_tensor(s_np, dtype=torch.float32), saturate=saturate)
    assert got.shape == x.shape
    codes = (got.view(torch.uint8) if fmt.torch_dtype is not None else got).reshape(-1)
    x64 = x.to(torch.float64).numpy()
    want = oracle.quantize(x64, s_np, fmt, saturate)
    s_flat = np.broadcast_to(s_np, x64.shape).ravel()
    nan = np.isnan(want)
    if fmt.has_nan:
        got_nan = torch.isnan(fmt.decode(codes)).numpy()
        bad_nan = np.nonzero(got_nan != nan)[0]
    else:  # E2M1: NaN -> code 0
        bad_nan = np.nonzero(nan & (codes.numpy() != 0))[0]
    want_codes = fmt.encode(torch.from_numpy(np.where(nan, 0.0, want))).numpy()
    bad = np.union1d(np.nonzero((codes.numpy() != want_codes) & ~nan)[0], bad_nan)
    if bad.size:
        rows = [f"x={float(x64.ravel()[i])!r} s={float(s_flat[i])!r}: got code {int(codes[i])} "
                f"({float(fmt.decode(codes[i:i + 1])[0])}), oracle {float(want[i])!r}" for i in bad[:8]]
        pytest.fail(f"{fmt.name} saturate={saturate}: {bad.size} of {want.size} differ\n" + "\n".join(rows))


def all_patterns(dtype):
    return torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)


# ------------------------------------------------------------------ exhaustive 16-bit inputs
@pytest.mark.parametrize("fmt,saturate", SATURATE, ids=IDS)
def test_all_bf16_patterns(fmt, saturate, oracle):
    x = all_patterns(torch.bfloat16)
    for s in BF16_SCALES[saturate]:
        check_cast(x, s, fmt, saturate, oracle)


@pytest.mark.parametrize("fmt,saturate", SATURATE, ids=IDS)
def test_all_fp16_patterns(fmt, saturate, oracle):
    x = all_patterns(torch.float16)
    for s in FP16_SCALES[saturate]:
        check_cast(x, s, fmt, saturate, oracle)


# ------------------------------------------------------------------ random and edge fp32 inputs
def grid_points(fmt) -> np.ndarray:
    """Nonnegative grid values, every midpoint between neighbours, and the ties/steps above max."""
    p = np.unique(fmt.values().numpy())
    p = p[p >= 0]
    half = 2.0 ** (fmt.emax - fmt.mbits - 1)  # half the top binade's step
    beyond = fmt.max + half * np.arange(1, 5)  # the overflow tie, the next grid value, ...
    return np.concatenate([p, (p[:-1] + p[1:]) / 2, beyond])


def ulps_away(v: np.ndarray, j: np.ndarray) -> np.ndarray:
    """fp32 values j ulps from nonnegative fp32 v (clamped at 0)."""
    bits = v.astype(np.float32).view(np.int32).astype(np.int64) + j
    return np.clip(bits, 0, 0x7F7FFFFF).astype(np.int32).view(np.float32).astype(np.float64)


def edge_cases(fmt) -> np.ndarray:
    f32 = np.finfo(np.float32)
    g = grid_points(fmt)
    near = np.concatenate([ulps_away(g, np.full(g.shape, j)) for j in (-1, 0, 1)])
    special = np.array([0.0, fmt.max, fmt.min_normal, fmt.min_subnormal, fmt.min_subnormal / 2,
                        2 * fmt.max, 1e30, float(f32.max), float(f32.smallest_subnormal),
                        float(f32.smallest_normal), np.inf, np.nan])
    y = np.concatenate([near, special])
    return np.concatenate([y, -y])


def random_fp32_cases(fmt, rng, n):
    """(x, s) with fp32 x and elementwise power-of-two s; see the module docstring for the mix."""
    sign = lambda k: rng.choice([-1.0, 1.0], k)  # noqa: E731
    n_log, n_raw, n_grid = int(0.55 * n), int(0.15 * n), int(0.2 * n)
    n_sub = n - n_log - n_raw - n_grid
    # 1) log-uniform |y| from below the smallest subnormal to above max, x = y * 2^k
    y = (np.exp2(rng.uniform(fmt.emin - fmt.mbits - 3, fmt.emax + 3, n_log)) * sign(n_log))
    k1 = rng.integers(-30, 31, n_log)
    x1 = y.astype(np.float32).astype(np.float64) * np.exp2(k1)
    # 2) raw fp32 bit patterns, scale 1
    x2 = rng.integers(0, 2 ** 32, n_raw, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x2 = torch.from_numpy(x2).double().numpy()  # numpy warns on signalling NaNs
    k2 = np.zeros(n_raw, dtype=np.int64)
    # 3) within 2 ulps of a grid value, midpoint (tie) or overflow tie, x = y * 2^k
    g = grid_points(fmt)
    y3 = ulps_away(g[rng.integers(0, g.size, n_grid)], rng.integers(-2, 3, n_grid)) * sign(n_grid)
    k3 = rng.integers(-20, 21, n_grid)
    x3 = y3 * np.exp2(k3)
    # 4) fp32 subnormals at scales that bring them into the format's range
    x4 = (rng.integers(1, 2 ** 23, n_sub).astype(np.float64) * 2.0 ** -149) * sign(n_sub)
    k4 = rng.choice([0, -126, -133, -140], n_sub)
    x = np.concatenate([x1, x2, x3, x4])
    k = np.concatenate([k1, k2, k3, k4])
    with np.errstate(all="ignore"):  # y * 2^k near 0 may underflow in fp32: x is what counts
        x = x.astype(np.float32).astype(np.float64)
    return x, np.exp2(k.astype(np.float64))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_random_and_edge_fp32(fmt, oracle):
    rng = np.random.default_rng(20 + FORMATS.index(fmt))
    x, s = random_fp32_cases(fmt, rng, N_RANDOM)
    check_cast(torch.from_numpy(x.astype(np.float32)), s, fmt, True, oracle)
    # edge list at several scales (x = fp32(y * s): the product may itself round, overflow or underflow)
    e = edge_cases(fmt)
    for s in (1.0, 2.0 ** -10, 2.0 ** 12, 2.0 ** -60, 2.0 ** 70):
        with np.errstate(all="ignore"):
            xe = torch.from_numpy((e * s).astype(np.float32))
        check_cast(xe, s, fmt, True, oracle)
        if fmt.has_nan:
            check_cast(xe, s, fmt, False, oracle)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_non_power_of_two_scales(fmt, oracle):
    rng = np.random.default_rng(30)
    sample = torch.cat([all_patterns(torch.bfloat16).float()[rng.permutation(65536)[:1500]],
                        all_patterns(torch.float16).float()[rng.permutation(65536)[:1500]]])
    for s in (0.3, 3.1415927e-3, 1.7e3, 1.3e5):  # 1.3e5: bf16/fp16 values land in the subnormals
        s = float(np.float32(s))
        check_cast(sample, s, fmt, True, oracle)
        with np.errstate(all="ignore"):
            ys = torch.from_numpy((edge_cases(fmt) * s).astype(np.float32))
        check_cast(ys, s, fmt, True, oracle)
    # per-row arbitrary fp32 scales (shape (R, 1)) broadcast over the columns
    rows = np.exp2(rng.uniform(-20, 20, (32, 1))).astype(np.float32).astype(np.float64)
    x = torch.from_numpy((rng.standard_normal((32, 96)) * rows * 100).astype(np.float32))
    check_cast(x, rows, fmt, True, oracle)


def test_staged_oracle_is_quantize_exact(oracle):
    """The staging used above equals quantize_exact called directly, on a sample of every kind of input."""
    rng = np.random.default_rng(40)
    for fmt, saturate in SATURATE:
        x, s = random_fp32_cases(fmt, rng, 400)
        x = np.concatenate([x, edge_cases(fmt)[::7], all_patterns(torch.bfloat16).double().numpy()[::331]])
        s = np.concatenate([s, np.full(x.size - s.size, 2.0 ** 100)])
        s[::5] = 0.37  # the rational path too
        s[1::5] = 2.0 ** -100
        staged = oracle.quantize(x, s, fmt, saturate)
        direct = np.array([quantize_exact(a, b, fmt, "rne", saturate) for a, b in zip(x.tolist(), s.tolist())])
        assert np.array_equal(staged, direct, equal_nan=True)
        assert np.array_equal(np.signbit(staged), np.signbit(direct))


# ------------------------------------------------------------------ the contract, spelled out
def q_values(xs, fmt, scale=1.0, saturate=True):
    q = quantize(torch.tensor(xs, dtype=torch.float32), fmt, scale, saturate=saturate)
    return fmt.decode(q.view(torch.uint8) if fmt.torch_dtype is not None else q).tolist()


def test_overflow_saturates_and_nan_stays_nan():
    inf, nan = float("inf"), float("nan")
    for fmt in FORMATS:
        m = fmt.max
        got = q_values([2 * m, -2 * m, inf, -inf, 3e38], fmt)
        assert got == [m, -m, m, -m, m]
        assert q_values([1.0, -1.0], fmt, scale=2.0 ** -30) == [m, -m]  # overflow through the scale
    assert all(v != v for v in q_values([nan, -nan], E4M3) + q_values([nan], E5M2))
    assert quantize(torch.tensor([nan, -nan]), E2M1, 1.0).tolist() == [0, 0]  # E2M1: NaN -> code 0


def test_no_saturate_gives_inf_for_e5m2_and_nan_for_e4m3():
    inf = float("inf")
    # E5M2: 61440 is the tie between max 57344 and 65536 -> rounds up -> inf
    assert q_values([61439.0, 61440.0, -61440.0, inf, -inf, 1e30], E5M2, saturate=False) == \
        [57344.0, inf, -inf, inf, -inf, inf]
    # E4M3: 464 is the tie between 448 and 480 -> 448 (even); anything above is NaN
    got = q_values([449.0, 464.0, 464.03125, -500.0, inf, 1e30], E4M3, saturate=False)
    assert got[:2] == [448.0, 448.0] and all(v != v for v in got[2:])


def test_signed_zero_and_underflow_keep_sign():
    for fmt in FORMATS:
        q = quantize(torch.tensor([0.0, -0.0, 1e-30, -1e-30, -fmt.min_subnormal / 2]), fmt, 1.0)
        codes = (q.view(torch.uint8) if fmt.torch_dtype is not None else q).tolist()
        neg_zero = 1 << (fmt.ebits + fmt.mbits)
        assert codes == [0, neg_zero, 0, neg_zero, neg_zero]
