"""Bad input to the tensor constructors and recipes: clear errors or well-defined numbers.

* NaN in -> NaN out where the format holds NaN (per element for FP32 scales; MX: the E8M0 block
  scale is NaN, so the whole block is NaN, as OCP MX specifies); FP4 has no NaN code: the block
  scale is NaN and the block dequantizes to NaN. +-inf saturates to +-max * scale; neither
  changes the scales of other blocks (amax is over finite values).
* All zeros: finite scales, zeros out (signs kept). Empty tensors: empty results, no error.
* Non-contiguous input quantizes exactly like its contiguous copy.
* Integer / bool / float8 input: TypeError naming the dtype. A recipe for the other tensor class,
  Delayed without state, invalid recipe fields and roles: ValueError / TypeError saying what is wrong.
"""
import math

import pytest
import torch

from lowbit.dtypes import FP4Tensor, FP8Tensor
from lowbit.kernels import scaled_mm
from lowbit.scaling import MX, NV, Blockwise, Current, Delayed, DelayedScalingState, Rowwise
from lowbit_cases import GRANULARITIES, NAMES, assert_same_lowbit, bits, quantized, sample

FP32_SCALED = ["tensor", "tensor-e5m2", "row", "1x128", "128x128"]


def scale_of(q) -> torch.Tensor:
    return q.scale_fp32() if isinstance(q, FP8Tensor) else q.block_scale_fp32()


# ---- NaN / inf ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FP32_SCALED)
def test_nan_inf_fp32_scaled(name):
    x = sample((20, 136))
    clean = quantized(name, x=x)
    x[3, 5], x[4, 6], x[7, 130] = math.nan, math.inf, -math.inf
    q = quantized(name, x=x)
    d = q.dequantize()
    assert torch.equal(torch.isnan(d), torch.isnan(x))  # NaN only where it came in
    fmax = q.fmt.max
    s = scale_of(q).reshape(-1) if q.block.is_tensorwise else None
    for (i, j), sign in (((4, 6), 1), ((7, 130), -1)):
        si = s[0] if s is not None else \
            q.scale_fp32()[i // q.block.sizes(q.shape)[0], j // q.block.sizes(q.shape)[1]]
        assert d[i, j] == sign * fmax * si  # inf saturates to +-max * scale
    # the finite elements saw the same scales as without the specials
    assert torch.equal(q.scale_fp32(), clean.scale_fp32())
    ok = torch.isfinite(x)
    assert torch.equal(d[ok], clean.dequantize()[ok])


@pytest.mark.parametrize("name", ["mx-fp8", "mx-fp4", "nv-1x16", "nv-16x16"])
def test_nan_block_scaled(name):
    """A NaN poisons its block (NaN scale), nothing else; inf saturates inside its block."""
    x = sample((20, 136))
    x[2, 40] = math.nan
    x[9, 100] = math.inf
    q = quantized(name, x=x)
    br, bc = q.block.sizes(q.shape)
    s = scale_of(q)
    nan_blocks = torch.zeros_like(s, dtype=torch.bool)
    nan_blocks[2 // br, 40 // bc] = True
    assert torch.equal(torch.isnan(s), nan_blocks)
    d = q.dequantize()
    want_nan = nan_blocks.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:20, :136]
    assert torch.equal(torch.isnan(d), want_nan)
    assert torch.isfinite(d[~want_nan]).all() and d[9, 100] > 0
    if isinstance(q, FP4Tensor):
        assert torch.isfinite(q._global_scale) and q._global_scale > 0
        assert (q.codes()[want_nan] == 0).all()  # E2M1 has no NaN: codes 0, the NaN is in the scale


def test_all_nan_and_all_inf_tensors():
    for name in ("tensor", "mx-fp8", "nv-1x16", "mx-fp4"):
        q = quantized(name, x=torch.full((4, 32), math.nan))
        assert torch.isnan(q.dequantize()).all()
        q = quantized(name, x=torch.full((4, 32), -math.inf))
        d = q.dequantize()
        assert torch.isfinite(d).all() and (d < 0).all()  # saturated, with scale 1 (no finite amax)


# ---- zeros, empty, non-contiguous -----------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_all_zeros(name):
    x = torch.zeros(20, 136)
    x[::2, 1::3] = -0.0
    q = quantized(name, x=x)
    s = scale_of(q)
    assert torch.isfinite(s).all() and (s > 0).all()
    d = q.dequantize()
    assert torch.equal(bits(d), bits(x))  # zeros, signs kept


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(0, 32), (4, 0), (0, 0)])
def test_empty(name, shape):
    q = quantized(name, x=torch.empty(shape))
    assert q.shape == shape and q.dequantize().shape == shape and q.t().dequantize().shape == shape[::-1]


@pytest.mark.parametrize("name", ["tensor", "1x128", "mx-fp4", "nv-16x16"])
def test_empty_gemm(name):
    cls, recipe, _ = GRANULARITIES[name]
    a = cls.from_float(torch.empty(0, 32), recipe, "input")
    b = cls.from_float(torch.randn(6, 32), recipe, "weight")
    assert scaled_mm(a, b.t()).shape == (0, 6)


@pytest.mark.parametrize("name", NAMES)
def test_non_contiguous_same_as_contiguous(name):
    big = sample((40, 272), seed=3)
    views = [big[::2, ::2], big[:, :136].t().t()[1::2], sample((136, 20), seed=4).t()]
    for x in views:
        assert not x.is_contiguous()
        assert_same_lowbit(quantized(name, x=x), quantized(name, x=x.contiguous()), same_strides=False)


# ---- wrong dtypes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tensor", "mx-fp8", "mx-fp4", "nv-1x16"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool, torch.float8_e4m3fn])
def test_non_float_input_is_a_type_error_naming_the_dtype(name, dtype):
    x = torch.ones(4, 32).to(dtype)
    with pytest.raises(TypeError, match=str(dtype).replace(".", r"\.")):
        quantized(name, x=x)


def test_not_a_tensor():
    with pytest.raises(TypeError, match="list"):
        FP8Tensor.from_float([[1.0, 2.0]], Current())


# ---- wrong recipe for the format -----------------------------------------------------------------
def test_wrong_recipe_for_the_tensor_class():
    x = torch.randn(4, 32)
    for fp4_recipe in (NV(), MX(elem="e2m1")):
        with pytest.raises(ValueError, match="FP4Tensor"):
            FP8Tensor.from_float(x, fp4_recipe)
    for fp8_recipe in (Current(), Rowwise(), Blockwise(), MX(), MX(elem="e5m2")):
        with pytest.raises(ValueError, match="NV recipe or MX"):
            FP4Tensor.from_float(x, fp8_recipe)
    with pytest.raises(ValueError, match="NV recipe or MX"):
        FP4Tensor.from_float(x, Delayed())
    with pytest.raises(ValueError):
        FP4Tensor.from_float(x, MX(elem="e4m3", grad_elem="e2m1"), "input")  # FP8 for this role


def test_delayed_needs_state():
    x = torch.randn(4, 32)
    with pytest.raises(TypeError, match="DelayedScalingState"):
        FP8Tensor.from_float(x, Delayed())
    with pytest.raises(TypeError, match="DelayedScalingState"):
        FP8Tensor.from_float(x, Delayed(), state=torch.ones(()))
    with pytest.raises(TypeError, match="DelayedScalingState"):
        Delayed().scales(x, "input")
    st = DelayedScalingState(Delayed(), "e4m3")
    FP8Tensor.from_float(x, Delayed(), state=st)  # with the state it works


# ---- invalid recipe fields and roles --------------------------------------------------------------
@pytest.mark.parametrize("make,match", [
    (lambda: MX(scale_rule="round"), "scale_rule"),
    (lambda: MX(scale_rule="ceil"), "scale_rule"),
    (lambda: MX(elem="fp16"), "not allowed"),
    (lambda: MX(elem="e4m3", grad_elem="bf16"), "not allowed"),
    (lambda: MX(block=0), "block"),
    (lambda: MX(block=31), "block"),
    (lambda: NV(block=32), "16"),
    (lambda: NV(block=8), "16"),
    (lambda: Delayed(history_len=0), "history_len"),
    (lambda: Delayed(history_len=-3), "history_len"),
    (lambda: Delayed(amax_algo="mean"), "amax_algo"),
    (lambda: Current(input_format="e2m1"), "not allowed"),
    (lambda: Rowwise(grad_format="e8m0"), "not allowed"),
    (lambda: Blockwise(act=(1, 0)), "positive"),
    (lambda: Blockwise(weight=(128, -5)), "positive"),
    (lambda: Blockwise(act=(1, 128, 1)), r"\(rows, cols\)"),
])
def test_invalid_recipe_fields(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("name", NAMES)
def test_bad_role(name):
    cls, recipe, _ = GRANULARITIES[name]
    with pytest.raises(ValueError, match="role must be one of"):
        cls.from_float(torch.randn(4, 32), recipe, "activation")
    with pytest.raises(ValueError, match="role must be one of"):
        recipe.granularity("bias")


def test_recipes_are_frozen():
    with pytest.raises(Exception, match="cannot assign"):
        MX().block = 16
