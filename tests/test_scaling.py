"""Scale rules of every recipe against an independent exact computation (docs/design.md "Conventions").

The references here use exact rationals (``fractions.Fraction``) and ``oracle.round_to_format``
only, never lowbit's torch code:

* FP32 scales (Current, Rowwise, Blockwise): ``fp32(amax / fmax)``, 1 for an all-zero block.
* MX ``floor``: ``2^(floor(log2 amax) - emax_elem)``; ``rceil``: ``2^ceil(log2(amax / fmax))``;
  the exponent clamped to E8M0's [-127, 127]; 1 for a zero block; NaN for a block holding NaN.
* NV: ``g = fp32(amax / 2688)`` (1 when that is 0), ``s_b = max(e4m3(fp32(fp32(amax_b / 6) / g)), 2^-9)``,
  NaN for a NaN block; elements use ``fp32(s_b * g)``.

amax is over the finite elements of a block. Then every element of ``from_float`` must equal
``oracle.quantize_exact(x, effective scale)`` bit for bit. Partial blocks behave as zero padding.
"""
import math
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

from lowbit.dtypes import E2M1, E4M3, FP4Tensor, FP8Tensor
from lowbit.dtypes.formats import FP32
from lowbit.scaling import MX, NV, Block, Blockwise, Current, Rowwise
from lowbit.validate.oracle import quantize_exact, round_to_format

F32MAX = torch.finfo(torch.float32).max
TINY = 2.0 ** -149


# ---- exact references -------------------------------------------------------------------------
def floor_log2(q: Fraction) -> int:
    k = q.numerator.bit_length() - q.denominator.bit_length()
    while Fraction(2) ** k > q:
        k -= 1
    while Fraction(2) ** (k + 1) <= q:
        k += 1
    return k


def finite_amax(vals) -> Fraction:
    return max((abs(Fraction(v)) for v in vals if math.isfinite(v)), default=Fraction(0))


def fp32(q) -> Fraction:
    return Fraction(round_to_format(q, FP32))


def ref_mx_scale(vals, fmt, rule) -> float:
    if any(math.isnan(v) for v in vals):
        return math.nan
    a = finite_amax(vals)
    if a == 0:
        return 1.0
    if rule == "floor":
        k = floor_log2(a) - fmt.emax
    else:
        r = a / Fraction(fmt.max)
        k = floor_log2(r)
        k += Fraction(2) ** k < r  # ceil(log2 r)
    return math.ldexp(1.0, min(max(k, -127), 127))


def ref_fp32_scale(vals, fmt) -> float:
    a = finite_amax(vals)
    return 1.0 if a == 0 else float(fp32(a / Fraction(fmt.max)))


def blocks_of(x: torch.Tensor, br: int, bc: int):
    """{(i, j): list of the float values of block (i, j)} for a 2-D tensor (partial blocks: present elements)."""
    R, C = x.shape
    rows = x.tolist()
    return {(i, j): [v for r in rows[i * br:(i + 1) * br] for v in r[j * bc:(j + 1) * bc]]
            for i in range(-(-R // br)) for j in range(-(-C // bc))}


def ref_nv_scales(x: torch.Tensor, br: int, bc: int):
    """(block scales as a float64 tensor, global scale) of the NV rule."""
    g = fp32(finite_amax(x.flatten().tolist()) / 2688)
    g = g if g > 0 else Fraction(1)
    blocks = blocks_of(x, br, bc)
    nr, nc = -(-x.shape[0] // br), -(-x.shape[1] // bc)
    s = torch.empty(nr, nc, dtype=torch.float64)
    for (i, j), vals in blocks.items():
        if any(math.isnan(v) for v in vals):
            s[i, j] = math.nan
            continue
        t = fp32(fp32(finite_amax(vals) / 6) / g)
        s[i, j] = max(round_to_format(t, E4M3), 2.0 ** -9)
    return s, float(g)


def expand(s: torch.Tensor, shape, br: int, bc: int) -> torch.Tensor:
    return s.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:shape[0], :shape[1]]


def assert_bits(got: torch.Tensor, want: torch.Tensor):
    """Equal as float64 bit patterns (signed zeros distinguished), NaN matching NaN."""
    got, want = got.to(torch.float64), want.to(torch.float64)
    assert got.shape == want.shape
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), "NaN positions differ"
    bad = (got.view(torch.int64) != want.view(torch.int64)) & ~nan
    assert not bad.any(), list(zip(got[bad][:5].tolist(), want[bad][:5].tolist()))


def oracle_elements(x: torch.Tensor, scale: torch.Tensor, fmt) -> torch.Tensor:
    """quantize_exact elementwise. A NaN scale (NaN block) gives NaN elements, except E2M1 (no NaN
    code): there the block's codes are 0 and the NaN lives in the scale."""
    nan_block = 0.0 if fmt is E2M1 else math.nan
    out = [nan_block if math.isnan(s) else quantize_exact(v, s, fmt)
           for v, s in zip(x.flatten().tolist(), scale.flatten().tolist())]
    return torch.tensor(out, dtype=torch.float64).reshape(x.shape)


def fp4_values(q: FP4Tensor) -> torch.Tensor:
    return E2M1.decode(q.codes()).to(torch.float64)


# ---- edge-case blocks ---------------------------------------------------------------------------
def edge_blocks(n: int, fmax: float, seed: int = 0) -> torch.Tensor:
    """One block of ``n`` fp32 values per row, each row an edge case for the scale rules."""
    g = torch.Generator().manual_seed(seed)
    f = lambda v: float(torch.tensor(v, dtype=torch.float32))  # noqa: E731
    up = lambda v: float(torch.nextafter(torch.tensor(v, dtype=torch.float32), torch.tensor(math.inf)))  # noqa: E731
    dn = lambda v: float(torch.nextafter(torch.tensor(v, dtype=torch.float32), torch.tensor(0.0)))  # noqa: E731
    amaxes = [1.0, 2.0 ** 10, 2.0 ** -20, dn(1.0), dn(2.0 ** 7), up(2.0 ** -5),
              f(fmax), dn(f(fmax)), up(f(fmax)), f(fmax * 2 ** -3), up(f(fmax * 2 ** -3)),
              dn(f(fmax * 2 ** 4)), f(fmax * 2 ** -30),
              2.0 ** -140, 3 * TINY, TINY, 1e-39, 2.0 ** -126, dn(2.0 ** -126),
              F32MAX, 2.0 ** 127, 1e38, 0.3, 7e5]
    rows = []
    for i, a in enumerate(amaxes):
        r = torch.rand(n, generator=g) * 0.9 * a * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
        r[i % n] = a if i % 2 else -a
        rows.append(r)
    z = torch.zeros(n)
    z[1::2] = -0.0
    rows.append(z)                                                      # all-zero block
    r = torch.randn(n, generator=g)
    r[3] = math.nan
    rows.append(r)                                                      # NaN block
    r = torch.randn(n, generator=g)
    r[0], r[5] = math.inf, -math.inf
    rows.append(r)                                                      # +-inf: amax over finite
    r = torch.zeros(n)
    r[2] = math.inf
    rows.append(r)                                                      # inf and zeros only
    return torch.stack(rows).to(torch.float32)


# ---- MX -------------------------------------------------------------------------------------------
MX_CASES = [(elem, rule) for elem in ("e4m3", "e5m2", "e2m1") for rule in ("floor", "rceil")]


def _mx_quantize(x, recipe, role="input"):
    if recipe.kind == "fp4":
        q = FP4Tensor.from_float(x, recipe, role)
        return q, q.block_scale_fp32(), fp4_values(q)
    q = FP8Tensor.from_float(x, recipe, role)
    assert q._scale.dtype == torch.float8_e8m0fnu
    return q, q.scale_fp32(), q._data.to(torch.float64)


@pytest.mark.parametrize("elem,rule", MX_CASES)
def test_mx_scales_and_elements_edge_blocks(elem, rule):
    recipe = MX(elem=elem, scale_rule=rule)
    fmt = recipe.format("input")
    x = edge_blocks(32, fmt.max, seed=1)
    q, scale, vals = _mx_quantize(x, recipe)
    want = torch.tensor([[ref_mx_scale(r, fmt, rule)] for r in x.tolist()], dtype=torch.float64)
    assert_bits(scale, want)
    assert (want[~want.isnan()] >= 2.0 ** -127).all() and (want[~want.isnan()] <= 2.0 ** 127).all()
    assert_bits(vals, oracle_elements(x, expand(want, x.shape, 1, 32), fmt))
    deq = q.dequantize(torch.float64)  # exactly the quantized values times the scale; NaN block -> NaN
    assert_bits(deq, vals * expand(want, x.shape, 1, 32))


@pytest.mark.parametrize("elem,rule", MX_CASES)
def test_mx_random_blocks_with_partial_block(elem, rule):
    """Random magnitudes, K = 72 = 2 * 32 + 8: the last block has 8 elements (zero padding)."""
    recipe = MX(elem=elem, scale_rule=rule)
    fmt = recipe.format("input")
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 72, generator=g) * torch.exp2(torch.randint(-30, 30, (6, 1), generator=g).float())
    q, scale, vals = _mx_quantize(x, recipe)
    want = torch.empty(6, 3, dtype=torch.float64)
    for (i, j), b in blocks_of(x, 1, 32).items():
        want[i, j] = ref_mx_scale(b, fmt, rule)
    assert_bits(scale, want)
    assert_bits(vals, oracle_elements(x, expand(want, x.shape, 1, 32), fmt))


def test_mx_rules_differ_only_at_the_boundary():
    """floor and rceil agree exactly when amax / 2^floor(log2 amax) <= fmax / 2^emax (the top
    mantissa of the element format): e.g. E4M3, amax = 1.75 * 2^k -> same; 1.8 * 2^k -> rceil is 2x."""
    x = torch.tensor([[1.75] + [0.0] * 31, [1.8] + [0.0] * 31])
    fl = FP8Tensor.from_float(x, MX(scale_rule="floor")).scale_fp32()
    rc = FP8Tensor.from_float(x, MX(scale_rule="rceil")).scale_fp32()
    assert fl[0, 0] == rc[0, 0] == 2.0 ** -8
    assert fl[1, 0] == 2.0 ** -8 and rc[1, 0] == 2.0 ** -7


# ---- NV -------------------------------------------------------------------------------------------
def nv_tensors():
    g = torch.Generator().manual_seed(3)
    mag = torch.exp2(torch.randint(-14, 6, (12, 1), generator=g).float())
    t1 = torch.randn(12, 48, generator=g) * mag
    t1[0, :16] = 0.0                        # zero block
    t1[1, 20] = math.nan                    # NaN block
    t1[2, 40] = math.inf                    # inf element (saturates; not in amax)
    t1[3, :16] = torch.randn(16, generator=g) * 1e-7  # s_b underflows E4M3: raised to 2^-9
    t2 = edge_blocks(16, 6.0, seed=4)       # every edge amax in one tensor (F32MAX sets g)
    t3 = torch.randn(4, 32, generator=g) * 1e-40  # subnormal: g and s_b * g are subnormal
    t4 = torch.randn(4, 32, generator=g) * 2.0 ** -146  # amax / 2688 underflows to 0: g = 1
    t5 = torch.zeros(4, 32)
    return [t1, t2, t3, t4, t5]


@pytest.mark.parametrize("idx", range(5))
@pytest.mark.parametrize("role,weight_2d", [("input", True), ("weight", True), ("weight", False), ("grad", True)])
def test_nv_scales_and_elements(idx, role, weight_2d):
    x = nv_tensors()[idx]
    recipe = NV(weight_2d=weight_2d)
    br, bc = (16, 16) if role == "weight" and weight_2d else (1, 16)
    q = FP4Tensor.from_float(x, recipe, role, generator=torch.Generator().manual_seed(0))
    s_want, g_want = ref_nv_scales(x, br, bc)
    assert q._scale.dtype == torch.float8_e4m3fn and q._global_scale.dtype == torch.float32
    assert_bits(q.block_scale_fp32(), s_want)
    assert_bits(q._global_scale, torch.tensor(g_want, dtype=torch.float64))
    if role == "grad":  # stochastic rounding: elements are checked in test_stochastic_rounding.py
        return
    eff = torch.tensor([[float(fp32(Fraction(s) * Fraction(g_want))) if not math.isnan(s) else math.nan
                         for s in row] for row in s_want.tolist()], dtype=torch.float64)
    assert_bits(fp4_values(q), oracle_elements(x, expand(eff, x.shape, br, bc), E2M1))
    deq = q.dequantize(torch.float64)
    assert torch.equal(torch.isnan(deq), torch.isnan(expand(s_want, x.shape, br, bc)))


def test_nv_16x16_weight_one_scale_per_tile_same_for_transpose():
    g = torch.Generator().manual_seed(5)
    w = torch.randn(40, 56, generator=g) * torch.exp2(torch.randint(-8, 8, (40, 1), generator=g).float())
    q = FP4Tensor.from_float(w, NV(), "weight")
    qt = FP4Tensor.from_float(w.t().contiguous(), NV(), "weight")
    assert q._scale.shape == (3, 4) and q.block == Block(16, 16)
    assert_bits(q.block_scale_fp32(), ref_nv_scales(w, 16, 16)[0])
    assert torch.equal(qt._scale.view(torch.uint8), q._scale.t().view(torch.uint8))
    assert torch.equal(qt._global_scale, q._global_scale)
    assert torch.equal(qt.dequantize(), q.dequantize().t())
    assert torch.equal(q.t().dequantize(), qt.dequantize())  # the transposed view serves W^T as is


# ---- FP32 scales ----------------------------------------------------------------------------------
FP32_CASES = [(Current(), "input", (-1, -1)), (Current(), "grad", (-1, -1)), (Rowwise(), "weight", (1, -1)),
              (Blockwise(), "input", (1, 128)), (Blockwise(), "weight", (128, 128)),
              (Blockwise(act=(1, 16), weight=(16, 16)), "weight", (16, 16)),
              (Blockwise(act=(1, 16), weight=(16, 16)), "grad", (1, 16))]


@pytest.mark.parametrize("recipe,role,blk", FP32_CASES, ids=lambda v: str(v)[:24])
def test_fp32_scales_and_elements(recipe, role, blk):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(20, 136, generator=g) * torch.exp2(torch.randint(-10, 10, (20, 1), generator=g).float())
    x[0, :16] = 0.0
    x[5, 3], x[6, 7] = math.nan, -math.inf
    x[7, 1] = TINY
    fmt = recipe.format(role)
    br, bc = (x.shape[0] if blk[0] == -1 else blk[0]), (x.shape[1] if blk[1] == -1 else blk[1])
    q = FP8Tensor.from_float(x, recipe, role)
    want = torch.empty(-(-20 // br), -(-136 // bc), dtype=torch.float64)
    for (i, j), b in blocks_of(x, br, bc).items():
        want[i, j] = ref_fp32_scale(b, fmt)
    assert q._scale.dtype == torch.float32
    assert_bits(q.scale_fp32().reshape(want.shape), want)
    assert_bits(q._data.to(torch.float64), oracle_elements(x, expand(want, x.shape, br, bc), fmt))


# ---- partial blocks and shapes ------------------------------------------------------------------
PARTIAL = [(MX(), "input", 1, 32), (MX(elem="e2m1", scale_rule="rceil"), "input", 1, 32),
           (NV(), "input", 1, 16), (NV(), "weight", 16, 16), (Blockwise(), "weight", 128, 128),
           (Blockwise(act=(1, 16), weight=(16, 16)), "weight", 16, 16), (Rowwise(), "input", 1, 40)]


@pytest.mark.parametrize("recipe,role,br,bc", PARTIAL, ids=lambda v: str(v)[:20])
def test_partial_blocks_are_zero_padded(recipe, role, br, bc):
    """A (20, 40) tensor quantizes exactly as its zero-padded version, restricted to the present part."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(20, 40, generator=g) * 3
    R, C = -(-20 // br) * br, -(-40 // bc) * bc
    xp = F.pad(x, (0, C - 40, 0, R - 20))
    T = FP4Tensor if recipe.kind == "fp4" else FP8Tensor
    q, qp = T.from_float(x, recipe, role), T.from_float(xp, recipe, role)
    assert q._scale.shape == qp._scale.shape == (R // br, C // bc)
    assert torch.equal(q._scale.view(torch.uint8) if q._scale.dtype != torch.float32 else q._scale,
                       qp._scale.view(torch.uint8) if qp._scale.dtype != torch.float32 else qp._scale)
    assert torch.equal(q.dequantize(), qp.dequantize()[:20, :40])


@pytest.mark.parametrize("recipe", [MX(elem="e2m1"), NV()], ids=["mxfp4", "nvfp4"])
def test_fp4_needs_even_last_dim(recipe):
    with pytest.raises(ValueError, match="even"):
        FP4Tensor.from_float(torch.randn(4, 33), recipe)
    with pytest.raises(ValueError, match="even"):
        FP4Tensor.from_float(torch.tensor(1.0), recipe)
