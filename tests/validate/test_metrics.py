"""Metrics and bounds of lowbit.validate.metrics against independent computation, and bounds that
hold for what they bound and break for a planted fault."""
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from lowbit.dtypes import E2M1, E4M3, E5M2, quantize
from lowbit.dtypes.formats import BF16, FP32
from lowbit.validate import metrics as M
from lowbit.validate.oracle import round_to_format


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1])
def test_ulp_distance_counts_the_values_between(fmt):
    vals = sorted({v for v in fmt.values().tolist()})  # -0 and +0 are one value
    g = torch.Generator().manual_seed(0)
    i, j = torch.randint(0, len(vals), (2, 500), generator=g)
    a = torch.tensor([vals[k] for k in i.tolist()], dtype=torch.float64)
    b = torch.tensor([vals[k] for k in j.tolist()], dtype=torch.float64)
    assert M.ulp_distance(a, b, fmt).tolist() == (i - j).abs().double().tolist()
    assert M.ulp_distance(torch.tensor([-0.0]), torch.tensor([0.0]), fmt).item() == 0


def test_ulp_distance_nan_rules_and_wide_formats():
    nan = torch.tensor([math.nan, math.nan, 1.0])
    assert M.ulp_distance(nan, torch.tensor([math.nan, 1.0, math.nan]), E4M3).tolist() == [0, math.inf, math.inf]
    x = torch.tensor([1.0, -2.0 ** -149, 3.0], dtype=torch.float64)
    nxt = torch.from_numpy(np.nextafter(x.numpy().astype(np.float32), np.float32(np.inf)).astype(np.float64))
    assert M.ulp_distance(x, nxt, FP32).tolist() == [1, 1, 1]
    assert M.ulp_distance(torch.tensor([1.0]), torch.tensor([1.0 + 2 ** -6]), BF16).item() == 2


def test_ulp_error_in_units_of_the_exact_values_binade():
    exact = torch.tensor([1.0, 1.5, 2.0 ** -149, 0.0, 8.0], dtype=torch.float64)
    out = torch.tensor([1.0 + 2 ** -23, 1.5 + 2 ** -24, 2.0 ** -148, 2.0 ** -149, 8.0], dtype=torch.float64)
    assert M.ulp_error(out, exact, FP32).tolist() == [1.0, 0.5, 1.0, 1.0, 0.0]
    odd = M.ulp_error(torch.tensor([math.inf, math.nan, math.nan]), torch.tensor([math.inf, 1.0, math.nan]), FP32)
    assert odd.tolist() == [0.0, math.inf, 0.0]
    h = M.ulp_histogram(torch.tensor([0.0, 0.25, 0.5, 0.75, 3.0, 100.0, math.inf]))
    assert h == {"0": 1, "(0,0.5]": 2, "(0.5,1]": 1, "(1,2]": 0, "(2,4]": 1, "(4,8]": 0, ">8": 1, "inf": 1}


def test_norm_metrics_against_fractions():
    ref = torch.tensor([[3.0, -4.0], [1.0, 0.0]], dtype=torch.float64)
    app = torch.tensor([[3.0, -3.0], [1.0, 0.5]], dtype=torch.float64)
    sig, noise = Fraction(9 + 16 + 1), Fraction(1 + Fraction(1, 4))
    assert M.sqnr_db(ref, app) == pytest.approx(10 * math.log10(sig / noise), rel=1e-12)
    assert M.rel_frobenius(ref, app) == pytest.approx(math.sqrt(noise / sig), rel=1e-12)
    per = M.sqnr_per_channel_db(ref, app)  # channels along the last dim
    assert per.tolist() == pytest.approx([math.inf, 10 * math.log10(16 / 1.25)])
    assert M.sqnr_per_channel_db(torch.zeros(2, 1), torch.ones(2, 1)).item() == -math.inf


def _exact_error(out, a, b):
    A, B = a.double().tolist(), b.double().tolist()
    return [[abs(Fraction(out[i][j]) - sum(Fraction(A[i][k]) * Fraction(B[k][j]) for k in range(len(B))))
             for j in range(len(B[0]))] for i in range(len(A))]


def test_matmul_error_is_a_tight_upper_bound_on_the_exact_difference():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(5, 64, generator=g) * torch.exp2(torch.randint(-40, 40, (5, 64), generator=g).float())
    b = torch.randn(64, 4, generator=g) * torch.exp2(torch.randint(-40, 40, (64, 4), generator=g).float())
    a[0, 1::2] = a[0, ::2]  # pairs that cancel against b's opposite pairs
    b[1::2, 0] = -b[::2, 0]
    out = (a @ b)
    out[1, 1] = float((a[1].double() @ b[:, 1].double()))  # (nearly) exact: the error is tiny, not zero
    err = M.matmul_error(out, a, b)
    exact = _exact_error(out.double().tolist(), a, b)
    S = (a.double().abs() @ b.double().abs()) + out.double().abs()
    for i in range(5):
        for j in range(4):
            e = exact[i][j]
            assert e <= Fraction(float(err[i, j])) <= e * (1 + Fraction(1, 2 ** 50)) + Fraction(float(S[i, j])) * 2 ** -80
    assert float(err[0, 0]) < 2.0 ** -60 * float(S[0, 0])  # an exact cancellation is seen as (almost) zero
    a[2, 3] = math.nan
    b[5, 1] = math.inf
    err = M.matmul_error(out, a, b)
    assert bool(err[2].isnan().all()) and bool(err[:, 1].isnan().all()) and not bool(err[0, 0].isnan())
    assert M.exact_matmul(a[:1, :8], b[:8, :1])[0][0] == sum(Fraction(float(a[0, k])) * Fraction(float(b[k, 0]))
                                                            for k in range(8))


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1])
def test_quantization_bound_holds_and_an_off_by_one_cast_breaks_it(fmt):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-12, 6, (4096,), generator=g).float())
    s = torch.tensor(float(x.abs().max()) / fmt.max / 3)  # the largest elements saturate: the bound's clip term
    q = quantize(x, fmt, s)
    deq = (fmt.decode(q) if fmt is E2M1 else q.float()).double() * float(s)
    bound = M.quantization_bound(x, s, fmt)
    assert bool(((deq - x.double()).abs() <= bound).all())
    assert bool(((deq - x.double()).abs() > 0.5 * bound).any())  # not a vacuous bound
    if fmt is not E2M1:  # one code up: more than half a step away from x for some elements
        bumped = (q.view(torch.uint8) + (q.view(torch.uint8) & 0x7F < 0x70).to(torch.uint8)).view(q.dtype)
        err = (bumped.float().double() * float(s) - x.double()).abs()
        assert bool((err > bound).any())


def _truncate(v: Fraction, bits: int) -> Fraction:
    if v == 0:
        return v
    e = math.floor(math.log2(abs(v)))
    while Fraction(2) ** e > abs(v):
        e -= 1
    while Fraction(2) ** (e + 1) <= abs(v):
        e += 1
    ulp = Fraction(2) ** (e - bits + 1)
    return math.copysign(1, v) * (abs(v) // ulp) * ulp


def _tensor_core(a, b, bits, group, promote):
    """Truncating accumulator (metrics.TensorCore's model) on float64 operands, exact arithmetic."""
    A, B = a.double().tolist(), b.double().tolist()
    K = len(B)
    L = promote or K
    out = []
    for i in range(len(A)):
        row = []
        for j in range(len(B[0])):
            total = Fraction(0)
            for c0 in range(0, K, L):
                acc = Fraction(0)
                for g0 in range(c0, min(c0 + L, K), group):
                    acc = _truncate(acc + sum(Fraction(A[i][k]) * Fraction(B[k][j])
                                              for k in range(g0, min(g0 + group, c0 + L, K))), bits)
                total = Fraction(round_to_format(total + acc, FP32, saturate=False))
            row.append(float(total))
        out.append(row)
    return torch.tensor(out, dtype=torch.float64)


def test_tensor_core_bound_holds_for_the_model_and_catches_a_missing_promotion():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(4, 512, generator=g).to(torch.float8_e4m3fn).double()
    b = torch.randn(512, 3, generator=g).to(torch.float8_e4m3fn).double()
    core = M.HOPPER_FP8.with_promotion(128)
    out = _tensor_core(a, b, 14, 32, 128)
    assert M.bound_ratio(out, M.matmul_error(out, a, b), M.tensor_core_bound(a, b, core)) <= 1
    # one big product, then small ones: without promotion they vanish; the promoted bound says no
    sw_a = torch.full((1, 2048), 2.0 ** -2, dtype=torch.float64)  # products 2^-4: a group of 32 sums to 2,
    sw_b = torch.full((2048, 1), 2.0 ** -2, dtype=torch.float64)  # under the 14-bit step 8 of 2^16
    sw_a[0, 0], sw_b[0, 0] = 256.0, 256.0
    unpromoted = _tensor_core(sw_a, sw_b, 14, 32, None)
    err = M.matmul_error(unpromoted, sw_a, sw_b)
    assert M.bound_ratio(unpromoted, err, M.tensor_core_bound(sw_a, sw_b, core)) > 1
    assert M.bound_ratio(unpromoted, err, M.tensor_core_bound(sw_a, sw_b, M.HOPPER_FP8)) <= 1


def test_fp32_bound_needs_the_underflow_term_for_subnormal_products():
    a = torch.full((1, 32), 2.0 ** -75)
    b = torch.full((32, 1), 3 * 2.0 ** -77)
    out = (a @ b).double()  # each product 3 * 2^-152: rounds to 2^-150 in fp32
    err = M.matmul_error(out, a, b)
    assert M.bound_ratio(out, err, M.gemm_bound(a, b)) > 1
    ufl = M.underflow_bound(32 + 4, torch.ones(1), torch.ones(1), torch.zeros(1, 1))
    assert M.bound_ratio(out, err, M.gemm_bound(a, b) + ufl) <= 1
